"""Times as Google's APIs write them (RFC 3339: "2026-11-27T03:50:00.000-08:00", "...Z"). Pure."""

from __future__ import annotations

from datetime import datetime, timezone


def rfc3339(text: str) -> datetime | None:
    """The time `text` says, in UTC when it names no offset; None for "" or what is not one."""
    try:
        parsed = datetime.fromisoformat((text or "").replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)

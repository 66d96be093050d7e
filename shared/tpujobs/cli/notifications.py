"""`tpujobs describe`'s notification lines: what became of each notify target of the job."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def notification_lines(answer: Mapping[str, Any]) -> list[str]:
    """One line per target record of a `describe` answer (none when the job has no records)."""
    records = answer.get("notifications") or []
    if not records:
        return []
    lines = ["Notifications:"]
    for record in records:
        name = f"{record.get('id', '?')} ({record.get('target', '?')})"
        event, state = record.get("event", ""), record.get("state", "")
        delivered = event in (record.get("delivered") or [])
        if delivered:
            outcome = "delivered"
        else:
            given_up = " (given up)" if record.get("gave_up") else " (will retry)"
            outcome = f"failed {record.get('attempts', 0)} tries{given_up}: {record.get('last_error', '')}"
        lines.append(f"  {name}: {state} {event}: {outcome}")
    return lines

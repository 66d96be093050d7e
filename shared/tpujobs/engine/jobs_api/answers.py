"""What the `jobs` HTTP function answers: a status code and a JSON object, and the stored
documents as JSON (timestamps as RFC 3339 in UTC), which the CLI reads back the same way."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

MAX_LIMIT = 1000  # the most items one read answers


@dataclass(frozen=True)
class Response:
    """What the function answers: a status code and a JSON object."""

    status: int
    body: dict[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)


class ApiError(Exception):
    """A request refused with `status` and a sentence saying why."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


def to_json(value: Any) -> Any:
    """A Firestore document as JSON: timestamps as RFC 3339 in UTC, maps and lists as they are."""
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


def dead_letter_document(letter: Any) -> dict[str, Any]:
    """A dead letter as JSON: its document less the original bytes (the payload shows them as text)."""
    document = letter.to_document()
    document.pop("data", None)
    return dict(to_json(document))


def rejection_document(rejection: Any) -> dict[str, Any]:
    """A rejection (a document of `rejections`) as JSON."""
    return {
        "message_id": rejection.message_id,
        "at": to_json(rejection.at),
        "reason": rejection.reason,
        "payload": rejection.payload,
        "topic": rejection.topic,
    }


def quota_document(pools: Any) -> dict[str, Any]:
    """Each pool (`family@zone`) with its quota (None: unlimited), chips held, holders and waiting jobs."""
    if pools is None:
        return {"pools": []}
    quotas = pools.quotas()
    names = sorted({f"{family}@{zone}" for zone, limits in quotas.items() for family in limits} | set(pools.pools()))
    rows = []
    for name in names:
        family, _, zone = name.partition("@")
        holders = pools.view(name).holders
        rows.append(
            {
                "pool": name,
                "quota": (quotas.get(zone) or {}).get(family),
                "held": sum(holder.chips for holder in holders),
                "holders": len(holders),
                "waiting": len(pools.queue(name, limit=MAX_LIMIT)),
            }
        )
    return {"pools": rows}

"""What the `jobs` HTTP function answers: a status code and a JSON object, and the stored
documents as JSON (timestamps as RFC 3339 in UTC), which the CLI reads back the same way."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from tpujobs.domain.quotas import PoolKey, region_of
from tpujobs.engine.errors import TransientError

if TYPE_CHECKING:
    from tpujobs.domain.admission import Holder
    from tpujobs.domain.job import Job
    from tpujobs.engine.ports import Pools

log = logging.getLogger(__name__)

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


def answered(what: str, answer: Callable[[], Response]) -> Response:
    """`answer()`, or the refusal it raised as `{"error": sentence}`: its own status for an
    ApiError, 503 for trouble that passes, 500 (the details in the log, not the answer) for the rest."""
    try:
        return answer()
    except ApiError as error:
        return Response(error.status, {"error": error.message}, error.headers)
    except TransientError as error:
        log.warning("%s unavailable for now: %s", what, error)
        return Response(503, {"error": f"Temporarily unavailable, try again: {error}"})
    except Exception:  # still a JSON answer; the details go to the log, not the caller
        log.exception("%s failed", what)
        return Response(500, {"error": "Internal error: see the function's logs."})


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


def quota_document(pools: Pools | None) -> dict[str, Any]:
    """Each limit as Google counts it, one row apiece (`_PoolReads.row`): a zone's, a region's or a
    reservation's quota, the chips held under it, their holders and the jobs waiting for it; then
    every other stored pool, unlimited (`quota` None). `problems`: what `config/quotas` holds that
    was skipped, and pool documents from before pools were regional that still hold chips (the
    reconciler empties them)."""
    if pools is None:
        return {"pools": [], "problems": []}
    book = pools.quotas()
    stored = pools.pools()
    keys = {pool: _parsed(pool) for pool in stored}
    reads = _PoolReads(pools)
    rows: list[dict[str, Any]] = []
    for entry in book.entries:
        if entry.reservation:
            found = [k for k in keys.values() if k is not None and k.reservation == entry.reservation]
            for used in found or [PoolKey("", "reserved", "", entry.reservation)]:
                rows.append(reads.row(used, "reservation", used.region, entry.chips))
        else:
            region = entry.location if entry.scope == "region" else region_of(entry.location)
            rows.append(reads.row(PoolKey(entry.family, entry.tier, region), entry.scope, entry.location, entry.chips))
    shown = {row["pool"] for row in rows}
    problems = list(book.problems)
    for pool, stored_key in keys.items():
        if stored_key is None:
            problems.extend(_left_from_zonal_pools(pools, pool))
        elif pool not in shown:
            scope = "reservation" if stored_key.reservation else "region"
            rows.append(reads.row(stored_key, scope, stored_key.region, None))
    rows.sort(key=lambda row: (row["pool"], row["reservation"], _SCOPE_ORDER[row["scope"]], row["location"]))
    return {"pools": rows, "problems": problems}


_SCOPE_ORDER = {"reservation": 0, "region": 1, "zone": 2}  # a pool's widest limit first


class _PoolReads:
    """Each pool's holders and queue read once, however many of its limits are shown."""

    def __init__(self, pools: Pools) -> None:
        self.pools = pools
        self.holders: dict[str, tuple[Holder, ...]] = {}
        self.queues: dict[str, list[Job]] = {}

    def row(self, key: PoolKey, scope: str, location: str, quota: int | None) -> dict[str, Any]:
        """One limit's row: under a zone's quota only that zone's holders and waiting jobs count;
        under a region's or a reservation's, all of the pool's. A reservation no job has used yet
        has no pool: its row has no pool, family nor location, and nothing held."""
        pool = key.id if key.family else ""
        if pool and pool not in self.holders:
            self.holders[pool] = self.pools.view(pool).holders
            self.queues[pool] = self.pools.queue(pool, limit=MAX_LIMIT)
        holders = [h for h in self.holders.get(pool, ()) if scope != "zone" or h.zone == location]
        waiting = [job for job in self.queues.get(pool, []) if scope != "zone" or job.zone == location]
        return {
            "pool": pool,
            "location": location,
            "scope": scope,
            "family": key.family,
            "tier": key.tier,
            "reservation": key.reservation,
            "quota": quota,
            "held": sum(holder.chips for holder in holders),
            "holders": len(holders),
            "waiting": len(waiting),
        }


def _left_from_zonal_pools(pools: Pools, pool: str) -> list[str]:
    """What to say of a pool document named as before pools were regional (`v4@us-central2-b`):
    nothing once the reconciler has emptied it."""
    holders = pools.view(pool).holders
    if not holders:
        return []
    return [
        f"quota_pools/{pool} is from before pools were regional and still lists {len(holders)} holders "
        f"({sum(h.chips for h in holders)} chips): the reconciler's next tick drops them and counts "
        "their jobs in their own pools"
    ]


def _parsed(pool: str) -> PoolKey | None:
    """The key of a stored pool id; None for an id of the old per-zone format (`v4@us-central2-b`)."""
    try:
        return PoolKey.parse(pool)
    except ValueError:
        return None

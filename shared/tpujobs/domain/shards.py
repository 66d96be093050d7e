"""How one reconcile tick is split: per zone, then per range of job ids.

A shard is a zone and a half-open range of job ids, (after, through], "" an open end. The shards of one
zone cover the whole id space, so each queued resource of the zone, named after its job, belongs to
exactly one shard, even when its job is no longer active. Job ids are ASCII, so Python's string order is
Firestore's document-id order. A shard travels on tpujobs-reconcile as `{"shard": {...}}`; any message
without a "shard" key is a tick. See docs/architecture.md#the-reconciler.

A tick's shards run in at most as many lanes as the reconcile function takes requests at once
(`lanes`): a shard carries the rest of its lane (`then`), and hands the next one on when it is done.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from tpujobs.domain.spec import ID_PATTERN, ZONE_PATTERN

SHARD_KEY = "shard"
ZONE = re.compile(ZONE_PATTERN)  # as a spec names a zone
JOB_ID = re.compile(ID_PATTERN)  # an open end is ""
TICK = re.compile(r"[0-9A-Za-z:.+-]{0,64}")  # the coordinator's time, ISO 8601: for logs only
FIELDS = ("zone", "after", "through", "tick", "then")
MAX_THEN = 1000  # shards a message may carry on: far more than a tick's, far less than Pub/Sub's 10 MB


class ShardError(ValueError):
    """A shard message that cannot be used: the sentence names the field."""


@dataclass(frozen=True)
class Placement:
    """Where one active job is, as far as sharding needs: read with nothing else."""

    job_id: str
    zone: str  # the zone of its current attempt
    preferred_zones: tuple[str, ...] = ()  # the zones it may have used (an attempt that moved leaves one behind)
    warm_pool_unit: str = ""  # the unit it runs on, if on a warm pool (the coordinator compares those)


@dataclass(frozen=True)
class Shard:
    """The jobs of `zone` whose ids are in (after, through]; "" is an open end."""

    zone: str
    after: str = ""  # exclusive: "" is from the first id
    through: str = ""  # inclusive: "" is to the last id
    tick: str = ""  # the coordinator's tick: for logs, and to know when a newer tick has begun
    then: tuple[Shard, ...] = ()  # the rest of its lane, in order, each without a `then` of its own

    def holds(self, job_id: str) -> bool:
        """Whether `job_id` is in this shard's range (the zone is the caller's to check)."""
        return job_id > self.after and (not self.through or job_id <= self.through)

    @property
    def name(self) -> str:
        return f"{self.zone}({self.after or '-'}..{self.through or '-'}]"

    def message(self) -> dict[str, dict[str, object]]:
        """The JSON object published on tpujobs-reconcile; `then` as [zone, after, through] triples."""
        body: dict[str, object] = {"zone": self.zone, "after": self.after, "through": self.through, "tick": self.tick}
        if self.then:
            body["then"] = [[shard.zone, shard.after, shard.through] for shard in self.then]
        return {SHARD_KEY: body}

    def next(self) -> Shard | None:
        """The next shard of its lane, carrying the rest; None at the lane's end."""
        if not self.then:
            return None
        first, *rest = self.then
        return Shard(first.zone, first.after, first.through, self.tick, tuple(rest))


def plan(placements: Iterable[Placement], also: Iterable[str], size: int, tick: str = "") -> list[Shard]:
    """The shards of one tick: each zone of an active job cut into ranges of at most `size` ids
    that together cover every id; each zone of `also` (preferred zones, warm pools, the default
    zone) without an active job gets one range covering everything. Sorted by zone, then range."""
    if size < 1:
        raise ValueError(f"shard size must be at least 1, got {size}")
    by_zone: dict[str, list[str]] = {}
    for placement in placements:
        by_zone.setdefault(placement.zone, []).append(placement.job_id)
    for zone in also:
        by_zone.setdefault(zone, [])
    shards = []
    for zone in sorted(by_zone):
        ids = sorted(set(by_zone[zone]))
        bounds = ids[size - 1 : -1 : size]  # the last id of each full shard but the final one
        starts = ["", *bounds]
        ends = [*bounds, ""]
        shards += [Shard(zone, after, through, tick) for after, through in zip(starts, ends, strict=True)]
    return shards


def lanes(shards: Sequence[Shard], width: int) -> list[Shard]:
    """The heads of at most `width` lanes that together run `shards` once each: shard i goes to
    lane i % width, so each wave (one shard of every lane) is `width` consecutive shards of the
    plan. Each head carries the rest of its lane in `then`."""
    if width < 1:
        raise ValueError(f"lane count must be at least 1, got {width}")
    heads = []
    for lane in range(min(width, len(shards))):
        first, *rest = shards[lane::width]
        heads.append(replace(first, then=tuple(replace(shard, tick="", then=()) for shard in rest)))
    return heads


def decode(data: bytes | None) -> Shard | None:
    """The shard a message carries; None for anything else (a scheduler's tick, whatever its
    body); ShardError when it has a "shard" that is not one."""
    if data is None:
        return None
    try:
        payload = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None  # not JSON: not a shard, so a tick
    if not isinstance(payload, dict) or SHARD_KEY not in payload:
        return None
    body = payload[SHARD_KEY]
    if not isinstance(body, dict):
        raise ShardError(f"field 'shard' must be an object with {', '.join(FIELDS)}, got {_excerpt(body)}")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise ShardError(f"field 'shard.{unknown[0]}' is not a shard field (expected {', '.join(FIELDS)})")
    zone = body.get("zone")
    if not isinstance(zone, str) or not ZONE.fullmatch(zone):
        raise ShardError(f"field 'shard.zone' must be a zone name like us-central2-b, got {_excerpt(zone)}")
    after, through, tick = (body.get(key, "") for key in ("after", "through", "tick"))
    for key, value, pattern, what in (
        ("after", after, JOB_ID, 'a job id or ""'),
        ("through", through, JOB_ID, 'a job id or ""'),
        ("tick", tick, TICK, "an ISO 8601 time"),
    ):
        if not isinstance(value, str) or (value and not pattern.fullmatch(value)):
            raise ShardError(f"field 'shard.{key}' must be {what}, got {_excerpt(value)}")
    assert isinstance(after, str) and isinstance(through, str) and isinstance(tick, str)
    _check_range("shard", after, through)
    return Shard(zone, after, through, tick, _decode_then(body.get("then", [])))


def _decode_then(then: object) -> tuple[Shard, ...]:
    """The rest of a lane: a list of [zone, after, through], each checked as a shard is."""
    what = "a list of [zone, after, through]"
    if not isinstance(then, list) or len(then) > MAX_THEN:
        raise ShardError(f"field 'shard.then' must be {what} of at most {MAX_THEN}, got {_excerpt(then)}")
    shards = []
    for n, item in enumerate(then):
        field = f"shard.then[{n}]"
        if not isinstance(item, list) or len(item) != 3 or not all(isinstance(part, str) for part in item):
            raise ShardError(f"field '{field}' must be [zone, after, through], got {_excerpt(item)}")
        zone, after, through = item
        if not ZONE.fullmatch(zone):
            raise ShardError(f"field '{field}' must name a zone like us-central2-b, got {_excerpt(zone)}")
        for value in (after, through):
            if value and not JOB_ID.fullmatch(value):
                raise ShardError(f"field '{field}' must bound its range with job ids or \"\", got {_excerpt(value)}")
        _check_range(field, after, through)
        shards.append(Shard(zone, after, through))
    return tuple(shards)


def _check_range(field: str, after: str, through: str) -> None:
    if after and through and through <= after:
        raise ShardError(f"field '{field}.through' ({through}) must come after '{field}.after' ({after})")


def _excerpt(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."

"""Quotas and admission: which waiting job gets chips next, and whom a high-priority job evicts.

A pool is one accelerator family in one zone ("v4@us-central2-b") with a quota of chips from
`config/quotas` (none: no limit). Its holders are listed in its own document, which changes only when
chips change hands, never on a running job's events. Its queue is strict (priority, then age); a `high` or
`very-high` job that does not fit evicts lower priorities, lowest and newest first, never an
`on_preemption: fail` job. A job too big for all its zones is refused at submit. See docs/quotas.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from tpujobs.domain.accelerators import parse_accelerator_type
from tpujobs.domain.spec import PRIORITY_RANK, JobSpec

EVICTING_PRIORITIES = frozenset({"high", "very-high"})


def pool_id(spec: JobSpec, zone: str) -> str:
    """The pool a job's chips come from: its accelerator family in its zone."""
    return f"{parse_accelerator_type(spec.accelerator_type).family}@{zone}"


def quota_of(quotas: Mapping[str, Mapping[str, int]], pool: str) -> int | None:
    """The pool's quota in chips from `config/quotas` (zone -> family -> chips); None: no limit."""
    family, _, zone = pool.partition("@")
    limit = (quotas.get(zone) or {}).get(family)
    return None if limit is None else int(limit)


@dataclass(frozen=True)
class Holder:
    """A job that holds chips of a pool, for the attempt it was admitted with."""

    job_id: str
    chips: int
    attempt: int
    priority: str
    since: datetime
    evictable: bool = True

    @property
    def rank(self) -> int:
        return PRIORITY_RANK[self.priority]


def chips_held(holders: Sequence[Holder]) -> int:
    return sum(h.chips for h in holders)


def fits(limit: int | None, holders: Sequence[Holder], chips: int) -> bool:
    """Whether `chips` more fit under the pool's limit next to what its holders hold."""
    return limit is None or chips_held(holders) + chips <= limit


def queue_key(priority: str, created_at: datetime) -> tuple[int, datetime]:
    """Sort key of a pool's queue: higher priority first, then earlier submission."""
    return (-PRIORITY_RANK[priority], created_at)


def victims_for(limit: int, holders: Sequence[Holder], chips: int, priority: str) -> list[Holder] | None:
    """The fewest lower-priority holders, lowest priority and newest first, whose chips make
    `chips` fit; None when the job may not evict or even evicting all of them would not do."""
    if priority not in EVICTING_PRIORITIES:
        return None
    rank = PRIORITY_RANK[priority]
    candidates = sorted(
        (h for h in holders if h.rank < rank and h.evictable),
        key=lambda h: (h.rank, -h.since.timestamp()),
    )
    free = limit - chips_held(holders)
    chosen: list[Holder] = []
    for holder in candidates:
        if free >= chips:
            break
        chosen.append(holder)
        free += holder.chips
    return chosen if free >= chips and chosen else None


def waiting_reason(pool: str, limit: int, chips: int) -> str:
    """Why a job waits; the same words each time, so saying it again writes nothing."""
    family, _, zone = pool.partition("@")
    return f"Waiting for quota: needs {chips} {family} chips in {zone}, where the quota is {limit}."


def never_fits(limit: int | None, chips: int) -> bool:
    """Whether `chips` exceed the pool's whole quota: even alone in the pool the job could not run.

    A quota of 0 is a pause, not a size (an admin stops a pool, then opens it again): its jobs
    wait, as they always did, and are never refused or failed for it.
    """
    return limit is not None and 0 < limit < chips


def never_fits_reason(pool: str, limit: int, chips: int) -> str:
    """Why a job can never be admitted to `pool`: the words of the timeline and of a refusal."""
    family, _, zone = pool.partition("@")
    return f"asks for {chips} chips of {family} in {zone}, whose quota is {limit}: it could never run there"


def refusal_when_oversized(spec: JobSpec, zones: Iterable[str], quotas: Mapping[str, Mapping[str, int]]) -> str | None:
    """Why a job must be refused at submission: it asks for more chips than the quota of every
    zone it may run in. None when at least one of them can take it (a zone that cannot is
    skipped at admission, `never_fits`)."""
    chips = spec.chips
    limits = [(pool_id(spec, zone), quota_of(quotas, pool_id(spec, zone))) for zone in zones]
    too_small = [(pool, limit) for pool, limit in limits if never_fits(limit, chips)]
    if not too_small or len(too_small) < len(limits):
        return None
    if len(too_small) == 1:
        pool, limit = too_small[0]
        reason = never_fits_reason(pool, limit or 0, chips).removesuffix(" there")
        return f"job {spec.job_id!r} {reason}; ask an admin to raise the quota, or ask for fewer chips"
    family = parse_accelerator_type(spec.accelerator_type).family
    each = ", ".join(f"{pool.partition('@')[2]}: {limit}" for pool, limit in too_small)
    return (
        f"job {spec.job_id!r} asks for {chips} chips of {family}, more than the quota of each of "
        f"its zones ({each}): it could never run; ask an admin to raise a quota, or ask for fewer chips"
    )

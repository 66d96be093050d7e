"""Admission: which waiting job gets chips next, and whom a high-priority job evicts.

A job's chips are counted in its admission pool (`domain.quotas`): its family and quota tier in
its region, or its reservation. The pool's limits are its region's quota and its zones' quotas
from `config/quotas` (none: no limit). Its holders are listed in its own document, which changes
only when chips change hands, never on a running job's events. Its queue is strict (priority,
then age) within each limit: a job held back by its zone's quota lets the jobs of other zones
pass, one held back by the region's stops the queue. A `high` or `very-high` job that does not
fit evicts lower priorities, lowest and newest first, never an `on_preemption: fail` job. A job
too big for all its zones is refused at submit. See docs/quotas.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from tpujobs.domain.accelerators import parse_accelerator_type
from tpujobs.domain.job import Job
from tpujobs.domain.quotas import Limits, PoolKey, QuotaBook, Scope, pool_key
from tpujobs.domain.spec import PRIORITY_RANK, JobSpec

EVICTING_PRIORITIES = frozenset({"high", "very-high"})


def pool_of(spec: JobSpec, zone: str, capacity: str | None = None) -> PoolKey:
    """The pool a job's chips come from in `zone`, for `capacity` (default: the spec's; a spot
    job continued on on-demand gives `Job.capacity`)."""
    family = parse_accelerator_type(spec.accelerator_type).family
    return pool_key(family, capacity or spec.capacity, zone, spec.reservation)


def pool_id(spec: JobSpec, zone: str, capacity: str | None = None) -> str:
    """`pool_of`'s document id."""
    return pool_of(spec, zone, capacity).id


def job_pool(job: Job) -> PoolKey:
    """The pool the job's current attempt counts in: its zone, and the capacity it asks for now
    (`Job.capacity`: a spot job continued on on-demand counts as on-demand)."""
    return pool_of(job.spec, job.zone, job.capacity)


@dataclass(frozen=True)
class Holder:
    """A job (or a warm pool's unit) that holds chips of a pool, for the attempt it was admitted with."""

    job_id: str
    chips: int
    attempt: int
    priority: str
    since: datetime
    evictable: bool = True
    zone: str = ""  # where the chips are; "" for a hold written before pools were regional
    team: str = ""  # whose share the chips count in (`domain.teams`); "": no team

    @property
    def rank(self) -> int:
        return PRIORITY_RANK[self.priority]


def chips_held(holders: Sequence[Holder]) -> int:
    return sum(h.chips for h in holders)


def blocked_by(limits: Limits, holders: Sequence[Holder], zone: str, chips: int) -> Scope | None:
    """Which of the pool's limits `chips` more in `zone` would pass; None: they fit."""
    return limits.blocked_by(((h.zone, h.chips) for h in holders), zone, chips)


def queue_key(priority: str, created_at: datetime) -> tuple[int, datetime]:
    """Sort key of a pool's queue: higher priority first, then earlier submission."""
    return (-PRIORITY_RANK[priority], created_at)


def victims_for(limits: Limits, holders: Sequence[Holder], zone: str, chips: int, priority: str) -> list[Holder] | None:
    """The fewest lower-priority holders, lowest priority and newest first, whose chips make
    `chips` fit in `zone` under every limit (a zone's quota only frees up by its own holders);
    None when the job may not evict or even evicting all of them would not do."""
    if priority not in EVICTING_PRIORITIES:
        return None
    rank = PRIORITY_RANK[priority]
    candidates = sorted(
        (h for h in holders if h.rank < rank and h.evictable),
        key=lambda h: (h.rank, -h.since.timestamp()),
    )
    chosen: list[Holder] = []
    for holder in candidates:
        staying = [h for h in holders if h not in chosen]
        short = blocked_by(limits, staying, zone, chips)
        if short is None:
            break
        if short == "region" or holder.zone == zone:
            chosen.append(holder)
    staying = [h for h in holders if h not in chosen]
    return chosen if chosen and blocked_by(limits, staying, zone, chips) is None else None


def limit_words(pool: PoolKey, scope: Scope, zone: str) -> str:
    """Which limit: 'the quota of v4 spot chips in us-central2-b', '... in region us-central2'."""
    return f"the quota of {pool.chips_of(zone if scope == 'zone' else pool.region)}"


def waiting_reason(pool: PoolKey, scope: Scope, zone: str, limit: int, chips: int) -> str:
    """Why a job waits; the same words each time, so saying it again writes nothing."""
    return f"Waiting for quota: needs {chips} chips, and {limit_words(pool, scope, zone)} is {limit}."


def never_fits_reason(pool: PoolKey, scope: Scope, zone: str, limit: int, chips: int) -> str:
    """Why a job can never be admitted there: the words of the timeline and of a refusal."""
    return f"asks for {chips} chips, more than {limit_words(pool, scope, zone)} ({limit}): it could never run there"


def refusal_when_oversized(spec: JobSpec, zones: Iterable[str], book: QuotaBook) -> str | None:
    """Why a job must be refused at submission: it asks for more chips than a limit of every
    zone it may run in. None when at least one of them can take it (a zone that cannot is
    skipped at admission)."""
    chips = spec.chips
    reasons: list[str] = []
    for zone in zones:
        pool = pool_of(spec, zone)
        limits = book.limits(pool)
        scope = limits.never_fits(zone, chips)
        if scope is None:
            return None
        reasons.append(never_fits_reason(pool, scope, zone, limits.of(scope, zone) or 0, chips).removesuffix(" there"))
    if not reasons:
        return None
    unique = list(dict.fromkeys(reasons))
    return f"job {spec.job_id!r} {'; and '.join(unique)}; ask an admin to raise the quota, or ask for fewer chips"

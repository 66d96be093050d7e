"""Small pure helpers on a pool document, shared by the warm pools' services."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from tpujobs.domain import pools
from tpujobs.domain.job import Job
from tpujobs.domain.pools import Pool, Unit, UnitState


def owns(pool: Pool, index: int, generation: int) -> bool:
    """The pool's unit `index` is still that generation, and not released."""
    unit = pool.unit(index)
    return unit is not None and unit.generation == generation and unit.state is not UnitState.RELEASED


def same(now: Unit | None, then: Unit) -> bool:
    """The unit is as it was read (same state, generation and assignment): the change decided on
    that read still applies. Another handler's change makes the caller's a no-op."""
    return (
        now is not None
        and now.state is then.state
        and now.generation == then.generation
        and now.seq == then.seq
        and now.removing == then.removing
    )


def assign(pool: Pool, index: int, job: Job, now: datetime) -> Pool | None:
    """Give the unit to the job if it is still free and the job has no unit yet."""
    unit = pool.unit(index)
    if unit is None or unit.state is not UnitState.IDLE or unit.removing or pool.unit_of(job.job_id) is not None:
        return None
    return pools.assigned(pool, index, job.job_id, job.attempt, now)


def said(pool: Pool, why: str) -> Pool | None:
    return None if pool.reason == why else replace(pool, reason=why)


def tally(pool: Pool) -> str:
    """`2 busy, 1 being requested` and the like, for a waiting job's reason."""
    counts: dict[str, int] = {}
    words = {
        UnitState.BUSY: "busy",
        UnitState.REQUESTED: "being requested",
        UnitState.WAITING_FOR_QUOTA: "waiting for quota",
        UnitState.RELEASED: "released",
        UnitState.IDLE: "idle",
    }
    for unit in pool.units:
        if not unit.removing:
            counts[words[unit.state]] = counts.get(words[unit.state], 0) + 1
    return ", ".join(f"{n} {word}" for word, n in counts.items()) or "no units"

"""A unit's chips in the admission quota: held from its request until it is released.

Units hold chips as holders named `pool:{name}/{index}` in their admission pool
(`quota_pools/{family}@{zone}`), beside the jobs; a unit never evicts, it waits.
"""

from __future__ import annotations

from tpujobs.domain.admission import Holder, chips_held, fits, pool_id, quota_of
from tpujobs.domain.pools import Pool, Unit
from tpujobs.engine.jobs.admission import Admission
from tpujobs.engine.ports import Clock, Pools

HOLDER_PREFIX = "pool:"
CLAIM_TRIES = 10  # compare-and-sets one claim tries before it waits for the next call


def unit_holder(pool: str, index: int) -> str:
    """The unit's holder id in its admission pool (`quota_pools/{family}@{zone}`)."""
    return f"{HOLDER_PREFIX}{pool}/{index}"


def parse_unit_holder(holder: str) -> tuple[str, int] | None:
    """(pool, unit index) of a unit's holder id, or None for a job's."""
    if not holder.startswith(HOLDER_PREFIX):
        return None
    name, _, index = holder[len(HOLDER_PREFIX) :].partition("/")
    return (name, int(index)) if index.isdigit() else None


class UnitQuota:
    """Claims and gives back a unit's chips; what it gives back goes to the admission queue."""

    def __init__(self, pools: Pools | None, clock: Clock, admission: Admission) -> None:
        self.pools = pools  # None: no quotas
        self.clock = clock
        self.admission = admission

    def quotas(self) -> dict[str, dict[str, int]]:
        """The quotas as configured; none without quotas."""
        return self.pools.quotas() if self.pools is not None else {}

    def claim(self, pool: Pool, unit: Unit, zone: str) -> str | None:
        """Hold the unit's chips in its admission pool; None when held (or no quota applies),
        else why it waits. Never evicts: a unit waits like a job that may not."""
        quota = self.pools
        if quota is None:
            return None
        shape = pool.shape()
        admission_pool = pool_id(shape, zone)
        limit = quota_of(quota.quotas(), admission_pool)
        if limit is None:
            return None
        holder = unit_holder(pool.name, unit.index)
        for _ in range(CLAIM_TRIES):
            view = quota.view(admission_pool)
            if any(h.job_id == holder for h in view.holders):
                return None
            if not fits(limit, view.holders, pool.chips_per_unit):
                free = limit - chips_held(view.holders)
                return (
                    f"Unit {unit.index} waits for quota: {admission_pool} has {free} of {limit} chips free and a "
                    f"unit needs {pool.chips_per_unit}."
                )
            claim = Holder(holder, pool.chips_per_unit, unit.generation, "medium", self.clock(), evictable=False)
            if quota.change(view, add=claim):
                return None
        return f"Unit {unit.index}: {admission_pool} changed under 10 attempts to claim its chips; asked again."

    def drop(self, pool: Pool, unit: Unit) -> None:
        """The unit gives its chips back, and the admission queue gets them at once."""
        if self.pools is not None:
            self.admission.drop_hold(unit_holder(pool.name, unit.index), pool_id(pool.shape(), unit.zone))

"""A unit's chips in the admission quota: held from its request until it is released.

Units hold chips as holders named `pool:{name}/{index}` in their admission pool
(`quota_pools/{pool id}`, `domain.quotas`), with their zone, beside the jobs; a unit never
evicts, it waits.
"""

from __future__ import annotations

from tpujobs.domain.admission import Holder, blocked_by, limit_words, pool_id, pool_of
from tpujobs.domain.pools import Pool, Unit
from tpujobs.domain.quotas import QuotaBook
from tpujobs.engine.jobs.admission import Admission
from tpujobs.engine.owner_team import owner_team
from tpujobs.engine.ports import AccessPolicyReader, Clock, Pools, Teams

HOLDER_PREFIX = "pool:"
CLAIM_TRIES = 10  # compare-and-sets one claim tries before it waits for the next call


def unit_holder(pool: str, index: int) -> str:
    """The unit's holder id in its admission pool (`quota_pools/{pool id}`)."""
    return f"{HOLDER_PREFIX}{pool}/{index}"


def parse_unit_holder(holder: str) -> tuple[str, int] | None:
    """(pool, unit index) of a unit's holder id, or None for a job's."""
    if not holder.startswith(HOLDER_PREFIX):
        return None
    name, _, index = holder[len(HOLDER_PREFIX) :].partition("/")
    return (name, int(index)) if index.isdigit() else None


class UnitQuota:
    """Claims and gives back a unit's chips; what it gives back goes to the admission queue."""

    def __init__(
        self,
        pools: Pools | None,
        clock: Clock,
        admission: Admission,
        teams: Teams | None = None,
        access: AccessPolicyReader | None = None,
    ) -> None:
        self.pools = pools  # None: no quotas
        self.clock = clock
        self.admission = admission
        self.teams = teams  # a unit's chips count in its pool owner's team
        self.access = access

    def quotas(self) -> QuotaBook:
        """The quotas as configured; none without quotas."""
        return self.pools.quotas() if self.pools is not None else QuotaBook(None)

    def claim(self, pool: Pool, unit: Unit, zone: str) -> str | None:
        """Hold the unit's chips in its admission pool, in `zone`; None when held (or no limit
        applies), else why it waits. Never evicts: a unit waits like a job that may not."""
        quota = self.pools
        if quota is None:
            return None
        key = pool_of(pool.shape(), zone)
        limits = quota.quotas().limits(key)
        if limits.unlimited:
            return None
        holder = unit_holder(pool.name, unit.index)
        chips = pool.chips_per_unit
        for _ in range(CLAIM_TRIES):
            view = quota.view(key.id)
            if any(h.job_id == holder and h.zone == zone for h in view.holders):
                return None
            others = [h for h in view.holders if h.job_id != holder]  # a hold in another zone moves here
            scope = blocked_by(limits, others, zone, chips)
            if scope is not None:
                limit = limits.of(scope, zone) or 0
                held = sum(h.chips for h in others if scope == "region" or h.zone == zone)
                return (
                    f"Unit {unit.index} waits for quota: {limit_words(key, scope, zone)} is {limit}, "
                    f"{held} held, and a unit needs {chips}."
                )
            team = owner_team(self.teams, self.access, pool.owner, owner_verified=pool.owner_verified)
            claim = Holder(holder, chips, unit.generation, "medium", self.clock(), False, zone, team)
            if quota.change(view, add=claim):
                return None
        return f"Unit {unit.index}: {key.id} changed under {CLAIM_TRIES} attempts to claim its chips; asked again."

    def drop(self, pool: Pool, unit: Unit) -> None:
        """The unit gives its chips back, and the admission queue gets them at once."""
        if self.pools is not None:
            self.admission.drop_hold(unit_holder(pool.name, unit.index), pool_id(pool.shape(), unit.zone))

"""The reconciler's repair of warm pools: each pool made what its document says, from what
the zones show, and unit holdings no pool owns released."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from tpujobs.domain import pools
from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.job import Job
from tpujobs.domain.naming import parse_unit_queued_resource_name
from tpujobs.domain.pools import Pool, PoolState, Unit, UnitState
from tpujobs.domain.states import ATTEMPT_LIVE, EventKind, JobState
from tpujobs.domain.transitions import Observation
from tpujobs.engine.jobs.lifecycle import JobLifecycle
from tpujobs.engine.ports import Capacity, CapacityStatus, Clock, JobRecords, WarmPoolStore
from tpujobs.engine.warm_pools.agents import UnitAgents
from tpujobs.engine.warm_pools.changes import owns
from tpujobs.engine.warm_pools.jobs import PoolJobs
from tpujobs.engine.warm_pools.quota import UnitQuota
from tpujobs.engine.warm_pools.units import PoolUnits

TELL_AFTER = timedelta(seconds=5)  # a unit whose agents were not told this long after a change is told again


class PoolRepair:
    """Repairs warm pools for the reconciler (its `PoolRepairs`)."""

    def __init__(
        self,
        store: WarmPoolStore,
        jobs: JobRecords,
        capacity: Capacity,
        clock: Clock,
        zone_wait_seconds: float,
        units: PoolUnits,
        agents: UnitAgents,
        quota: UnitQuota,
        pool_jobs: PoolJobs,
        lifecycle: JobLifecycle,
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.capacity = capacity
        self.clock = clock
        self.zone_wait_seconds = zone_wait_seconds
        self.units = units
        self.agents = agents
        self.quota = quota
        self.pool_jobs = pool_jobs
        self.lifecycle = lifecycle

    def repair(self, pool: Pool, seen: Mapping[str, CapacityStatus], live: Mapping[str, Job]) -> list[str]:
        """Make one pool what its document says, from the tick's listing (`seen`, by queued
        resource name) and active jobs (`live`): units asked for, ready, lost, told, released;
        units whose job is gone freed; jobs whose unit is gone lost; leftovers released. What it
        did, for the tick's report."""
        did: list[str] = []
        name = pool.name
        now = self.clock()
        if pool.state is PoolState.DELETING:
            self.pool_jobs.settle_jobs_of_deleted(name, f"Pool {name} was deleted")
        for unit in pool.units:
            qr = unit.queued_resource(name)
            status = _pools(seen.get(qr), name)
            if unit.state is UnitState.WAITING_FOR_QUOTA and not unit.removing:
                self.units.request(name, unit)
            elif unit.state is UnitState.REQUESTED:
                if status is None and _pools(self.capacity.status(unit.zone, qr), name) is None:
                    self.units.create(pool, unit.index)  # a request that never landed (a crash): ask again
                    did.append(f"{name}: asked again for {qr}")
                elif status is not None:
                    self.units.seen(name, unit.index, unit.generation, status)
                    self._move_if_waited(pool, unit, status, did)
            elif unit.state in pools.HELD:
                if status is None:
                    status = _pools(self.capacity.status(unit.zone, qr), name)  # confirm before calling it lost
                self.units.seen(name, unit.index, unit.generation, status)
                if unit.state is UnitState.BUSY:
                    self._check_busy(pool, unit, live, did)
                if not unit.written and now - unit.since >= TELL_AFTER:
                    self.agents.tell(name, unit.index)
                    did.append(f"{name}: told unit {unit.index} again")
        self._lose_jobs_without_unit(pool, live, did)
        self.units.settle_units(name)
        self.units.request_units(name)
        did += [f"{name}: gave {job_id} a unit" for job_id in self.units.fill(name)]
        return did

    def _move_if_waited(self, pool: Pool, unit: Unit, status: CapacityStatus, did: list[str]) -> None:
        """A unit that waited past the zone wait moves to the pool's next zone, as a job does."""
        if status.state is HoldingState.ACTIVE or unit.requested_at is None or len(pool.zones) < 2:
            return
        waited = (self.clock() - unit.requested_at).total_seconds()
        if waited <= self.zone_wait_seconds:
            return
        zones = pool.zones
        following = zones[(zones.index(unit.zone) + 1) % len(zones)] if unit.zone in zones else zones[0]
        self.capacity.release(unit.zone, unit.queued_resource(pool.name))
        if following != unit.zone:  # its hold names its zone: held again in the next one
            self.quota.drop(pool, unit)
        self.units.request(pool.name, unit, following)
        did.append(f"{pool.name}: unit {unit.index} waited {waited / 60:.0f} min; asked for in {following}")

    def _check_busy(self, pool: Pool, unit: Unit, live: Mapping[str, Job], did: list[str]) -> None:
        """A busy unit whose job is not on it: finish a claim left half-way, or free it."""
        assert unit.job_id is not None and unit.attempt is not None
        qr = unit.queued_resource(pool.name)
        job = live.get(unit.job_id) or self.jobs.get(unit.job_id)
        if job is not None and job.state in ATTEMPT_LIVE and job.attempt == unit.attempt and job.warm_pool_unit == qr:
            return
        if job is not None and job.state is JobState.QUEUED and job.attempt == unit.attempt and job.warm_pool:
            self.units.place(pool, unit, job)
            did.append(f"{pool.name}: finished giving unit {unit.index} to {job.job_id}")
            return
        self.units.leave_unit(unit.job_id, unit.attempt, qr, lost=False)
        did.append(f"{pool.name}: freed unit {unit.index} ({unit.job_id} is not on it)")

    def _lose_jobs_without_unit(self, pool: Pool, live: Mapping[str, Job], did: list[str]) -> None:
        """A job live on a unit of this pool that does not run it has lost its capacity."""
        for job in live.values():
            if job.state not in ATTEMPT_LIVE or not job.warm_pool_unit:
                continue
            parsed = parse_unit_queued_resource_name(job.warm_pool_unit)
            if parsed is None or parsed[0] != pool.name:
                continue
            unit = pool.unit(parsed[1])
            if unit is not None and unit.generation == parsed[2] and unit.runs(job.job_id, job.attempt):
                continue
            fresh = self.jobs.get(job.job_id)
            if fresh is None or fresh.state not in ATTEMPT_LIVE or fresh.warm_pool_unit != job.warm_pool_unit:
                continue
            what = f"Unit {job.warm_pool_unit} of pool {pool.name} no longer runs this attempt: the capacity is lost"
            self.lifecycle.observe(job.job_id, Observation(EventKind.CAPACITY_LOST, job.attempt, "reconciler", what))
            did.append(f"{job.job_id}: {what}")

    def release_leftovers(self, seen: Mapping[str, CapacityStatus], known: Mapping[str, Pool]) -> list[str]:
        """Delete unit queued resources no pool unit owns now: an older generation, a removed
        unit, a deleted pool. Read the pool again first: it may have changed since the listing."""
        released = []
        for name, status in seen.items():
            parsed = parse_unit_queued_resource_name(name)
            if parsed is None or status.pool_label != parsed[0] or status.state is HoldingState.RELEASING:
                continue
            pool_name, index, generation = parsed
            pool = known.get(pool_name)
            if pool is not None and owns(pool, index, generation):
                continue
            pool = self.store.get(pool_name)
            if pool is not None and owns(pool, index, generation):
                continue
            self.capacity.release(status.zone, name)
            released.append(name)
        return released


def _pools(status: CapacityStatus | None, pool: str) -> CapacityStatus | None:
    """A unit's holding as seen, or None when what holds its name is not labelled for the pool:
    someone else's is never taken for the unit's (`domain.ownership`); asking for it again
    finds it and moves the unit to its next generation."""
    return status if status is not None and status.pool_label == pool else None

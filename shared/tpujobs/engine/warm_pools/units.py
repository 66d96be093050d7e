"""A warm pool's units: asked for, seen ready or lost, freed, released; and given to the jobs
of the pool's queue (`fill`). The package docstring tells the whole story."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from tpujobs.domain import pools
from tpujobs.domain.holdings import HOLDING_LOST, HoldingState
from tpujobs.domain.job import Job
from tpujobs.domain.naming import parse_unit_queued_resource_name
from tpujobs.domain.pools import Pool, PoolState, Unit, UnitState
from tpujobs.domain.states import ATTEMPT_LIVE, EventKind
from tpujobs.domain.transitions import Decision, Observation
from tpujobs.engine.errors import NotOurs, PermanentError, QuotaExhausted
from tpujobs.engine.jobs.journal import JobJournal, Observe
from tpujobs.engine.ports import Capacity, CapacityStatus, Clock, JobRecords, UnitRequest, WarmPoolStore
from tpujobs.engine.queue_rounds import QUEUE_PEEK, jittered_rounds
from tpujobs.engine.warm_pools.agents import UnitAgents
from tpujobs.engine.warm_pools.changes import assign, said, same
from tpujobs.engine.warm_pools.quota import UnitQuota

log = logging.getLogger(__name__)

FILL_ROUNDS = 20  # assignments (or lost races) one call may make
UNITS_REPLACED_PER_JOB = 3  # units a job's attempts may lose (and the pool ask for again) by their own word


def replaced_for(job: Job) -> int:
    """How many of the job's attempts ended on a pool unit with their capacity lost."""
    return sum(1 for usage in job.usage if usage.pool and usage.capacity_lost)


def current_unit(store: WarmPoolStore, queued_resource: str) -> tuple[str, Unit] | None:
    """(pool, unit) of the unit whose current generation `queued_resource` names, as read now."""
    parsed = parse_unit_queued_resource_name(queued_resource)
    if parsed is None:
        return None
    name, index, generation = parsed
    pool = store.get(name)
    unit = pool.unit(index) if pool is not None else None
    return (name, unit) if unit is not None and unit.generation == generation else None


class PoolUnits:
    """The units of every pool, and the jobs on them."""

    def __init__(
        self,
        store: WarmPoolStore,
        jobs: JobRecords,
        capacity: Capacity,
        clock: Clock,
        sleep: Callable[[float], None],
        journal: JobJournal,
        quota: UnitQuota,
        agents: UnitAgents,
        observe: Observe,
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.capacity = capacity
        self.clock = clock
        self.sleep = sleep
        self.journal = journal
        self.quota = quota
        self.agents = agents
        self.observe = observe

    def _change(self, name: str, change: Callable[[Pool], Pool | None]) -> tuple[Pool, Pool] | None:
        """Apply `change` to the pool (a compare-and-set): (before, after) when it wrote something,
        None when the pool is gone or the change left it as it was."""
        changed = self.store.update(name, change)
        return None if changed is None or changed[0] == changed[1] else changed

    def request_units(self, name: str) -> None:
        """Ask for every unit that should be asked for: those waiting for quota (if it fits now)."""
        pool = self.store.get(name)
        if pool is None or pool.state is not PoolState.ACTIVE:
            return
        for unit in pool.units:
            if unit.state is UnitState.WAITING_FOR_QUOTA and not unit.removing:
                self.request(name, unit)

    def request(self, name: str, seen: Unit, zone: str | None = None) -> None:
        """Claim the unit's quota, mark it REQUESTED (its next generation), then create it, if the
        unit is still as the caller saw it (`seen`): two handlers that decided on one read (the
        pool's creation and a reconciler tick) must not ask for two generations of one unit."""
        pool = self.store.get(name)
        index = seen.index
        unit = pool.unit(index) if pool is not None else None
        if pool is None or unit is None or not same(unit, seen):
            return
        target = zone or unit.zone
        waiting = self.quota.claim(pool, unit, target)
        if waiting is not None:
            if unit.state is not UnitState.WAITING_FOR_QUOTA or pool.reason != waiting:
                self.store.update(name, lambda p: pools.waiting_for_quota(p, index, self.clock(), waiting))
            return
        changed = self._change(
            name, lambda p: pools.requested(p, index, self.clock(), target) if same(p.unit(index), unit) else None
        )
        if changed is None:
            return
        self.create(changed[1], index)

    def create(self, pool: Pool, index: int) -> None:
        """Create (or adopt) the unit's queued resource; its VMs boot the pool-mode agent, idle."""
        unit = pool.unit(index)
        if unit is None or unit.state is not UnitState.REQUESTED:
            return
        shape = self.agents.shape(pool)
        name = unit.queued_resource(pool.name)
        boot = self.agents.idle_boot(pool, unit)
        labels = {"tpujobs-pool": pool.name, "tpujobs-unit": str(index)}
        try:
            status = self.capacity.request_unit(UnitRequest(name, unit.zone, shape, labels), boot)
        except QuotaExhausted as error:
            why = f"Unit {index}: the TPU quota in {unit.zone} is exhausted ({error}); asked again every tick."
            self.store.update(pool.name, lambda p: said(p, why))
            return
        except NotOurs as error:  # someone else's resource of its name: never adopted, never asked for again
            why = f"Unit {index} was not requested: {error}. The next tick asks for its next generation."
            self._change(
                pool.name,
                lambda p: (
                    replace(pools.lost(p, index, self.clock(), why), reason=why) if same(p.unit(index), unit) else None
                ),
            )
            return
        except PermanentError as error:
            why = f"Unit {index} could not be requested: {error}; asked again every tick."
            self.store.update(pool.name, lambda p: said(p, why))
            return
        self.seen(pool.name, index, unit.generation, status)

    def observe_unit(
        self, queued_resource: str, state: HoldingState, detail: str = "", unhealthy_hosts: int = 0
    ) -> None:
        """A unit's holding was seen in some state (tpujobs-qr-state, the reconciler)."""
        current = current_unit(self.store, queued_resource)
        if current is None:
            return  # an older generation, or a pool gone: the reconciler releases leftovers
        name, unit = current
        status = CapacityStatus(queued_resource, unit.zone, state, detail, unhealthy_hosts)
        self.seen(name, unit.index, unit.generation, status)

    def unit_zone(self, queued_resource: str) -> str | None:
        """The zone the unit whose current generation `queued_resource` names was requested in, else None."""
        current = current_unit(self.store, queued_resource)
        return current[1].zone if current is not None else None

    def seen(self, name: str, index: int, generation: int, status: CapacityStatus | None) -> None:
        """What the unit's queued resource state means: ready, lost, or still on its way."""
        pool = self.store.get(name)
        unit = pool.unit(index) if pool is not None else None
        if pool is None or unit is None or unit.generation != generation:
            return
        qr = unit.queued_resource(name)
        gone = status is None or status.state in HOLDING_LOST or status.unhealthy_hosts > 0
        if unit.state in pools.HELD and gone:
            what = (
                f"queued resource {qr} no longer exists"
                if status is None
                else f"{status.unhealthy_hosts} host(s) of {qr} were lost"
                if status.state not in HOLDING_LOST
                else f"{qr} is {status.state}" + (f": {status.detail}" if status.detail else "")
            )
            self._unit_lost(pool, unit, what)
        elif unit.state is UnitState.REQUESTED and status is not None and status.state in HOLDING_LOST:
            self._unit_lost(pool, unit, f"{qr} is {status.state}" + (f": {status.detail}" if status.detail else ""))
        elif unit.state is UnitState.REQUESTED and status is not None and status.state is HoldingState.ACTIVE:
            changed = self._change(
                name, lambda p: pools.active(p, index, self.clock()) if same(p.unit(index), unit) else None
            )
            if changed is not None:
                log.info("pool %s: unit %d ready (%s)", name, index, qr)
                self.fill(name)
        elif status is not None and status.state != unit.capacity_state:
            self.store.update(name, lambda p: pools.seen_capacity(p, index, status.state.value))

    def _unit_lost(self, pool: Pool, unit: Unit, what: str) -> None:
        """A unit's capacity is gone: it is asked for again at once (the pool document first, so
        nothing waits on the job's handling), then the job that was on it, if any, recovers by its
        rules. A crash in between leaves a job live on a unit that no longer runs it, which the
        reconciler's repair loses."""
        if unit.state is UnitState.BUSY and unit.job_id is not None and unit.attempt is not None:
            self.leave_unit(unit.job_id, unit.attempt, unit.queued_resource(pool.name), lost=True)
            seen = Observation(EventKind.CAPACITY_LOST, unit.attempt, "tpu", f"Preempted: {what}")
            self.observe(unit.job_id, seen)
            return
        self._replace(pool.name, unit, what)

    def _replace(self, name: str, unit: Unit, what: str) -> None:
        """Release the unit's lost queued resource and ask for its next generation (or, for a unit
        being removed, let it go)."""
        changed = self._change(
            name, lambda p: pools.lost(p, unit.index, self.clock(), f"Unit {unit.index} lost: {what}.")
            if same(p.unit(unit.index), unit) else None,
        )  # fmt: skip
        if changed is None:
            return
        before, after = changed
        log.info("pool %s: unit %d lost (%s)", name, unit.index, what)
        self.capacity.release(unit.zone, unit.queued_resource(name))
        now_unit = after.unit(unit.index)
        if now_unit is None:
            self.quota.drop(before, unit)
        else:
            self.create(after, unit.index)

    def settle_units(self, name: str) -> None:
        """Release the units that should go: removed (resize, delete) and free, or idle too long;
        delete the pool's document once a deleted pool has no unit left."""
        pool = self.store.get(name)
        if pool is None:
            return
        now = self.clock()
        for unit in pool.units:
            if unit.removing and unit.state is not UnitState.BUSY:
                self._release(name, unit, f"Unit {unit.index} removed.")
        for unit in pools.idle_too_long(pool, now):
            self._release(name, unit, f"Unit {unit.index} released after {pool.idle_minutes} idle minute(s).")
        pool = self.store.get(name)
        if pool is not None and pool.state is PoolState.DELETING and not pool.units and self.store.delete(pool):
            log.info("pool %s deleted", name)

    def _release(self, name: str, unit: Unit, why: str) -> None:
        changed = self._change(
            name, lambda p: pools.released(p, unit.index, self.clock(), why) if same(p.unit(unit.index), unit) else None
        )
        if changed is None:
            return
        if unit.state in pools.QUOTA_HELD:  # it had asked for capacity: give it and its chips back
            self.capacity.release(unit.zone, unit.queued_resource(name))
            self.quota.drop(changed[0], unit)

    def fill(self, name: str) -> list[str]:
        """Give free units to the pool's queue, head first; finish claims left half-way; wake a
        released unit for a head that finds none free. The job ids given a unit."""
        placed: list[str] = []
        for _ in jittered_rounds(FILL_ROUNDS, self.sleep):
            pool = self.store.get(name)
            if pool is None or pool.state is not PoolState.ACTIVE:
                return placed
            queue = self.store.queue(name, QUEUE_PEEK)
            claimed = [(j, u) for j in queue if (u := pool.unit_of(j.job_id, j.attempt)) is not None]
            for job, unit in claimed:
                if self.place(pool, unit, job):
                    placed.append(job.job_id)
            waiting = [j for j in queue if pool.unit_of(j.job_id, j.attempt) is None]
            if not waiting:
                return placed
            head = waiting[0]
            free = pool.free_unit()
            if free is None:
                self._wake(pool)
                return placed
            changed = self._change(name, partial(assign, index=free.index, job=head, now=self.clock()))
            if changed is None:
                continue  # someone took the unit first: read again
            after = changed[1].unit(free.index)
            if after is not None and self.place(changed[1], after, head):
                placed.append(head.job_id)
        return placed

    def _wake(self, pool: Pool) -> None:
        """A job waits and no unit is free: ask again for a released unit, if the pool has one."""
        sleeping = pool.sleeping_unit()
        if sleeping is not None:
            self.request(pool.name, sleeping)

    def place(self, pool: Pool, unit: Unit, job: Job) -> bool:
        """Commit the job PROVISIONING on the unit the pool gave it, then tell the unit's agents.
        A job that moved on meanwhile (cancelled) gives the unit back. True when it runs there."""
        qr = unit.queued_resource(pool.name)
        seen = Observation(EventKind.ADMITTED, job.attempt, "submit", capacity_state=HoldingState.ACTIVE.value,
                           unit=qr, zone=unit.zone, unit_requested_at=unit.requested_at)  # fmt: skip
        outcome = self.journal.commit(job.job_id, seen)
        current = outcome.job if isinstance(outcome, Decision) else self.jobs.get(job.job_id)
        on_unit = (
            current is not None
            and current.state in ATTEMPT_LIVE
            and current.attempt == job.attempt
            and current.warm_pool_unit == qr
        )
        if not on_unit:
            self.leave_unit(job.job_id, job.attempt, qr, lost=False)
            return False
        assert current is not None
        self.agents.tell(pool.name, unit.index, current)
        return isinstance(outcome, Decision)

    def leave_unit(self, job_id: str, attempt: int, unit_name: str, *, lost: bool) -> None:
        """The job's attempt is off its unit (ended, recovering, moved): free the unit and tell its
        agents to stop what still runs, or, when its capacity was lost, ask for it again; then the
        pool's queue gets the unit. Nothing when the unit no longer runs that attempt."""
        parsed = parse_unit_queued_resource_name(unit_name)
        if parsed is None:
            return
        name, index, generation = parsed
        pool = self.store.get(name)
        unit = pool.unit(index) if pool is not None else None
        if pool is None or unit is None or unit.generation != generation or not unit.runs(job_id, attempt):
            return
        if lost:
            self._replace(name, unit, f"its job {job_id} lost its capacity")
            self.fill(name)
            return
        why = f"Unit {index} is free again: {job_id} (attempt {attempt}) left it."
        changed = self._change(
            name, lambda p: pools.freed(p, index, self.clock(), why) if same(p.unit(index), unit) else None
        )
        if changed is None:
            return
        self.agents.tell(name, index)
        if unit.removing or changed[1].state is not PoolState.ACTIVE:
            self.settle_units(name)
        else:
            self.fill(name)

    def leave_attempt(self, job: Job) -> None:
        """An ended or recovering job's current attempt leaves its unit; an attempt that ended with
        its capacity lost loses the unit too (asked for again at once)."""
        if not job.warm_pool_unit:
            return
        usage = job.usage_of()
        lost = bool(usage and usage.capacity_lost)
        if lost and replaced_for(job) > UNITS_REPLACED_PER_JOB:
            # A loss the TPU API shows replaces the unit on its own (`_unit_lost`); one that only
            # the job's own hosts claim (`rebooted`, `peer_silent`, signed with its key) costs
            # the pool a release and a new request at most this often per job.
            log.warning("%s lost its unit once more: the unit is freed, not replaced", job.job_id)
            lost = False
        self.leave_unit(job.job_id, job.attempt, job.warm_pool_unit, lost=lost)

"""Warm pools, acted on: units asked for and healed, jobs given units and taken off them.

`tpujobs.domain.pools` decides each change of a pool; this module reads the pool, applies
the change as a compare-and-set (`WarmPoolStore.update`) and then acts on it, in that order,
as the job service does: a crash between the two leaves a pool document that says what should
be, and the reconciler's `repair` (or the next event) makes it so.

How a job gets a unit (`fill`): the pool's queue is read (priority, then age); a unit already
naming a queued job is a claim left half-way and is finished first; else the first idle unit is
given to the head of the queue (the compare-and-set makes it that job's alone), the job is
committed PROVISIONING on it, and the unit's agents are told by writing its node metadata
(`Tpu.write_metadata`), which they wait on. Taking a job off a unit (`leave_unit`) is the
same in reverse: the unit is freed in the document, then its agents are told to stop.

A unit whose capacity is lost is asked for again at once as its next generation; the job on it
recovers by its own `on_preemption` rule, through the pool's queue, onto whichever unit is free
first. A unit idle past the pool's `idle_minutes` is released and asked for again when a job
needs it. Units hold chips of the admission quota (`quota_pools`) as holders named
`pool:{name}/{index}`, from their request until they are released.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Literal

from tpujobs.domain import pools
from tpujobs.domain.access import AccessPolicies
from tpujobs.domain.admission import Holder, chips_held, fits, never_fits, pool_id, quota_of
from tpujobs.domain.job import Job
from tpujobs.domain.naming import parse_unit_queued_resource_name
from tpujobs.domain.pools import Pool, PoolError, PoolState, Unit, UnitState
from tpujobs.domain.spec import JobSpec, SpecError, with_deployment_defaults
from tpujobs.domain.states import ATTEMPT_LIVE, EventKind, JobState
from tpujobs.domain.transitions import Decision, Observation
from tpujobs.engine import process_log
from tpujobs.engine.errors import PermanentError, QuotaExhausted
from tpujobs.engine.ports import CapacityStatus, HostBoot, UnitRequest, WarmPoolStore
from tpujobs.engine.startup_script import (
    assignment_text,
    idle_assignment_text,
    render_unit_startup_script,
    unit_metadata,
)

if TYPE_CHECKING:
    from tpujobs.engine.job_service import JobService, SubmitOutcome

log = logging.getLogger(__name__)

FILL_ROUNDS = 20  # assignments (or lost races) one call may make
QUEUE_PEEK = 5  # waiting jobs read per round: the head, and claims still being finished
TELL_AFTER = timedelta(seconds=5)  # a unit whose agents were not told this long after a change is told again
CAPACITY_GONE = frozenset({"SUSPENDING", "SUSPENDED", "FAILED"})
HOLDER_PREFIX = "pool:"


def unit_holder(pool: str, index: int) -> str:
    """The unit's holder id in its admission pool (`quota_pools/{family}@{zone}`)."""
    return f"{HOLDER_PREFIX}{pool}/{index}"


def parse_unit_holder(holder: str) -> tuple[str, int] | None:
    """(pool, unit index) of a unit's holder id, or None for a job's."""
    if not holder.startswith(HOLDER_PREFIX):
        return None
    name, _, index = holder[len(HOLDER_PREFIX) :].partition("/")
    return (name, int(index)) if index.isdigit() else None


@dataclass(frozen=True)
class PoolOutcome:
    """What became of one pool request (create, resize, delete)."""

    kind: Literal["done", "missing", "forbidden", "invalid", "exists"]
    pool: Pool | None
    reason: str


class WarmPoolService:
    """The use cases of warm pools, on the job service's ports and the pool store."""

    def __init__(self, store: WarmPoolStore, jobs: JobService) -> None:
        self.store = store
        self.jobs = jobs

    @property
    def _now(self) -> datetime:
        return self.jobs.clock()

    def _change(self, name: str, change: Callable[[Pool], Pool | None]) -> tuple[Pool, Pool] | None:
        """Apply `change` to the pool (a compare-and-set): (before, after) when it wrote something,
        None when the pool is gone or the change left it as it was."""
        changed = self.store.update(name, change)
        return None if changed is None or changed[0] == changed[1] else changed

    # -- managing pools (the jobs API, tpujobs-control, the CLI) ---------------------------

    def create(self, data: dict[str, object], caller: str, *, verified: bool) -> PoolOutcome:
        """`pool create`: admins, or owners `config/policies.pools` allows; the quota must be able
        to hold every unit. The units are asked for at once."""
        settings = self.jobs.settings
        try:
            request, shape = pools.parse_pool_request({**data, "owner": caller}, settings.default_zone)
            shape = with_deployment_defaults(shape, settings.vm_defaults, default_zone=settings.default_zone)
        except (PoolError, SpecError) as error:
            return PoolOutcome("invalid", None, f"Invalid pool: {error}")
        refused = self._creation_refusal(caller, verified, shape)
        if refused is not None:
            return PoolOutcome("forbidden", None, refused)
        too_big = self._never_fits(request.count, shape, request.zones)
        if too_big is not None:
            return PoolOutcome("invalid", None, too_big)
        pool = pools.new_pool(request, self._now)
        if not self.store.create(pool):
            existing = self.store.get(request.name)
            return PoolOutcome("exists", existing, f"a pool named {request.name} already exists")
        log.info("pool %s created by %s: %d unit(s)", pool.name, caller, pool.count)
        self.request_units(pool.name)
        return PoolOutcome("done", self.store.get(pool.name), pool.reason)

    def _creation_refusal(self, caller: str, verified: bool, shape: JobSpec) -> str | None:
        settings = self.jobs.settings
        policies = self.jobs.access.policies() if self.jobs.access is not None else None
        if not caller:
            return "a pool needs an owner"
        trusted = verified or (policies is not None and policies.trust_topic_owners)
        if not trusted:
            return "creating a pool needs a verified caller: use the jobs API (tpujobs pool with TPUJOBS_API_URL)"
        if caller not in settings.admins and (policies is None or not policies.members(caller) & set(policies.pools)):
            return f"{caller} may not create pools: an admin allows it in config/policies.pools"
        # Reserved capacity and a service account need what a job of the caller would need.
        return self.jobs.submission_refusal(shape, owner_verified=True, policies=policies)

    def _never_fits(self, count: int, shape: JobSpec, zones: tuple[str, ...]) -> str | None:
        quotas = self.jobs.pools.quotas() if self.jobs.pools is not None else {}
        for zone in zones:  # a quota of 0 is a pause, not a size (`admission.never_fits`)
            if not never_fits(quota_of(quotas, pool_id(shape, zone)), count * shape.chips):
                return None
        return (
            f"{count} unit(s) of {shape.chips} chips need {count * shape.chips} chips, more than the quota of "
            f"{', '.join(pool_id(shape, z) for z in zones)}: ask an admin to raise it, or ask for fewer units"
        )

    def resize(self, name: str, count: int, caller: str) -> PoolOutcome:
        """`pool resize`: new units are asked for at once; surplus units go once no job is on them."""
        pool = self.store.get(name)
        if pool is None:
            return PoolOutcome("missing", None, f"no pool named {name}")
        if not pools.may_manage(pool, caller, self.jobs.settings.admins):
            return PoolOutcome("forbidden", pool, f"{caller} may not resize pool {name}: only its owner or an admin")
        if pool.state is not PoolState.ACTIVE:
            return PoolOutcome("invalid", pool, f"pool {name} is being deleted")
        if count > pool.count:
            too_big = self._never_fits(count, pool.shape(), pool.zones)
            if too_big is not None:
                return PoolOutcome("invalid", pool, too_big)
        try:
            self.store.update(name, lambda p: pools.resized(p, count, self._now))
        except PoolError as error:
            return PoolOutcome("invalid", pool, f"Invalid resize: {error}")
        self.request_units(name)
        self.settle_units(name)
        return PoolOutcome("done", self.store.get(name), f"Pool {name} resized to {count} unit(s).")

    def delete(self, name: str, caller: str) -> PoolOutcome:
        """`pool delete`: jobs on it are cancelled, or moved to capacity of their own
        (`pool_fallback: provision`); units are released; the document goes with the last."""
        pool = self.store.get(name)
        if pool is None:
            return PoolOutcome("missing", None, f"no pool named {name}")
        if not pools.may_manage(pool, caller, self.jobs.settings.admins):
            return PoolOutcome("forbidden", pool, f"{caller} may not delete pool {name}: only its owner or an admin")
        self.store.update(name, lambda p: pools.deleting(p, self._now, caller) if p.state is PoolState.ACTIVE else None)
        self.settle_jobs_of_deleted(name, f"Pool {name} was deleted by {caller}")
        self.settle_units(name)
        return PoolOutcome("done", self.store.get(name), f"Pool {name} is being deleted.")

    def settle_jobs_of_deleted(self, name: str, why: str) -> None:
        """Every job of a deleted pool goes: cancelled, or to capacity of its own."""
        for job in self.store.jobs_on(name):
            process_log.bind_job(job.job_id)
            if job.spec.pool_fallback == "provision":
                outcome = self.jobs.observe(job.job_id, Observation(EventKind.LEFT_POOL, None, "user", why))
                if isinstance(outcome, Decision) and job.warm_pool_unit:
                    self.leave_unit(job.job_id, job.attempt, job.warm_pool_unit, lost=False)
            else:
                self.jobs.cancel(job.job_id, f"{why}; the job was cancelled (set pool_fallback: provision to move).")

    # -- units' capacity ----------------------------------------------------------------------

    def request_units(self, name: str) -> None:
        """Ask for every unit that should be asked for: those waiting for quota (if it fits now)."""
        pool = self.store.get(name)
        if pool is None or pool.state is not PoolState.ACTIVE:
            return
        for unit in pool.units:
            if unit.state is UnitState.WAITING_FOR_QUOTA and not unit.removing:
                self._request(name, unit.index)

    def _request(self, name: str, index: int, zone: str | None = None) -> None:
        """Claim the unit's quota, mark it REQUESTED (its next generation), then create it."""
        pool = self.store.get(name)
        unit = pool.unit(index) if pool is not None else None
        if pool is None or unit is None:
            return
        target = zone or unit.zone
        waiting = self._claim_quota(pool, unit, target)
        if waiting is not None:
            if unit.state is not UnitState.WAITING_FOR_QUOTA or pool.reason != waiting:
                self.store.update(name, lambda p: pools.waiting_for_quota(p, index, self._now, waiting))
            return
        changed = self._change(
            name, lambda p: pools.requested(p, index, self._now, target) if _same(p.unit(index), unit) else None
        )
        if changed is None:
            return
        self._create(changed[1], index)

    def _create(self, pool: Pool, index: int) -> None:
        """Create (or adopt) the unit's queued resource; its VMs boot the pool-mode agent, idle."""
        unit = pool.unit(index)
        if unit is None or unit.state is not UnitState.REQUESTED:
            return
        settings = self.jobs.settings
        shape = self._shape(pool)
        name = unit.queued_resource(pool.name)
        script = render_unit_startup_script(pool.name, index, name, shape, settings)
        boot = HostBoot(
            pool.service_account or settings.tpu_service_account,
            unit_metadata(script, idle_assignment_text(unit.seq)),
        )
        labels = {"tpujobs-pool": pool.name, "tpujobs-unit": str(index)}
        try:
            status = self.jobs.tpu.request_unit(UnitRequest(name, unit.zone, shape, labels), boot)
        except QuotaExhausted as error:
            why = f"Unit {index}: the TPU quota in {unit.zone} is exhausted ({error}); asked again every tick."
            self.store.update(pool.name, lambda p: _said(p, why))
            return
        except PermanentError as error:
            why = f"Unit {index} could not be requested: {error}; asked again every tick."
            self.store.update(pool.name, lambda p: _said(p, why))
            return
        self._seen(pool.name, index, unit.generation, status)

    def _shape(self, pool: Pool) -> JobSpec:
        settings = self.jobs.settings
        return with_deployment_defaults(pool.shape(), settings.vm_defaults, default_zone=settings.default_zone)

    def _claim_quota(self, pool: Pool, unit: Unit, zone: str) -> str | None:
        """Hold the unit's chips in its admission pool; None when held (or no quota applies),
        else why it waits. Never evicts: a unit waits like a job that may not."""
        quota = self.jobs.pools
        if quota is None:
            return None
        shape = pool.shape()
        admission_pool = pool_id(shape, zone)
        limit = quota_of(quota.quotas(), admission_pool)
        if limit is None:
            return None
        holder = unit_holder(pool.name, unit.index)
        for _ in range(10):
            view = quota.view(admission_pool)
            if any(h.job_id == holder for h in view.holders):
                return None
            if not fits(limit, view.holders, pool.chips_per_unit):
                free = limit - chips_held(view.holders)
                return (
                    f"Unit {unit.index} waits for quota: {admission_pool} has {free} of {limit} chips free and a "
                    f"unit needs {pool.chips_per_unit}."
                )
            claim = Holder(holder, pool.chips_per_unit, unit.generation, "medium", self._now, evictable=False)
            if quota.change(view, add=claim):
                return None
        return f"Unit {unit.index}: {admission_pool} changed under 10 attempts to claim its chips; asked again."

    def _drop_quota(self, pool: Pool, unit: Unit) -> None:
        """The unit gives its chips back, and the admission queue gets them at once."""
        if self.jobs.pools is not None:
            self.jobs.drop_hold(unit_holder(pool.name, unit.index), pool_id(pool.shape(), unit.zone))

    def observe_unit(self, queued_resource: str, state: str, detail: str = "", unhealthy_hosts: int = 0) -> None:
        """A unit's queued resource was seen in some state (tpujobs-qr-state, the reconciler)."""
        parsed = parse_unit_queued_resource_name(queued_resource)
        if parsed is None:
            return
        name, index, generation = parsed
        pool = self.store.get(name)
        unit = pool.unit(index) if pool is not None else None
        if pool is None or unit is None or unit.generation != generation:
            return  # an older generation, or a pool gone: the reconciler releases leftovers
        self._seen(name, index, generation, CapacityStatus(queued_resource, unit.zone, state, detail, unhealthy_hosts))

    def _seen(self, name: str, index: int, generation: int, status: CapacityStatus | None) -> None:
        """What the unit's queued resource state means: ready, lost, or still on its way."""
        pool = self.store.get(name)
        unit = pool.unit(index) if pool is not None else None
        if pool is None or unit is None or unit.generation != generation:
            return
        qr = unit.queued_resource(name)
        gone = status is None or status.state in CAPACITY_GONE or status.unhealthy_hosts > 0
        if unit.state in pools.HELD and gone:
            what = (
                f"queued resource {qr} no longer exists"
                if status is None
                else f"{status.unhealthy_hosts} host(s) of {qr} were lost"
                if status.state not in CAPACITY_GONE
                else f"{qr} is {status.state}" + (f": {status.detail}" if status.detail else "")
            )
            self._unit_lost(pool, unit, what)
        elif unit.state is UnitState.REQUESTED and status is not None and status.state in CAPACITY_GONE:
            self._unit_lost(pool, unit, f"{qr} is {status.state}" + (f": {status.detail}" if status.detail else ""))
        elif unit.state is UnitState.REQUESTED and status is not None and status.state == "ACTIVE":
            changed = self._change(
                name, lambda p: pools.active(p, index, self._now) if _same(p.unit(index), unit) else None
            )
            if changed is not None:
                log.info("pool %s: unit %d ready (%s)", name, index, qr)
                self.fill(name)
        elif status is not None and status.state != unit.capacity_state:
            self.store.update(name, lambda p: pools.seen_capacity(p, index, status.state))

    def _unit_lost(self, pool: Pool, unit: Unit, what: str) -> None:
        """A unit's capacity is gone: it is asked for again at once (the pool document first, so
        nothing waits on the job's handling), then the job that was on it, if any, recovers by its
        rules. A crash in between leaves a job live on a unit that no longer runs it, which the
        reconciler's repair loses."""
        if unit.state is UnitState.BUSY and unit.job_id is not None and unit.attempt is not None:
            self.leave_unit(unit.job_id, unit.attempt, unit.queued_resource(pool.name), lost=True)
            seen = Observation(EventKind.CAPACITY_LOST, unit.attempt, "tpu", f"Preempted: {what}")
            self.jobs.observe(unit.job_id, seen)
            return
        self._replace(pool.name, unit, what)

    def _replace(self, name: str, unit: Unit, what: str) -> None:
        """Release the unit's lost queued resource and ask for its next generation (or, for a unit
        being removed, let it go)."""
        changed = self._change(
            name, lambda p: pools.lost(p, unit.index, self._now, f"Unit {unit.index} lost: {what}.")
            if _same(p.unit(unit.index), unit) else None,
        )  # fmt: skip
        if changed is None:
            return
        before, after = changed
        log.info("pool %s: unit %d lost (%s)", name, unit.index, what)
        self.jobs.tpu.release(unit.zone, unit.queued_resource(name))
        now_unit = after.unit(unit.index)
        if now_unit is None:
            self._drop_quota(before, unit)
        else:
            self._create(after, unit.index)

    def settle_units(self, name: str) -> None:
        """Release the units that should go: removed (resize, delete) and free, or idle too long;
        delete the pool's document once a deleted pool has no unit left."""
        pool = self.store.get(name)
        if pool is None:
            return
        now = self._now
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
            name, lambda p: pools.released(p, unit.index, self._now, why) if _same(p.unit(unit.index), unit) else None
        )
        if changed is None:
            return
        if unit.state in pools.QUOTA_HELD:  # it had asked for capacity: give it and its chips back
            self.jobs.tpu.release(unit.zone, unit.queued_resource(name))
            self._drop_quota(changed[0], unit)

    # -- jobs on units ----------------------------------------------------------------------------

    def refusal(self, spec: JobSpec, *, owner_verified: bool, policies: AccessPolicies | None) -> str | None:
        """Why a job may not ask for its `pool`: none by that name, being deleted, its shape or
        account differs, or its owner is not the pool's (nor a user it names, nor an admin).
        A topic's owner is a claim, so only a verified owner counts (unless `policies` trust it)."""
        if spec.pool is None:
            return None
        pool = self.store.get(spec.pool)
        if pool is None:
            return f"no pool named {spec.pool}: `tpujobs pool list` shows them"
        if pool.state is not PoolState.ACTIVE:
            return f"pool {spec.pool} is being deleted"
        misfit = pools.misfit(spec, pool)
        if misfit is not None:
            return misfit
        if not owner_verified and not (policies is not None and policies.trust_topic_owners):
            return (
                f"a job on pool {spec.pool} needs a verified owner: its jobs share the pool's VMs, so submit "
                "through the jobs API (tpujobs submit with TPUJOBS_API_URL)"
            )
        members = policies.members(spec.owner) if policies is not None else frozenset({spec.owner})
        if not pools.may_use(pool, spec.owner, tuple(self.jobs.settings.admins), members):
            return f"{spec.owner} may not run jobs on pool {spec.pool}: its owner {pool.owner} names who may"
        return None

    def admit(self, job: Job) -> SubmitOutcome:
        """A QUEUED job of a pool: a free unit now, in the pool's order, or it waits saying why
        (or leaves for capacity of its own, `pool_fallback: provision`)."""
        from tpujobs.engine.job_service import SubmitOutcome

        placed = self.fill(job.warm_pool)
        if job.job_id in placed:
            return SubmitOutcome("provisioning", job.job_id, f"assigned a unit of pool {job.warm_pool}")
        current = self.jobs.store.get(job.job_id)
        if current is None or current.state is not JobState.QUEUED or current.warm_pool != job.warm_pool:
            return SubmitOutcome("duplicate", job.job_id, "the job moved on meanwhile")
        pool = self.store.get(job.warm_pool)
        if pool is None or pool.state is not PoolState.ACTIVE:
            if current.warm_pool:
                self.settle_jobs_of_deleted(job.warm_pool, f"Pool {job.warm_pool} no longer exists")
            return SubmitOutcome("queued", job.job_id, f"pool {job.warm_pool} is gone")
        if pool.unit_of(current.job_id, current.attempt) is not None:  # a racing fill took it
            return SubmitOutcome("provisioning", job.job_id, f"assigned a unit of pool {job.warm_pool}")
        if current.spec.pool_fallback == "provision":
            why = f"No unit of pool {pool.name} is free ({_tally(pool)})"
            outcome = self.jobs.observe(
                current.job_id, Observation(EventKind.LEFT_POOL, current.attempt, "submit", why)
            )
            state = outcome.job.state.value.lower() if isinstance(outcome, Decision) else "queued"
            return SubmitOutcome("provisioning" if state == "provisioning" else "queued", job.job_id, why)
        why = f"Waiting for a free unit of pool {pool.name} ({_tally(pool)}), in the pool's order (priority, then age)."
        self.jobs.record(current.job_id, Observation(EventKind.WAITING_FOR_POOL, current.attempt, "submit", why))
        return SubmitOutcome("queued", job.job_id, why)

    def fill(self, name: str) -> list[str]:
        """Give free units to the pool's queue, head first; finish claims left half-way; wake a
        released unit for a head that finds none free. The job ids given a unit."""
        placed: list[str] = []
        for round_number in range(FILL_ROUNDS):
            if round_number:
                self.jobs.sleep(random.uniform(0, 0.005 * min(round_number, 10)))
            pool = self.store.get(name)
            if pool is None or pool.state is not PoolState.ACTIVE:
                return placed
            queue = self.store.queue(name, QUEUE_PEEK)
            claimed = [(j, u) for j in queue if (u := pool.unit_of(j.job_id, j.attempt)) is not None]
            for job, unit in claimed:
                if self._place(pool, unit, job):
                    placed.append(job.job_id)
            waiting = [j for j in queue if pool.unit_of(j.job_id, j.attempt) is None]
            if not waiting:
                return placed
            head = waiting[0]
            free = pool.free_unit()
            if free is None:
                self._wake(pool)
                return placed
            changed = self._change(name, partial(_assign, index=free.index, job=head, now=self._now))
            if changed is None:
                continue  # someone took the unit first: read again
            after = changed[1].unit(free.index)
            if after is not None and self._place(changed[1], after, head):
                placed.append(head.job_id)
        return placed

    def _wake(self, pool: Pool) -> None:
        """A job waits and no unit is free: ask again for a released unit, if the pool has one."""
        sleeping = pool.sleeping_unit()
        if sleeping is not None:
            self._request(pool.name, sleeping.index)

    def _place(self, pool: Pool, unit: Unit, job: Job) -> bool:
        """Commit the job PROVISIONING on the unit the pool gave it, then tell the unit's agents.
        A job that moved on meanwhile (cancelled) gives the unit back. True when it runs there."""
        qr = unit.queued_resource(pool.name)
        seen = Observation(EventKind.ADMITTED, job.attempt, "submit", capacity_state="ACTIVE", unit=qr, zone=unit.zone)
        outcome = self.jobs.record(job.job_id, seen)
        current = outcome.job if isinstance(outcome, Decision) else self.jobs.store.get(job.job_id)
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
        self.tell(pool.name, unit.index, current)
        return isinstance(outcome, Decision)

    def tell(self, name: str, index: int, job: Job | None = None) -> None:
        """Write the unit's node metadata as the pool document says (its job's assignment, or
        idle), then mark it told. Level-based: it writes what the document says now."""
        pool = self.store.get(name)
        unit = pool.unit(index) if pool is not None else None
        if pool is None or unit is None or unit.written or unit.state not in pools.HELD:
            return
        settings = self.jobs.settings
        qr = unit.queued_resource(name)
        if unit.state is UnitState.BUSY:
            assert unit.job_id is not None
            job = job if job is not None and job.job_id == unit.job_id else self.jobs.store.get(unit.job_id)
            if job is None or job.warm_pool_unit != qr or job.attempt != unit.attempt:
                return  # not committed on it yet (or gone): `fill` or the reconciler settles it first
            assignment = assignment_text(job, settings, unit.seq, qr)
        else:
            assignment = idle_assignment_text(unit.seq)
        script = render_unit_startup_script(name, index, qr, self._shape(pool), settings)
        try:
            self.jobs.tpu.write_metadata(unit.zone, qr, pool.slices, unit_metadata(script, assignment))
        except PermanentError as error:  # a node not READY (restarting, preempted): not told yet;
            log.warning("pool %s: unit %d not told yet: %s", name, index, error)  # the reconciler tries again
            return
        self.store.update(name, lambda p: pools.marked_written(p, index, unit.seq))

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
            name, lambda p: pools.freed(p, index, self._now, why) if _same(p.unit(index), unit) else None
        )
        if changed is None:
            return
        self.tell(name, index)
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
        self.leave_unit(job.job_id, job.attempt, job.warm_pool_unit, lost=bool(usage and usage.capacity_lost))

    def requeue(self, job: Job) -> None:
        """A RECOVERING job of a pool, off its unit: its next attempt waits in the pool's queue."""
        self.jobs.observe(job.job_id, Observation(EventKind.POOL_REQUEUED, job.attempt, "tpu"))

    # -- the reconciler's repair ------------------------------------------------------------------

    def repair(self, pool: Pool, seen: Mapping[str, CapacityStatus], live: Mapping[str, Job]) -> list[str]:
        """Make one pool what its document says, from the tick's listing (`seen`, by queued
        resource name) and active jobs (`live`): units asked for, ready, lost, told, released;
        units whose job is gone freed; jobs whose unit is gone lost; leftovers released. What it
        did, for the tick's report."""
        did: list[str] = []
        name = pool.name
        now = self._now
        if pool.state is PoolState.DELETING:
            self.settle_jobs_of_deleted(name, f"Pool {name} was deleted")
        for unit in pool.units:
            qr = unit.queued_resource(name)
            status = seen.get(qr)
            if unit.state is UnitState.WAITING_FOR_QUOTA and not unit.removing:
                self._request(name, unit.index)
            elif unit.state is UnitState.REQUESTED:
                if status is None and self.jobs.tpu.status(unit.zone, qr) is None:
                    self._create(pool, unit.index)  # a request that never landed (a crash): ask again
                    did.append(f"{name}: asked again for {qr}")
                elif status is not None:
                    self._seen(name, unit.index, unit.generation, status)
                    self._move_if_waited(pool, unit, status, did)
            elif unit.state in pools.HELD:
                if status is None:
                    status = self.jobs.tpu.status(unit.zone, qr)  # confirm before calling it lost
                self._seen(name, unit.index, unit.generation, status)
                if unit.state is UnitState.BUSY:
                    self._check_busy(pool, unit, live, did)
                if not unit.written and now - unit.since >= TELL_AFTER:
                    self.tell(name, unit.index)
                    did.append(f"{name}: told unit {unit.index} again")
        self._lose_jobs_without_unit(pool, live, did)
        self.settle_units(name)
        self.request_units(name)
        did += [f"{name}: gave {job_id} a unit" for job_id in self.fill(name)]
        return did

    def _move_if_waited(self, pool: Pool, unit: Unit, status: CapacityStatus, did: list[str]) -> None:
        """A unit that waited past the zone wait moves to the pool's next zone, as a job does."""
        if status.state == "ACTIVE" or unit.requested_at is None or len(pool.zones) < 2:
            return
        waited = (self._now - unit.requested_at).total_seconds()
        if waited <= self.jobs.settings.zone_wait_seconds:
            return
        zones = pool.zones
        following = zones[(zones.index(unit.zone) + 1) % len(zones)] if unit.zone in zones else zones[0]
        self.jobs.tpu.release(unit.zone, unit.queued_resource(pool.name))
        if pool_id(pool.shape(), following) != pool_id(pool.shape(), unit.zone):
            self._drop_quota(pool, unit)
        self._request(pool.name, unit.index, following)
        did.append(f"{pool.name}: unit {unit.index} waited {waited / 60:.0f} min; asked for in {following}")

    def _check_busy(self, pool: Pool, unit: Unit, live: Mapping[str, Job], did: list[str]) -> None:
        """A busy unit whose job is not on it: finish a claim left half-way, or free it."""
        assert unit.job_id is not None and unit.attempt is not None
        qr = unit.queued_resource(pool.name)
        job = live.get(unit.job_id) or self.jobs.store.get(unit.job_id)
        if job is not None and job.state in ATTEMPT_LIVE and job.attempt == unit.attempt and job.warm_pool_unit == qr:
            return
        if job is not None and job.state is JobState.QUEUED and job.attempt == unit.attempt and job.warm_pool:
            self._place(pool, unit, job)
            did.append(f"{pool.name}: finished giving unit {unit.index} to {job.job_id}")
            return
        self.leave_unit(unit.job_id, unit.attempt, qr, lost=False)
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
            fresh = self.jobs.store.get(job.job_id)
            if fresh is None or fresh.state not in ATTEMPT_LIVE or fresh.warm_pool_unit != job.warm_pool_unit:
                continue
            what = f"Unit {job.warm_pool_unit} of pool {pool.name} no longer runs this attempt: the capacity is lost"
            self.jobs.observe(job.job_id, Observation(EventKind.CAPACITY_LOST, job.attempt, "reconciler", what))
            did.append(f"{job.job_id}: {what}")

    def release_leftovers(self, seen: Mapping[str, CapacityStatus], known: Mapping[str, Pool]) -> list[str]:
        """Delete unit queued resources no pool unit owns now: an older generation, a removed
        unit, a deleted pool. Read the pool again first: it may have changed since the listing."""
        released = []
        for name, status in seen.items():
            parsed = parse_unit_queued_resource_name(name)
            if parsed is None or status.pool_label != parsed[0] or status.state == "DELETING":
                continue
            pool_name, index, generation = parsed
            pool = known.get(pool_name)
            if pool is not None and _owns(pool, index, generation):
                continue
            pool = self.store.get(pool_name)
            if pool is not None and _owns(pool, index, generation):
                continue
            self.jobs.tpu.release(status.zone, name)
            released.append(name)
        return released


def _owns(pool: Pool, index: int, generation: int) -> bool:
    unit = pool.unit(index)
    return unit is not None and unit.generation == generation and unit.state is not UnitState.RELEASED


def _same(now: Unit | None, then: Unit) -> bool:
    """The unit is as it was read (same state, generation and assignment): the change decided on
    that read still applies. Another handler's change makes the caller's a no-op."""
    return (
        now is not None
        and now.state is then.state
        and now.generation == then.generation
        and now.seq == then.seq
        and now.removing == then.removing
    )


def _assign(pool: Pool, index: int, job: Job, now: datetime) -> Pool | None:
    """Give the unit to the job if it is still free and the job has no unit yet."""
    unit = pool.unit(index)
    if unit is None or unit.state is not UnitState.IDLE or unit.removing or pool.unit_of(job.job_id) is not None:
        return None
    return pools.assigned(pool, index, job.job_id, job.attempt, now)


def _said(pool: Pool, why: str) -> Pool | None:
    return None if pool.reason == why else replace(pool, reason=why)


def _tally(pool: Pool) -> str:
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


def pool_summary(pool: Pool, now: datetime, waiting: list[Job], *, show_jobs: bool = True) -> dict[str, object]:
    """A pool as the jobs API and `tpujobs pool describe` show it: settings, units, the queue, and
    its chip-hours (busy, charged to the jobs that ran; idle, the pool's own) with the last day's
    utilisation. `show_jobs` false hides which jobs run or wait (a caller the pool is not for)."""
    day = pools.usage_since(pool, now - pools.RECENT_WINDOW, now)
    total = pools.total_usage(pool, now)
    return {
        **pools.settings_of(pool),
        "reason": pool.reason if show_jobs else "(hidden: it may name a job)",
        "units": [
            {
                "index": u.index,
                "state": u.state.value,
                "queued_resource": u.queued_resource(pool.name),
                "zone": u.zone,
                "capacity_state": u.capacity_state,
                "job_id": u.job_id if show_jobs else ("(hidden)" if u.job_id else None),
                "attempt": u.attempt if show_jobs else None,
                "since": u.since,
                "removing": u.removing,
            }
            for u in pool.units
        ],
        "waiting": [j.job_id for j in waiting] if show_jobs else len(waiting),
        "busy_chip_hours": round(total.busy_chip_hours, 6),
        "idle_chip_hours": round(total.idle_chip_hours, 6),
        "last_day": {
            "busy_chip_hours": round(day.busy_chip_hours, 6),
            "idle_chip_hours": round(day.idle_chip_hours, 6),
            "utilisation": None if day.utilisation is None else round(day.utilisation, 4),
        },
    }

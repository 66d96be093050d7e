"""Warm-pool assignment and release killed at each of their I/O steps in turn, then repaired.

Each handler runs on in-memory stores and the TPU simulator, on ports (`local.testing.Crashing*`)
that raise `InjectedCrash` just before or after the k-th call. Then redelivery plus reconciler
ticks, or ticks alone, must reach the scenario's end with the invariants kept: no unit BUSY with
a job not live on it, no job on two units, every unit's agents told, no leaked queued resource.
A crash before the job's own commit with the call lost must leave the world as it was. Each
scenario lists its port calls (`steps`); a test checks the list against an uncrashed run.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tpujobs.adapters.tpu import CloudTpu
from tpujobs.domain import pools
from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.naming import parse_unit_queued_resource_name
from tpujobs.domain.pools import UnitState
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import JobState
from tpujobs.engine.jobs.admission import SubmitOutcome
from tpujobs.engine.services import Engine
from tpujobs.local.fakes import InMemoryJobStore, InMemoryWarmPools
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.testing import (
    CrashPlan,
    InjectedCrash,
    OffsetClock,
    When,
    crashing_engine,
    inbound,
    local_settings,
    reconciler_for,
    signed,
    wait_for,
)

PROJECT = "test-project"
ZONE = "us-central2-b"
ADMIN = "root@example.com"
OWNER = "ada@example.com"
POOL = "demo"
SLOW_PROVISIONING_S = 1.0  # far longer than a handler's calls take here, and short beside `settle`
TELL_AFTER_S = 6  # past `warm_pools.TELL_AFTER`: the reconciler tells a unit's agents again


@dataclass
class World:
    """One test's world: the real service on the emulator, its own simulator, a clock it moves."""

    service: Engine
    clock: OffsetClock
    tpu_client: Any
    project_id: str
    simulator_url: str

    @property
    def warm(self) -> Any:
        assert self.service.warm is not None
        return self.service.warm

    def crashing(self, plan: CrashPlan) -> Engine:
        """The same service, on ports (its warm pools' too) that crash where `plan` says."""
        return crashing_engine(self.service, plan, warm_pools=True)

    def pool(self) -> pools.Pool:
        found = self.warm.store.get(POOL)
        assert found is not None
        return found

    def job(self, job_id: str) -> Any:
        return self.service.store.get(job_id)

    def ready(self) -> None:
        """Tick until every unit of the pool is ACTIVE (idle or busy)."""
        reconciler = reconciler_for(self.service)

        def held() -> bool:
            """every unit of the pool to be IDLE or BUSY"""
            reconciler.tick()
            return all(u.state in pools.HELD for u in self.pool().units)

        wait_for(held, timeout=20)

    def assignment(self, queued_resource: str) -> dict[str, Any]:
        """The unit's `tpujobs-assignment` as GetNode shows its node's metadata."""
        name = f"projects/{self.project_id}/locations/{ZONE}/nodes/{queued_resource}"
        answer: dict[str, Any] = json.loads(self.tpu_client.get_node(name=name).metadata["tpujobs-assignment"])
        return answer

    def unit_resources(self) -> set[str]:
        """Unit queued resources the simulator holds (not being deleted)."""
        found = self.tpu_client.list_queued_resources(parent=f"projects/{self.project_id}/locations/{ZONE}")
        names = {r.name.rsplit("/", 1)[-1] for r in found if r.state.state.name != "DELETING"}
        return {name for name in names if parse_unit_queued_resource_name(name)}


def spec_of(service: Engine, job_id: str) -> Any:
    data = {
        "job_id": job_id,
        "name": "train",
        "owner": OWNER,
        "accelerator_type": "v4-8",  # one host: one exit report ends an attempt
        "command": "python train.py",
        "pool": POOL,
        "on_preemption": "resume",
    }
    return service.submission.completed(parse_spec(data))


def submit(service: Engine, job_id: str) -> SubmitOutcome:
    return service.submission.submit_verified(spec_of(service, job_id))


def started(w: World, job_id: str) -> None:
    payload = {"kind": "started", "job_id": job_id, "attempt": 1, "slice_id": 0, "worker_id": 0}
    w.service.worker_events.on_worker_report(
        signed(w.service, "tpujobs-worker-events", payload, message_id=f"started-{job_id}")
    )
    assert w.job(job_id).state is JobState.RUNNING


# -- the scenarios -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One handler, the world it finds, the call it gets, and where that must lead."""

    name: str
    setup: Callable[[World], Any]  # builds the world; returns what `deliver` needs (a message)
    deliver: Callable[[Engine, World, Any], object]  # the call, on the given service
    steps: tuple[str, ...]  # its port calls, in order, when nothing crashes
    done: dict[str, tuple[JobState, int, bool] | None]  # job -> (state, attempt, on a unit) once repaired
    commit: int | None = None  # the step that records the call; None: the TPU or the pool shows it
    untouched: dict[str, tuple[JobState, int, bool] | None] | None = None  # a call lost before its commit

    def reconcilable(self, k: int, when: When) -> bool:
        return self.commit is None or k > self.commit or (k == self.commit and when == "after")


def create(w: World, count: int) -> None:
    """The pool, made by an admin for OWNER's jobs: its units are asked for at once."""
    data = {"name": POOL, "accelerator_type": "v4-8", "count": count, "users": [OWNER]}
    assert w.warm.create(data, ADMIN, verified=True).kind == "done"


def _one_idle_unit(w: World) -> None:
    create(w, count=1)
    w.ready()


def _one_busy_one_waiting(w: World) -> None:
    _one_idle_unit(w)
    submit(w.service, "j1")
    started(w, "j1")
    assert submit(w.service, "j2").kind == "queued"


def _two_units_one_preempted(w: World) -> None:
    create(w, count=2)
    w.ready()
    submit(w.service, "j1")
    started(w, "j1")
    # a queued resource is SUSPENDING for its hosts' whole grace (no hosts here): a short one
    SimulatorControl(w.simulator_url).configure(preemption_grace_seconds=0.2)
    SimulatorControl(w.simulator_url).preempt(ZONE, "demo-u0-g1")

    def suspended() -> bool:
        """the unit's queued resource to be SUSPENDED"""
        status = w.service.capacity.status(ZONE, "demo-u0-g1")
        return status is not None and status.state is HoldingState.LOST

    wait_for(suspended, timeout=10)
    # The lost unit's next generation is not ACTIVE before the handler's last step, even on a
    # loaded machine (else the handler fills the queue once more, and its steps would follow the
    # timing, not the code), and is ACTIVE well within `settle`'s wait.
    SimulatorControl(w.simulator_url).configure(provisioning_seconds=SLOW_PROVISIONING_S)


def _requested_unit_now_active_and_a_job_waiting(w: World) -> None:
    # The unit is still provisioning when j1 arrives, even on a loaded machine.
    simulator = SimulatorControl(w.simulator_url)
    quick = simulator.config()["provisioning_seconds"]
    simulator.configure(provisioning_seconds=SLOW_PROVISIONING_S)
    create(w, count=1)
    assert submit(w.service, "j1").kind == "queued"

    def active() -> bool:
        """the unit's queued resource to be ACTIVE"""
        status = w.service.capacity.status(ZONE, "demo-u0-g1")
        return status is not None and status.state == "ACTIVE"

    wait_for(active, timeout=10)
    simulator.configure(provisioning_seconds=quick)


def _exit_message(w: World) -> Any:
    payload = {"kind": "exited", "job_id": "j1", "attempt": 1, "slice_id": 0, "worker_id": 0, "exit_code": 0}
    return signed(w.service, "tpujobs-worker-events", payload, message_id="4242")


def _with_exit_message(w: World) -> Any:
    _one_busy_one_waiting(w)
    return _exit_message(w)


def _tick(service: Engine, w: World, _: Any) -> object:
    return reconciler_for(service).tick()


# Named runs of I/O steps, as `tpujobs.engine.pool_service` makes them.
_READ_QUEUE = ("warm.get", "warm.queue")  # `fill`: the pool and the head of its queue
# `fill` gives the head a unit (a compare-and-set), `_place` commits the job PROVISIONING on it,
# `tell` reads the pool, writes the unit's node metadata and marks the unit told.
_TAKE = ("warm.update", "store.apply", "warm.get", "tpu.tell_hosts", "warm.update")
# `leave_unit`: the pool read, the unit freed, then `tell`: the idle assignment written, marked told.
_FREE = ("warm.get", "warm.update", "warm.get", "tpu.tell_hosts", "warm.update")
_BELIEVED = ("store.get", "store.remember_report")  # a report's job read, its signature remembered

SCENARIOS = [
    Scenario(
        "submit-takes-a-free-unit",
        setup=_one_idle_unit,
        deliver=lambda service, w, _: submit(service, "j1"),
        steps=("store.create", *_READ_QUEUE, *_TAKE, *_READ_QUEUE),
        done={"j1": (JobState.PROVISIONING, 1, True)},
        commit=1,
        untouched={"j1": None},
    ),
    Scenario(
        "cancel-hands-the-unit-on",
        setup=_one_busy_one_waiting,
        deliver=lambda service, w, _: service.cancel("j1", "Cancelled by ada."),
        steps=("store.apply", *_FREE, *_READ_QUEUE, *_TAKE, *_READ_QUEUE),
        done={"j1": (JobState.CANCELLED, 1, False), "j2": (JobState.PROVISIONING, 1, True)},
        commit=1,
        untouched={"j1": (JobState.RUNNING, 1, True), "j2": (JobState.QUEUED, 1, False)},
    ),
    Scenario(
        "exit-hands-the-unit-on",
        setup=_with_exit_message,
        deliver=lambda service, w, message: service.worker_events.on_worker_report(message),
        steps=(
            *_BELIEVED,
            "store.record_worker",  # the host's exit 0 on its record first,
            "store.attempt_workers_succeeded",  # then its attempt's hosts counted: all done,
            "store.apply",  # so the job SUCCEEDED
            *_FREE,
            *_READ_QUEUE,
            *_TAKE,
            *_READ_QUEUE,
        ),
        done={"j1": (JobState.SUCCEEDED, 1, False), "j2": (JobState.PROVISIONING, 1, True)},
        commit=5,
        untouched={"j1": (JobState.RUNNING, 1, True), "j2": (JobState.QUEUED, 1, False)},
    ),
    Scenario(
        "unit-lost-job-moves",
        setup=_two_units_one_preempted,
        deliver=lambda service, w, _: service.capacity_events.on_qr_state(
            inbound("tpujobs-qr-state", {"queued_resource": "demo-u0-g1", "zone": ZONE, "state": "LOST"}, "4242")
        ),
        steps=(
            "warm.get",  # the pool, for the unit the state names
            "warm.get",  # read again to decide what the state means: lost
            "warm.get",  # the unit leaves its job first, lost:
            "warm.update",  # asked for again as g2 (committed first),
            "tpu.release",  # g1 released,
            "tpu.request_unit",  # g2 created,
            "warm.get",
            "warm.update",  # and its TPU state mirrored
            *_READ_QUEUE,  # nobody waits yet
            "store.apply",  # then the job's capacity is lost: RECOVERING
            "warm.get",  # its recovery's leave_attempt: already off the unit
            "store.apply",  # the next attempt QUEUED in the pool
            *_READ_QUEUE,
            *_TAKE,  # onto the other unit
            *_READ_QUEUE,
        ),
        done={"j1": (JobState.PROVISIONING, 2, True)},
    ),
    Scenario(
        "unit-ready-takes-the-head",
        setup=_requested_unit_now_active_and_a_job_waiting,
        deliver=_tick,
        steps=(
            "store.active_placements",  # the coordinator: where the active jobs are
            "warm.list_pools",
            "store.active_in_shard",  # the zone's one shard, run in this process by tick()
            "tpu.list_capacity",
            "store.get",  # the waiting job converged: still no unit ready
            *_READ_QUEUE,
            "store.get",
            "warm.get",
            "store.apply",  # its reason, unchanged
            "warm.list_pools",  # the zone's first shard: the unit's queued resource is its pool's
            "warm.list_pools",  # the coordinator's warm pools, read again after the shards
            "tpu.list_capacity",  # and their zone listed
            "warm.get",  # the pool's repair: the unit's QR is ACTIVE,
            "warm.update",  # so the unit is IDLE
            *_READ_QUEUE,
            *_TAKE,  # and the head of the queue takes it
            *_READ_QUEUE,
            "warm.get",  # settle_units
            "warm.get",
            "warm.get",  # request_units
            *_READ_QUEUE,  # the repair's own fill: nothing left
            "store.silent_workers",
            "store.prune_expired_jobs",
        ),
        done={"j1": (JobState.PROVISIONING, 1, True)},
    ),
]


@pytest.fixture
def world(tpu_client, simulator_url) -> World:
    """The engine on in-memory stores and this test's simulator, behind the real TPU adapter."""
    clock = OffsetClock()
    store = InMemoryJobStore()
    settings = local_settings(
        project=PROJECT,
        default_zone=ZONE,
        tpu_endpoint=simulator_url,
        logs_bucket="logs",
        report_key=secrets.token_urlsafe(48),
        admins=(ADMIN,),
        stuck_after_seconds=0.0,  # the reconciler finishes half-done QUEUED/RECOVERING work at once
    )
    service = Engine(
        store,
        CloudTpu(tpu_client, PROJECT),
        settings,
        clock,
        lambda seconds: None,  # restart backoff returns at once: the test moves time itself
        warm_pools=InMemoryWarmPools(store),
    )
    return World(service, clock, tpu_client, PROJECT, simulator_url)


def _crash_points(reconcilable: bool | None = None) -> list[Any]:
    """(scenario, k, when) for every step of every scenario; optionally only those the reconciler
    can (True) or cannot (False) repair. Ids read `cancel-hands-the-unit-on-2-warm.get-after`."""
    return [
        pytest.param(scenario, k, when, id=f"{scenario.name}-{k}-{step}-{when}")
        for scenario in SCENARIOS
        for k, step in enumerate(scenario.steps, start=1)
        for when in ("before", "after")
        if reconcilable is None or scenario.reconcilable(k, when) is reconcilable
    ]


def crash(w: World, scenario: Scenario, given: Any, k: int, when: When) -> None:
    """Make the scenario's call on a service that dies around its k-th I/O step."""
    plan = CrashPlan(at=k, when=when)
    with pytest.raises(InjectedCrash):
        scenario.deliver(w.crashing(plan), w, given)
    assert plan.crashed and plan.steps == list(scenario.steps[:k]), plan.steps


def where(w: World, job_id: str) -> tuple[JobState, int, bool] | None:
    """(state, attempt, whether a unit of the pool runs that attempt) of a job; None: no job."""
    job = w.job(job_id)
    if job is None:
        return None
    unit = w.pool().unit_of(job_id, job.attempt)
    return job.state, job.attempt, unit is not None and unit.queued_resource(POOL) == job.warm_pool_unit


def settle(w: World, expected: dict[str, tuple[JobState, int, bool] | None], context: str) -> None:
    """Tick (past the wait before agents are told again) until the jobs are where `expected`
    says and every unit is ACTIVE and told; then check the invariants."""
    w.clock.advance(TELL_AFTER_S)
    reconciler = reconciler_for(w.service)

    def settled() -> bool:
        """the jobs to be where the scenario says, and every unit ACTIVE and told"""
        reconciler.tick()
        units = w.pool().units
        steady = all(u.state in pools.HELD and u.written for u in units)
        return steady and all(where(w, job_id) == want for job_id, want in expected.items())

    try:
        wait_for(settled, timeout=20)
    except AssertionError:
        found = {job_id: where(w, job_id) for job_id in expected}
        raise AssertionError(f"{context}: not settled: jobs {found}, units {w.pool().units}") from None
    assert_invariants(w, context)


def assert_invariants(w: World, context: str) -> None:
    """No unit runs a job not live on it; no job is live on a unit that does not run it, nor on
    two; each node's assignment is its unit's; the simulator holds exactly the current units."""
    pool = w.pool()
    busy = [u for u in pool.units if u.state is UnitState.BUSY]
    assert len({u.job_id for u in busy}) == len(busy), f"{context}: a job on two units: {busy}"
    for unit in busy:
        job = w.job(str(unit.job_id))
        assert job is not None and job.state in (JobState.PROVISIONING, JobState.RUNNING), f"{context}: {unit}"
        assert (job.attempt, job.warm_pool_unit) == (unit.attempt, unit.queued_resource(POOL)), f"{context}: {unit}"
    for job in w.warm.store.jobs_on(POOL):
        if job.state in (JobState.PROVISIONING, JobState.RUNNING):
            on = [u.queued_resource(POOL) for u in pool.units if u.runs(job.job_id, job.attempt)]
            assert on == [job.warm_pool_unit], f"{context}: {job.job_id} live on {job.warm_pool_unit}, run by {on}"
    for unit in pool.units:
        if unit.state in pools.HELD:
            told = w.assignment(unit.queued_resource(POOL))
            assert (told["seq"], told.get("job_id")) == (unit.seq, unit.job_id), f"{context}: {unit} told {told}"
    current = {u.queued_resource(POOL) for u in pool.units if u.state in pools.QUOTA_HELD}
    assert w.unit_resources() == current, f"{context}: unit queued resources leaked or missing"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_each_scenario_makes_the_steps_it_lists_and_settles_uncrashed(world, scenario):
    """The step lists are the handlers' real I/O, and an uncrashed call ends where `done` says."""
    given = scenario.setup(world)
    plan = CrashPlan()
    scenario.deliver(world.crashing(plan), world, given)
    assert plan.steps == list(scenario.steps)
    settle(world, scenario.done, "uncrashed")


@pytest.mark.parametrize(("scenario", "k", "when"), _crash_points())
def test_a_crash_at_any_step_is_repaired_by_redelivery(world, scenario, k, when):
    """Killed around step k, the call made again, then ticks: the scenario's end, invariants kept."""
    given = scenario.setup(world)
    crash(world, scenario, given, k, when)
    scenario.deliver(world.service, world, given)
    settle(world, scenario.done, f"crash {when} step {k}, redelivered")


@pytest.mark.parametrize(("scenario", "k", "when"), _crash_points(reconcilable=True))
def test_a_crash_after_the_commit_is_repaired_by_the_reconciler_alone(world, scenario, k, when):
    """Killed around step k and the call lost: reconciler ticks finish the work."""
    given = scenario.setup(world)
    crash(world, scenario, given, k, when)
    settle(world, scenario.done, f"crash {when} step {k}, reconciled")


@pytest.mark.parametrize(("scenario", "k", "when"), _crash_points(reconcilable=False))
def test_a_crash_before_the_commit_with_the_call_lost_leaves_the_world_as_it_was(world, scenario, k, when):
    """Killed before the job's own commit and the call lost: nothing changed, nothing stuck or leaked."""
    given = scenario.setup(world)
    crash(world, scenario, given, k, when)
    assert scenario.untouched is not None
    settle(world, scenario.untouched, f"crash {when} step {k}, lost")

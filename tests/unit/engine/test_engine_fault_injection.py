"""Every job-service handler, and the reconciler's tick, killed at each of its I/O steps in turn, then repaired.

Each runs on an in-memory store and the TPU simulator, on ports (`local.testing.Crashing*`) that
raise `InjectedCrash` just before or after the k-th call. Then redelivery, or reconciler ticks
alone once the commit (or the TPU) records what happened, must reach the scenario's end: no
leaked queued resource, no attempt created twice, a timeline that never goes back, no rejection.
A message lost before its commit must leave the job as it was. Each scenario lists its port
calls (`steps`); a test checks the list against an uncrashed run, so a change to a handler's
I/O shows up here first.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from operator import attrgetter
from typing import Any

import pytest

from tpujobs.adapters.tpu import CloudTpu
from tpujobs.domain.states import JobState
from tpujobs.engine.api import CALLER_HEADER, JobsApi
from tpujobs.engine.capacity_handoff import NoCapacity
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.ports import Rejection
from tpujobs.engine.services import Engine
from tpujobs.local.fakes import InMemoryJobStore
from tpujobs.local.fakes.publishers import RecordingPublisher
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.testing import (
    CrashPlan,
    InjectedCrash,
    When,
    crashing_engine,
    local_settings,
    reconciler_for,
    signed,
    wait_for,
)

PROJECT = "test-project"
ZONE = "us-central2-b"
JOB = "train-1"  # every test has its own store and simulator, so one id serves all
OWNER = "ada@example.com"
SPEC: dict[str, Any] = {
    "job_id": JOB,
    "name": "train",
    "owner": OWNER,
    "accelerator_type": "v4-8",  # one worker host: one exit report ends an attempt
    "command": "python train.py",
    "on_preemption": "resume",
    "on_error": "fail",
    "max_restarts": 3,
}


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class Outcome:
    """Where the job should be once everything settled."""

    state: JobState | None  # None: there is no job at all
    attempt: int = 1
    exit_code: int | None = None
    recoveries: int = 0  # RECOVERING entries in the timeline, and restarts: one per loss
    held_over: frozenset[str] = frozenset()  # earlier attempts' kept through their hosts' grace

    @property
    def holds(self) -> set[str]:
        """The queued resources that should be live: the current attempt's, while the job lives,
        and those kept through a preemption's shutdown grace."""
        if self.state is None or self.state.is_terminal:
            return set()
        return {f"{JOB}-a{self.attempt}", *self.held_over}

    @property
    def created(self) -> set[str]:
        """The queued resources that should have been created, each once: one per attempt."""
        if self.state is None:
            return set()
        return {f"{JOB}-a{n}" for n in range(1, self.attempt + 1)}


@dataclass
class Harness:
    """One test's world: the engine on an in-memory store and this test's TPU simulator."""

    service: Engine
    store: InMemoryJobStore
    tpu_client: Any
    simulator_url: str

    def crashing(self, plan: CrashPlan) -> Engine:
        """The same service, on ports that crash where `plan` says."""
        return crashing_engine(self.service, plan)

    def submit(self, spec: dict[str, Any] = SPEC) -> None:
        outcome = self.service.submission.submit(
            InboundMessage("setup-submit", "tpujobs-submit", json.dumps(spec).encode())
        )
        assert outcome.kind == "provisioning", outcome

    def started(self, worker_id: int = 0, **extra: Any) -> None:
        payload = {"kind": "started", "job_id": JOB, "attempt": 1, "slice_id": 0, "worker_id": worker_id, **extra}
        self.service.worker_events.on_worker_report(
            signed(self.service, "tpujobs-worker-events", payload, message_id=f"setup-started-{worker_id}")
        )
        assert self.service.store.get(JOB).state is JobState.RUNNING

    def preempt(self, name: str) -> None:
        """Take the queued resource's capacity back, as Google does to spot TPUs."""

        def preemptible() -> bool:
            """the queued resource to be PROVISIONING or ACTIVE"""
            status = self.service.capacity.status(ZONE, name)
            return status is not None and status.state in ("PROVISIONING", "ACTIVE")

        wait_for(preemptible, timeout=10)
        SimulatorControl(self.simulator_url).preempt(ZONE, name)

    def live_resources(self) -> set[str]:
        parent = f"projects/{PROJECT}/locations/{ZONE}"
        return {
            r.name.rsplit("/", 1)[-1]
            for r in self.tpu_client.list_queued_resources(parent=parent)
            if r.state.state.name != "DELETING"
        }

    def created_resources(self) -> list[str]:
        """Every queued resource the simulator was asked to create, in order, repeats kept."""
        state = SimulatorControl(self.simulator_url).state()
        prefix = f"projects/{PROJECT}/locations/{ZONE}/queuedResources/"
        return [
            op["metadata"]["target"].removeprefix(prefix)
            for op in state["operations"]
            if op["metadata"]["verb"] == "create" and op["metadata"]["target"].startswith(prefix)
        ]

    def rejections(self) -> list[Rejection]:
        return self.store.rejections()


@dataclass(frozen=True)
class Scenario:
    """One handler, the job it finds, the message it gets, and where that must lead."""

    name: str
    handler: str  # the engine's service method the function target calls ("controls.on_control")
    topic: str
    payload: dict[str, Any]
    setup: Callable[[Harness], None]
    steps: tuple[str, ...]  # its port calls, in order, when nothing crashes
    done: Outcome  # after the message was handled
    commit: int | None = None  # the step that records the message; None: the TPU shows it anyway
    untouched: Outcome | None = None  # as the setup left it: a message lost before its commit
    # How the message reaches the service; None: the method `handler` names.
    via: Callable[[Engine, InboundMessage], object] | None = None

    def message(self, h: Harness) -> InboundMessage:
        """The one message of the test: a redelivery carries the same id and bytes. Worker
        reports and notices are signed by the attempt's key, as its agent signs them."""
        if self.topic in SIGNED_TOPICS:
            return signed(h.service, self.topic, self.payload, message_id="4242")
        return InboundMessage("4242", self.topic, json.dumps(self.payload).encode())

    def deliver(self, service: Engine, message: InboundMessage) -> object:
        if self.via is not None:
            return self.via(service, message)
        return attrgetter(self.handler)(service)(message)

    def reconcilable(self, k: int, when: When) -> bool:
        """Whether the reconciler alone can finish after a crash around step k."""
        return self.commit is None or k > self.commit or (k == self.commit and when == "after")


def _running(h: Harness) -> None:
    h.submit()
    h.started()


def _slice_running(h: Harness) -> None:
    """A v4-16 (one slice of two hosts) RUNNING; worker 0 speaks for worker 1."""
    h.submit({**SPEC, "accelerator_type": "v4-16"})
    h.started(0, next_report_seconds=10)
    h.started(1, watch="slice")


def _preempted(h: Harness) -> None:
    h.submit()
    h.started()
    h.preempt(f"{JOB}-a1")


# A committed decision is acted on as committed: no read between `store.apply` and the action.
# A report is believed first: its job read, its signature remembered (a replay is refused).
_BELIEVED = ("store.get", "store.remember_report")
# A failing exit's worker record comes after the commit: written first, a crash after it would mark
# the worker done while the job, never told, stayed RUNNING holding its capacity.
_EXIT_STEPS = (*_BELIEVED, "store.apply", "tpu.release", "store.record_worker")
# The next attempt is requested first; the lost one is read (are its hosts saving within
# Google's grace?) and, as here, released before the commit.
_LOSS_STEPS = ("store.apply", "tpu.request", "tpu.status", "tpu.release", "store.apply")
SIGNED_TOPICS = ("tpujobs-worker-events", "tpujobs-preemption")
_RECOVERED = Outcome(JobState.PROVISIONING, attempt=2, recoveries=1)
# A preempted attempt's hosts save within Google's shutdown grace: its queued resource is kept
# (held over) past the next attempt's request, and released by a later tick once the grace is over.
_HELD_LOSS_STEPS = ("store.apply", "tpu.request", "tpu.status", "store.apply")
_HELD = replace(_RECOVERED, held_over=frozenset({f"{JOB}-a1"}))


def _http_cancel(service: Engine, message: InboundMessage) -> object:
    """The `jobs` function's cancel: the message's bytes as the POST body, the owner as the
    caller (the local stack's header); every answer, a retry's too, says CANCELLED."""
    api = JobsApi(service, service.store, replace(service.settings, local_stack=True), verify_token=_no_tokens)
    response = api.handle("POST", "http://127.0.0.1/jobs", {CALLER_HEADER: OWNER}, message.data or b"")
    assert (response.status, response.body.get("state")) == (200, "CANCELLED"), response
    return response


def _no_tokens(token: str, audiences: Any) -> Any:
    raise AssertionError("the local stack names its caller in a header: no token is verified")


def _cancelled_through_the_api(h: Harness) -> None:
    """RUNNING, then cancelled through the jobs API as deployed: its engine holds no capacity, so
    the cancel is committed and its release handed to tpujobs-converge (the message of the test)."""
    _running(h)
    handoffs = RecordingPublisher()
    api_engine = Engine(h.store, NoCapacity(), h.service.settings, h.service.clock, handoff=handoffs)
    _http_cancel(
        api_engine, InboundMessage("setup-cancel", "jobs-api", json.dumps({"action": "cancel", "job_id": JOB}).encode())
    )
    assert handoffs.handed_off == [("job", JOB)]
    assert f"{JOB}-a1" in h.live_resources()


def _exit(code: int) -> dict[str, Any]:
    return {
        "kind": "exited",
        "job_id": JOB,
        "attempt": 1,
        "slice_id": 0,
        "worker_id": 0,
        "exit_code": code,
    }


SCENARIOS = [
    Scenario(
        "submit",
        "submission.submit",
        "tpujobs-submit",
        SPEC,
        setup=lambda h: None,
        steps=("store.create", "tpu.request", "store.apply"),
        done=Outcome(JobState.PROVISIONING),
        commit=1,
        untouched=Outcome(None),
    ),
    Scenario(
        "exited-0",
        "worker_events.on_worker_report",
        "tpujobs-worker-events",
        _exit(0),
        setup=_running,
        # An exit 0 is counted on the worker records: its own record first, then the count.
        steps=(
            *_BELIEVED,
            "store.record_worker",
            "store.attempt_workers_succeeded",
            "store.apply",
            "tpu.release",
        ),
        done=Outcome(JobState.SUCCEEDED, exit_code=0),
        commit=5,
        untouched=Outcome(JobState.RUNNING),
    ),
    Scenario(
        "exited-3",
        "worker_events.on_worker_report",
        "tpujobs-worker-events",
        _exit(3),
        setup=_running,
        steps=_EXIT_STEPS,
        done=Outcome(JobState.FAILED, exit_code=3),
        commit=3,
        untouched=Outcome(JobState.RUNNING),
    ),
    Scenario(
        "preemption",
        "capacity_events.on_preemption",
        "tpujobs-preemption",
        {"job_id": JOB, "attempt": 1, "slice_id": 0, "worker_id": 0, "reason": "SIGTERM"},
        setup=_preempted,
        steps=(*_BELIEVED, *_HELD_LOSS_STEPS),
        done=_HELD,
    ),
    Scenario(
        "peer-silent",
        "worker_events.on_worker_report",
        "tpujobs-worker-events",
        {"kind": "peer_silent", "job_id": JOB, "attempt": 1, "slice_id": 0, "worker_id": 0, "peer_worker_id": 1},
        setup=_slice_running,
        # The node is healthy, so only worker 0's word says the host is lost: a report lost
        # before its commit leaves the job as it was until worker 0's next heartbeat names the
        # peer again (`peers_silent`; worker 1 is spoken for, never silent by its own record).
        steps=(*_BELIEVED, *_LOSS_STEPS),
        done=_RECOVERED,
        commit=3,
        untouched=Outcome(JobState.RUNNING),
    ),
    Scenario(
        "qr-suspended",
        "capacity_events.on_qr_state",
        "tpujobs-qr-state",
        {"queued_resource": f"{JOB}-a1", "zone": ZONE, "state": "LOST"},
        setup=_preempted,
        steps=_HELD_LOSS_STEPS,
        done=_HELD,
    ),
    Scenario(
        "cancel",
        "controls.on_control",
        "tpujobs-control",
        {"action": "cancel", "job_id": JOB, "owner": OWNER},
        setup=_running,
        steps=("store.get", "store.apply", "tpu.release"),
        done=Outcome(JobState.CANCELLED),
        commit=2,
        untouched=Outcome(JobState.RUNNING),
    ),
    Scenario(
        "http-cancel",
        "cancel",
        "jobs-api",  # no topic: an HTTP request, retried by its caller
        {"action": "cancel", "job_id": JOB},
        setup=_running,
        # the job read, the cancel committed, its capacity released, the job read for the answer
        steps=("store.get", "store.apply", "tpu.release", "store.get"),
        done=Outcome(JobState.CANCELLED),
        commit=2,
        untouched=Outcome(JobState.RUNNING),
        via=_http_cancel,
    ),
    Scenario(
        "converge-cancelled",
        "convergence.on_converge",
        "tpujobs-converge",
        {"action": "converge", "job_id": JOB},
        setup=_cancelled_through_the_api,
        # the job read, its committed cancel acted on: the capacity released
        steps=("store.get", "tpu.release"),
        done=Outcome(JobState.CANCELLED),
    ),
]


def _crash_points(reconcilable: bool | None = None) -> list[Any]:
    """(scenario, k, when) for every step of every scenario; optionally only those the
    reconciler can (True) or cannot (False) repair. Ids read `cancel-2-store.apply-after`."""
    return [
        pytest.param(scenario, k, when, id=f"{scenario.name}-{k}-{step}-{when}")
        for scenario in SCENARIOS
        for k, step in enumerate(scenario.steps, start=1)
        for when in ("before", "after")
        if reconcilable is None or scenario.reconcilable(k, when) is reconcilable
    ]


@pytest.fixture
def harness(tpu_client, simulator_url) -> Harness:
    """The engine on an in-memory store and this test's simulator, behind the real TPU adapter."""
    store = InMemoryJobStore()
    settings = local_settings(
        project=PROJECT,
        default_zone=ZONE,
        tpu_endpoint=simulator_url,
        logs_bucket="logs",
        stuck_after_seconds=0.0,  # the reconciler finishes half-done work at once
    )
    service = Engine(
        store,
        CloudTpu(tpu_client, PROJECT),
        settings,
        utc_now,
        sleep=lambda seconds: None,  # backoffs do not wait
    )
    return Harness(service, store, tpu_client, simulator_url)


def crash(h: Harness, scenario: Scenario, message: InboundMessage, k: int, when: When) -> CrashPlan:
    """Deliver `message` to a handler that dies around its k-th I/O step."""
    plan = CrashPlan(at=k, when=when)
    with pytest.raises(InjectedCrash):
        scenario.deliver(h.crashing(plan), message)
    assert plan.crashed and plan.steps == list(scenario.steps[:k]), plan.steps
    return plan


def assert_settled(h: Harness, expected: Outcome, context: str) -> None:
    """The invariants: final state, no leaked capacity, no attempt twice, a sane timeline."""
    job = h.service.store.get(JOB)
    if expected.state is None:
        assert job is None, context
    else:
        assert job is not None, context
        got = (job.state, job.attempt, job.exit_code, job.restarts, job.queued_resource)
        want = (
            expected.state,
            expected.attempt,
            expected.exit_code,
            expected.recoveries,
            f"{JOB}-a{expected.attempt}",
        )
        assert got == want, f"{context}: {job.state_reason}"
        events = h.service.store.events(JOB)
        timeline = [(e.seq, e.attempt, e.to_state.value) for e in events]
        assert [e.seq for e in events] == list(range(1, len(events) + 1)), f"{context}: {timeline}"
        attempts = [e.attempt for e in events]
        assert attempts == sorted(attempts), f"{context}: an attempt went back: {timeline}"
        recoveries = [e.to_state for e in events].count(JobState.RECOVERING)
        assert recoveries == expected.recoveries, f"{context}: {timeline}"
    assert h.live_resources() == expected.holds, context
    created = h.created_resources()
    assert len(created) == len(set(created)), f"{context}: an attempt was created twice: {created}"
    assert set(created) == expected.created, context
    assert h.rejections() == [], context


def reconcile(h: Harness, context: str) -> None:
    """Two ticks: the first repairs, the second must find nothing left to finish."""
    reconciler_for(h.service).tick()
    second = reconciler_for(h.service).tick()
    assert not (second.re_requested or second.converged or second.released), f"{context}: {second}"


@pytest.mark.parametrize("scenario", [pytest.param(s, id=s.name) for s in SCENARIOS])
def test_each_handler_makes_exactly_its_listed_io_steps_and_settles(harness, scenario):
    """Uncrashed, the handler makes the listed port calls (the N crash points) and ends as expected."""
    scenario.setup(harness)
    plan = CrashPlan()
    scenario.deliver(harness.crashing(plan), scenario.message(harness))
    assert plan.steps == list(scenario.steps) and not plan.crashed
    assert_settled(harness, scenario.done, f"{scenario.name} uncrashed")


@pytest.mark.parametrize(("scenario", "k", "when"), _crash_points())
def test_redelivery_finishes_a_handler_killed_at_any_io_step(harness, scenario, k, when):
    """Killed before/after step k, the same message delivered again ends the job right, once."""
    scenario.setup(harness)
    message = scenario.message(harness)
    plan = crash(harness, scenario, message, k, when)
    context = f"{scenario.name}: crash {when} {plan.steps}, then redelivered"
    scenario.deliver(harness.service, message)
    assert_settled(harness, scenario.done, context)


@pytest.mark.parametrize(("scenario", "k", "when"), _crash_points(reconcilable=True))
def test_the_reconciler_finishes_a_handler_killed_after_its_commit(harness, scenario, k, when):
    """Killed before/after step k and the message lost: the reconciler alone ends the job right;
    a redelivery that turns up after all, once the tick repaired it, changes nothing."""
    scenario.setup(harness)
    message = scenario.message(harness)
    plan = crash(harness, scenario, message, k, when)
    context = f"{scenario.name}: crash {when} {plan.steps}, message lost, reconciled"
    reconcile(harness, context)
    assert_settled(harness, scenario.done, context)
    scenario.deliver(harness.service, message)
    assert_settled(harness, scenario.done, f"{context}, then redelivered late")


@pytest.mark.parametrize(("scenario", "k", "when"), _crash_points(reconcilable=False))
def test_a_message_lost_before_its_commit_leaves_the_job_as_it_was(harness, scenario, k, when):
    """Killed before the commit and the message lost: nothing to repair, and nothing leaks."""
    scenario.setup(harness)
    plan = crash(harness, scenario, scenario.message(harness), k, when)
    context = f"{scenario.name}: crash {when} {plan.steps}, message lost, reconciled"
    reconcile(harness, context)
    assert scenario.untouched is not None
    assert_settled(harness, scenario.untouched, context)


# -- the reconciler itself, killed mid-tick ----------------------------------------------


@dataclass(frozen=True)
class TickScenario:
    """Something only the reconciler can repair, and a tick that dies while repairing it."""

    name: str
    setup: Callable[[Harness], None]
    steps: tuple[str, ...]  # the tick's port calls, in order, when nothing crashes
    done: Outcome


def _half_done(name: str, k: int) -> Callable[[Harness], None]:
    """Handler scenario `name`'s setup, then that handler killed right after step k, its message lost."""
    scenario = next(s for s in SCENARIOS if s.name == name)

    def setup(h: Harness) -> None:
        scenario.setup(h)
        crash(h, scenario, scenario.message(h), k, "after")

    return setup


# Every tick starts by reading what is: where the active jobs are (the coordinator), then the
# one shard's jobs and its zone's listing (tick() runs the shards in this process).
_SURVEY = ("store.active_placements", "store.active_in_shard", "tpu.list_capacity")
_PRUNE = "store.prune_expired_jobs"  # every tick ends by deleting expired jobs (none here)

TICKS = [
    TickScenario(  # the notice never came: the tick sees the SUSPENDING resource itself; its
        # hosts are within their shutdown grace, so it is kept (held over), not released
        "unreported-preemption",
        _preempted,
        (*_SURVEY, "store.apply", "tpu.request", "tpu.status", "store.apply", "store.silent_workers", _PRUNE),
        _HELD,
    ),
    TickScenario(  # submit died after creating the job: the tick admits it
        "queued-job",
        _half_done("submit", 1),
        (*_SURVEY, "store.get", "tpu.request", "store.apply", "store.silent_workers", _PRUNE),
        Outcome(JobState.PROVISIONING),
    ),
    TickScenario(  # a loss was committed but its handler died: the tick starts attempt 2
        "recovering-job",
        _half_done("preemption", 3),  # after its commit (the report was checked and remembered first)
        (*_SURVEY, "store.get", *_HELD_LOSS_STEPS[1:], "store.silent_workers", _PRUNE),
        _HELD,
    ),
    TickScenario(  # a cancel was committed but its handler died: the tick frees the capacity
        "ended-job-holding-capacity",
        _half_done("cancel", 2),
        (*_SURVEY, "store.get", "tpu.release", "store.silent_workers", _PRUNE),  # the shard releases
        Outcome(JobState.CANCELLED),
    ),
]


def _tick_crash_points() -> list[Any]:
    return [
        pytest.param(tick, k, when, id=f"{tick.name}-{k}-{step}-{when}")
        for tick in TICKS
        for k, step in enumerate(tick.steps, start=1)
        for when in ("before", "after")
    ]


@pytest.mark.parametrize("tick", [pytest.param(t, id=t.name) for t in TICKS])
def test_each_repairing_tick_makes_exactly_its_listed_io_steps_and_settles(harness, tick):
    """Uncrashed, one tick makes the listed port calls and repairs the job."""
    tick.setup(harness)
    plan = CrashPlan()
    reconciler_for(harness.crashing(plan)).tick()
    assert plan.steps == list(tick.steps) and not plan.crashed, plan.steps
    assert_settled(harness, tick.done, f"{tick.name} uncrashed")


@pytest.mark.parametrize(("tick", "k", "when"), _tick_crash_points())
def test_the_next_tick_finishes_a_tick_killed_at_any_io_step(harness, tick, k, when):
    """A tick killed before/after step k: the next scheduled tick finishes the repair, once."""
    tick.setup(harness)
    plan = CrashPlan(at=k, when=when)
    with pytest.raises(InjectedCrash):
        reconciler_for(harness.crashing(plan)).tick()
    assert plan.steps == list(tick.steps[:k]), plan.steps
    context = f"{tick.name}: tick crashed {when} {plan.steps}, then ticked again"
    reconcile(harness, context)
    assert_settled(harness, tick.done, context)

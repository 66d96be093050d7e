"""Every handler killed at each of its I/O steps in turn, then repaired.

The service's promise (service.py) is that a handler may die anywhere and lose nothing:
the redelivered message or the reconciler finishes the work, because the commit comes
first and every action is idempotent. Here each handler runs on ports wrapped by
`tpujobs.local.testing.CrashingStore`/`CrashingTpu`, which raise `InjectedCrash` just before
or just after the k-th port call (after: the call took effect, then the process died).
Then one of two things repairs it, on the real ports:

- redelivered: Pub/Sub delivers the same message (same id) again;
- reconciled: the message is lost, and only `Reconciler.tick()` runs (twice; with
  `stuck_after_seconds=0`, so it finishes half-done QUEUED/RECOVERING work at once).

After either, the invariants hold: the job is in the scenario's final state; the live
queued resources are exactly the current attempt's (none once terminal); the simulator
saw at most one create per `{job}-a{N}`; the timeline's attempts never go back, with
one RECOVERING per loss; and the valid message was never recorded as a rejection.

Each scenario lists its port calls (`steps`) when nothing crashes; a test checks the list
against an uncrashed run, so a change to a handler's I/O shows up here first.

Crash points only redelivery can repair (the message is the only record of what
happened, so the reconciler, which reads job documents and queued resources, has
nothing to go on; these are checked to leave the job exactly as it was, with no leak):

- submit: before `store.create` -- no job document exists yet.
- worker exited 0 / exited 3: before the `store.apply` of the exit -- the queued
  resource still looks healthy and only the message knows the exit code. The worker's
  own record is written after the commit, so a crash between them leaves a worker
  still `live` whose job has moved on: the tick retires it once it falls silent.
  (Were the record written first, a crash after it would mark the worker done with
  its exit code while the job, never told, stayed RUNNING holding its capacity.)
- cancel: before or after the first `store.get`, and before the `store.apply` of the
  cancel -- only the message says the owner asked.

Every other crash point is repaired by either path, and a redelivery arriving after
the tick repaired it changes nothing. Preemption notices and SUSPENDED observations can
always be repaired by the reconciler: the queued resource really is SUSPENDING or
SUSPENDED in the TPU API, so the tick observes the loss itself.

The reconciler is a handler too (Cloud Scheduler runs it): the last tests kill a tick at
each of its I/O steps while it repairs something only it can see, and the next tick
must finish the repair with the same invariants.

The status publisher (`Engine(status=...)`) is not wrapped: these services have
none, so announcing makes no I/O here.

Three handlers are not the job service's Pub/Sub handlers, and are crashed the same way:

- the HTTP cancel (`JobsApi.cancel`, the `jobs` function), a scenario above whose delivery is
  an HTTP request and whose redelivery is the caller's retry. A retry after the commit finds
  the job CANCELLED, releases the capacity a crash left held, and answers 200.
- `export_logs` (`OutputExporter.handle`), on the storage emulator: every crash point is repaired
  by redelivery, and by the reconciler, which asks again (`tpujobs-log-export`, through the
  Pub/Sub emulator) for the export of an attempt that ended a minute or more ago and is not
  recorded as exported; a redelivery after either rewrites nothing.
- `record_dead_letter` (`DeadLetters.record`): one write, repaired by redelivery only. The
  dead letter is the only record of the message, so there is nothing for a reconciler to
  read; the dead-letter topic's subscription retries until the message expires (7 days).
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from operator import attrgetter
from typing import Any

import pytest

from tpujobs.adapters.firestore_dead_letters import DEAD_LETTERS
from tpujobs.adapters.firestore_store import REJECTIONS, FirestoreJobStore
from tpujobs.adapters.output_bucket import GcsOutputBucket
from tpujobs.adapters.pubsub import Publisher
from tpujobs.adapters.tpu import CloudTpu
from tpujobs.domain.states import JobState
from tpujobs.engine import dead_letters, topology
from tpujobs.engine.api import CALLER_HEADER, JobsApi
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.output_export import OutputExporter, OutputObjects, attempt_log_name, worker_log_name
from tpujobs.engine.reconciler import EXPORT_GRACE_S
from tpujobs.engine.services import Engine
from tpujobs.local import wiring
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.testing import (
    CrashingStore,
    CrashingTpu,
    CrashPlan,
    InjectedCrash,
    When,
    local_settings,
    reconciler_for,
    signed,
    wait_for,
)
from tpujobs.runtime import instances

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"
JOB = "train-1"  # every test has its own project and simulator, so one id serves all
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

    @property
    def holds(self) -> set[str]:
        """The queued resources that should be live: the current attempt's, while the job lives."""
        if self.state is None or self.state.is_terminal:
            return set()
        return {f"{JOB}-a{self.attempt}"}

    @property
    def created(self) -> set[str]:
        """The queued resources that should have been created, each once: one per attempt."""
        if self.state is None:
            return set()
        return {f"{JOB}-a{n}" for n in range(1, self.attempt + 1)}


@dataclass
class Harness:
    """One test's world: the real service on the emulator and its own TPU simulator."""

    service: Engine
    firestore_client: Any
    tpu_client: Any
    project_id: str
    simulator_url: str

    def crashing(self, plan: CrashPlan) -> Engine:
        """The same service, on ports that crash where `plan` says."""
        real = self.service
        return Engine(
            CrashingStore(real.store, plan),
            CrashingTpu(real.tpu, plan),
            real.settings,
            real.clock,
            real.sleep,
        )

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
        parent = f"projects/{self.project_id}/locations/{ZONE}"
        return {
            r.name.rsplit("/", 1)[-1]
            for r in self.tpu_client.list_queued_resources(parent=parent)
            if r.state.state.name != "DELETING"
        }

    def created_resources(self) -> list[str]:
        """Every queued resource the simulator was asked to create, in order, repeats kept."""
        state = SimulatorControl(self.simulator_url).state()
        prefix = f"projects/{self.project_id}/locations/{ZONE}/queuedResources/"
        return [
            op["metadata"]["target"].removeprefix(prefix)
            for op in state["operations"]
            if op["metadata"]["verb"] == "create" and op["metadata"]["target"].startswith(prefix)
        ]

    def rejections(self) -> list[dict[str, Any]]:
        return [doc.to_dict() for doc in self.firestore_client.collection(REJECTIONS).stream()]


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
_EXIT_STEPS = (*_BELIEVED, "store.apply", "tpu.release", "store.record_worker")
_LOSS_STEPS = ("store.apply", "tpu.release", "tpu.request", "store.apply")
SIGNED_TOPICS = ("tpujobs-worker-events", "tpujobs-preemption")
_RECOVERED = Outcome(JobState.PROVISIONING, attempt=2, recoveries=1)


def _http_cancel(service: Engine, message: InboundMessage) -> object:
    """The `jobs` function's cancel: the message's bytes as the POST body, the owner as the
    caller (the local stack's header); every answer, a retry's too, says CANCELLED."""
    api = JobsApi(service, service.store, replace(service.settings, local_stack=True), verify_token=_no_tokens)
    response = api.handle("POST", "http://127.0.0.1/jobs", {CALLER_HEADER: OWNER}, message.data or b"")
    assert (response.status, response.body.get("state")) == (200, "CANCELLED"), response
    return response


def _no_tokens(token: str, audiences: Any) -> Any:
    raise AssertionError("the local stack names its caller in a header: no token is verified")


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
        steps=(*_BELIEVED, *_LOSS_STEPS),
        done=_RECOVERED,
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
        {"queued_resource": f"{JOB}-a1", "zone": ZONE, "state": "SUSPENDED"},
        setup=_preempted,
        steps=_LOSS_STEPS,
        done=_RECOVERED,
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
def harness(firestore_client, tpu_client, project_id, simulator_url) -> Harness:
    settings = local_settings(
        project=project_id,
        default_zone=ZONE,
        tpu_endpoint=simulator_url,
        logs_bucket="logs",
        stuck_after_seconds=0.0,  # the reconciler finishes half-done work at once
    )
    service = Engine(
        FirestoreJobStore(firestore_client),
        CloudTpu(tpu_client, project_id),
        settings,
        utc_now,
        sleep=lambda seconds: None,  # backoffs do not wait
    )
    return Harness(service, firestore_client, tpu_client, project_id, simulator_url)


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
_NEXT_ATTEMPT = ("tpu.release", "tpu.request", "store.apply")
_PRUNE = "store.prune_expired_jobs"  # every tick ends by deleting expired jobs (none here)

TICKS = [
    TickScenario(  # the notice never came: the tick sees the SUSPENDING resource itself
        "unreported-preemption",
        _preempted,
        (*_SURVEY, "store.apply", *_NEXT_ATTEMPT, "store.silent_workers", _PRUNE),
        _RECOVERED,
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
        (*_SURVEY, "store.get", *_NEXT_ATTEMPT, "store.silent_workers", _PRUNE),
        _RECOVERED,
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


# -- handlers beside the job service: export_logs and record_dead_letter ------------------


class CrashingPort:
    """Any adapter whose `io` methods are steps of `plan`, named `{label}.{method}`; its other
    attributes (names, URIs) pass through uncounted."""

    def __init__(self, label: str, real: Any, plan: CrashPlan, io: tuple[str, ...]) -> None:
        self._label, self._real, self._plan, self._io = label, real, plan, io

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._real, name)
        if name not in self._io:
            return attribute
        return lambda *args, **kwargs: self._plan.step(f"{self._label}.{name}", lambda: attribute(*args, **kwargs))


def crash_around(plan: CrashPlan, handle: Callable[[], object], steps: tuple[str, ...]) -> None:
    """Run `handle` on ports sharing `plan`, and check it died where planned."""
    with pytest.raises(InjectedCrash):
        handle()
    assert plan.crashed and plan.steps == list(steps[: plan.at]), plan.steps


def _step_points(name: str, steps: tuple[str, ...]) -> list[Any]:
    return [
        pytest.param(k, when, id=f"{name}-{k}-{step}-{when}")
        for k, step in enumerate(steps, start=1)
        for when in ("before", "after")
    ]


# export_logs: one ended attempt of one host, its output uploaded as the agent uploads it.
OUTPUT = [b"step 1 loss 2.0\n", b"step 2 loss 1.0\n"]
EXPORT_STEPS = (
    "store.get",  # the job: has the attempt ended?
    "objects.worker_outputs",  # list the chunks, read complete.json
    "objects.write_stream_if_changed",  # worker-0.log, streamed from the one worker's chunks
    "objects.write_stream_if_changed",  # attempt.log, streamed from them again
    "store.record_attempt_logs",  # the commit: attempts/1 and the job's log_uri
)
_OBJECT_IO = ("worker_outputs", "read", "chunks_text", "write_if_changed", "write_stream_if_changed")


@dataclass
class ExportWorld:
    """The harness's job, ended, with its output in a bucket of the storage emulator."""

    harness: Harness
    objects: OutputObjects
    emulator_host: str

    def exporter(self, plan: CrashPlan | None = None) -> OutputExporter:
        store, objects = self.harness.service.store, self.objects
        if plan is not None:
            store, objects = CrashingStore(store, plan), CrashingPort("objects", objects, plan, _OBJECT_IO)
        return OutputExporter(objects, store, utc_now, sleep=lambda seconds: None, settle_seconds=0.0)

    def request(self) -> InboundMessage:
        payload = {"job_id": JOB, "attempt": 1}
        return InboundMessage("4343", topology.LOG_EXPORT, json.dumps(payload).encode())


@pytest.fixture
def exports(harness: Harness, storage_url: str, emulators: dict[str, str]) -> ExportWorld:
    harness.submit()
    harness.started()
    harness.service.worker_events.on_worker_report(
        signed(harness.service, "tpujobs-worker-events", _exit(0), message_id="setup-exited")
    )
    assert harness.service.store.get(JOB).state is JobState.SUCCEEDED
    bucket = wiring.storage_client(storage_url, harness.project_id).create_bucket(f"logs-{uuid.uuid4().hex[:10]}")
    chunks = f"logs/jobs/{JOB}/attempt-1/chunks/slice-0-worker-0/"
    for seq, piece in enumerate(OUTPUT):
        bucket.blob(f"{chunks}{seq:06d}.log").upload_from_string(piece)
    bucket.blob(chunks + "complete.json").upload_from_string(json.dumps({"exit_code": 0, "chunks": 2}))
    return ExportWorld(
        harness, OutputObjects(GcsOutputBucket(bucket.client, bucket.name)), emulators["PUBSUB_EMULATOR_HOST"]
    )


def assert_exported(world: ExportWorld, context: str) -> None:
    """Both logs hold the output, the attempt and the job name them, and exporting again
    uploads nothing: the export is whole and written once."""
    objects = world.objects
    assert objects.read(worker_log_name(JOB, 1, 0)) == b"".join(OUTPUT), context
    assert objects.read(attempt_log_name(JOB, 1)) == b"".join(b"[worker 0] " + line for line in OUTPUT), context
    job = world.harness.service.store.get(JOB)
    assert job.log_uri == objects.uri(attempt_log_name(JOB, 1)), context
    (recorded,) = world.harness.service.store.attempt_documents(JOB)
    assert recorded["id"] == "1" and recorded["worker_logs"] == {"0": objects.uri(worker_log_name(JOB, 1, 0))}, context
    again = world.exporter().handle(world.request())
    assert again is not None and again.written == (), f"{context}: exported again, it rewrote {again}"
    assert world.harness.rejections() == [], context


def test_the_export_makes_exactly_its_listed_io_steps_and_exports(exports: ExportWorld) -> None:
    """Uncrashed, export_logs makes the listed port calls and writes both logs."""
    plan = CrashPlan()
    exports.exporter(plan).handle(exports.request())
    assert plan.steps == list(EXPORT_STEPS) and not plan.crashed
    assert_exported(exports, "uncrashed")


@pytest.mark.parametrize(("k", "when"), _step_points("export", EXPORT_STEPS))
def test_redelivery_finishes_an_export_killed_at_any_io_step(exports: ExportWorld, k: int, when: When) -> None:
    """Killed before/after step k, the same request delivered again leaves the whole export."""
    plan = CrashPlan(at=k, when=when)
    crash_around(plan, lambda: exports.exporter(plan).handle(exports.request()), EXPORT_STEPS)
    exports.exporter().handle(exports.request())
    assert_exported(exports, f"export: crash {when} {plan.steps}, then redelivered")


@pytest.mark.parametrize(("k", "when"), _step_points("export", EXPORT_STEPS))
def test_the_reconciler_asks_again_for_an_export_killed_at_any_io_step(
    exports: ExportWorld, k: int, when: When
) -> None:
    """Killed before/after step k and the request lost: a tick a minute later (the handler's
    grace) publishes the request again unless the export was recorded, and that request,
    pulled from the Pub/Sub emulator, finishes it."""
    plan = CrashPlan(at=k, when=when)
    crash_around(plan, lambda: exports.exporter(plan).handle(exports.request()), EXPORT_STEPS)
    context = f"export: crash {when} {plan.steps}, request lost, reconciled"
    h, host = exports.harness, exports.emulator_host
    publisher, subscriber = wiring.publisher_client(host), wiring.subscriber_client(host)
    topic = publisher.create_topic(name=publisher.topic_path(h.project_id, topology.LOG_EXPORT)).name
    watch = subscriber.subscription_path(h.project_id, "log-export-watch")
    subscriber.create_subscription(name=watch, topic=topic)
    later = Engine(
        h.service.store,
        h.service.capacity,
        h.service.settings,
        lambda: utc_now() + timedelta(seconds=EXPORT_GRACE_S + 30),
        sleep=lambda seconds: None,
        exports=Publisher.build(h.project_id, h.service.settings.prefix),
    )
    report = reconciler_for(later).tick()
    asked = f"{JOB}: export of attempt 1 asked again" in report.observed
    assert asked is (k < len(EXPORT_STEPS) or when == "before"), f"{context}: {report}"
    if asked:
        pulled = wait_for(lambda: subscriber.pull(subscription=watch, max_messages=1, timeout=5).received_messages)
        subscriber.acknowledge(subscription=watch, ack_ids=[pulled[0].ack_id])
        request = InboundMessage(pulled[0].message.message_id, topology.LOG_EXPORT, pulled[0].message.data)
        exports.exporter().handle(request)
    assert_exported(exports, context)
    exports.exporter().handle(exports.request())  # the lost request turns up after all
    assert_exported(exports, f"{context}, then redelivered late")


# record_dead_letter: one write of a message only it knows.
DEAD_LETTER_STEPS = ("dead_letters.add",)
SUBMIT_ROUTE = next(r for r in topology.FUNCTIONS if r.topic == topology.SUBMIT)
RECORDED_AT = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


def _dead_letter(project_id: str) -> InboundMessage:
    """A submit that failed five deliveries, with the attributes Pub/Sub adds to a dead letter."""
    return InboundMessage(
        "9001",
        topology.DEAD_LETTER,
        json.dumps(SPEC).encode(),
        {
            "origin": "ci",
            dead_letters.DELIVERY_COUNT: "5",
            dead_letters.SOURCE_SUBSCRIPTION: topology.push_subscription_name(SUBMIT_ROUTE, ""),
            dead_letters.SOURCE_PROJECT: project_id,
            dead_letters.SOURCE_PUBLISH_TIME: "2026-03-01T11:59:30.123Z",
        },
    )


def _recorder(project_id: str, plan: CrashPlan | None = None) -> dead_letters.DeadLetters:
    """The recorder `record_dead_letter` builds, on the emulator; its store crashing as planned."""
    recorder = instances.build_dead_letters(local_settings(project=project_id), lambda: RECORDED_AT)
    if plan is not None:
        recorder = copy.copy(recorder)
        recorder.store = CrashingPort(
            "dead_letters", recorder.store, plan, ("add", "get", "list_dead_letters", "mark_replayed")
        )
    return recorder


def assert_recorded(project_id: str, firestore_client: Any, context: str) -> None:
    """One record, exactly what the message says, replayable to tpujobs-submit."""
    message = _dead_letter(project_id)
    assert _recorder(project_id).get(message.message_id) == dead_letters.dead_letter_from_message(
        message, RECORDED_AT
    ), context
    assert len(list(firestore_client.collection(DEAD_LETTERS).stream())) == 1, context


def test_recording_a_dead_letter_makes_exactly_its_listed_io_steps(project_id, firestore_client) -> None:
    """Uncrashed, record_dead_letter makes one write, and the letter names its topic."""
    plan = CrashPlan()
    letter = _recorder(project_id, plan).record(_dead_letter(project_id))
    assert plan.steps == list(DEAD_LETTER_STEPS) and not plan.crashed
    assert letter is not None and letter.topic == topology.SUBMIT
    assert_recorded(project_id, firestore_client, "uncrashed")


@pytest.mark.parametrize(("k", "when"), _step_points("dead-letter", DEAD_LETTER_STEPS))
def test_redelivery_finishes_a_dead_letter_record_killed_at_its_write(
    project_id, firestore_client, k: int, when: When
) -> None:
    """Killed before or after its write, the dead letter delivered again is recorded once, as
    it would have been; the record, when the write happened, is left as it was."""
    plan = CrashPlan(at=k, when=when)
    crash_around(plan, lambda: _recorder(project_id, plan).record(_dead_letter(project_id)), DEAD_LETTER_STEPS)
    written = _recorder(project_id).get("9001") is not None
    assert written is (when == "after"), plan.steps
    _recorder(project_id).record(_dead_letter(project_id))
    assert_recorded(project_id, firestore_client, f"dead letter: crash {when} {plan.steps}, then redelivered")

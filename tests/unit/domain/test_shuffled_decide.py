"""decide() folded over shuffled, duplicated observations: the timeline stays legal whatever the order.

Pub/Sub delivers at least once and in no particular order, and several sources (agents, the
TPU audit log, the reconciler, users) speak about the same job. Here every observation a
job of up to three attempts could receive is generated, each delivered one to three times,
and shuffled; the property is about every Decision along the way, not about where the job
ends: the move is in TRANSITIONS for its event kind, the attempt never goes back, a terminal
job never moves again, and the timeline's sequence numbers are consecutive.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from tpujobs.domain.job import Job, JobEvent, new_job, worker_key
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import TERMINAL, TRANSITIONS, EventKind, JobState
from tpujobs.domain.transitions import Decision, Ignored, Observation, decide

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
ZONE = "us-central2-b"
CAPACITY_STATES = ["CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]
ACCELERATORS = {"v4-8": 1, "v4-16": 2, "v4-32": 4}  # worker hosts per slice
ATTEMPTS = (1, 2, 3)


def a_job(accelerator: str, slices: int, on_preemption: str, on_error: str, max_restarts: int) -> Job:
    spec = parse_spec(
        {
            "job_id": "shuffled-1",
            "name": "shuffled",
            "owner": "ada",
            "accelerator_type": accelerator,
            "slices": slices,
            "command": "python train.py",
            "on_preemption": on_preemption,
            "on_error": on_error,
            "max_restarts": max_restarts,
        }
    )
    job, _ = new_job(spec, ZONE, T0)
    return job


jobs = st.builds(
    a_job,
    st.sampled_from(sorted(ACCELERATORS)),
    st.integers(1, 2),
    st.sampled_from(["resume", "rerun", "fail"]),
    st.sampled_from(["resume", "rerun", "fail"]),
    st.integers(0, 3),
)


def workers_of(job: Job) -> list[str]:
    return [worker_key(s, w) for s in range(job.spec.slices) for w in range(job.spec.hosts_per_slice)]


@st.composite
def observations_of_an_attempt(draw: st.DrawFn, job: Job, attempt: int) -> list[Observation]:
    """What the sources could say about one attempt: admission, capacity, each worker, a loss, the next request."""
    seen = [
        Observation(
            EventKind.ADMITTED,
            attempt,
            "submit",
            capacity_state=draw(st.sampled_from(CAPACITY_STATES)),
        ),
        Observation(
            EventKind.CAPACITY_CHANGED,
            attempt,
            "tpu",
            capacity_state=draw(st.sampled_from(CAPACITY_STATES)),
        ),
        Observation(EventKind.NEXT_ATTEMPT_REQUESTED, attempt, "tpu", capacity_state="CREATING"),
    ]
    for worker in workers_of(job):
        seen.append(Observation(EventKind.WORKERS_STARTED, attempt, "agent", worker=worker))
        code = draw(st.sampled_from([0, 0, 0, 0, 0, 1, 137]))
        kind = EventKind.WORKER_SUCCEEDED if code == 0 else EventKind.COMMAND_FAILED
        seen.append(Observation(kind, attempt, "agent", exit_code=code, worker=worker))
    if draw(st.booleans()):
        seen.append(Observation(EventKind.CAPACITY_LOST, attempt, "agent", reason="Preempted", worker="0-0"))
    if draw(st.booleans()):
        seen.append(Observation(EventKind.CAPACITY_LOST, attempt, "reconciler", reason="SUSPENDED"))
    return seen


any_observation = st.builds(
    Observation,
    # A user's resume or rerun starts an ended job again on purpose (tests/unit/domain/test_restart.py):
    # what is checked here is that nothing else ever moves a job that has ended.
    kind=st.sampled_from([k for k in EventKind if k not in (EventKind.RESUME_REQUESTED, EventKind.RERUN_REQUESTED)]),
    attempt=st.one_of(st.none(), st.sampled_from(ATTEMPTS)),
    source=st.sampled_from(["submit", "tpu", "agent", "reconciler", "user"]),
    capacity_state=st.one_of(st.none(), st.sampled_from(CAPACITY_STATES)),
    exit_code=st.one_of(st.none(), st.integers(-1, 255)),
    worker=st.one_of(st.none(), st.sampled_from(["0-0", "0-1", "1-0", "1-3"])),
)


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[Job, list[Observation]]:
    """A job and every observation about it, each delivered 1 to 3 times, in a shuffled order."""
    job = draw(jobs)
    seen: list[Observation] = []
    for attempt in ATTEMPTS:
        seen += draw(observations_of_an_attempt(job, attempt))
    if draw(st.integers(0, 3)) == 0:
        seen.append(Observation(EventKind.CANCEL_REQUESTED, None, "user", reason="Cancelled by ada."))
    seen += draw(st.lists(any_observation, max_size=4))
    copies = [o for o in seen for _ in range(draw(st.integers(1, 3)))]
    return job, draw(st.permutations(copies))


def fold(job: Job, order: list[Observation]) -> tuple[Job, list[JobEvent]]:
    """Apply every observation in order, checking each decision; the final job and its timeline."""
    timeline = [JobEvent(1, T0, None, JobState.QUEUED, "submitted", "submit", 1)]
    for i, seen in enumerate(order):
        now = T0 + timedelta(seconds=i + 1)
        before = job
        outcome = decide(before, seen, now)
        if isinstance(outcome, Ignored):
            assert outcome.reason
            continue
        assert isinstance(outcome, Decision)
        event, job = outcome.event, outcome.job
        assert before.state not in TERMINAL, f"a {before.state.value} job moved on {seen}"
        assert event.from_state is before.state
        assert event.to_state in TRANSITIONS.get((before.state, seen.kind), frozenset()), (
            f"{before.state.value} -> {event.to_state.value} on {seen.kind.value} is not in TRANSITIONS"
        )
        assert job.state is event.to_state
        assert event.seq == before.event_seq + 1 == job.event_seq
        assert event.attempt == before.attempt
        requeued = job.state is JobState.QUEUED and before.state is not JobState.QUEUED  # evicted, zone failover
        expected_attempt = before.attempt + (seen.kind is EventKind.NEXT_ATTEMPT_REQUESTED or requeued)
        assert job.attempt == expected_attempt >= before.attempt
        assert before.restarts <= job.restarts <= job.spec.max_restarts
        assert job.queued_resource == f"{job.job_id}-a{job.attempt}"
        assert len(set(job.workers_done)) == len(job.workers_done) <= job.total_workers
        if job.state is JobState.SUCCEEDED:
            assert len(job.workers_done) == job.total_workers and job.exit_code == 0
        if job.state in TERMINAL:
            assert job.ended_at == now
        again = decide(job, seen, now)  # the same message, redelivered at once
        assert isinstance(again, Ignored), f"{seen} moved the job twice: {again}"
        timeline.append(event)
    return job, timeline


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deliveries())
@example(
    (
        a_job("v4-16", 1, "resume", "fail", 2),
        [
            Observation(EventKind.ADMITTED, 1, "submit", capacity_state="CREATING"),
            Observation(EventKind.WORKER_SUCCEEDED, 1, "agent", exit_code=0, worker="0-0"),
            Observation(EventKind.CAPACITY_LOST, 1, "agent", reason="Preempted"),
            Observation(EventKind.WORKER_SUCCEEDED, 1, "agent", exit_code=0, worker="0-1"),
            Observation(EventKind.NEXT_ATTEMPT_REQUESTED, 1, "tpu"),
            Observation(EventKind.WORKER_SUCCEEDED, 2, "agent", exit_code=0, worker="0-0"),
            Observation(EventKind.WORKER_SUCCEEDED, 2, "agent", exit_code=0, worker="0-1"),
            Observation(EventKind.CANCEL_REQUESTED, None, "user"),
        ],
    )
)
def test_shuffled_duplicated_observations_only_ever_make_legal_moves(
    case: tuple[Job, list[Observation]],
) -> None:
    """Every decision is in the table, attempts never go back, terminal is final, seqs are consecutive."""
    job, order = case
    final, timeline = fold(job, order)
    assert [e.seq for e in timeline] == list(range(1, len(timeline) + 1))
    attempts = [e.attempt for e in timeline]
    assert attempts == sorted(attempts)
    ended = [i for i, e in enumerate(timeline) if e.to_state in TERMINAL]
    assert ended in ([], [len(timeline) - 1]), "a terminal state must be the timeline's last entry"
    assert final.state is timeline[-1].to_state
    event(f"ends {final.state.value} at attempt {final.attempt}")  # --hypothesis-show-statistics


@settings(max_examples=100, deadline=None)
@given(job=jobs, order=st.lists(any_observation, max_size=30))
def test_arbitrary_observation_streams_never_raise_and_only_make_legal_moves(
    job: Job, order: list[Observation]
) -> None:
    """Any kind, any attempt (or none), any worker and code: Ignored or a legal Decision, never IllegalTransition."""
    _, timeline = fold(job, order)
    assert [e.seq for e in timeline] == list(range(1, len(timeline) + 1))

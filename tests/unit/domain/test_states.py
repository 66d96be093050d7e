"""Contract section 3: job states as data, the transition table, and decide().

The table is walked exhaustively: every JobState against every EventKind.
"""

from __future__ import annotations

import ast
import inspect
import itertools
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tpujobs.domain import states as states_module
from tpujobs.domain.job import HeldOver, Job, ScheduledMaintenance, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import (
    ACTIVE,
    TERMINAL,
    TRANSITIONS,
    EventKind,
    JobState,
    allowed_targets,
)
from tpujobs.domain.transitions import Decision, Ignored, Observation, decide

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
LATER = NOW + timedelta(minutes=7)
ZONE = "us-central2-b"

ALL_PAIRS = list(itertools.product(JobState, EventKind))
TABLE_PAIRS = [pair for pair in ALL_PAIRS if pair in TRANSITIONS]
OTHER_PAIRS = [pair for pair in ALL_PAIRS if pair not in TRANSITIONS]


def pair_id(pair: tuple[JobState, EventKind]) -> str:
    return f"{pair[0].value}-{pair[1].value}"


# An earlier attempt's holding kept through its hosts' shutdown grace (`domain.grace`).
HELD = HeldOver("train-1-a0", "us-central2-b", 1, 4, "v4@us-central2", datetime(2026, 1, 1, tzinfo=timezone.utc))


def make_job(state: JobState = JobState.QUEUED, **spec_changes: Any) -> Job:
    """A job made by new_job from a valid spec, then put in `state`."""
    data = {
        "job_id": "train-1",
        "name": "train",
        "owner": "alice",
        "accelerator_type": "v4-8",
        "command": "python train.py",
        "zones": [ZONE, "us-east5-a"],  # a zone to fail over to
        **spec_changes,
    }
    job, _ = new_job(parse_spec(data), ZONE, NOW)
    return job.evolve(state=state)


def observation(kind: EventKind, job: Job, **changes: Any) -> Observation:
    """An observation of `kind` for the job's current attempt that should move it, if anything can."""
    fields: dict[str, Any] = {"kind": kind, "attempt": job.attempt, "source": "tpu"}
    if kind is EventKind.CANCEL_REQUESTED:
        fields.update(attempt=None, source="user")
    if kind in (
        EventKind.ADMITTED,
        EventKind.CAPACITY_CHANGED,
        EventKind.NEXT_ATTEMPT_REQUESTED,
        EventKind.REQUESTED_AGAIN,
    ):
        fields["capacity_state"] = "WAITING_FOR_RESOURCES"
    if kind is EventKind.HOSTS_SUSPECT:
        fields.update(hosts=(("train-1-a1", "health TIMEOUT"),), source="reconciler")
    if kind is EventKind.MAINTENANCE_SCHEDULED:
        window = ScheduledMaintenance("worker 0-0", "2026-12-01T04:00:00Z", "2026-12-01T08:00:00Z", "SCHEDULED")
        fields.update(maintenance=(window,), source="agent")
    if kind is EventKind.REPAIR_FAILED:
        fields.update(attempt=None, source="reconciler", reason="The reconciler could not repair the job: refused.")
    if kind is EventKind.COMMAND_FAILED:
        fields.update(exit_code=3, source="agent")
    if kind is EventKind.WAITING_FOR_QUOTA:
        fields.update(reason="Waiting for quota: needs 4 v4 chips.", source="submit")
    if kind is EventKind.TIME_LIMIT_REACHED:
        fields.update(source="reconciler", reason="The job's time_limit of 5s was reached: it used 6 s.")
    if kind is EventKind.HELD_OVER_RELEASED:
        fields.update(attempt=None, source="reconciler", holding=HELD.holding)
    if kind is EventKind.RUN_END_SCHEDULED:
        fields.update(source="reconciler", run_ends_at=datetime(2026, 12, 1, 4, 0, tzinfo=timezone.utc))
    fields.update(changes)
    return Observation(**fields)


def moved(result: Decision | Ignored) -> Decision:
    assert isinstance(result, Decision), f"expected a move, got {result!r}"
    return result


# --- states and events are documented data --------------------------------------------


def _member_docstrings(class_name: str) -> dict[str, str | None]:
    """Each enum member assigned in the class body of states.py, and the string literal after it."""
    tree = ast.parse(inspect.getsource(states_module))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    docs: dict[str, str | None] = {}
    for index, node in enumerate(cls.body):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            after = cls.body[index + 1] if index + 1 < len(cls.body) else None
            is_doc = (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            )
            docs[node.targets[0].id] = after.value.value if is_doc else None  # type: ignore[union-attr]
    return docs


@pytest.mark.parametrize("enum", [JobState, EventKind], ids=lambda e: e.__name__)
def test_every_member_is_followed_by_a_docstring_in_the_source(enum: type) -> None:
    """States and events are documented data: each member assignment has a string literal after it."""
    docs = _member_docstrings(enum.__name__)
    assert set(docs) == {member.name for member in enum}  # type: ignore[attr-defined]
    undocumented = [name for name, doc in docs.items() if not (doc and doc.strip())]
    assert undocumented == []


@pytest.mark.parametrize("enum", [JobState, EventKind], ids=lambda e: e.__name__)
def test_every_enum_has_a_class_docstring(enum: type) -> None:
    """The enum itself says what it is."""
    assert enum.__doc__ and enum.__doc__.strip()


def test_every_state_value_is_its_name_as_stored_in_firestore() -> None:
    """The stored value is the upper-case name, as the state table of docs/records.md lists it."""
    assert [s.value for s in JobState] == [
        "QUEUED",
        "PROVISIONING",
        "RUNNING",
        "RECOVERING",
        "SUCCEEDED",
        "FAILED",
        "CANCELLED",
    ]


def test_terminal_states_are_succeeded_failed_and_cancelled() -> None:
    """Exactly the three end states are terminal; the rest are active."""
    assert {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED} == TERMINAL
    assert set(JobState) == ACTIVE | TERMINAL
    assert not ACTIVE & TERMINAL
    assert all(state.is_terminal == (state in TERMINAL) for state in JobState)


# --- the transition table -------------------------------------------------------------


def test_every_transition_leads_somewhere() -> None:
    """No entry of the table has an empty set of targets."""
    assert all(targets for targets in TRANSITIONS.values())


def test_no_transition_starts_from_a_terminal_state_but_a_users_resume_or_rerun() -> None:
    """Terminal states accept nothing but a user's resume (FAILED, CANCELLED) or rerun (any)."""
    restarts = {EventKind.RESUME_REQUESTED, EventKind.RERUN_REQUESTED}
    assert [pair for pair in TRANSITIONS if pair[0] in TERMINAL and pair[1] not in restarts] == []
    assert {s for s, k in TRANSITIONS if k is EventKind.RESUME_REQUESTED} == {JobState.FAILED, JobState.CANCELLED}
    assert {s for s, k in TRANSITIONS if k is EventKind.RERUN_REQUESTED} == TERMINAL


def test_every_active_state_can_be_cancelled() -> None:
    """A user can cancel a job at any point before it ends."""
    for state in ACTIVE:
        assert allowed_targets(state, EventKind.CANCEL_REQUESTED) == {JobState.CANCELLED}


def test_every_event_kind_appears_in_the_table() -> None:
    """No event is dead: each one moves a job from at least one state."""
    assert {kind for _, kind in TRANSITIONS} == set(EventKind)


@pytest.mark.parametrize("pair", OTHER_PAIRS, ids=pair_id)
def test_allowed_targets_is_empty_for_a_pair_not_in_the_table(
    pair: tuple[JobState, EventKind],
) -> None:
    """Absent pairs change nothing."""
    assert allowed_targets(*pair) == frozenset()


# --- decide() against every state and every event --------------------------------------


@pytest.mark.parametrize("pair", TABLE_PAIRS, ids=pair_id)
@pytest.mark.parametrize("rule", ["resume", "rerun", "fail"])
def test_an_event_in_the_table_moves_the_job_to_an_allowed_target(pair: tuple[JobState, EventKind], rule: str) -> None:
    """For each (state, event) of the table, decide() moves the job to one of its targets."""
    state, kind = pair
    job = make_job(state, on_error=rule, on_preemption=rule)
    if kind in (EventKind.WAITING_FOR_POOL, EventKind.POOL_REQUEUED, EventKind.LEFT_POOL):
        job = job.evolve(warm_pool="team-pool")  # the events of a job on a warm pool
    if kind is EventKind.HELD_OVER_RELEASED:
        job = job.evolve(held_over=(HELD,))  # an earlier attempt's holding, kept through its grace
    decision = moved(decide(job, observation(kind, job), LATER))
    assert decision.job.state in TRANSITIONS[pair]
    assert decision.event.from_state is state
    assert decision.event.to_state is decision.job.state
    assert decision.job.state_reason == decision.event.reason != ""


@pytest.mark.parametrize("pair", OTHER_PAIRS, ids=pair_id)
def test_an_event_not_in_the_table_is_ignored_and_the_job_is_unchanged(
    pair: tuple[JobState, EventKind],
) -> None:
    """For each (state, event) outside the table, decide() returns Ignored and the job stays as it was."""
    state, kind = pair
    job = make_job(state)
    before = job.evolve()
    result = decide(job, observation(kind, job), LATER)
    assert isinstance(result, Ignored)
    assert kind.value in result.reason
    assert job == before


@pytest.mark.parametrize("state", sorted(TERMINAL, key=lambda s: s.value))
@pytest.mark.parametrize(
    "kind", [k for k in EventKind if k not in (EventKind.RESUME_REQUESTED, EventKind.RERUN_REQUESTED)]
)
def test_a_terminal_job_ignores_every_event(state: JobState, kind: EventKind) -> None:
    """Nothing but a user's resume or rerun moves a job that has ended, not even a cancel."""
    job = make_job(state)
    assert isinstance(decide(job, observation(kind, job), LATER), Ignored)


# --- decide(): attempts ---------------------------------------------------------------


@pytest.mark.parametrize("seen_attempt", [1, 3])
def test_an_observation_for_another_attempt_is_ignored(seen_attempt: int) -> None:
    """A late report of an older attempt (or one from the future) changes nothing."""
    job = make_job(JobState.PROVISIONING).evolve(attempt=2, queued_resource="train-1-a2")
    result = decide(job, observation(EventKind.WORKERS_STARTED, job, attempt=seen_attempt), LATER)
    assert isinstance(result, Ignored)
    assert str(seen_attempt) in result.reason and "2" in result.reason


def test_a_cancel_concerns_the_job_whatever_its_attempt() -> None:
    """A cancel carries no attempt and applies to the current one."""
    job = make_job(JobState.RUNNING).evolve(attempt=4, queued_resource="train-1-a4")
    decision = moved(decide(job, observation(EventKind.CANCEL_REQUESTED, job), LATER))
    assert decision.job.state is JobState.CANCELLED
    assert decision.event.source == "user"


def test_a_duplicate_observation_is_ignored_the_second_time() -> None:
    """A redelivered 'workers started' moves the job once."""
    job = make_job(JobState.PROVISIONING)
    first = moved(decide(job, observation(EventKind.WORKERS_STARTED, job), LATER))
    again = decide(first.job, observation(EventKind.WORKERS_STARTED, first.job), LATER)
    assert isinstance(again, Ignored)


# --- decide(): a failed command --------------------------------------------------------


def test_a_failed_command_with_on_error_fail_fails_the_job_with_its_exit_code() -> None:
    """on_error fail: the job ends FAILED, keeping the exit code, without using a restart."""
    job = make_job(JobState.RUNNING, on_error="fail")
    decision = moved(decide(job, observation(EventKind.COMMAND_FAILED, job, exit_code=3), LATER))
    assert decision.job.state is JobState.FAILED
    assert decision.job.exit_code == 3
    assert decision.job.restarts == 0
    assert decision.job.ended_at == LATER


def test_a_failed_command_with_on_error_resume_and_restarts_left_recovers_resuming() -> None:
    """on_error resume: RECOVERING, one more restart used, the next attempt resumes."""
    job = make_job(JobState.RUNNING, on_error="resume", max_restarts=2).evolve(restarts=1)
    decision = moved(decide(job, observation(EventKind.COMMAND_FAILED, job, exit_code=7), LATER))
    assert decision.job.state is JobState.RECOVERING
    assert decision.job.restarts == 2
    assert decision.job.resume_next is True
    assert decision.job.exit_code == 7
    assert decision.job.ended_at is None


def test_a_failed_command_with_on_error_rerun_recovers_from_scratch() -> None:
    """on_error rerun: RECOVERING, and the next attempt does not resume."""
    job = make_job(JobState.RUNNING, on_error="rerun").evolve(resume_next=True)
    decision = moved(decide(job, observation(EventKind.COMMAND_FAILED, job), LATER))
    assert decision.job.state is JobState.RECOVERING
    assert decision.job.restarts == 1
    assert decision.job.resume_next is False


@pytest.mark.parametrize("rule", ["resume", "rerun"])
@pytest.mark.parametrize("max_restarts", [0, 1, 5])
def test_a_failed_command_with_restarts_used_up_fails_the_job(rule: str, max_restarts: int) -> None:
    """When restarts == max_restarts the rules give up: FAILED, ended, the budget untouched."""
    job = make_job(JobState.RUNNING, on_error=rule, max_restarts=max_restarts)
    job = job.evolve(restarts=max_restarts)
    decision = moved(decide(job, observation(EventKind.COMMAND_FAILED, job, exit_code=1), LATER))
    assert decision.job.state is JobState.FAILED
    assert decision.job.restarts == max_restarts
    assert decision.job.exit_code == 1
    assert decision.job.ended_at == LATER
    assert str(max_restarts) in decision.job.state_reason


# --- decide(): lost capacity -----------------------------------------------------------


@pytest.mark.parametrize("state", [JobState.PROVISIONING, JobState.RUNNING])
@pytest.mark.parametrize(("rule", "resume"), [("resume", True), ("rerun", False)])
def test_lost_capacity_recovers_by_on_preemption(state: JobState, rule: str, resume: bool) -> None:
    """on_preemption resume or rerun: RECOVERING with one restart used and no exit code."""
    job = make_job(state, on_preemption=rule)
    decision = moved(decide(job, observation(EventKind.CAPACITY_LOST, job), LATER))
    assert decision.job.state is JobState.RECOVERING
    assert decision.job.restarts == 1
    assert decision.job.resume_next is resume
    assert decision.job.exit_code is None


def test_lost_capacity_with_on_preemption_fail_fails_the_job() -> None:
    """on_preemption fail: a preemption ends the job."""
    job = make_job(JobState.RUNNING, on_preemption="fail")
    decision = moved(decide(job, observation(EventKind.CAPACITY_LOST, job), LATER))
    assert decision.job.state is JobState.FAILED
    assert decision.job.ended_at == LATER


def test_preemptions_and_errors_share_one_restart_budget() -> None:
    """A preemption and then an error with max_restarts 1: the error fails the job."""
    job = make_job(JobState.RUNNING, on_error="resume", on_preemption="resume", max_restarts=1)
    lost = moved(decide(job, observation(EventKind.CAPACITY_LOST, job), LATER))
    requested = moved(decide(lost.job, observation(EventKind.NEXT_ATTEMPT_REQUESTED, lost.job), LATER))
    started = moved(decide(requested.job, observation(EventKind.WORKERS_STARTED, requested.job), LATER))
    failed = moved(decide(started.job, observation(EventKind.COMMAND_FAILED, started.job), LATER))
    assert failed.job.state is JobState.FAILED


# --- decide(): a job bigger than its pool's whole quota --------------------------------


QUOTA_SENTENCE = "The job asks for 4 chips of v4 in us-central2-b, whose quota is 2: it could never run there"


def test_a_job_over_the_whole_quota_waits_in_its_next_zone_same_attempt() -> None:
    """QUOTA_EXCEEDED with a later zone: QUEUED there, same attempt (it never asked for capacity)."""
    job = make_job(JobState.QUEUED)
    seen = observation(EventKind.QUOTA_EXCEEDED, job, reason=QUOTA_SENTENCE, source="submit")
    decision = moved(decide(job, seen, LATER))
    assert decision.job.state is JobState.QUEUED
    assert (decision.job.zone, decision.job.attempt, decision.job.restarts) == ("us-east5-a", 1, 0)
    assert decision.job.queued_resource == job.queued_resource
    assert [u.zone for u in decision.job.usage] == ["us-east5-a"]
    assert decision.job.state_reason == f"{QUOTA_SENTENCE}; attempt 1 waits in us-east5-a instead."
    assert decision.job.ended_at is None


def test_a_job_over_the_whole_quota_of_its_last_zone_fails_naming_the_quota() -> None:
    """QUOTA_EXCEEDED in the last zone: FAILED, ended, the reason names the quota and what to do."""
    job = make_job(JobState.QUEUED, zones=[ZONE])
    decision = moved(decide(job, observation(EventKind.QUOTA_EXCEEDED, job, reason=QUOTA_SENTENCE), LATER))
    assert decision.job.state is JobState.FAILED
    assert decision.job.ended_at == LATER
    assert "whose quota is 2" in decision.job.state_reason
    assert decision.job.state_reason.endswith("ask an admin to raise the quota, or ask for fewer chips.")
    assert decision.job.accounting().chip_hours == 0


# --- decide(): the next attempt --------------------------------------------------------


def test_the_next_attempt_increments_attempt_and_names_its_queued_resource() -> None:
    """NEXT_ATTEMPT_REQUESTED: attempt N+1, queued_resource {job_id}-a{N+1}, PROVISIONING."""
    job = make_job(JobState.RECOVERING).evolve(
        attempt=2, queued_resource="train-1-a2", exit_code=5, capacity_state="SUSPENDED"
    )
    decision = moved(
        decide(
            job,
            observation(EventKind.NEXT_ATTEMPT_REQUESTED, job, capacity_state="ACCEPTED"),
            LATER,
        )
    )
    assert decision.job.state is JobState.PROVISIONING
    assert decision.job.attempt == 3
    assert decision.job.queued_resource == "train-1-a3"
    assert decision.job.capacity_state == "ACCEPTED"
    assert decision.job.exit_code is None
    assert "train-1-a3" in decision.job.state_reason


def test_a_whole_recovery_writes_a_consecutive_timeline() -> None:
    """Queued, provisioning, running, recovering, provisioning, running, succeeded: seq 1..7."""
    spec = parse_spec(
        {
            "job_id": "train-1",
            "name": "train",
            "owner": "alice",
            "accelerator_type": "v4-8",
            "command": "python train.py",
        }
    )
    job, first = new_job(spec, ZONE, NOW)
    events = [first]
    steps = [
        EventKind.ADMITTED,
        EventKind.WORKERS_STARTED,
        EventKind.CAPACITY_LOST,
        EventKind.NEXT_ATTEMPT_REQUESTED,
        EventKind.WORKERS_STARTED,
        EventKind.WORKER_SUCCEEDED,
    ]
    for minute, kind in enumerate(steps, start=1):
        decision = moved(decide(job, observation(kind, job), NOW + timedelta(minutes=minute)))
        job = decision.job
        events.append(decision.event)
    assert [e.seq for e in events] == list(range(1, 8))
    assert job.event_seq == 7
    assert [e.document_id for e in events] == [
        "0001-queued",
        "0002-provisioning",
        "0003-running",
        "0004-recovering",
        "0005-provisioning",
        "0006-running",
        "0007-succeeded",
    ]
    assert [e.attempt for e in events] == [1, 1, 1, 1, 1, 2, 2]
    assert (job.attempt, job.restarts, job.exit_code) == (2, 1, 0)
    assert job.started_at == NOW + timedelta(minutes=2)
    assert job.ended_at == NOW + timedelta(minutes=6)


# --- decide(): times, sequence numbers, capacity state --------------------------------


@pytest.mark.parametrize(
    ("state", "kind", "to_state"),
    [
        (JobState.RUNNING, EventKind.WORKER_SUCCEEDED, JobState.SUCCEEDED),
        (JobState.QUEUED, EventKind.CAPACITY_REQUEST_FAILED, JobState.FAILED),
        (JobState.RECOVERING, EventKind.CAPACITY_REQUEST_FAILED, JobState.FAILED),
        (JobState.PROVISIONING, EventKind.CANCEL_REQUESTED, JobState.CANCELLED),
    ],
)
def test_a_terminal_transition_sets_ended_at(state: JobState, kind: EventKind, to_state: JobState) -> None:
    """Reaching SUCCEEDED, FAILED or CANCELLED records when the job ended."""
    job = make_job(state)
    decision = moved(decide(job, observation(kind, job), LATER))
    assert decision.job.state is to_state
    assert decision.job.ended_at == LATER
    assert decision.job.updated_at == LATER


@pytest.mark.parametrize("pair", TABLE_PAIRS, ids=pair_id)
def test_a_move_writes_the_next_event_at_now(pair: tuple[JobState, EventKind]) -> None:
    """Each move's event has seq event_seq + 1, the time given, and the job's attempt."""
    state, kind = pair
    job = make_job(state).evolve(event_seq=41, warm_pool="team-pool" if kind is EventKind.LEFT_POOL else "")
    if kind is EventKind.HELD_OVER_RELEASED:
        job = job.evolve(held_over=(HELD,))
    decision = moved(decide(job, observation(kind, job), LATER))
    assert decision.event.seq == decision.job.event_seq == 42
    assert decision.event.at == decision.job.updated_at == LATER
    assert decision.event.attempt == job.attempt
    assert decision.event.document_id == f"0042-{decision.job.state.value.lower()}"
    assert (decision.job.ended_at == LATER) is decision.job.state.is_terminal


def test_admission_records_the_capacity_state_and_a_reason_naming_the_queued_resource() -> None:
    """ADMITTED: PROVISIONING, capacity_state from the observation, event 0002-provisioning."""
    job = make_job(JobState.QUEUED)
    decision = moved(decide(job, observation(EventKind.ADMITTED, job, capacity_state="ACCEPTED"), LATER))
    assert decision.job.capacity_state == "ACCEPTED"
    assert decision.event.document_id == "0002-provisioning"
    assert "train-1-a1" in decision.event.reason


def test_a_reason_given_with_the_observation_is_kept() -> None:
    """A source's own sentence wins over the default one."""
    job = make_job(JobState.QUEUED)
    seen = observation(EventKind.ADMITTED, job, reason="Admitted after 3 jobs ahead finished.")
    decision = moved(decide(job, seen, LATER))
    assert decision.job.state_reason == "Admitted after 3 jobs ahead finished."


def test_a_capacity_change_to_the_same_state_is_ignored() -> None:
    """CAPACITY_CHANGED repeating the current capacity_state is not a new event."""
    job = make_job(JobState.PROVISIONING).evolve(capacity_state="WAITING_FOR_RESOURCES")
    seen = observation(EventKind.CAPACITY_CHANGED, job, capacity_state="WAITING_FOR_RESOURCES")
    assert isinstance(decide(job, seen, LATER), Ignored)


def test_a_capacity_change_to_another_state_is_recorded() -> None:
    """CAPACITY_CHANGED to a new TPU state stays PROVISIONING and writes an event."""
    job = make_job(JobState.PROVISIONING).evolve(capacity_state="ACCEPTED", event_seq=2)
    seen = observation(EventKind.CAPACITY_CHANGED, job, capacity_state="PROVISIONING")
    decision = moved(decide(job, seen, LATER))
    assert decision.job.state is JobState.PROVISIONING
    assert decision.job.capacity_state == "PROVISIONING"
    assert decision.event.document_id == "0003-provisioning"


def test_workers_starting_set_started_at_and_active_capacity() -> None:
    """WORKERS_STARTED: RUNNING, capacity ACTIVE, started_at now."""
    job = make_job(JobState.PROVISIONING)
    decision = moved(decide(job, observation(EventKind.WORKERS_STARTED, job), LATER))
    assert decision.job.state is JobState.RUNNING
    assert decision.job.capacity_state == "ACTIVE"
    assert decision.job.started_at == LATER


def test_decide_does_not_change_the_job_it_is_given() -> None:
    """decide() is pure: the input job is equal before and after."""
    job = make_job(JobState.RUNNING, on_error="resume")
    before = job.evolve()
    moved(decide(job, observation(EventKind.COMMAND_FAILED, job), LATER))
    assert job == before

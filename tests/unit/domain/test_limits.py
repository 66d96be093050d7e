"""Time limits and hang detection as pure rules: what is counted from when, and what decide() makes of it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tpujobs.domain import limits
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Decision, Ignored, Observation, decide
from tpujobs.engine.messages import decode_report
from tpujobs.engine.worker_reports import WorkerReport

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
ZONE = "us-central2-b"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def moved(job: Job, seen: Observation, now: datetime) -> Job:
    outcome = decide(job, seen, now)
    assert isinstance(outcome, Decision), outcome
    return outcome.job


def running(accelerator: str = "v4-16", started: float = 60, **spec: Any) -> Job:
    """A job submitted at T0, admitted at T0, whose workers started the command at `started` s."""
    data = {"job_id": "train-1", "name": "train", "owner": "ada", "accelerator_type": accelerator, "command": "x"}
    job, _ = new_job(parse_spec({**data, **spec}), ZONE, T0)
    job = moved(job, Observation(EventKind.ADMITTED, 1, "tpu", capacity_state="WAITING_FOR_RESOURCES"), T0)
    return moved(job, Observation(EventKind.WORKERS_STARTED, 1, "agent", worker="0-0"), at(started))


def next_attempt_running(job: Job, lost_at: float, started: float) -> Job:
    """The job preempted at `lost_at` s and its next attempt's workers started at `started` s."""
    job = moved(job, Observation(EventKind.CAPACITY_LOST, job.attempt, "tpu", "Preempted"), at(lost_at))
    job = moved(job, Observation(EventKind.NEXT_ATTEMPT_REQUESTED, job.attempt, "tpu"), at(lost_at))
    return moved(job, Observation(EventKind.WORKERS_STARTED, job.attempt, "agent", worker="0-0"), at(started))


# --- time limits ------------------------------------------------------------------------


def test_the_time_limit_counts_from_the_capacity_not_from_the_submission() -> None:
    """Submitted at 0, started at 60, time_limit 5m: not reached at 359 s, reached at 360 s."""
    job = running(time_limit="5m")
    assert limits.limit_reached(job, at(359)) is None
    reached = limits.limit_reached(job, at(360))
    assert reached is not None
    assert (reached.limit, reached.limit_seconds, reached.used_seconds) == ("time_limit", 300, 300.0)


def test_a_job_that_never_held_capacity_is_past_no_limit() -> None:
    """Hours in the queue do not count against the time limit."""
    data = {
        "job_id": "queued",
        "name": "queued",
        "owner": "ada",
        "accelerator_type": "v4-8",
        "command": "x",
        "time_limit": "1m",
    }
    job, _ = new_job(parse_spec(data), ZONE, T0)
    assert limits.limit_reached(job, at(10_000)) is None


def test_the_time_limit_spans_attempts_and_the_attempt_limit_restarts_with_each() -> None:
    """Started at 60, preempted at 200, attempt 2 started at 300: the job's 10m runs out at 660,
    attempt 2's 5m at 600, and the earlier one is what is reached."""
    job = next_attempt_running(running(time_limit="10m", attempt_time_limit="5m"), lost_at=200, started=300)
    assert job.attempt == 2
    assert limits.limit_reached(job, at(599)) is None
    reached = limits.limit_reached(job, at(600))
    assert reached is not None and reached.limit == "attempt_time_limit" and reached.used_seconds == 300
    whole = limits.limit_reached(job, at(660), which="time_limit")
    assert whole is not None and whole.used_seconds == 600


def test_the_reason_names_the_limit_and_the_time_used() -> None:
    """The sentence a user reads in the timeline."""
    job = running(time_limit="1h30m")
    reached = limits.limit_reached(job, at(60 + 5401))
    assert reached is not None
    assert "time_limit of 1h30m" in reached.reason and "5401 s" in reached.reason


def test_a_limit_reached_fails_the_job_whatever_its_rules() -> None:
    """on_error resume and restarts left: the limit still ends the job FAILED, with the reason."""
    job = running(time_limit="5s", on_error="resume", on_preemption="resume", max_restarts=5)
    reached = limits.limit_reached(job, at(70))
    assert reached is not None
    seen = Observation(EventKind.TIME_LIMIT_REACHED, 1, "reconciler", reason=reached.reason, limit=reached.limit)
    outcome = decide(job, seen, at(70))
    assert isinstance(outcome, Decision)
    assert outcome.job.state is JobState.FAILED and outcome.job.ended_at == at(70)
    assert outcome.event.reason == reached.reason and outcome.event.source == "reconciler"


def test_the_agents_limit_report_is_worded_by_the_control_plane() -> None:
    """The agent names only the limit: the reason counts the time used from the capacity's start."""
    job = running(attempt_time_limit="30s")
    seen = Observation(
        EventKind.TIME_LIMIT_REACHED, 1, "agent", exit_code=143, worker="0-1", limit="attempt_time_limit"
    )
    outcome = decide(job, seen, at(91))
    assert isinstance(outcome, Decision)
    assert outcome.job.state is JobState.FAILED and outcome.job.exit_code == 143
    assert "attempt_time_limit of 30s" in outcome.event.reason
    assert "31 s" in outcome.event.reason and "worker 0-1" in outcome.event.reason


def test_a_limit_report_for_a_limit_the_job_does_not_have_changes_nothing() -> None:
    """A report naming a limit the spec never set is not believed."""
    job = running(time_limit="1h")
    seen = Observation(EventKind.TIME_LIMIT_REACHED, 1, "agent", exit_code=143, limit="attempt_time_limit")
    assert isinstance(decide(job, seen, at(90)), Ignored)


def test_an_ended_job_is_past_no_limit() -> None:
    """Once FAILED or SUCCEEDED, nothing is enforced again."""
    job = running(time_limit="5s").evolve(state=JobState.SUCCEEDED)
    assert limits.limit_reached(job, at(1000)) is None


def test_the_agent_gets_a_relative_limit_first_and_an_absolute_one_once_capacity_was_held() -> None:
    """Attempt 1's startup script is written before capacity is held; attempt 2's knows when it was."""
    first = running(time_limit="10m", attempt_time_limit="2m")
    data = {
        "job_id": "fresh",
        "name": "fresh",
        "owner": "ada",
        "accelerator_type": "v4-8",
        "command": "x",
        "time_limit": "10m",
    }
    fresh, _ = new_job(parse_spec(data), ZONE, T0)
    assert limits.agent_deadlines(fresh) == {
        "time_limit_at": None,
        "time_limit_seconds": 600,
        "attempt_time_limit_seconds": None,
    }
    later = limits.agent_deadlines(first.as_next_attempt())
    assert later == {
        "time_limit_at": "2025-03-01T12:11:00Z",
        "time_limit_seconds": None,
        "attempt_time_limit_seconds": 120,
    }


# --- hang detection -----------------------------------------------------------------------


def test_an_attempt_is_hung_only_when_every_worker_is_quiet_past_the_timeout() -> None:
    """Two workers; one printed 10 s ago with a 60 s timeout: not hung. Both quiet 61 s: hung."""
    job = running(hang_timeout="1m")
    quiet = [limits.WorkerProgress("0-0", last_output_at=at(100)), limits.WorkerProgress("0-1", started_at=at(60))]
    busy = [quiet[0], limits.WorkerProgress("0-1", last_output_at=at(150))]
    assert limits.hung(job, busy, at(160)) is None
    found = limits.hung(job, quiet, at(161))
    assert found is not None
    assert found.silent == (("0-0", 61.0), ("0-1", 101.0))
    assert "0-0 for 61 s" in found.reason and "0-1 for 101 s" in found.reason and "1m" in found.reason


def test_a_checkpoint_is_progress_and_a_worker_never_heard_counts_from_the_attempts_start() -> None:
    """A recent checkpoint keeps the attempt alive; a worker without a record counts from the start."""
    job = running(hang_timeout="30s")
    ticking = [limits.WorkerProgress("0-0", checkpoint_at=at(80))]
    assert limits.hung(job, ticking, at(100)) is None
    found = limits.hung(job, [], at(91))
    assert found is not None and [w for w, _ in found.silent] == ["0-0", "0-1"]


def test_a_worker_that_finished_is_not_silent() -> None:
    """Worker 0-0 exited 0; only 0-1 is watched."""
    job = moved(running(hang_timeout="30s"), Observation(EventKind.WORKER_SUCCEEDED, 1, "agent", worker="0-0"), at(61))
    found = limits.hung(job, [limits.WorkerProgress("0-1", last_output_at=at(62))], at(93))
    assert found is not None and found.silent == (("0-1", 31.0),)


def test_a_worker_whose_record_says_it_exited_0_is_not_silent() -> None:
    """A job of many hosts counts exits on the worker records (`workers_done` stays empty):
    worker 0-0 exited 0 long ago, 0-1 printed 31 s ago with a 30 s timeout; only 0-1 is quiet,
    and while 0-1 moves the attempt is not hung."""
    job = running(hang_timeout="30s")
    assert job.workers_done == ()
    done = limits.WorkerProgress("0-0", last_output_at=at(5), exit_code=0)
    found = limits.hung(job, [done, limits.WorkerProgress("0-1", last_output_at=at(62))], at(93))
    assert found is not None and found.silent == (("0-1", 31.0),)
    assert limits.hung(job, [done, limits.WorkerProgress("0-1", last_output_at=at(80))], at(93)) is None
    failed = limits.WorkerProgress("0-0", last_output_at=at(5), exit_code=3)  # not done: counted as quiet
    found = limits.hung(job, [failed, limits.WorkerProgress("0-1", last_output_at=at(62))], at(93))
    assert found is not None and [w for w, _ in found.silent] == ["0-0", "0-1"]


def test_worker_0_that_outlived_its_command_still_carries_its_slices_progress() -> None:
    """Worker 0 exited 0 and speaks on for peer 0-1, which writes nothing itself (its record has only its start):
    worker 0's heartbeats put the slice's last output on its record, so the attempt is not hung while 0-1 prints;
    once that goes quiet too, only 0-1 is named."""
    job = running(hang_timeout="30s")
    peer = limits.WorkerProgress("0-1", started_at=at(10))
    printing = limits.WorkerProgress("0-0", last_output_at=at(90), exit_code=0)
    assert limits.hung(job, [printing, peer], at(100)) is None
    quiet = limits.WorkerProgress("0-0", last_output_at=at(60), exit_code=0)
    found = limits.hung(job, [quiet, peer], at(100))
    assert found is not None and found.silent == (("0-1", 90.0),)


def test_workers_are_read_only_once_the_job_itself_shows_no_progress_within_the_timeout() -> None:
    """might_hang is the cheap gate: no hang_timeout, not RUNNING, or a recent start: no read."""
    assert not limits.might_hang(running(), at(10_000))
    job = running(hang_timeout="30s")
    assert not limits.might_hang(job, at(89))
    assert limits.might_hang(job, at(90))
    assert not limits.might_hang(job.evolve(state=JobState.RECOVERING), at(90))


@pytest.mark.parametrize(
    ("rule", "restarts", "state", "resume"),
    [
        ("resume", 0, JobState.RECOVERING, True),
        ("rerun", 0, JobState.RECOVERING, False),
        ("fail", 0, JobState.FAILED, False),
        ("resume", 1, JobState.FAILED, False),
    ],
)
def test_on_hang_decides_within_max_restarts(rule: str, restarts: int, state: JobState, resume: bool) -> None:
    """resume and rerun restart within the budget; fail, or a spent budget, ends the job."""
    job = running(hang_timeout="5s", on_hang=rule, max_restarts=1).evolve(restarts=restarts)
    seen = Observation(EventKind.HUNG, 1, "reconciler", reason="Attempt 1 is hung: 0-0 for 6 s")
    outcome = decide(job, seen, at(70))
    assert isinstance(outcome, Decision)
    assert outcome.job.state is state and outcome.event.reason.startswith("Attempt 1 is hung: 0-0 for 6 s")
    if state is JobState.RECOVERING:
        assert outcome.job.resume_next is resume and outcome.job.restarts == 1
    else:
        assert "restarts are used up" in outcome.event.reason or "'fail'" in outcome.event.reason


def test_the_default_on_hang_is_fail() -> None:
    """Left out, a hung attempt ends the job."""
    job = running(hang_timeout="5s", max_restarts=3)
    outcome = decide(job, Observation(EventKind.HUNG, 1, "reconciler", reason="hung"), at(70))
    assert isinstance(outcome, Decision) and outcome.job.state is JobState.FAILED


def test_a_hang_seen_for_an_attempt_that_is_over_changes_nothing() -> None:
    """The reconciler's listing may be a tick old: attempt 1's hang means nothing at attempt 2."""
    job = next_attempt_running(running(hang_timeout="5s", on_hang="resume"), lost_at=100, started=120)
    assert isinstance(decide(job, Observation(EventKind.HUNG, 1, "reconciler", reason="hung"), at(130)), Ignored)


# --- the reports -----------------------------------------------------------------------


def test_a_heartbeat_carries_the_last_output_time_and_an_exit_the_limit() -> None:
    """Both new fields pass the door; a limit the schema does not know is refused naming the field."""
    import json

    base = {"job_id": "train-1", "attempt": 1, "slice_id": 0, "worker_id": 0, "nonce": "0" * 16, "at": None}
    beat = decode_report(
        WorkerReport, json.dumps({**base, "kind": "heartbeat", "last_output_at": "2025-03-01T12:00:01.500Z"}).encode()
    )
    assert beat.last_output_at == at(1.5)
    exited = decode_report(
        WorkerReport, json.dumps({**base, "kind": "exited", "exit_code": 143, "limit": "time_limit"}).encode()
    )
    assert exited.limit == "time_limit"
    with pytest.raises(ValueError, match="limit"):
        decode_report(WorkerReport, json.dumps({**base, "kind": "exited", "exit_code": 1, "limit": "forever"}).encode())

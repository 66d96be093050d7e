"""Time limits and hang detection through the engine's handlers and its reconciler, on the fakes."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from engine_harness import ZONE, Engine

from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.states import JobState
from tpujobs.local.testing import ManualClock as Clock
from tpujobs.local.testing import inbound as message


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def jobs(engine, clock) -> Engine:
    return engine(clock=clock, heartbeat_timeout_seconds=60.0, stuck_after_seconds=30.0)


def running(jobs: Engine, job_id: str, accelerator: str = "v4-16", **spec: object) -> str:
    """A submitted job whose every worker said `started`: RUNNING, its capacity held from now."""
    data = {"job_id": job_id, "name": "train", "owner": "ada@example.com", "accelerator_type": accelerator}
    assert jobs.handle(message("tpujobs-submit", {**data, "command": "x", **spec})).kind == "provisioning"
    for worker in range(2 if accelerator == "v4-16" else 1):
        beat(jobs, "started", worker, job_id=job_id)
    assert jobs.store.get(job_id).state is JobState.RUNNING
    return job_id


def beat(jobs: Engine, kind: str, worker: int, attempt: int = 1, job_id: str = "train-1", **extra) -> None:
    jobs.report(kind, attempt, worker=worker, job_id=job_id, **extra)


def stamp(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def released(jobs: Engine, name: str) -> bool:
    status = jobs.capacity.status(ZONE, name)
    return status is None or status.state is HoldingState.RELEASING


def test_a_job_past_its_time_limit_fails_naming_the_limit_and_its_capacity_is_released(jobs, clock):
    """time_limit 5m: RUNNING at 299 s; the tick after 300 s ends it FAILED and deletes its queued resource."""
    running(jobs, "limited", time_limit="5m", on_error="resume", max_restarts=3)
    clock.advance(299)
    for worker in (0, 1):
        beat(jobs, "heartbeat", worker, job_id="limited")
    assert jobs.tick().observed == []
    assert jobs.store.get("limited").state is JobState.RUNNING

    clock.advance(2)
    for worker in (0, 1):
        beat(jobs, "heartbeat", worker, job_id="limited")
    report = jobs.tick()
    job = jobs.store.get("limited")
    assert job.state is JobState.FAILED
    assert "time_limit of 5m was reached" in job.state_reason and "301 s" in job.state_reason
    last = jobs.store.events("limited")[-1]
    assert (last.to_state, last.source, last.reason) == (JobState.FAILED, "reconciler", job.state_reason)
    assert report.observed == [f"limited: {job.state_reason}"]
    assert released(jobs, "limited-a1")


def test_the_agents_limit_report_fails_the_job_instead_of_restarting_it(jobs, clock):
    """on_error resume with restarts left: an `exited` that names the limit still ends the job FAILED."""
    running(jobs, "stopped", accelerator="v4-8", attempt_time_limit="1m", on_error="resume", max_restarts=3)
    clock.advance(61)
    beat(jobs, "exited", 0, job_id="stopped", exit_code=143, limit="attempt_time_limit", detail="time limit reached")
    job = jobs.store.get("stopped")
    assert (job.state, job.attempt, job.exit_code) == (JobState.FAILED, 1, 143)
    assert "attempt_time_limit of 1m was reached" in job.state_reason and "worker 0-0" in job.state_reason
    assert released(jobs, "stopped-a1")


def test_the_heartbeats_last_output_time_is_kept_on_the_worker_record(jobs, clock):
    """The jobs stores `last_output_at` where the reconciler reads it, one field per worker."""
    running(jobs, "chatty", accelerator="v4-8", hang_timeout="1m")
    printed = clock.now
    beat(jobs, "heartbeat", 0, job_id="chatty", last_output_at=stamp(printed))
    (record,) = jobs.store.attempt_workers("chatty", 1)
    assert record.last_output_at == printed


def test_a_silent_attempt_is_hung_resumed_once_then_failed_at_its_restart_limit(jobs, clock):
    """hang_timeout 30s, on_hang resume, max_restarts 1: output keeps it RUNNING; 31 s of silence
    from both workers resumes it, and the second attempt's silence ends the job."""
    running(jobs, "quiet", hang_timeout="30s", on_hang="resume", max_restarts=1)
    clock.advance(25)
    beat(jobs, "heartbeat", 0, job_id="quiet", last_output_at=stamp(clock.now))
    beat(jobs, "heartbeat", 1, job_id="quiet")
    clock.advance(20)  # 45 s since the start, 20 s since worker 0 printed
    beat(jobs, "heartbeat", 0, job_id="quiet", last_output_at=stamp(clock.now))
    beat(jobs, "heartbeat", 1, job_id="quiet")
    assert jobs.tick().observed == []
    assert jobs.store.get("quiet").state is JobState.RUNNING

    clock.advance(31)  # worker 0's last line is 31 s old, worker 1 never printed (76 s since its start)
    for worker in (0, 1):
        beat(jobs, "heartbeat", worker, job_id="quiet")
    jobs.tick()
    job = jobs.store.get("quiet")
    assert (job.state, job.attempt, job.restarts, job.resume_next) == (JobState.PROVISIONING, 2, 1, True)
    hung = next(e for e in jobs.store.events("quiet") if e.to_state is JobState.RECOVERING)
    assert hung.source == "reconciler"
    assert "Attempt 1 is hung" in hung.reason and "0-0 for 31 s" in hung.reason and "0-1 for 76 s" in hung.reason
    assert "restart 1 of 1 will resume" in hung.reason

    for worker in (0, 1):
        beat(jobs, "started", worker, attempt=2, job_id="quiet")
    clock.advance(31)
    for worker in (0, 1):
        beat(jobs, "heartbeat", worker, attempt=2, job_id="quiet")
    jobs.tick()
    job = jobs.store.get("quiet")
    assert (job.state, job.attempt) == (JobState.FAILED, 2)
    assert "Attempt 2 is hung" in job.state_reason and "all 1 restarts are used up" in job.state_reason
    assert released(jobs, "quiet-a2")


def test_a_limit_committed_by_a_handler_that_died_before_releasing_is_released_by_the_next_tick(jobs, clock):
    """The FAILED commit landed but the release never ran: the tick finds the resource unowned and deletes it,
    and enforces nothing twice."""
    from tpujobs.domain.states import EventKind
    from tpujobs.domain.transitions import Observation

    running(jobs, "crashed", accelerator="v4-8", time_limit="1m")
    clock.advance(61)
    seen = Observation(EventKind.TIME_LIMIT_REACHED, 1, "reconciler", reason="limit", limit="time_limit")
    jobs.store.apply("crashed", seen, jobs.clock)  # committed, not acted on
    assert not released(jobs, "crashed-a1")
    report = jobs.tick()
    assert report.released == ["crashed-a1"] and report.observed == []
    assert released(jobs, "crashed-a1")
    assert [e.to_state for e in jobs.store.events("crashed")].count(JobState.FAILED) == 1

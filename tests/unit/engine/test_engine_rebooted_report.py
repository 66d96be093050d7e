"""The `rebooted` report on the fakes and the TPU simulator: a host lost, if signed.

A VM that reboots runs its startup script again, and the agent, finding that its attempt
had already started on that host, reports `rebooted` instead of running the command twice.
The engine takes it as the loss of that host (CAPACITY_LOST: the job resumes by its rules),
but only when it is signed by the attempt it names; anything else changes nothing and is
recorded in `rejections`, like every other report (test_engine_signed_reports.py).
"""

from __future__ import annotations

import secrets
from datetime import datetime, timezone

import pytest
from engine_harness import Engine

from tpujobs.domain import signing
from tpujobs.domain.states import JobState
from tpujobs.engine.inbound import InboundMessage
from tpujobs.local.testing import inbound, signed, signed_with

EVENTS = "tpujobs-worker-events"
DETAIL = (
    "the agent first started 12:00Z, before the host rebooted; "
    "its command (pid 42, started 12:01Z) is gone: nothing is started again"
)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@pytest.fixture
def jobs(engine) -> Engine:
    return engine()


def running(jobs: Engine, job_id: str = "train-1", **changes: object) -> str:
    """A v4-16 job (two hosts) submitted, its worker 0 `started`, signed: RUNNING at attempt 1."""
    spec = {
        "job_id": job_id,
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-16",
        "command": "python train.py",
        "max_restarts": 3,
        **changes,
    }
    assert jobs.handle(inbound("tpujobs-submit", spec)).kind == "provisioning"
    started = {"kind": "started", "job_id": job_id, "attempt": 1, "slice_id": 0, "worker_id": 0}
    jobs.handle(signed(jobs, EVENTS, started))
    assert jobs.store.get(job_id).state is JobState.RUNNING
    return job_id


def rebooted(job_id: str = "train-1", attempt: int = 1, worker: int = 1) -> dict:
    return {
        "kind": "rebooted",
        "job_id": job_id,
        "attempt": attempt,
        "slice_id": 0,
        "worker_id": worker,
        "detail": DETAIL,
    }


def key_of(jobs: Engine, job_id: str, attempt: int) -> bytes:
    job = jobs.store.get(job_id)
    return signing.attempt_key(jobs.settings.report_key, job_id, job.created_at, attempt)


def snapshot(jobs: Engine, job_id: str = "train-1") -> tuple:
    job = jobs.store.get(job_id)
    return job.state, job.attempt, job.restarts, job.queued_resource, len(jobs.store.events(job_id))


def rejection_of(jobs: Engine, message: InboundMessage):
    return next((r for r in jobs.store.rejections() if r.message_id == message.message_id), None)


def test_a_signed_rebooted_report_loses_the_host_and_the_job_resumes_at_the_next_attempt(jobs):
    """on_preemption=resume: RECOVERING with a reason saying which host rebooted and what it found, then attempt 2
    requested."""
    running(jobs)
    outcome = jobs.handle(signed(jobs, EVENTS, rebooted()))
    assert outcome is not None
    job = jobs.store.get("train-1")
    assert (job.state, job.attempt, job.restarts, job.queued_resource) == (
        JobState.PROVISIONING,
        2,
        1,
        "train-1-a2",
    )
    assert job.resume_next
    lost = next(e for e in jobs.store.events("train-1") if e.to_state is JobState.RECOVERING)
    assert lost.source == "agent" and lost.attempt == 1
    assert lost.reason.startswith(f"Rebooted: worker 0-1 of attempt 1 started over ({DETAIL})")
    assert jobs.store.rejections() == []


def test_a_rebooted_host_of_a_job_that_must_not_restart_fails_it(jobs):
    """on_preemption=fail: a rebooted host is a lost host, so the job ends FAILED saying why."""
    running(jobs, on_preemption="fail")
    jobs.handle(signed(jobs, EVENTS, rebooted()))
    job = jobs.store.get("train-1")
    assert job.state is JobState.FAILED and "Rebooted: worker 0-1" in job.state_reason


FORGERIES = {
    "unsigned": lambda jobs: inbound(
        EVENTS, {"at": utc_now().isoformat(), "nonce": secrets.token_hex(16), **rebooted()}
    ),
    "another_jobs_key": lambda jobs: signed_with(jobs, key_of(jobs, "train-2", 1), EVENTS, rebooted()),
    "another_attempts_key": lambda jobs: signed_with(jobs, key_of(jobs, "train-1", 2), EVENTS, rebooted()),
    "a_host_the_job_lacks": lambda jobs: signed(jobs, EVENTS, rebooted(worker=2)),
}
REASONS = {
    "unsigned": signing.UNSIGNED,
    "another_jobs_key": signing.MISMATCH,
    "another_attempts_key": signing.MISMATCH,
    "a_host_the_job_lacks": "worker 2 is out of range",
}


@pytest.mark.parametrize("forgery", FORGERIES, ids=FORGERIES)
def test_a_rebooted_report_not_signed_by_its_attempt_changes_nothing_and_is_rejected(jobs, forgery):
    """Unsigned, another job's or attempt's key, a host the job lacks: the job runs on; the rejection says why."""
    running(jobs, "train-1")
    running(jobs, "train-2")
    before = snapshot(jobs)
    forged = FORGERIES[forgery](jobs)
    assert jobs.handle(forged) is None
    assert snapshot(jobs) == before
    assert REASONS[forgery] in rejection_of(jobs, forged).reason


def test_a_redelivered_rebooted_report_restarts_the_job_once(jobs):
    """Pub/Sub delivers the same message again: still attempt 2, one restart, no rejection."""
    running(jobs)
    message = signed(jobs, EVENTS, rebooted())
    jobs.handle(message)
    before = snapshot(jobs)
    jobs.handle(InboundMessage(message.message_id, EVENTS, message.data, dict(message.attributes)))
    assert snapshot(jobs) == before and before[1:3] == (2, 1)
    assert jobs.store.rejections() == []


def test_a_late_rebooted_report_of_an_earlier_attempt_does_not_touch_the_next(jobs):
    """A host of attempt 1 rebooting after the job moved on to attempt 2: believed, but nothing changes."""
    running(jobs)
    jobs.handle(signed(jobs, EVENTS, rebooted(worker=0)))
    started = {"kind": "started", "job_id": "train-1", "attempt": 2, "slice_id": 0, "worker_id": 0}
    jobs.handle(signed(jobs, EVENTS, started))
    before = snapshot(jobs)
    assert before[:3] == (JobState.RUNNING, 2, 1)
    jobs.handle(signed(jobs, EVENTS, rebooted(worker=1)))
    assert snapshot(jobs) == before
    assert jobs.store.rejections() == []

"""Jobs whose every time is known: moved by decide() itself, observation by observation, at chosen
minutes after T0. The domain's accounting tests and the CLI's tables of cost and state read them."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tpujobs.domain.accounting import checkpoint_reported
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Decision, Observation, decide

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def a_job(on_preemption: str = "resume", accelerator: str = "v4-16", slices: int = 2) -> Job:
    spec = parse_spec(
        {
            "job_id": "acct-1",
            "name": "acct",
            "owner": "ada",
            "accelerator_type": accelerator,  # v4-16: 8 chips on 2 hosts per slice
            "slices": slices,
            "capacity": "spot",
            "command": "python train.py",
            "on_preemption": on_preemption,
        }
    )
    job, _ = new_job(spec, "us-central2-b", at(0))
    return job


def move(job: Job, minute: float, kind: EventKind, **fields: object) -> Job:
    outcome = decide(job, Observation(kind, fields.pop("attempt", job.attempt), "tpu", **fields), at(minute))
    assert isinstance(outcome, Decision), outcome
    return outcome.job


def run_to_success(job: Job, minute: float) -> Job:
    for slice_id in range(job.spec.slices):
        for worker in range(job.spec.hosts_per_slice):
            job = move(job, minute, EventKind.WORKER_SUCCEEDED, worker=f"{slice_id}-{worker}")
    assert job.state is JobState.SUCCEEDED
    return job


def preempted_job(on_preemption: str = "resume", checkpoint_minute: float | None = 50) -> Job:
    """16 chips; waits 20 min, holds 60 (checkpoint at 50, lost at 80), then 10 min and 60 more."""
    job = a_job(on_preemption)
    job = move(job, 10, EventKind.ADMITTED, capacity_state="WAITING_FOR_RESOURCES")
    job = move(job, 20, EventKind.CAPACITY_CHANGED, capacity_state="ACTIVE")
    job = move(job, 21, EventKind.WORKERS_STARTED, worker="0-0")
    if checkpoint_minute is not None:
        usage = checkpoint_reported(job.usage, 1, at(checkpoint_minute))
        assert usage is not None
        job = job.evolve(usage=usage)
    job = move(job, 80, EventKind.CAPACITY_LOST)
    assert job.state is JobState.RECOVERING
    job = move(job, 80, EventKind.NEXT_ATTEMPT_REQUESTED, capacity_state="ACCEPTED")
    job = move(job, 90, EventKind.WORKERS_STARTED, worker="0-0")
    return run_to_success(job, 150)

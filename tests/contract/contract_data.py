"""What the contract tests share: a fixed time, the zone, and a job to store (not fixtures: `conftest`
is no module to import from, since every test folder has one)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from tpujobs.domain.job import Job, JobEvent, new_job
from tpujobs.domain.spec import parse_spec

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
ZONE = "us-central2-b"


def clock(seconds: float = 5) -> datetime:
    return T0 + timedelta(seconds=seconds)


def a_job(job_id: str = "train-1", minutes: float = 0, **changes: Any) -> tuple[Job, JobEvent]:
    """A QUEUED v4-16 job (two hosts), created `minutes` after T0."""
    spec = {
        "job_id": job_id,
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-16",
        "command": "python train.py",
        "labels": {"team": "research"},
        **changes,
    }
    job, event = new_job(parse_spec(spec), ZONE, T0 + timedelta(minutes=minutes))
    return job, event

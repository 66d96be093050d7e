"""Accounting as stored: the job document's numbers, and checkpoints reported by workers.

The service runs on the Firestore emulator and the TPU simulator with a clock the test
moves, so every number on the document is known in advance.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tpujobs.domain.states import JobState
from tpujobs.engine.services import Engine
from tpujobs.local.testing import inbound as message
from tpujobs.local.testing import signed

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)


class Clock:
    """Minutes after T0, set by the test."""

    def __init__(self) -> None:
        self.minutes = 0.0

    def __call__(self) -> datetime:
        return T0 + timedelta(minutes=self.minutes)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def service(job_service, clock) -> Engine:
    return job_service(clock=clock)


def report(service: Engine, kind: str, attempt: int, worker: int, minute: float, **extra) -> None:
    """A report sent at `minute`, which is when it arrives: the clock moves on to it if behind."""
    service.clock.minutes = max(service.clock.minutes, minute)
    at = (T0 + timedelta(minutes=minute)).isoformat()
    payload = {"kind": kind, "job_id": "acct-1", "attempt": attempt, "slice_id": 0, "worker_id": worker, "at": at}
    service.worker_events.on_worker_report(signed(service, "tpujobs-worker-events", {**payload, **extra}))


def test_the_document_carries_chip_hours_lost_time_and_goodput(service, clock, firestore_client):
    """v4-16 (8 chips, 2 hosts): attempt 1 holds 60 min, checkpoint at 50, preempted at 80;
    attempt 2 holds 60 min. 16 chip-hours, 4 lost, goodput 0.75."""
    spec = {
        "job_id": "acct-1",
        "name": "acct",
        "owner": "ada@example.com",
        "accelerator_type": "v4-16",
        "capacity": "spot",
        "command": "python train.py",
    }
    assert service.submission.submit(message("tpujobs-submit", spec)).kind == "provisioning"
    clock.minutes = 20
    report(service, "started", 1, 0, 20)
    report(service, "checkpoint", 1, 0, 50, step=100)
    report(service, "checkpoint", 1, 1, 50, step=100)  # the same checkpoint from the other host
    report(service, "checkpoint", 1, 0, 40, step=80)  # an older one, delivered late
    clock.minutes = 80
    service.capacity_events.on_preemption(
        signed(service, "tpujobs-preemption", {"job_id": "acct-1", "attempt": 1, "slice_id": 0, "worker_id": 0})
    )
    job = service.store.get("acct-1")
    assert job.state is JobState.PROVISIONING and job.attempt == 2
    clock.minutes = 90
    report(service, "started", 2, 0, 90)
    clock.minutes = 150
    report(service, "exited", 2, 0, 150, exit_code=0)
    report(service, "exited", 2, 1, 150, exit_code=0)

    doc = firestore_client.collection("jobs").document("acct-1").get().to_dict()
    assert doc["state"] == "SUCCEEDED"
    assert doc["chip_hours"] == pytest.approx(16.0)
    assert doc["lost_chip_hours"] == pytest.approx(4.0)
    assert doc["useful_chip_hours"] == pytest.approx(12.0)
    assert doc["goodput"] == pytest.approx(0.75)
    assert doc["lost_seconds"] == pytest.approx(30 * 60)
    assert doc["queue_wait_seconds"] == pytest.approx((20 + 10) * 60)
    first, second = doc["usage"]
    assert first["attempt"] == 1 and first["chip_hours"] == pytest.approx(8.0)
    assert first["last_checkpoint_at"] == T0 + timedelta(minutes=50)
    assert first["capacity_lost"] is True and first["lost_seconds"] == pytest.approx(1800)
    assert second["attempt"] == 2 and second["lost_seconds"] == 0


def test_a_checkpoint_reported_after_the_preemption_notice_still_counts(service, clock, firestore_client):
    spec = {
        "job_id": "acct-1",
        "name": "acct",
        "owner": "ada@example.com",
        "accelerator_type": "v4-8",
        "capacity": "spot",
        "command": "python train.py",
    }
    service.submission.submit(message("tpujobs-submit", spec))
    report(service, "started", 1, 0, 0)
    report(service, "checkpoint", 1, 0, 30, step=10)
    clock.minutes = 60
    service.capacity_events.on_preemption(
        signed(service, "tpujobs-preemption", {"job_id": "acct-1", "attempt": 1, "slice_id": 0, "worker_id": 0})
    )
    assert service.store.get("acct-1").accounting().lost_seconds == pytest.approx(30 * 60)
    timeline = service.store.events("acct-1")

    report(service, "checkpoint", 1, 0, 60.05, step=20)  # saved on SIGTERM, in the grace period

    job = service.store.get("acct-1")
    assert job.attempt == 2  # the state is untouched: only the first attempt's accounting
    assert job.accounting().lost_seconds == 0
    assert service.store.events("acct-1") == timeline  # checkpoints make no timeline entries

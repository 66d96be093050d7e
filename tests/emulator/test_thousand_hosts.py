"""A job of 1,024 hosts (64 slices x 16) on the Firestore emulator: a model, not the simulator.

The simulator cannot run 1,024 agents on a 2-core machine (one idle agent is a Python process
of about 20 MiB resident: 20 GiB for the attempt), so this drives the real JobService with the
report stream such an attempt makes: every host's signed `started` within a second, the same
checkpoint step from every host, then every host's `exited 0`, delivered by 16 threads at once.
A listener on the job document counts its writes: they must not grow with the hosts.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tpujobs.adapters.firestore_store import JOBS
from tpujobs.domain.states import JobState
from tpujobs.engine.services import Engine
from tpujobs.local.testing import inbound, signed

pytestmark = pytest.mark.emulator

EVENTS = "tpujobs-worker-events"
SLICES, HOSTS = 64, 16  # v4-128: 64 chips, 16 hosts a slice
JOB = "big-1"
DELIVERY_THREADS = 16
# The job document's writes over the whole attempt: PROVISIONING, RUNNING, all_started_at,
# one checkpoint, SUCCEEDED, and a few to spare; a write per host would be over 1,000.
MAX_JOB_WRITES = 12
MAX_ARRAY = SLICES  # no array of the job document may grow with the hosts


class WriteCounter:
    """Counts the distinct versions (update times) of one document a real listener sees."""

    def __init__(self) -> None:
        self.versions: set[datetime] = set()

    def __call__(self, snapshots: list[Any], changes: Any, read_time: Any) -> None:
        for snapshot in snapshots:
            if snapshot.exists:
                self.versions.add(snapshot.update_time)


@pytest.fixture
def service(job_service) -> Engine:
    return job_service()


@pytest.fixture
def job_writes(firestore_client) -> Iterator[WriteCounter]:
    counter = WriteCounter()
    watch = firestore_client.collection(JOBS).document(JOB).on_snapshot(counter)
    yield counter
    watch.unsubscribe()


def report(kind: str, slice_id: int, worker_id: int, at: datetime, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "job_id": JOB, "attempt": 1, "slice_id": slice_id, "worker_id": worker_id,
            "at": at.isoformat(), **fields}  # fmt: skip


def deliver(service: Engine, payloads: list[dict[str, Any]]) -> None:
    """Sign each as its host's agent does, then hand them all to the service at once."""
    messages = [signed(service, EVENTS, payload) for payload in payloads]
    with ThreadPoolExecutor(DELIVERY_THREADS) as pool:
        list(pool.map(service.worker_events.on_worker_report, messages))


def hosts() -> list[tuple[int, int]]:
    return [(s, w) for s in range(SLICES) for w in range(HOSTS)]


def test_a_64_by_16_attempt_writes_its_job_a_bounded_number_of_times_and_succeeds(
    service: Engine, job_writes: WriteCounter, firestore_client
):
    """1,024 starts, checkpoints and exits: SUCCEEDED, all_started_at noted, the job written O(1) times."""
    spec = {"job_id": JOB, "name": "big", "owner": "ada@example.com", "accelerator_type": "v4-128",
            "slices": SLICES, "command": "python train.py"}  # fmt: skip
    assert service.submission.submit(inbound("tpujobs-submit", spec)).kind == "provisioning"
    job = service.store.get(JOB)
    assert job.total_workers == SLICES * HOSTS == 1024

    start = datetime.now(timezone.utc)
    spread = [start + timedelta(milliseconds=i % 1000) for i in range(len(hosts()))]  # all within 1 s
    deliver(service, [report("started", s, w, at) for (s, w), at in zip(hosts(), spread, strict=True)])
    job = service.store.get(JOB)
    usage = job.usage_of()
    assert job.state is JobState.RUNNING
    assert usage is not None and usage.all_started_at is not None  # the last `started` completed the count

    deliver(service, [report("checkpoint", s, w, start + timedelta(seconds=5), step=100) for s, w in hosts()])
    assert service.store.get(JOB).usage_of().last_checkpoint_step == 100

    exits = [report("exited", s, w, start + timedelta(seconds=10), exit_code=0) for s, w in hosts()]
    deliver(service, exits[:-1])
    assert service.store.get(JOB).state is JobState.RUNNING  # one host still running
    deliver(service, exits[-1:])

    job = service.store.get(JOB)
    assert (job.state, job.exit_code) == (JobState.SUCCEEDED, 0)
    assert service.store.attempt_workers_succeeded(JOB, 1) == 1024
    document = firestore_client.collection(JOBS).document(JOB).get()
    written = len(job_writes.versions)
    events = len(service.store.events(JOB))
    assert events <= 5, [e.reason for e in service.store.events(JOB)]  # QUEUED, PROVISIONING, RUNNING, SUCCEEDED
    assert events - 1 <= written <= MAX_JOB_WRITES, f"the job document was written {written} times"
    arrays = {k: len(v) for k, v in (document.to_dict() or {}).items() if isinstance(v, list)}
    assert max(arrays.values()) <= MAX_ARRAY, arrays

"""The reconciler's guards: silent workers, flapping, and a cost that ignores finished jobs."""

from __future__ import annotations

import dataclasses
import json
import urllib.request
from datetime import datetime, timedelta, timezone

import pytest

from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.adapters.google_errors import transient_retry
from tpujobs.adapters.tpu import CloudTpu
from tpujobs.domain.states import JobState
from tpujobs.reconciler import Reconciler
from tpujobs.service import JobService
from tpujobs.testing import inbound as message
from tpujobs.testing import local_settings, signed

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = datetime.now(timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def service(firestore_client, tpu_client, project_id, simulator_url, clock) -> JobService:
    settings = local_settings(
        project=project_id,
        default_zone=ZONE,
        tpu_endpoint=simulator_url,
        logs_bucket="logs",
        heartbeat_timeout_seconds=60.0,
        stuck_after_seconds=30.0,
    )
    # Some tests fail every TPU call 25 times over: a short in-call retry keeps each tick quick.
    tpu = CloudTpu(tpu_client, project_id, retry=transient_retry(deadline_s=0.2))
    return JobService(FirestoreJobStore(firestore_client), tpu, settings, clock, lambda s: None)


def running_job(service: JobService, job_id: str = "train-1", accelerator: str = "v4-16") -> str:
    spec = {"job_id": job_id, "name": "train", "owner": "ada@example.com", "accelerator_type": accelerator, "command": "x"}
    assert service.submit(message("tpujobs-submit", spec)).kind == "provisioning"
    workers = 2 if accelerator == "v4-16" else 1
    for worker in range(workers):
        beat(service, "started", worker, job_id=job_id)
    assert service.store.get(job_id).state is JobState.RUNNING
    return job_id


def beat(service: JobService, kind: str, worker: int, attempt: int = 1, job_id: str = "train-1", **extra) -> None:
    payload = {"kind": kind, "job_id": job_id, "attempt": attempt, "slice_id": 0, "worker_id": worker, **extra}
    service.on_worker_report(signed(service,"tpujobs-worker-events", payload))


def configure(simulator_url: str, **config) -> None:
    request = urllib.request.Request(
        f"{simulator_url}/simulator/v1/config", data=json.dumps(config).encode(), headers={"Content-Type": "application/json"}
    )
    urllib.request.urlopen(request, timeout=5).read()


def test_a_missed_heartbeat_does_not_start_a_recovery(service, clock):
    """Silent for 45 s with a 60 s timeout (several heartbeats of 10 s missed): still RUNNING."""
    running_job(service)
    clock.advance(45)
    beat(service, "heartbeat", 0)  # worker 0 beats on; worker 1 has been quiet for 45 s
    report = Reconciler(service).tick()
    job = service.store.get("train-1")
    assert (job.state, job.attempt) == (JobState.RUNNING, 1)
    assert report.observed == []


def test_a_worker_silent_past_the_timeout_is_a_lost_host(service, clock):
    """Silent for longer than the timeout: the attempt is lost and the next one requested."""
    running_job(service)
    clock.advance(61)
    beat(service, "heartbeat", 0)
    Reconciler(service).tick()
    job = service.store.get("train-1")
    assert (job.state, job.attempt) == (JobState.PROVISIONING, 2)
    lost = [e for e in service.store.events("train-1") if e.to_state is JobState.RECOVERING]
    assert len(lost) == 1 and lost[0].source == "reconciler" and "Worker 0-1" in lost[0].reason


def test_a_finished_worker_is_not_missed(service, clock):
    """A worker that exited 0 stops beating while the others run: that is not a loss."""
    running_job(service)
    beat(service, "exited", 1, exit_code=0)
    for _ in range(3):
        clock.advance(30)
        beat(service, "heartbeat", 0)
        Reconciler(service).tick()
    job = service.store.get("train-1")
    assert (job.state, job.attempt) == (JobState.RUNNING, 1)


def test_workers_of_an_attempt_that_is_over_are_retired_once(service, clock, firestore_client):
    """After a recovery, the old attempt's silent workers are retired, not counted as losses."""
    running_job(service)
    service.on_preemption(signed(service,"tpujobs-preemption", {"job_id": "train-1", "attempt": 1, "reason": "SIGTERM"}))
    assert service.store.get("train-1").attempt == 2
    clock.advance(120)
    Reconciler(service).tick()
    assert service.store.silent_workers(clock()) == []  # both old workers retired
    assert service.store.get("train-1").attempt == 2
    recoveries = [e for e in service.store.events("train-1") if e.to_state is JobState.RECOVERING]
    assert len(recoveries) == 1 and recoveries[0].source == "agent"


@pytest.mark.parametrize("rate", [1.0, 0.5])
def test_twenty_five_failing_status_reads_start_no_recovery(service, simulator_url, rate):
    """SkyPilot #10155: 25 status-fetch failures gave 24 needless recoveries. Here: none."""
    running_job(service)
    configure(simulator_url, api_error_rate=rate, seed=7)
    for _ in range(25):
        Reconciler(service).tick()
    configure(simulator_url, api_error_rate=0.0)
    job = service.store.get("train-1")
    assert (job.state, job.attempt, job.restarts) == (JobState.RUNNING, 1, 0)
    assert [e.to_state for e in service.store.events("train-1")] == [
        JobState.QUEUED,
        JobState.PROVISIONING,
        JobState.RUNNING,
    ]


class CountingStore:
    """The real store, counting the documents each tick reads."""

    def __init__(self, store: FirestoreJobStore) -> None:
        self._store = store
        self.read = 0

    def __getattr__(self, name):
        return getattr(self._store, name)

    def list_active(self, limit: int = 10_000):
        jobs = self._store.list_active(limit)
        self.read += len(jobs)
        return jobs

    def silent_workers(self, before, limit: int = 1000):
        found = self._store.silent_workers(before, limit)
        self.read += len(found)
        return found

    def get(self, job_id):
        self.read += 1
        return self._store.get(job_id)


def test_a_tick_reads_active_jobs_only_whatever_the_history(service, clock):
    """Twenty finished jobs with finished workers add no reads to a tick: O(active jobs)."""
    running_job(service, "live-job", accelerator="v4-8")
    counting = CountingStore(service.store)
    service.store = counting
    Reconciler(service).tick()
    baseline = counting.read
    for index in range(20):
        job_id = f"done-{index}"
        running_job(service, job_id, accelerator="v4-8")
        beat(service, "exited", 0, job_id=job_id, exit_code=0)
        assert service.store.get(job_id).state is JobState.SUCCEEDED
    clock.advance(600)  # everything is long silent now
    beat(service, "heartbeat", 0, job_id="live-job")
    counting.read = 0
    Reconciler(service).tick()
    assert counting.read == baseline


def test_the_reconcilers_listing_leaves_the_startup_scripts_behind(service, tpu_client, project_id):
    """The list calls ask for a field mask: labels and states come, the 46 KB scripts do not."""
    from tpujobs.adapters.tpu import _QR_FIELDS

    running_job(service, accelerator="v4-8")
    parent = f"projects/{project_id}/locations/{ZONE}"
    full = next(iter(tpu_client.list_queued_resources(parent=parent)))
    assert len(full.tpu.node_spec[0].node.metadata["startup-script"]) > 10_000
    masked = next(iter(tpu_client.list_queued_resources(parent=parent, metadata=[("x-goog-fieldmask", _QR_FIELDS)])))
    assert "startup-script" not in masked.tpu.node_spec[0].node.metadata
    assert masked.tpu.node_spec[0].node.labels["tpujobs-job"] == "train-1"
    assert [status.job_label for status in service.tpu.list(ZONE)] == ["train-1"]


# --- paid capacity is never held silently: the boot timeout ----------------------------


def active_but_silent(service: JobService, job_id: str = "train-1") -> None:
    """Submitted; its queued resource went ACTIVE and a tick saw it; no agent ever reported."""
    from tpujobs.testing import wait_for

    spec = {"job_id": job_id, "name": "train", "owner": "ada@example.com", "accelerator_type": "v4-16", "command": "x"}
    assert service.submit(message("tpujobs-submit", spec)).kind == "provisioning"
    wait_for(lambda: service.tpu.status(ZONE, f"{job_id}-a1").state == "ACTIVE", timeout=10)
    Reconciler(service).tick()
    job = service.store.get(job_id)
    assert (job.state, job.capacity_state) == (JobState.PROVISIONING, "ACTIVE")


def test_capacity_active_with_no_agent_past_the_boot_timeout_is_a_lost_host(service, clock):
    """ACTIVE for 599 s without a word: nothing yet; for 612 s: lost, the next attempt asked for."""
    assert service.settings.boot_timeout_seconds == 600  # the default
    active_but_silent(service)
    clock.advance(599)
    Reconciler(service).tick()
    assert (service.store.get("train-1").state, service.store.get("train-1").attempt) == (JobState.PROVISIONING, 1)

    clock.advance(13)
    report = Reconciler(service).tick()

    job = service.store.get("train-1")
    assert (job.state, job.attempt, job.restarts) == (JobState.PROVISIONING, 2, 1)
    (lost,) = [e for e in service.store.events("train-1") if e.to_state is JobState.RECOVERING]
    assert lost.source == "reconciler"
    assert lost.reason.startswith(
        "Queued resource train-1-a1 has been ACTIVE for 612 s and no worker agent reported: "
        "the hosts never booted the agent"
    )
    assert report.observed and "never booted the agent" in report.observed[0]
    assert "train-1-a1" not in {s.name for s in service.tpu.list(ZONE) if s.state != "DELETING"}


def test_a_host_that_never_said_started_is_lost_naming_it(service, clock):
    """Worker 0-0 started and beats on; worker 0-1 never said a word: lost after the boot timeout."""
    service.settings = dataclasses.replace(service.settings, boot_timeout_seconds=120.0)
    spec = {"job_id": "train-1", "name": "train", "owner": "ada@example.com", "accelerator_type": "v4-16", "command": "x"}
    service.submit(message("tpujobs-submit", spec))
    beat(service, "started", 0)
    assert service.store.get("train-1").state is JobState.RUNNING
    for seconds in (50, 50):  # within the timeout, with heartbeats: nothing happens
        clock.advance(seconds)
        beat(service, "heartbeat", 0)
        Reconciler(service).tick()
    assert (service.store.get("train-1").state, service.store.get("train-1").attempt) == (JobState.RUNNING, 1)

    clock.advance(21)
    beat(service, "heartbeat", 0)
    Reconciler(service).tick()

    job = service.store.get("train-1")
    assert (job.state, job.attempt) == (JobState.PROVISIONING, 2)
    (lost,) = [e for e in service.store.events("train-1") if e.to_state is JobState.RECOVERING]
    assert lost.source == "reconciler"
    assert lost.reason.startswith("Worker 0-1 of attempt 1 never reported, 121 s after the first host started: its host is lost")


class BootReads:
    """The real store, counting the boot check's reads of worker documents and its notes."""

    def __init__(self, store: FirestoreJobStore) -> None:
        self._store = store
        self.worker_reads: list[str] = []
        self.noted: list[str] = []

    def __getattr__(self, name):
        return getattr(self._store, name)

    def attempt_workers(self, job_id: str, attempt: int):
        self.worker_reads.append(f"{job_id}#{attempt}")
        return self._store.attempt_workers(job_id, attempt)

    def record_all_started(self, job_id: str, attempt: int, at):
        self.noted.append(f"{job_id}#{attempt}")
        return self._store.record_all_started(job_id, attempt, at)


def test_an_attempt_whose_hosts_all_started_is_read_once_and_a_single_host_never(service, clock):
    """Past the timeout, a two-host attempt's workers are read once and noted; later ticks, and a
    one-host job (noted by its own `started`), read no worker documents at all."""
    service.settings = dataclasses.replace(service.settings, boot_timeout_seconds=120.0)
    running_job(service, "multi")
    running_job(service, "single", accelerator="v4-8")
    assert service.store.get("single").usage[0].all_started_at is not None
    counting = BootReads(service.store)
    service.store = counting
    for _ in range(4):
        clock.advance(50)
        for worker in (0, 1):
            beat(service, "heartbeat", worker, job_id="multi")
        beat(service, "heartbeat", 0, job_id="single")
        Reconciler(service).tick()

    assert counting.worker_reads == ["multi#1"] and counting.noted == ["multi#1"]
    multi = service.store.get("multi")
    assert (multi.state, multi.attempt) == (JobState.RUNNING, 1)
    assert multi.usage[0].all_started_at is not None
    assert service.store.get("single").state is JobState.RUNNING

"""The reconciler on the fakes and the TPU simulator: silent workers, flapping, the boot timeout,
a tick that one job's failure never stops, paged reads, creates followed through, TPU quota, and
node conditions that often pass."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from engine_harness import PROJECT, ZONE, Engine

from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Observation
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.testing import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def make(engine, clock):
    """`make(**settings)`: the engine on a hand-moved clock, heartbeats timing out after 60 s."""
    return lambda **settings: engine(clock=clock, heartbeat_timeout_seconds=60.0, stuck_after_seconds=30.0, **settings)


@pytest.fixture
def jobs(make) -> Engine:
    return make()


def running_job(jobs: Engine, job_id: str = "train-1", accelerator: str = "v4-16") -> str:
    spec = {
        "job_id": job_id,
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": accelerator,
        "command": "x",
    }
    assert jobs.submit(spec).kind == "provisioning"
    workers = 2 if accelerator == "v4-16" else 1
    for worker in range(workers):
        beat(jobs, "started", worker, job_id=job_id)
    assert jobs.store.get(job_id).state is JobState.RUNNING
    return job_id


def beat(jobs: Engine, kind: str, worker: int, attempt: int = 1, job_id: str = "train-1", **extra) -> None:
    jobs.report(kind, attempt, worker=worker, job_id=job_id, **extra)


def configure(simulator_url: str, **config) -> None:
    SimulatorControl(simulator_url).configure(**config)


def test_a_missed_heartbeat_does_not_start_a_recovery(jobs, clock):
    """Silent for 45 s with a 60 s timeout (several heartbeats of 10 s missed): still RUNNING."""
    running_job(jobs)
    clock.advance(45)
    beat(jobs, "heartbeat", 0)  # worker 0 beats on; worker 1 has been quiet for 45 s
    report = jobs.tick()
    job = jobs.store.get("train-1")
    assert (job.state, job.attempt) == (JobState.RUNNING, 1)
    assert report.observed == []


def test_a_worker_silent_past_the_timeout_is_a_lost_host(jobs, clock):
    """Silent for longer than the timeout: the attempt is lost and the next one requested."""
    running_job(jobs)
    clock.advance(61)
    beat(jobs, "heartbeat", 0)
    jobs.tick()
    job = jobs.store.get("train-1")
    assert (job.state, job.attempt) == (JobState.PROVISIONING, 2)
    lost = [e for e in jobs.store.events("train-1") if e.to_state is JobState.RECOVERING]
    assert len(lost) == 1 and lost[0].source == "reconciler" and "Worker 0-1" in lost[0].reason


def test_a_finished_worker_is_not_missed(jobs, clock):
    """A worker that exited 0 stops beating while the others run: that is not a loss."""
    running_job(jobs)
    beat(jobs, "exited", 1, exit_code=0)
    for _ in range(3):
        clock.advance(30)
        beat(jobs, "heartbeat", 0)
        jobs.tick()
    job = jobs.store.get("train-1")
    assert (job.state, job.attempt) == (JobState.RUNNING, 1)


def test_workers_of_an_attempt_that_is_over_are_retired_once(jobs, clock):
    """After a recovery, the old attempt's silent workers are retired, not counted as losses."""
    running_job(jobs)
    jobs.preempt(1)
    assert jobs.store.get("train-1").attempt == 2
    clock.advance(120)
    jobs.tick()
    assert jobs.store.silent_workers(clock()) == []  # both old workers retired
    assert jobs.store.get("train-1").attempt == 2
    recoveries = [e for e in jobs.store.events("train-1") if e.to_state is JobState.RECOVERING]
    assert len(recoveries) == 1 and recoveries[0].source == "agent"


@pytest.mark.parametrize("rate", [1.0, 0.5])
def test_twenty_five_failing_status_reads_start_no_recovery(jobs, simulator_url, rate):
    """SkyPilot #10155: 25 status-fetch failures gave 24 needless recoveries. Here: none (each call
    retried for 0.2 s, not the default 10 s, so 25 ticks of failures stay quick)."""
    running_job(jobs)
    configure(simulator_url, api_error_rate=rate, seed=7)
    for _ in range(25):
        jobs.tick()
    configure(simulator_url, api_error_rate=0.0)
    job = jobs.store.get("train-1")
    assert (job.state, job.attempt, job.restarts) == (JobState.RUNNING, 1, 0)
    assert [e.to_state for e in jobs.store.events("train-1")] == [
        JobState.QUEUED,
        JobState.PROVISIONING,
        JobState.RUNNING,
    ]


class CountingStore:
    """The real store, counting the documents each tick reads."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.read = 0

    def __getattr__(self, name):
        return getattr(self._store, name)

    def active_placements(self, page_size: int = 500):
        found = self._store.active_placements(page_size)
        self.read += len(found)
        return found

    def active_in_shard(self, zone, after, through, page_size: int = 500):
        jobs = self._store.active_in_shard(zone, after, through, page_size)
        self.read += len(jobs)
        return jobs

    def outlines(self, job_ids, page_size: int = 500):
        jobs = self._store.outlines(job_ids, page_size)
        self.read += len(jobs)
        return jobs

    def silent_workers(self, before, page_size: int = 500):
        found = self._store.silent_workers(before, page_size)
        self.read += len(found)
        return found

    def get(self, job_id):
        self.read += 1
        return self._store.get(job_id)


def test_a_tick_reads_active_jobs_only_whatever_the_history(jobs, clock):
    """Twenty finished jobs with finished workers add no reads to a tick: O(active jobs)."""
    running_job(jobs, "live-job", accelerator="v4-8")
    counting = CountingStore(jobs.store)
    jobs.tick(store=counting)
    baseline = counting.read
    for index in range(20):
        job_id = f"done-{index}"
        running_job(jobs, job_id, accelerator="v4-8")
        beat(jobs, "exited", 0, job_id=job_id, exit_code=0)
        assert jobs.store.get(job_id).state is JobState.SUCCEEDED
    clock.advance(600)  # everything is long silent now
    beat(jobs, "heartbeat", 0, job_id="live-job")
    counting.read = 0
    jobs.tick(store=counting)
    assert counting.read == baseline


def test_the_reconcilers_listing_leaves_the_startup_scripts_behind(jobs, tpu_client):
    """The list calls ask for a field mask: labels and states come, the 46 KB scripts do not."""
    from tpujobs.adapters.tpu import QUEUED_RESOURCE_FIELDS

    running_job(jobs, accelerator="v4-8")
    parent = f"projects/{PROJECT}/locations/{ZONE}"
    full = next(iter(tpu_client.list_queued_resources(parent=parent)))
    assert len(full.tpu.node_spec[0].node.metadata["startup-script"]) > 10_000
    masked = next(
        iter(tpu_client.list_queued_resources(parent=parent, metadata=[("x-goog-fieldmask", QUEUED_RESOURCE_FIELDS)]))
    )
    assert "startup-script" not in masked.tpu.node_spec[0].node.metadata
    assert masked.tpu.node_spec[0].node.labels["tpujobs-job"] == "train-1"
    assert [status.job_label for status in jobs.capacity.list_capacity(ZONE)] == ["train-1"]


# --- paid capacity is never held silently: the boot timeout ----------------------------


def active_but_silent(jobs: Engine, job_id: str = "train-1") -> None:
    """Submitted; its queued resource went ACTIVE and a tick saw it; no agent ever reported."""
    from tpujobs.local.testing import wait_for

    spec = {"job_id": job_id, "name": "train", "owner": "ada@example.com", "accelerator_type": "v4-16", "command": "x"}
    assert jobs.submit(spec).kind == "provisioning"
    wait_for(lambda: jobs.capacity.status(ZONE, f"{job_id}-a1").state == "ACTIVE", timeout=10)
    jobs.tick()
    job = jobs.store.get(job_id)
    assert (job.state, job.capacity_state) == (JobState.PROVISIONING, "ACTIVE")


def test_capacity_active_with_no_agent_past_the_boot_timeout_is_a_lost_host(jobs, clock):
    """ACTIVE for 599 s without a word: nothing yet; for 612 s: lost, the next attempt asked for."""
    assert jobs.settings.boot_timeout_seconds == 600  # the default
    active_but_silent(jobs)
    clock.advance(599)
    jobs.tick()
    assert (jobs.store.get("train-1").state, jobs.store.get("train-1").attempt) == (JobState.PROVISIONING, 1)

    clock.advance(13)
    report = jobs.tick()

    job = jobs.store.get("train-1")
    assert (job.state, job.attempt, job.restarts) == (JobState.PROVISIONING, 2, 1)
    (lost,) = [e for e in jobs.store.events("train-1") if e.to_state is JobState.RECOVERING]
    assert lost.source == "reconciler"
    assert lost.reason.startswith(
        "Queued resource train-1-a1 has been ACTIVE for 612 s and no worker agent reported: "
        "the hosts never booted the agent"
    )
    assert report.observed and "never booted the agent" in report.observed[0]
    assert "train-1-a1" not in {
        s.name for s in jobs.capacity.list_capacity(ZONE) if s.state is not HoldingState.RELEASING
    }


def test_a_host_that_never_said_started_is_lost_naming_it(make, clock):
    """Worker 0-0 started and beats on; worker 0-1 never said a word: lost after the boot timeout."""
    jobs = make(boot_timeout_seconds=120.0)
    spec = {
        "job_id": "train-1",
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-16",
        "command": "x",
    }
    jobs.submit(spec)
    beat(jobs, "started", 0)
    assert jobs.store.get("train-1").state is JobState.RUNNING
    for seconds in (50, 50):  # within the timeout, with heartbeats: nothing happens
        clock.advance(seconds)
        beat(jobs, "heartbeat", 0)
        jobs.tick()
    assert (jobs.store.get("train-1").state, jobs.store.get("train-1").attempt) == (JobState.RUNNING, 1)

    clock.advance(21)
    beat(jobs, "heartbeat", 0)
    jobs.tick()

    job = jobs.store.get("train-1")
    assert (job.state, job.attempt) == (JobState.PROVISIONING, 2)
    (lost,) = [e for e in jobs.store.events("train-1") if e.to_state is JobState.RECOVERING]
    assert lost.source == "reconciler"
    assert lost.reason.startswith(
        "Worker 0-1 of attempt 1 never reported, 121 s after the first host started: its host is lost"
    )


class BootReads:
    """The real store, counting the boot check's reads of worker documents and its notes."""

    def __init__(self, store: Any) -> None:
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


def test_an_attempt_whose_hosts_all_started_is_read_once_and_a_single_host_never(make, clock):
    """Past the timeout, a two-host attempt noted by its last `started` and a one-host job (noted
    by its own `started`) have no worker documents read by any tick."""
    jobs = make(boot_timeout_seconds=120.0)
    running_job(jobs, "multi")
    running_job(jobs, "single", accelerator="v4-8")
    assert jobs.store.get("single").usage[0].all_started_at is not None
    counting = BootReads(jobs.store)
    for _ in range(4):
        clock.advance(50)
        for worker in (0, 1):
            beat(jobs, "heartbeat", worker, job_id="multi")
        beat(jobs, "heartbeat", 0, job_id="single")
        jobs.tick(store=counting)

    # The last `started` of the two hosts noted it already (a worker's `started` report): no read.
    assert counting.worker_reads == [] and counting.noted == []
    multi = jobs.store.get("multi")
    assert (multi.state, multi.attempt) == (JobState.RUNNING, 1)
    assert multi.usage[0].all_started_at is not None
    assert jobs.store.get("single").state is JobState.RUNNING


# --- nothing one job does stops the tick ------------------------------------------------


def control(simulator_url: str, path: str, body: dict) -> dict:
    """POST to the simulator's control API (`tpujobs dev fault` drives the same endpoints)."""
    return SimulatorControl(simulator_url).call("POST", path, body)


def fault(simulator_url: str, method: str, code: int | str, count: int = 1, quota: bool = False) -> None:
    """The next `count` TPU API calls of `method` answer with Google's error for `code`."""
    control(simulator_url, "faults/errors", {"method": method, "code": code, "count": count, "quota": quota})


def submitted(jobs: Engine, job_id: str, **spec) -> None:
    body = {
        "job_id": job_id,
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-8",
        "command": "x",
        **spec,
    }
    assert jobs.submit(body).kind == "provisioning"


def vanish(jobs: Engine, name: str, zone: str = ZONE) -> None:
    """Someone deleted the queued resource behind tpujobs' back."""
    jobs.capacity.release(zone, name)
    assert jobs.capacity.status(zone, name) is None


def test_a_permanent_error_in_one_jobs_repair_is_noted_on_it_and_the_tick_goes_on(jobs, clock, simulator_url):
    """The TPU API refuses (403) the read that would confirm a-lost's vanished capacity: a-lost says
    so in its reason and timeline and waits; c-missing is still asked for again, b-silent's silent
    worker is still found, and the next tick repairs a-lost."""
    for job_id in ("a-lost", "b-silent"):
        running_job(jobs, job_id, accelerator="v4-8")
    submitted(jobs, "c-missing")
    vanish(jobs, "a-lost-a1")
    vanish(jobs, "c-missing-a1")
    clock.advance(61)
    beat(jobs, "heartbeat", 0, job_id="a-lost")  # b-silent's worker says nothing for 61 s
    fault(simulator_url, "get", 403)  # the first read of the tick: a-lost's confirmation

    report = jobs.tick()

    a_lost = jobs.store.get("a-lost")
    assert (a_lost.state, a_lost.attempt) == (JobState.RUNNING, 1)
    assert a_lost.state_reason.startswith(
        "The reconciler could not repair the job: TPU API refused to read queued resource a-lost-a1"
    )
    (noted,) = [e for e in jobs.store.events("a-lost") if e.source == "reconciler"]
    assert (noted.from_state, noted.to_state, noted.reason) == (JobState.RUNNING, JobState.RUNNING, a_lost.state_reason)
    assert len(report.failed) == 1 and report.failed[0].startswith("a-lost: repair the job: ")
    assert report.re_requested == ["c-missing-a1"]
    assert jobs.capacity.status(ZONE, "c-missing-a1") is not None
    assert jobs.store.get("b-silent").attempt == 2  # the later phase ran

    beat(jobs, "heartbeat", 0, job_id="a-lost")
    second = jobs.tick()
    assert second.failed == []
    assert (jobs.store.get("a-lost").state, jobs.store.get("a-lost").attempt) == (JobState.PROVISIONING, 2)


class Exploding:
    """The real store, but one of its queries fails with an error nobody expected."""

    def __init__(self, store: Any, method: str) -> None:
        self._store = store
        self._method = method

    def __getattr__(self, name):
        if name == self._method:

            def explode(*args, **kwargs):
                raise RuntimeError(f"{name} exploded")

            return explode
        return getattr(self._store, name)


def test_an_unexpected_error_in_one_phase_is_logged_and_the_next_phase_runs(make, clock, caplog):
    """The silent-worker query raises something unforeseen: the tick logs it with its traceback and
    still finds the hosts that never booted, in the phase after it."""
    jobs = make(boot_timeout_seconds=120.0)
    active_but_silent(jobs, "never-booted")
    clock.advance(121)
    exploding = Exploding(jobs.store, "silent_workers")

    report = jobs.tick(store=exploding)

    assert report.failed == ["find silent workers: silent_workers exploded"]
    assert any(r.exc_info and "could not find silent workers" in r.getMessage() for r in caplog.records)
    job = jobs.store.get("never-booted")
    assert (job.state, job.attempt) == (JobState.PROVISIONING, 2)  # the boot check ran after it


# --- the listing: projected, paged, uncapped -------------------------------------------


class SmallPages:
    """The real store, listing active jobs two to a page (the coordinator's and the shards' reads)."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name):
        return getattr(self._store, name)

    def active_placements(self, page_size: int = 500):
        return self._store.active_placements(2)

    def active_in_shard(self, zone, after, through, page_size: int = 500):
        return self._store.active_in_shard(zone, after, through, 2)


def test_more_active_jobs_than_a_page_are_all_reconciled(jobs):
    """Five PROVISIONING jobs lost their queued resources; pages of two: all five are asked for again."""
    names = [f"job-{n}" for n in range(5)]
    for job_id in names:
        submitted(jobs, job_id)
        vanish(jobs, f"{job_id}-a1")
    assert {p.job_id for p in jobs.store.active_placements(2)} == set(names)
    report = jobs.tick(store=SmallPages(jobs.store))

    assert report.jobs == 5
    assert sorted(report.re_requested) == [f"{job_id}-a1" for job_id in names]
    assert all(jobs.capacity.status(ZONE, f"{job_id}-a1") is not None for job_id in names)


def test_every_query_of_a_tick_pages_past_a_page_of_results(jobs, clock):
    """Ended jobs (for their exports) and silent workers, two to a page: each query finds all
    five, and ended jobs come as outlines (no env), like the active ones."""
    names = [f"done-{n}" for n in range(5)]
    start = clock()
    for job_id in names:
        running_job(jobs, job_id, accelerator="v4-8")
        beat(jobs, "heartbeat", 0, job_id=job_id)
    clock.advance(120)  # every worker silent for longer than the timeout
    silent = jobs.store.silent_workers(clock(), 2)
    assert sorted(w.job_id for w in silent) == names
    for job_id in names:
        jobs.cancel(job_id, "done")
    ended = jobs.store.ended_between(start, clock() + timedelta(seconds=1), 2)
    assert sorted(job.job_id for job in ended) == names
    assert all(job.spec.env == {} and job.state is JobState.CANCELLED for job in ended)


# --- creates followed through -------------------------------------------------------------


def created(simulator_url: str, project_id: str, job_id: str) -> list[str]:
    """Every queued resource of the job the simulator was asked to create, repeats kept."""
    state = SimulatorControl(simulator_url).state()
    return [
        op["metadata"]["target"].rsplit("/", 1)[-1]
        for op in state["operations"]
        if op["metadata"]["verb"] == "create"
        and f"/{project_id}/" in op["metadata"]["target"]
        and op["metadata"]["target"].rsplit("/", 1)[-1].startswith(f"{job_id}-a")
    ]


def test_a_resource_already_being_deleted_is_not_deleted_again_at_every_tick(jobs, simulator_url):
    """Deletion takes minutes: a cancelled job's resource still DELETING is left to finish, while one
    nobody deleted yet is released."""
    configure(simulator_url, deleting_seconds=60.0)
    try:
        submitted(jobs, "gone")
        jobs.cancel("gone", "done")  # releases: the resource is DELETING for a minute
        assert jobs.capacity.status(ZONE, "gone-a1").state is HoldingState.RELEASING
        submitted(jobs, "left")
        jobs.store.apply("left", Observation(EventKind.CANCEL_REQUESTED, None, "user", reason="x"), jobs.clock)

        report = jobs.tick()
    finally:
        configure(simulator_url, deleting_seconds=0.0)
    assert report.released == ["left-a1"]


def test_a_create_whose_operation_failed_moves_the_job_to_its_next_zone_saying_why(jobs, simulator_url, tpu_client):
    """The queued resource was deleted before it was accepted, so its create operation ended with
    ABORTED and nothing exists: the tick reads the operation and the job moves to its next zone."""
    configure(simulator_url, accept_seconds=60.0)  # the create stays CREATING, its operation running
    submitted(jobs, "train-1", zones=[ZONE, "us-east5-a"])
    assert jobs.store.get("train-1").create_operation
    name = f"projects/{PROJECT}/locations/{ZONE}/queuedResources/train-1-a1"
    tpu_client.delete_queued_resource(request={"name": name, "force": True})
    configure(simulator_url, accept_seconds=0.0)

    report = jobs.tick()

    job = jobs.store.get("train-1")
    assert (job.state, job.attempt, job.zone) == (JobState.PROVISIONING, 2, "us-east5-a")
    (moved,) = [
        e
        for e in jobs.store.events("train-1")
        if e.from_state is JobState.PROVISIONING and e.to_state is JobState.QUEUED
    ]
    assert moved.reason.startswith("Queued resource train-1-a1 was never created: operation ")
    assert "failed with ABORTED" in moved.reason and moved.reason.endswith("attempt 2 moves to us-east5-a.")
    assert report.re_requested == []


def test_a_queued_resource_that_never_appears_is_asked_for_within_the_zone_wait_then_ends_by_the_rules(
    jobs, clock, simulator_url
):
    """Deleted behind tpujobs' back twice: asked for again once within the zone wait; past it, with no
    zone left and no restart left, the job FAILS saying so; no tick asks again after that."""
    submitted(jobs, "train-1", max_restarts=0)
    vanish(jobs, "train-1-a1")
    first = jobs.tick()
    assert first.re_requested == ["train-1-a1"]
    (again,) = [e for e in jobs.store.events("train-1") if e.source == "reconciler"]
    assert again.reason == f"Queued resource train-1-a1 was missing; requested again in {ZONE}."
    vanish(jobs, "train-1-a1")
    clock.advance(601)

    second = jobs.tick()
    third = jobs.tick()

    job = jobs.store.get("train-1")
    assert job.state is JobState.FAILED
    assert job.state_reason.startswith("Queued resource train-1-a1 never appeared in the 10 min after its request")
    assert second.re_requested == [] and third.re_requested == []
    assert created(simulator_url, PROJECT, "train-1") == ["train-1-a1", "train-1-a1"]


# --- TPU quota: the job waits, saying so ---------------------------------------------------


def test_a_job_refused_for_tpu_quota_waits_provisioning_and_is_asked_for_again(jobs, simulator_url):
    """A 429 whose details say the TPU quota ran out: the submission is done with (no error, no
    rejection), the job PROVISIONING says what Google said; a tick still refused writes nothing; the
    first tick with room creates the queued resource."""
    from tpujobs.domain.states import QUOTA_EXHAUSTED

    fault(simulator_url, "create", 429, count=2, quota=True)
    submitted(jobs, "train-1")
    job = jobs.store.get("train-1")
    assert (job.state, job.capacity_state) == (JobState.PROVISIONING, QUOTA_EXHAUSTED)
    assert job.state_reason.startswith(
        f"TPU quota exhausted in {ZONE}: Quota limit 'TPUsPerProjectPerZoneForTPUAPI' has been exceeded"
    )
    assert job.state_reason.endswith("; waiting, asked again at every reconciler tick.")
    assert jobs.capacity.status(ZONE, "train-1-a1") is None
    assert jobs.rejections() == []
    events = len(jobs.store.events("train-1"))

    still = jobs.tick()
    assert still.re_requested == ["train-1-a1"] and len(jobs.store.events("train-1")) == events
    room = jobs.tick()

    job = jobs.store.get("train-1")
    assert room.re_requested == ["train-1-a1"] and job.capacity_state != QUOTA_EXHAUSTED
    assert job.state_reason == f"The TPU quota in {ZONE} has room now: queued resource train-1-a1 requested."
    assert jobs.capacity.status(ZONE, "train-1-a1") is not None


def test_a_job_waiting_for_tpu_quota_moves_to_its_next_zone_after_the_zone_wait(jobs, clock, simulator_url):
    """Still no quota 10 minutes on, with another zone in `zones`: attempt 2 is requested there."""
    fault(simulator_url, "create", 429, count=2, quota=True)
    submitted(jobs, "train-1", zones=[ZONE, "us-east5-a"])
    jobs.tick()
    clock.advance(601)

    jobs.tick()

    job = jobs.store.get("train-1")
    assert (job.state, job.attempt, job.zone) == (JobState.PROVISIONING, 2, "us-east5-a")
    (moved,) = [
        e
        for e in jobs.store.events("train-1")
        if e.from_state is JobState.PROVISIONING and e.to_state is JobState.QUEUED
    ]
    assert moved.reason == f"The TPU quota had no room for 10 min in {ZONE}; attempt 2 moves to us-east5-a."


# --- node states and health that often pass -----------------------------------------------


def running_active(jobs: Engine) -> None:
    """A one-host job RUNNING on capacity the simulator shows ACTIVE (its nodes READY, HEALTHY)."""
    from tpujobs.local.testing import wait_for

    running_job(jobs, accelerator="v4-8")
    wait_for(lambda: jobs.capacity.status(ZONE, "train-1-a1").state == "ACTIVE", timeout=10)


@pytest.mark.parametrize(
    ("verb", "body", "condition"),
    [
        ("node-health", {"health": "TIMEOUT"}, "health TIMEOUT"),
        ("node-health", {"health": "UNHEALTHY_TENSORFLOW"}, "health UNHEALTHY_TENSORFLOW"),
        ("node-state", {"state": "RESTARTING"}, "state RESTARTING"),
        ("node-state", {"state": "UNKNOWN"}, "state UNKNOWN"),
    ],
)
def test_a_node_condition_that_often_passes_is_a_lost_host_only_past_the_grace(
    jobs, clock, simulator_url, verb, body, condition
):
    """Seen at once, remembered on the job with its time; gone within the grace: forgotten, nothing
    lost; seen again and lasting past the grace: the host is lost and attempt 2 is requested."""
    assert jobs.settings.unhealthy_grace_seconds == 300  # the default
    running_active(jobs)
    control(simulator_url, f"queuedResources/{ZONE}/train-1-a1:{verb}", body)

    def tick_after(seconds: float):
        clock.advance(seconds)
        beat(jobs, "heartbeat", 0)
        return jobs.tick()

    tick_after(0)
    job = jobs.store.get("train-1")
    ((node, seen_as, since),) = [(h.node, h.condition, h.first_seen_at) for h in job.suspect_hosts]
    assert (job.state, node, seen_as, since) == (JobState.RUNNING, "train-1-a1", condition, clock())
    assert job.state_reason == f"Watching: node train-1-a1 is {condition}; a host is lost if its condition lasts 300 s."
    events = len(jobs.store.events("train-1"))
    tick_after(50)
    assert len(jobs.store.events("train-1")) == events  # the same condition again writes nothing

    control(simulator_url, f"queuedResources/{ZONE}/train-1-a1:node-state", {"state": "READY"})
    control(simulator_url, f"queuedResources/{ZONE}/train-1-a1:node-health", {"health": "HEALTHY"})
    tick_after(50)
    job = jobs.store.get("train-1")
    assert (job.state, job.suspect_hosts) == (JobState.RUNNING, ())
    assert job.state_reason == "Every host of attempt 1 is back to a definite, healthy state."

    control(simulator_url, f"queuedResources/{ZONE}/train-1-a1:{verb}", body)
    tick_after(50)
    tick_after(50)
    for _ in range(5):
        tick_after(50)  # 300 s since it was seen again: not yet past the grace
    assert (jobs.store.get("train-1").state, jobs.store.get("train-1").attempt) == (JobState.RUNNING, 1)

    tick_after(1)

    job = jobs.store.get("train-1")
    assert (job.state, job.attempt, job.suspect_hosts) == (JobState.PROVISIONING, 2, ())
    (lost,) = [e for e in jobs.store.events("train-1") if e.to_state is JobState.RECOVERING]
    assert lost.reason.startswith(
        f"Node train-1-a1 has been {condition} for 301 s, past the 300 s grace: the host is lost"
    )


@pytest.mark.parametrize(
    ("verb", "body"),
    [("node-health", {"health": "UNHEALTHY_MAINTENANCE"}), ("node-state", {"state": "PREEMPTED"}),
     ("node-state", {"state": "TERMINATED"})],
)  # fmt: skip
def test_a_node_state_that_means_the_host_is_gone_is_lost_at_once(jobs, simulator_url, verb, body):
    """No grace for a host that is certainly gone: the first tick that sees it starts attempt 2."""
    running_active(jobs)
    control(simulator_url, f"queuedResources/{ZONE}/train-1-a1:{verb}", body)

    jobs.tick()

    job = jobs.store.get("train-1")
    assert (job.state, job.attempt) == (JobState.PROVISIONING, 2)

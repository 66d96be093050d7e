"""Quotas, admission in queue order, priority eviction, zone failover and the on-demand fallback.

On the Firestore emulator and the TPU simulator, through the real clients. Admission is
driven by the events that free chips: these tests never wait for a reconciler tick unless
the tick is what they are about.
"""

from __future__ import annotations

import dataclasses
import threading
from datetime import datetime, timezone

import pytest
from google.cloud import tpu_v2

from tpujobs.adapters.firestore_pools import FirestorePools
from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.adapters.tpu import CloudTpu, build_client
from tpujobs.domain.states import JobState
from tpujobs.engine.job_service import JobService
from tpujobs.local.simulator import SimulatorConfig, SimulatorServer
from tpujobs.local.testing import OffsetClock, local_settings, reconciler_for, signed
from tpujobs.local.testing import inbound as message

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"
OTHER_ZONE = "us-east5-a"


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@pytest.fixture
def simulator(request) -> SimulatorServer:
    capacity = getattr(request, "param", {})
    config = SimulatorConfig(waiting_seconds=0.05, provisioning_seconds=0.1, capacity=capacity)
    with SimulatorServer(config, run_workers=False) as server:
        yield server


@pytest.fixture
def pools(firestore_client) -> FirestorePools:
    return FirestorePools(firestore_client)


@pytest.fixture
def clock() -> OffsetClock:
    return OffsetClock()


@pytest.fixture
def service(firestore_client, project_id, simulator, pools, clock) -> JobService:
    settings = local_settings(
        project=project_id, default_zone=ZONE, tpu_endpoint=simulator.url, logs_bucket="logs", zone_wait_seconds=0.5
    )
    tpu = CloudTpu(build_client(simulator.url), project_id)
    return JobService(FirestoreJobStore(firestore_client), tpu, settings, clock, lambda _: None, pools=pools)


def submit(service: JobService, job_id: str, **changes) -> str:
    spec = {
        "job_id": job_id,
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-8",  # 4 chips
        "command": "python train.py",
        **changes,
    }
    service.submit(message("tpujobs-submit", spec))
    return job_id


def state(service: JobService, job_id: str) -> JobState:
    return service.store.get(job_id).state


def live_resources(simulator: SimulatorServer, project_id: str, zone: str = ZONE) -> set[str]:
    client = build_client(simulator.url)
    found = client.list_queued_resources(parent=f"projects/{project_id}/locations/{zone}")
    return {r.name.rsplit("/", 1)[-1] for r in found if r.state.state.name != "DELETING"}


def test_without_a_quota_every_job_is_admitted_at_once(service):
    for n in range(3):
        submit(service, f"free-{n}")
    assert [state(service, f"free-{n}") for n in range(3)] == [JobState.PROVISIONING] * 3


def test_jobs_wait_for_quota_and_the_next_is_admitted_when_one_ends(service, pools, simulator, project_id):
    """Quota 8 v4 chips: two 4-chip jobs run, the rest wait; a cancel admits the next at once."""
    pools.set_quota(ZONE, "v4", 8)
    submit(service, "q-1")
    submit(service, "q-2")
    submit(service, "q-3")
    submit(service, "q-4", priority="low")
    submit(service, "q-5")  # medium, submitted after the low one: goes before it

    assert [state(service, f"q-{n}") for n in range(1, 6)] == [
        JobState.PROVISIONING,
        JobState.PROVISIONING,
        JobState.QUEUED,
        JobState.QUEUED,
        JobState.QUEUED,
    ]
    waiting = service.store.get("q-3")
    assert waiting.state_reason == "Waiting for quota: needs 4 v4 chips in us-central2-b, where the quota is 8."
    assert pools.view(f"v4@{ZONE}").holders[0].job_id in {"q-1", "q-2"}

    service.cancel("q-1", "Cancelled by ada.")  # the event that frees chips admits the next job
    assert state(service, "q-3") is JobState.PROVISIONING
    service.cancel("q-2", "Cancelled by ada.")
    assert state(service, "q-5") is JobState.PROVISIONING, "medium goes before low, whatever came first"
    assert state(service, "q-4") is JobState.QUEUED
    assert {h.job_id for h in pools.view(f"v4@{ZONE}").holders} == {"q-3", "q-5"}
    assert live_resources(simulator, project_id) == {"q-3-a1", "q-5-a1"}


def test_a_quota_raised_at_run_time_admits_on_the_next_tick(service, pools):
    pools.set_quota(ZONE, "v4", 4)
    submit(service, "r-1")
    submit(service, "r-2")
    assert state(service, "r-2") is JobState.QUEUED

    pools.set_quota(ZONE, "v4", 8)
    reconciler_for(service).tick()
    assert state(service, "r-2") is JobState.PROVISIONING
    pools.set_quota(ZONE, "v4", None)  # no quota: no limit
    submit(service, "r-3")
    assert state(service, "r-3") is JobState.PROVISIONING


def test_concurrent_admissions_never_hand_out_a_chip_twice(service, pools):
    """Twelve submissions at once against a quota of four jobs: exactly four are admitted,
    and the compare-and-set on the pool document sees no lock timeout."""
    pools.set_quota(ZONE, "v4", 16)
    errors: list[BaseException] = []

    def one(n: int) -> None:
        try:
            submit(service, f"c-{n}")
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    states = [state(service, f"c-{n}") for n in range(12)]
    assert states.count(JobState.PROVISIONING) == 4
    assert states.count(JobState.QUEUED) == 8
    assert sum(h.chips for h in pools.view(f"v4@{ZONE}").holders) == 16


def test_a_high_priority_job_evicts_the_lowest_newest_job_which_resumes_later(
    service, pools, simulator, project_id, clock
):
    pools.set_quota(ZONE, "v4", 8)
    submit(service, "low-old", priority="low")
    clock.advance(0.01)
    submit(service, "low-new", priority="low")
    service.on_worker_report(
        signed(
            service,
            "tpujobs-worker-events",
            {"kind": "started", "job_id": "low-new", "attempt": 1, "slice_id": 0, "worker_id": 0},
        )
    )
    submit(service, "urgent", priority="high")

    assert state(service, "urgent") is JobState.PROVISIONING
    evicted = service.store.get("low-new")
    assert evicted.state is JobState.QUEUED and evicted.attempt == 2 and evicted.resume_next
    assert state(service, "low-old") is JobState.PROVISIONING
    (eviction,) = [e for e in service.store.events("low-new") if "Evicted" in e.reason]
    assert eviction.from_state is JobState.RUNNING and eviction.to_state is JobState.QUEUED
    assert "Evicted by urgent (priority high)" in eviction.reason
    assert "will resume from its checkpoint" in eviction.reason
    assert "low-new-a1" not in live_resources(simulator, project_id)  # its capacity was released
    assert evicted.usage[0].capacity_lost  # the evicted attempt's work since its checkpoint is lost

    service.cancel("urgent", "Cancelled by ada.")
    back = service.store.get("low-new")
    assert back.state is JobState.PROVISIONING and back.queued_resource == "low-new-a2"


def test_medium_priority_never_evicts_and_jobs_that_cannot_recover_are_never_evicted(service, pools):
    pools.set_quota(ZONE, "v4", 8)
    submit(service, "keep-1", priority="low", on_preemption="fail")
    submit(service, "keep-2", priority="low")
    submit(service, "medium", priority="medium")
    assert state(service, "medium") is JobState.QUEUED
    submit(service, "urgent", priority="very-high", accelerator_type="v4-16")  # needs all 8 chips
    assert state(service, "urgent") is JobState.QUEUED  # keep-1 may not be evicted: 4 chips are not enough
    assert state(service, "keep-1") is JobState.PROVISIONING
    assert state(service, "keep-2") is JobState.PROVISIONING


@pytest.mark.parametrize("simulator", [{f"v4@{ZONE}": 0}], indirect=True)
def test_a_queued_resource_waiting_too_long_moves_the_job_to_its_next_zone(service, simulator, project_id, clock):
    submit(service, "roam", zones=[ZONE, OTHER_ZONE])
    job = service.store.get("roam")
    assert job.state is JobState.PROVISIONING and job.zone == ZONE
    clock.advance(0.7)  # past zone_wait_seconds, with no v4 capacity in the first zone

    reconciler_for(service).tick()

    job = service.store.get("roam")
    assert job.state is JobState.PROVISIONING and job.zone == OTHER_ZONE and job.queued_resource == "roam-a2"
    assert [u.zone for u in job.usage] == [ZONE, OTHER_ZONE]
    moved = [e for e in service.store.events("roam") if e.to_state is JobState.QUEUED][-1]
    assert f"in {ZONE}; attempt 2 moves to {OTHER_ZONE}" in moved.reason
    assert live_resources(simulator, project_id, ZONE) == set()
    assert live_resources(simulator, project_id, OTHER_ZONE) == {"roam-a2"}


def test_a_queued_resource_that_failed_before_running_moves_the_job_to_its_next_zone(service):
    submit(service, "roam", zones=[ZONE, OTHER_ZONE])
    service.observe_capacity("roam-a1", "FAILED", "no capacity in zone")
    job = service.store.get("roam")
    assert job.zone == OTHER_ZONE and job.attempt == 2 and job.state is JobState.PROVISIONING
    assert job.restarts == 0  # moving zone is not a restart


def test_a_spot_job_continues_on_demand_after_repeated_preemptions(service, simulator, project_id):
    submit(service, "flaky", capacity="spot", on_demand_after_preemptions=2, preemption_window_minutes=60)
    client = build_client(simulator.url)
    name = f"projects/{project_id}/locations/{ZONE}/queuedResources"
    assert tpu_v2.QueuedResource.pb(client.get_queued_resource(name=f"{name}/flaky-a1")).HasField("spot")
    for attempt in (1, 2):
        service.on_worker_report(
            signed(
                service,
                "tpujobs-worker-events",
                {"kind": "started", "job_id": "flaky", "attempt": attempt, "slice_id": 0, "worker_id": 0},
            )
        )
        service.on_preemption(
            signed(
                service, "tpujobs-preemption", {"job_id": "flaky", "attempt": attempt, "slice_id": 0, "worker_id": 0}
            )
        )
    job = service.store.get("flaky")
    assert job.attempt == 3 and job.on_demand and job.capacity == "on-demand"
    third = client.get_queued_resource(name=f"{name}/flaky-a3")
    assert not tpu_v2.QueuedResource.pb(third).HasField("spot")
    reasons = [e.reason for e in service.store.events("flaky")]
    assert any("continues on on-demand capacity" in r for r in reasons)


def test_a_pool_with_quota_zero_admits_when_the_quota_is_raised(service, pools):
    pools.set_quota(ZONE, "v4", 0)
    submit(service, "zero-1")
    assert state(service, "zero-1") is JobState.QUEUED
    pools.set_quota(ZONE, "v4", 4)
    reconciler_for(service).tick()
    assert state(service, "zero-1") is JobState.PROVISIONING


def test_a_tick_admits_a_waiting_pool_once_not_once_per_waiting_job(service, pools, firestore_client):
    """Waiting jobs are old, so a tick finds them 'stuck'; it must not admit per job."""
    from tpujobs.local.testing import CrashingPools, CrashingStore, CrashPlan

    pools.set_quota(ZONE, "v4", 4)
    for n in range(6):
        submit(service, f"wait-{n}")
    plan = CrashPlan()  # counts only
    counted = JobService(
        CrashingStore(service.store, plan),
        service.tpu,
        dataclasses.replace(service.settings, stuck_after_seconds=0.0),
        utc_now,
        lambda _: None,
        pools=CrashingPools(pools, plan),
    )
    reconciler_for(counted).tick()
    assert plan.steps.count("pools.queue") == 1, plan.steps
    assert [state(service, f"wait-{n}") for n in range(6)].count(JobState.PROVISIONING) == 1


def test_a_job_bigger_than_the_quota_is_refused_at_submission_and_the_queue_moves(service, pools):
    """16 chips against a quota of 8: a rejection with a sentence, no job; the next job runs."""
    pools.set_quota(ZONE, "v4", 8)
    outcome = service.submit(
        message(
            "tpujobs-submit",
            {"job_id": "huge", "name": "huge", "owner": "ada@example.com", "accelerator_type": "v4-32", "command": "x"},
        )
    )
    assert outcome.kind == "rejected"
    assert service.store.get("huge") is None
    (rejection,) = service.store.rejections()
    assert rejection.reason == (
        "job 'huge' asks for 16 chips of v4 in us-central2-b, whose quota is 8: it could never run; "
        "ask an admin to raise the quota, or ask for fewer chips"
    )
    submit(service, "after")
    assert state(service, "after") is JobState.PROVISIONING


def test_a_quota_lowered_under_the_waiting_head_fails_it_and_admits_the_job_behind(service, pools):
    """The head (16 chips) waits; the quota drops to 12: it can never run, so it fails with the
    quota in its reason, and the 4-chip job behind it is admitted at the next tick."""
    pools.set_quota(ZONE, "v4", 16)
    submit(service, "running")
    submit(service, "head", accelerator_type="v4-32")  # 16 chips: waits for the 4 held
    submit(service, "behind")
    assert [state(service, j) for j in ("running", "head", "behind")] == [
        JobState.PROVISIONING,
        JobState.QUEUED,
        JobState.QUEUED,
    ]

    pools.set_quota(ZONE, "v4", 12)
    reconciler_for(service).tick()

    head = service.store.get("head")
    assert head.state is JobState.FAILED
    assert head.state_reason == (
        "The job asks for 16 chips of v4 in us-central2-b, whose quota is 12: it could never run there; "
        "ask an admin to raise the quota, or ask for fewer chips."
    )
    assert state(service, "behind") is JobState.PROVISIONING
    assert {h.job_id for h in pools.view(f"v4@{ZONE}").holders} == {"running", "behind"}


def test_a_zone_whose_quota_is_too_small_is_skipped(service, pools, simulator, project_id):
    """Zones [small, large]: the job is accepted, moves to the zone that can take it, and runs there."""
    pools.set_quota(ZONE, "v4", 4)
    submit(service, "skip", accelerator_type="v4-16", zones=[ZONE, OTHER_ZONE])  # 8 chips
    job = service.store.get("skip")
    assert (job.state, job.zone, job.attempt) == (JobState.PROVISIONING, OTHER_ZONE, 1)
    assert [u.zone for u in job.usage] == [OTHER_ZONE]
    moved = [
        e for e in service.store.events("skip") if e.from_state is JobState.QUEUED and e.to_state is JobState.QUEUED
    ]
    assert len(moved) == 1 and f"attempt 1 waits in {OTHER_ZONE} instead" in moved[0].reason
    assert live_resources(simulator, project_id, OTHER_ZONE) == {"skip-a1"}

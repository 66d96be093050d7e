"""Quotas, admission in queue order, priority eviction, zone failover and the on-demand fallback,
on the fakes and the TPU simulator.

Admission is driven by the events that free chips: these tests never wait for a reconciler tick
unless the tick is what they are about.
"""

from __future__ import annotations

import threading

import pytest
from engine_harness import PROJECT, ZONE, Engine
from google.cloud import tpu_v2

from tpujobs.domain.states import JobState
from tpujobs.local.testing import CrashPlan, OffsetClock

OTHER_ZONE = "us-east5-a"
POOL = "v4@us-central2"  # the on-demand v4 chips of ZONE's region


@pytest.fixture
def clock() -> OffsetClock:
    return OffsetClock()


@pytest.fixture
def jobs(engine, clock) -> Engine:
    return engine(zone_wait_seconds=0.5, clock=clock)


def submit(jobs: Engine, job_id: str, **changes) -> str:
    spec = {
        "job_id": job_id,
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-8",  # 4 chips
        "command": "python train.py",
        **changes,
    }
    jobs.submit(spec)
    return job_id


def state(jobs: Engine, job_id: str) -> JobState:
    return jobs.job(job_id).state


def test_without_a_quota_every_job_is_admitted_at_once(jobs):
    """No quota, no limit: three jobs are all PROVISIONING."""
    for n in range(3):
        submit(jobs, f"free-{n}")
    assert [state(jobs, f"free-{n}") for n in range(3)] == [JobState.PROVISIONING] * 3


def test_jobs_wait_for_quota_and_the_next_is_admitted_when_one_ends(jobs):
    """Quota 8 v4 chips: two 4-chip jobs run, the rest wait; a cancel admits the next at once."""
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 8)
    submit(jobs, "q-1")
    submit(jobs, "q-2")
    submit(jobs, "q-3")
    submit(jobs, "q-4", priority="low")
    submit(jobs, "q-5")  # medium, submitted after the low one: goes before it

    assert [state(jobs, f"q-{n}") for n in range(1, 6)] == [
        JobState.PROVISIONING,
        JobState.PROVISIONING,
        JobState.QUEUED,
        JobState.QUEUED,
        JobState.QUEUED,
    ]
    waiting = jobs.job("q-3")
    assert waiting.state_reason == (
        "Waiting for quota: needs 4 chips, and the quota of v4 on-demand chips in us-central2-b is 8."
    )
    assert jobs.pools.view(POOL).holders[0].job_id in {"q-1", "q-2"}

    jobs.cancel("q-1", "Cancelled by ada.")  # the event that frees chips admits the next job
    assert state(jobs, "q-3") is JobState.PROVISIONING
    jobs.cancel("q-2", "Cancelled by ada.")
    assert state(jobs, "q-5") is JobState.PROVISIONING, "medium goes before low, whatever came first"
    assert state(jobs, "q-4") is JobState.QUEUED
    assert {h.job_id for h in jobs.pools.view(POOL).holders} == {"q-3", "q-5"}
    assert jobs.live_capacity() == {"q-3-a1", "q-5-a1"}


def test_a_quota_raised_at_run_time_admits_on_the_next_tick(jobs):
    """A raised quota admits the waiting job at the next tick; no quota at all admits at once."""
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 4)
    submit(jobs, "r-1")
    submit(jobs, "r-2")
    assert state(jobs, "r-2") is JobState.QUEUED

    jobs.pools.set_quota(ZONE, "v4", "on-demand", 8)
    jobs.tick()
    assert state(jobs, "r-2") is JobState.PROVISIONING
    jobs.pools.set_quota(ZONE, "v4", "on-demand", None)  # no quota: no limit
    submit(jobs, "r-3")
    assert state(jobs, "r-3") is JobState.PROVISIONING


def test_concurrent_admissions_never_hand_out_a_chip_twice(jobs):
    """Twelve submissions at once against a quota of four jobs: exactly four are admitted."""
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 16)
    errors: list[BaseException] = []

    def one(n: int) -> None:
        try:
            submit(jobs, f"c-{n}")
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    states = [state(jobs, f"c-{n}") for n in range(12)]
    assert states.count(JobState.PROVISIONING) == 4
    assert states.count(JobState.QUEUED) == 8
    assert sum(h.chips for h in jobs.pools.view(POOL).holders) == 16


def test_a_high_priority_job_evicts_the_lowest_newest_job_which_resumes_later(jobs, clock):
    """The evicted job goes back to QUEUED for its next attempt, resumes, and its capacity goes."""
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 8)
    submit(jobs, "low-old", priority="low")
    clock.advance(0.01)
    submit(jobs, "low-new", priority="low")
    jobs.report("started", 1, job_id="low-new")
    submit(jobs, "urgent", priority="high")

    assert state(jobs, "urgent") is JobState.PROVISIONING
    evicted = jobs.job("low-new")
    assert evicted.state is JobState.QUEUED and evicted.attempt == 2 and evicted.resume_next
    assert state(jobs, "low-old") is JobState.PROVISIONING
    (eviction,) = [e for e in jobs.events("low-new") if "Evicted" in e.reason]
    assert eviction.from_state is JobState.RUNNING and eviction.to_state is JobState.QUEUED
    assert "Evicted by urgent (priority high)" in eviction.reason
    assert "will resume from its checkpoint" in eviction.reason
    assert "low-new-a1" not in jobs.live_capacity()  # its capacity was released
    assert evicted.usage[0].capacity_lost  # the evicted attempt's work since its checkpoint is lost

    jobs.cancel("urgent", "Cancelled by ada.")
    back = jobs.job("low-new")
    assert back.state is JobState.PROVISIONING and back.queued_resource == "low-new-a2"


def test_medium_priority_never_evicts_and_jobs_that_cannot_recover_are_never_evicted(jobs):
    """A medium job waits; a very-high one needing the chips of a job that cannot recover waits too."""
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 8)
    submit(jobs, "keep-1", priority="low", on_preemption="fail")
    submit(jobs, "keep-2", priority="low")
    submit(jobs, "medium", priority="medium")
    assert state(jobs, "medium") is JobState.QUEUED
    submit(jobs, "urgent", priority="very-high", accelerator_type="v4-16")  # needs all 8 chips
    assert state(jobs, "urgent") is JobState.QUEUED  # keep-1 may not be evicted: 4 chips are not enough
    assert state(jobs, "keep-1") is JobState.PROVISIONING
    assert state(jobs, "keep-2") is JobState.PROVISIONING


def test_a_queued_resource_waiting_too_long_moves_the_job_to_its_next_zone(jobs, clock):
    """No v4 capacity in the first zone: past zone_wait_seconds the tick moves attempt 2 to the next zone."""
    jobs.simulator.configure(capacity={f"v4@{ZONE}": 0})  # the simulator's capacity is per zone
    submit(jobs, "roam", zones=[ZONE, OTHER_ZONE])
    job = jobs.job("roam")
    assert job.state is JobState.PROVISIONING and job.zone == ZONE
    clock.advance(0.7)  # past zone_wait_seconds, with no v4 capacity in the first zone

    jobs.tick()

    job = jobs.job("roam")
    assert job.state is JobState.PROVISIONING and job.zone == OTHER_ZONE and job.queued_resource == "roam-a2"
    assert [u.zone for u in job.usage] == [ZONE, OTHER_ZONE]
    moved = [e for e in jobs.events("roam") if e.to_state is JobState.QUEUED][-1]
    assert f"in {ZONE}; attempt 2 moves to {OTHER_ZONE}" in moved.reason
    assert jobs.live_capacity(ZONE) == set()
    assert jobs.live_capacity(OTHER_ZONE) == {"roam-a2"}


def test_a_queued_resource_that_failed_before_running_moves_the_job_to_its_next_zone(jobs):
    """FAILED before it ran: the next zone, and no restart counted."""
    submit(jobs, "roam", zones=[ZONE, OTHER_ZONE])
    jobs.qr_state({"queued_resource": "roam-a1", "zone": ZONE, "state": "FAILED", "detail": "no capacity in zone"})
    job = jobs.job("roam")
    assert job.zone == OTHER_ZONE and job.attempt == 2 and job.state is JobState.PROVISIONING
    assert job.restarts == 0  # moving zone is not a restart


def test_a_spot_job_continues_on_demand_after_repeated_preemptions(jobs, tpu_client):
    """Two preemptions within the window: attempt 3 asks for on-demand capacity."""
    submit(jobs, "flaky", capacity="spot", on_demand_after_preemptions=2, preemption_window_minutes=60)
    name = f"projects/{PROJECT}/locations/{ZONE}/queuedResources"
    assert tpu_v2.QueuedResource.pb(tpu_client.get_queued_resource(name=f"{name}/flaky-a1")).HasField("spot")
    for attempt in (1, 2):
        jobs.report("started", attempt, job_id="flaky")
        jobs.preempt(attempt, job_id="flaky")
    job = jobs.job("flaky")
    assert job.attempt == 3 and job.on_demand and job.capacity == "on-demand"
    third = tpu_client.get_queued_resource(name=f"{name}/flaky-a3")
    assert not tpu_v2.QueuedResource.pb(third).HasField("spot")
    assert any("continues on on-demand capacity" in e.reason for e in jobs.events("flaky"))


def test_a_pool_with_quota_zero_admits_when_the_quota_is_raised(jobs):
    """Quota 0 holds the job QUEUED; raised, the next tick admits it."""
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 0)
    submit(jobs, "zero-1")
    assert state(jobs, "zero-1") is JobState.QUEUED
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 4)
    jobs.tick()
    assert state(jobs, "zero-1") is JobState.PROVISIONING


def test_a_tick_admits_a_waiting_pool_once_not_once_per_waiting_job(engine):
    """Waiting jobs are old, so a tick finds them 'stuck'; it must not admit per job (a region's
    quota: a zone's would read the queue once more, further, for other zones' jobs)."""
    plan = CrashPlan()  # counts only
    jobs = engine(zone_wait_seconds=0.5, stuck_after_seconds=0.0, steps=plan)
    jobs.pools.set_quota("us-central2", "v4", "on-demand", 4)
    for n in range(6):
        submit(jobs, f"wait-{n}")
    plan.steps.clear()
    jobs.tick()
    assert plan.steps.count("pools.waiting") == 1, plan.steps
    assert [state(jobs, f"wait-{n}") for n in range(6)].count(JobState.PROVISIONING) == 1


def test_a_job_bigger_than_the_quota_is_refused_at_submission_and_the_queue_moves(jobs):
    """16 chips against a quota of 8: a rejection with a sentence, no job; the next job runs."""
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 8)
    spec = {"job_id": "huge", "name": "huge", "owner": "ada@example.com", "accelerator_type": "v4-32", "command": "x"}
    assert jobs.submit(spec).kind == "rejected"
    assert jobs.store.get("huge") is None
    (rejection,) = jobs.rejections()
    assert rejection.reason == (
        "job 'huge' asks for 16 chips, more than the quota of v4 on-demand chips in us-central2-b (8): it could "
        "never run; ask an admin to raise the quota, or ask for fewer chips"
    )
    submit(jobs, "after")
    assert state(jobs, "after") is JobState.PROVISIONING


def test_a_quota_lowered_under_the_waiting_head_fails_it_and_admits_the_job_behind(jobs):
    """The head (16 chips) waits; the quota drops to 12: it can never run, so it fails with the
    quota in its reason, and the 4-chip job behind it is admitted at the next tick."""
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 16)
    submit(jobs, "running")
    submit(jobs, "head", accelerator_type="v4-32")  # 16 chips: waits for the 4 held
    submit(jobs, "behind")
    assert [state(jobs, j) for j in ("running", "head", "behind")] == [
        JobState.PROVISIONING,
        JobState.QUEUED,
        JobState.QUEUED,
    ]

    jobs.pools.set_quota(ZONE, "v4", "on-demand", 12)
    jobs.tick()

    head = jobs.job("head")
    assert head.state is JobState.FAILED
    assert head.state_reason == (
        "The job asks for 16 chips, more than the quota of v4 on-demand chips in us-central2-b (12): it could "
        "never run there; ask an admin to raise the quota, or ask for fewer chips."
    )
    assert state(jobs, "behind") is JobState.PROVISIONING
    assert {h.job_id for h in jobs.pools.view(POOL).holders} == {"running", "behind"}


def test_a_zone_whose_quota_is_too_small_is_skipped(jobs):
    """Zones [small, large]: the job is accepted, moves to the zone that can take it, and runs there."""
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 4)
    submit(jobs, "skip", accelerator_type="v4-16", zones=[ZONE, OTHER_ZONE])  # 8 chips
    job = jobs.job("skip")
    assert (job.state, job.zone, job.attempt) == (JobState.PROVISIONING, OTHER_ZONE, 1)
    assert [u.zone for u in job.usage] == [OTHER_ZONE]
    moved = [e for e in jobs.events("skip") if e.from_state is JobState.QUEUED and e.to_state is JobState.QUEUED]
    assert len(moved) == 1 and f"attempt 1 waits in {OTHER_ZONE} instead" in moved[0].reason
    assert jobs.live_capacity(OTHER_ZONE) == {"skip-a1"}

"""Quota as Google counts it, in admission: one pool per family, tier and region, a region's
quota shared by its zones, a zone's quota strict only within its zone, reservations apart,
and failover out of a region whose quota is the limit. On the fakes and the TPU simulator."""

from __future__ import annotations

import pytest
from engine_harness import ZONE, Engine

from tpujobs.domain.admission import Holder
from tpujobs.domain.states import JobState
from tpujobs.engine.ports import PoolView
from tpujobs.local.testing import OffsetClock

REGION = "us-central2"
ZONE_A = "us-central2-a"  # ZONE is us-central2-b
ON_DEMAND, SPOT = f"v4@{REGION}", f"v4@{REGION}:spot"


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
    outcome = jobs.submit(spec)
    assert outcome.kind != "rejected", outcome.reason
    return job_id


def states(jobs: Engine, *job_ids: str) -> list[JobState]:
    return [jobs.job(j).state for j in job_ids]


def holders(jobs: Engine, pool: str) -> set[str]:
    return {h.job_id for h in jobs.pools.view(pool).holders}


P, Q = JobState.PROVISIONING, JobState.QUEUED


def test_spot_and_on_demand_jobs_of_one_zone_do_not_wait_for_each_other(jobs):
    """Room for one job of each tier: the second of each waits, each in its own pool."""
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 4)
    jobs.pools.set_quota(ZONE, "v4", "spot", 4)
    submit(jobs, "od-1")
    submit(jobs, "spot-1", capacity="spot")
    submit(jobs, "od-2")
    submit(jobs, "spot-2", capacity="spot")
    assert states(jobs, "od-1", "spot-1", "od-2", "spot-2") == [P, P, Q, Q]
    assert (holders(jobs, ON_DEMAND), holders(jobs, SPOT)) == ({"od-1"}, {"spot-1"})
    assert jobs.job("spot-2").state_reason == (
        "Waiting for quota: needs 4 chips, and the quota of v4 spot chips in us-central2-b is 4."
    )
    jobs.cancel("spot-1", "Cancelled by ada.")  # frees spot chips only
    assert states(jobs, "od-2", "spot-2") == [Q, P]


def test_a_regional_quota_is_shared_by_the_zones_of_its_region(jobs):
    """8 chips for the region: zone a's two jobs hold them, so zone b's job waits, though zone b
    holds nothing; when one of zone a's ends, zone b's runs."""
    jobs.pools.set_quota(REGION, "v4", "on-demand", 8)
    submit(jobs, "a-1", zones=[ZONE_A])
    submit(jobs, "a-2", zones=[ZONE_A])
    submit(jobs, "b-1", zones=[ZONE])
    assert states(jobs, "a-1", "a-2", "b-1") == [P, P, Q]
    assert jobs.job("b-1").state_reason == (
        "Waiting for quota: needs 4 chips, and the quota of v4 on-demand chips in region us-central2 is 8."
    )
    assert {(h.job_id, h.zone) for h in jobs.pools.view(ON_DEMAND).holders} == {("a-1", ZONE_A), ("a-2", ZONE_A)}
    jobs.cancel("a-1", "Cancelled by ada.")
    assert states(jobs, "b-1") == [P]
    assert holders(jobs, ON_DEMAND) == {"a-2", "b-1"}


def test_a_full_zone_quota_lets_the_jobs_of_another_zone_pass_but_not_the_region(jobs, clock):
    """Zone b may hold 4 of the region's 12: b-2 waits for its zone, and the later a-1 and a-2
    pass it (strict within each limit: b-3 stays behind b-2); with the region full, a-3 waits
    behind b-2, and when b-1 ends, b-2 goes first."""
    jobs.pools.set_quota(REGION, "v4", "on-demand", 12)
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 4)
    for job_id, zone in (("b-1", ZONE), ("b-2", ZONE), ("b-3", ZONE), ("a-1", ZONE_A), ("a-2", ZONE_A)):
        submit(jobs, job_id, zones=[zone])
        clock.advance(0.01)
    assert states(jobs, "b-1", "b-2", "b-3", "a-1", "a-2") == [P, Q, Q, P, P]
    assert jobs.job("b-2").state_reason == (
        "Waiting for quota: needs 4 chips, and the quota of v4 on-demand chips in us-central2-b is 4."
    )
    submit(jobs, "a-3", zones=[ZONE_A])  # the region is full now: a-3 waits for it
    assert states(jobs, "a-3") == [Q]
    assert "in region us-central2 is 12" in jobs.job("a-3").state_reason
    jobs.cancel("b-1", "Cancelled by ada.")
    assert states(jobs, "b-2", "b-3", "a-3") == [P, Q, Q]


def test_a_zone_quota_head_does_not_hide_other_zones_jobs_behind_a_long_queue(jobs, clock):
    """Six jobs wait for zone b's quota, more than one read of the queue's head: a later job of
    zone a is still admitted past them."""
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 4)
    for n in range(7):
        submit(jobs, f"b-{n}", zones=[ZONE])
        clock.advance(0.01)
    submit(jobs, "a-late", zones=[ZONE_A])
    assert states(jobs, "b-0", "b-6", "a-late") == [P, Q, P]


def test_a_reserved_job_counts_against_its_reservation_not_the_on_demand_quota(jobs):
    """On-demand is full; the reservation has room for one: the reserved job runs, the next
    reserved job waits for the reservation."""
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 4)
    jobs.pools.set_reservation("team-a", 4)
    submit(jobs, "od-1")
    submit(jobs, "od-2")
    submit(jobs, "res-1", capacity="reserved", reservation="team-a")
    submit(jobs, "res-2", capacity="reserved", reservation="team-a")
    assert states(jobs, "od-1", "od-2", "res-1", "res-2") == [P, Q, P, Q]
    assert holders(jobs, ON_DEMAND) == {"od-1"}
    assert holders(jobs, f"v4@{REGION}:reserved:team-a") == {"res-1"}
    assert jobs.job("res-2").state_reason == (
        "Waiting for quota: needs 4 chips, and the quota of v4 chips of reservation team-a is 4."
    )


def test_a_regional_quota_too_small_skips_every_zone_of_the_region(jobs):
    """v5p (4 chips) under a region quota of 2 in us-east5: not us-east5-b but us-central1-a."""
    jobs.pools.set_quota("us-east5", "v5p", "on-demand", 2)
    submit(jobs, "away", accelerator_type="v5p-8", zones=["us-east5-a", "us-east5-b", "us-central1-a"])
    job = jobs.job("away")
    assert (job.state, job.zone, job.attempt) == (P, "us-central1-a", 1)
    (moved,) = [e for e in jobs.events("away") if e.from_state is Q and e.to_state is Q]
    assert "more than the quota of v5p on-demand chips in region us-east5 (2)" in moved.reason
    assert "attempt 1 waits in us-central1-a instead" in moved.reason


def test_a_regional_quota_lowered_under_a_job_fails_it_naming_the_region(jobs):
    """Every later zone is in the same region: the job fails, saying that region's quota is the limit."""
    jobs.pools.set_quota("us-east5", "v5p", "on-demand", 8)
    zones = ["us-east5-a", "us-east5-b"]
    submit(jobs, "running", accelerator_type="v5p-8", zones=zones)
    submit(jobs, "big", accelerator_type="v5p-16", zones=zones)  # 8 chips: waits for the 4 held
    assert states(jobs, "running", "big") == [P, Q]
    jobs.pools.set_quota("us-east5", "v5p", "on-demand", 4)
    jobs.tick()
    big = jobs.job("big")
    assert (big.state, big.zone) == (JobState.FAILED, "us-east5-a")
    assert big.state_reason == (
        "The job asks for 8 chips, more than the quota of v5p on-demand chips in region us-east5 (4): it could "
        "never run there; its other zones are in region us-east5, which shares that quota; ask an admin to "
        "raise the quota, or ask for fewer chips."
    )


def test_a_spot_job_continued_on_on_demand_counts_as_on_demand_after_the_repair(jobs):
    """After its switch the job's chips move from the spot pool to the on-demand pool at the next
    tick, and the spot job waiting behind it gets the spot chips."""
    jobs.pools.set_quota(ZONE, "v4", "spot", 4)
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 8)
    submit(jobs, "flaky", capacity="spot", on_demand_after_preemptions=1, preemption_window_minutes=60)
    submit(jobs, "spot-2", capacity="spot")
    assert states(jobs, "flaky", "spot-2") == [P, Q]
    jobs.report("started", 1, job_id="flaky")
    jobs.preempt(1, job_id="flaky")
    assert jobs.job("flaky").capacity == "on-demand"
    jobs.tick()
    assert holders(jobs, SPOT) == {"spot-2"} and states(jobs, "spot-2") == [P]
    assert holders(jobs, ON_DEMAND) == {"flaky"}


def test_a_zones_pool_from_before_regions_is_retired_into_the_regional_pool(jobs):
    """`v4@us-central2-b` (a zone's pool, as an older deployment wrote it, with its jobs'
    documents naming it): the repair does not fail on it; the running job's hold moves to the
    regional pool with its zone, the queued job joins the regional queue, the old one is emptied."""
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 4)
    submit(jobs, "old")
    submit(jobs, "waiting")
    assert states(jobs, "old", "waiting") == [P, Q]
    old_pool = f"v4@{ZONE}"
    jobs.pools.change(jobs.pools.view(ON_DEMAND), remove=frozenset({"old"}))
    assert jobs.pools.change(PoolView(old_pool, (), None), add=Holder("old", 4, 1, "medium", jobs.clock()))
    for job_id in ("old", "waiting"):  # the documents as the older deployment wrote them
        jobs.store._jobs[job_id]["pool"] = old_pool  # no port writes a stale field
    jobs.tick()
    assert jobs.pools.view(old_pool).holders == ()
    assert {(h.job_id, h.zone) for h in jobs.pools.view(ON_DEMAND).holders} == {("old", ZONE)}
    assert [j.job_id for j in jobs.pools.queue(ON_DEMAND)] == ["waiting"]
    jobs.cancel("old", "Cancelled by ada.")
    assert states(jobs, "waiting") == [P]

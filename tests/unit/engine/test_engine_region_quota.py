"""Zone failover when Google says a REGION's quota is full: the other zones of that region have
no room either, so the failover after the zone wait skips them, or, with none outside it, the
job waits where it is and says why. On the TPU API the region comes with the refused create
(`QuotaExhausted.region`); on Compute Engine with the holding's status (`quota_region`)."""

from __future__ import annotations

import dataclasses

import pytest
from engine_harness import Engine

from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.states import QUOTA_EXHAUSTED, REGION_QUOTA_EXHAUSTED, JobState
from tpujobs.engine.errors import QuotaExhausted
from tpujobs.local.fakes.capacity import InMemoryCapacity
from tpujobs.local.testing import ManualClock

ZONES = ["us-east5-a", "us-east5-b", "us-central1-a"]
WAIT = 600.0  # the zone wait (TPUJOBS_ZONE_WAIT_SECONDS)
REGIONAL = "Quota limit 'TPUV4sPodPerProjectPerRegionForTPUAPI' has been exceeded. Limit: 0 in region us-east5."
ZONAL = "Quota limit 'TPUV4sPodPerProjectPerZoneForTPUAPI' has been exceeded. Limit: 0 in zone us-east5-a."


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def submitted(jobs: Engine, zones: list[str]) -> None:
    spec = {"job_id": "train-1", "name": "train", "owner": "ada@example.com", "accelerator_type": "v4-8"}
    assert jobs.submit({**spec, "command": "x", "zones": zones}).kind == "provisioning"


def refused_for_quota(engine, clock: ManualClock, error: QuotaExhausted, zones: list[str], refusals: int = 1):
    """A job whose first `refusals` requests the TPU API refuses with `error`."""
    capacity = InMemoryCapacity()
    for _ in range(refusals):
        capacity.refuse_next(error)
    jobs = engine(capacity=capacity, clock=clock, zone_wait_seconds=WAIT)
    submitted(jobs, zones)
    return jobs, capacity


@pytest.mark.parametrize(
    ("error", "capacity_state", "moved_to"),
    [
        (QuotaExhausted(REGIONAL, region="us-east5"), REGION_QUOTA_EXHAUSTED, "us-central1-a"),
        (QuotaExhausted(ZONAL), QUOTA_EXHAUSTED, "us-east5-b"),
    ],
    ids=["region-full", "zone-full"],
)
def test_a_request_refused_for_quota_fails_over_past_the_full_regions_zones(
    engine, clock, error, capacity_state, moved_to
):
    """Refused for us-east5's quota: after the zone wait attempt 2 is requested in us-central1-a,
    never in us-east5-b; refused for us-east5-a's own quota: us-east5-b is worth a try."""
    jobs, capacity = refused_for_quota(engine, clock, error, ZONES)
    job = jobs.job()
    assert (job.state, job.capacity_state) == (JobState.PROVISIONING, capacity_state)
    clock.advance(WAIT + 1)

    jobs.tick()

    job = jobs.job()
    assert (job.state, job.attempt, job.zone) == (JobState.PROVISIONING, 2, moved_to)
    assert capacity.held() == ["train-1-a2"] and [z for z, _ in capacity.holdings] == [moved_to]


def test_with_every_later_zone_in_the_full_region_the_job_waits_asked_again_and_says_why(engine, clock):
    """zones [us-east5-a, us-east5-b], us-east5's quota full: no pointless failover; the job stays
    in attempt 1, says why, is asked again every tick, and gets its capacity once there is room."""
    jobs, capacity = refused_for_quota(engine, clock, QuotaExhausted(REGIONAL, region="us-east5"), ZONES[:2], 3)
    job = jobs.job()
    assert "every later zone of the job is in us-east5 too, so it waits here" in job.state_reason
    clock.advance(WAIT + 1)

    waiting = jobs.tick()
    again = jobs.tick()

    job = jobs.job()
    assert (job.state, job.attempt, job.zone, job.capacity_state) == (
        JobState.PROVISIONING, 1, "us-east5-a", REGION_QUOTA_EXHAUSTED,
    )  # fmt: skip
    assert waiting.re_requested == ["train-1-a1"] and again.re_requested == ["train-1-a1"]
    room = jobs.tick()
    job = jobs.job()
    assert room.re_requested == ["train-1-a1"] and (job.attempt, job.zone) == (1, "us-east5-a")
    assert job.capacity_state == "WAITING" and capacity.held("us-east5-a") == ["train-1-a1"]


def compute_waiting(engine, clock: ManualClock, zones: list[str], quota_region: str):
    """A Compute Engine-like holding waiting for capacity, its hosts refused by `quota_region`'s quota."""
    capacity = InMemoryCapacity(initial_state=HoldingState.WAITING)
    jobs = engine(capacity=capacity, clock=clock, zone_wait_seconds=WAIT)
    submitted(jobs, zones)
    (holding,) = capacity.holdings.values()
    said = f"quota exhausted creating host train-1-c1-aaaa: QUOTA_EXCEEDED: Limit: 8.0 in region {quota_region}."
    holding.status = dataclasses.replace(holding.status, detail=said, quota_region=quota_region)
    return jobs, capacity


def test_a_holding_waiting_on_a_full_regions_quota_fails_over_outside_the_region(engine, clock):
    """Compute Engine's QUOTA_EXCEEDED "in region us-east5": past the zone wait, us-central1-a."""
    jobs, capacity = compute_waiting(engine, clock, ZONES, "us-east5")
    clock.advance(WAIT + 1)

    jobs.tick()

    job = jobs.job()
    assert (job.state, job.attempt, job.zone) == (JobState.PROVISIONING, 2, "us-central1-a")
    assert any("region us-east5's quota is full" in e.reason for e in jobs.events())
    assert "train-1-a1" in capacity.released()


def test_a_holding_waiting_on_a_full_regions_quota_with_no_zone_outside_it_waits_saying_why(engine, clock):
    """Every later zone in us-east5: the holding is kept, the job says why once, and a later tick
    writes nothing new."""
    jobs, capacity = compute_waiting(engine, clock, ZONES[:2], "us-east5")
    clock.advance(WAIT + 1)

    jobs.tick()
    events = len(jobs.events())
    jobs.tick()

    job = jobs.job()
    assert (job.state, job.attempt, job.zone) == (JobState.PROVISIONING, 1, "us-east5-a")
    assert "every later zone of the job is in us-east5" in job.state_reason
    assert len(jobs.events()) == events and capacity.released() == []

"""A partial Compute Engine slice (individual mode: some hosts came, the rest wait for capacity) is
a holding waiting for resources: the command never runs on it, and the zone wait bounds what it
costs: the attempt is released and fails over as for a stockout, its timeline saying how many came."""

from __future__ import annotations

import dataclasses

from engine_harness import Engine

from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.states import JobState
from tpujobs.local.fakes.capacity import InMemoryCapacity
from tpujobs.local.testing import ManualClock

WAIT = 600.0  # the zone wait (TPUJOBS_ZONE_WAIT_SECONDS)
CAME = "3 of 4 hosts came; the others wait: no capacity for host train-1-c1-dddd: ZONE_RESOURCE_POOL_EXHAUSTED"


def test_a_partial_slice_waits_the_zone_wait_then_is_released_and_fails_over_saying_how_many_came(engine) -> None:
    """WAITING_FOR_RESOURCES with 3 of 4 hosts: still PROVISIONING before the zone wait is over;
    after it, attempt 2 in the next zone, attempt 1's holding released, the reason naming the 3 of 4."""
    clock = ManualClock()
    capacity = InMemoryCapacity(initial_state=HoldingState.WAITING)
    jobs: Engine = engine(capacity=capacity, clock=clock, zone_wait_seconds=WAIT)
    spec = {"job_id": "train-1", "name": "train", "owner": "ada@example.com", "accelerator_type": "v4-8"}
    assert jobs.submit({**spec, "command": "x", "zones": ["us-east5-a", "us-east5-b"]}).kind == "provisioning"
    (holding,) = capacity.holdings.values()
    holding.status = dataclasses.replace(holding.status, detail=CAME)
    clock.advance(WAIT / 2)
    jobs.tick()
    assert (jobs.job().state, jobs.job().attempt) == (JobState.PROVISIONING, 1)

    clock.advance(WAIT)
    jobs.tick()

    job = jobs.job()
    assert (job.state, job.attempt, job.zone) == (JobState.PROVISIONING, 2, "us-east5-b")
    assert "train-1-a1" in capacity.released()
    assert any("3 of 4 hosts came" in e.reason and "moves to us-east5-b" in e.reason for e in jobs.events())

"""A unit's tell whose metadata write is not confirmed (the node had someone else's update in
flight at every try) leaves the unit untold without failing the job's handler; the reconciler
tells it again, and that write is confirmed."""

from __future__ import annotations

import pytest
from engine_harness import Engine
from test_engine_warm_pools import ADMIN, POOL, assignment, create, pool_of, ready, submit

from tpujobs.adapters.tpu import METADATA_TRIES
from tpujobs.domain.pools import UnitState
from tpujobs.engine.warm_pools.repair import TELL_AFTER
from tpujobs.local.testing import OffsetClock


@pytest.fixture
def clock() -> OffsetClock:
    return OffsetClock()


@pytest.fixture
def jobs(engine, clock) -> Engine:
    return engine(clock=clock, admins=(ADMIN,))


def test_a_tell_refused_as_concurrent_leaves_the_unit_untold_and_a_tick_tells_it(jobs, clock, tpu_client):
    """Every UpdateNode of the tell answered 409 ABORTED: the job is still placed on the unit, the
    unit not `written`; a tick past TELL_AFTER writes the assignment and marks it told."""
    create(jobs)
    ready(jobs)
    jobs.simulator.plan_errors("update", "ABORTED", count=METADATA_TRIES)
    outcome = submit(jobs, "j1")
    assert outcome.kind == "provisioning", outcome
    unit = pool_of(jobs).unit(0)
    assert (unit.state, unit.job_id, unit.written) == (UnitState.BUSY, "j1", False)
    assert "job_id" not in assignment(tpu_client, "demo-u0-g1")

    clock.advance(TELL_AFTER.total_seconds() + 1)
    jobs.tick()
    unit = pool_of(jobs, POOL).unit(0)
    assert unit.written
    told = assignment(tpu_client, "demo-u0-g1")
    assert (told["seq"], told["job_id"]) == (unit.seq, "j1")

"""Warm pools never take someone else's resource for a unit (issue 37, item 7), on the fake capacity.

Someone else's resource of a unit's name (`plant_foreign`: no tpujobs marker) is refused when
the unit is asked for (NotOurs), never seen as the unit in the reconciler's listing, never
written into and never released; the unit moves to its next generation, and says why.
"""

from __future__ import annotations

import pytest
from engine_harness import ZONE, Engine

from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.pools import Pool, UnitState
from tpujobs.engine.errors import PermanentError
from tpujobs.local.fakes.capacity import InMemoryCapacity
from tpujobs.local.testing import OffsetClock

ADMIN = "root@example.com"
POOL = "demo"
FIRST = "demo-u0-g1"  # unit 0's first holding
NEXT = "demo-u0-g2"


@pytest.fixture
def capacity() -> InMemoryCapacity:
    return InMemoryCapacity(initial_state=HoldingState.ACTIVE)


@pytest.fixture
def jobs(engine, capacity) -> Engine:
    return engine(clock=OffsetClock(), admins=(ADMIN,), capacity=capacity)


def create(jobs: Engine) -> Pool:
    data = {"name": POOL, "accelerator_type": "v4-8", "count": 1, "users": ["ada@example.com"]}
    assert jobs.create_pool(data, ADMIN).kind == "done"
    return pool_of(jobs)


def pool_of(jobs: Engine) -> Pool:
    found = jobs.warm_pools.get(POOL)
    assert found is not None
    return found


def untouched(capacity: InMemoryCapacity, name: str) -> bool:
    """Someone else's resource is still there, its metadata never written."""
    holding = capacity.holdings.get((ZONE, name))
    return holding is not None and holding.metadata == {} and holding.status.pool_label is None


def test_pool_creation_over_someone_elses_resource_of_the_units_name_refuses_and_says_why(jobs, capacity):
    """The create finds a foreign FIRST: never adopted; the pool says why and asks for NEXT at the next tick."""
    capacity.plant_foreign(ZONE, FIRST)
    pool = create(jobs)
    (unit,) = pool.units
    assert unit.queued_resource(POOL) == NEXT and unit.state is UnitState.REQUESTED
    assert "tpujobs did not make it" in pool.reason and FIRST in pool.reason
    jobs.tick()
    (unit,) = pool_of(jobs).units
    assert unit.queued_resource(POOL) == NEXT and unit.state is UnitState.IDLE
    assert untouched(capacity, FIRST) and capacity.held(ZONE) == [FIRST, NEXT]


def test_the_reconciler_never_takes_a_foreign_resource_in_its_listing_for_a_requested_unit(jobs, capacity):
    """A unit whose create did not land, and someone else's FIRST appears: the tick refuses it, never IDLE on it."""
    capacity.refuse_next(PermanentError("the create was refused"))
    create(jobs)
    capacity.plant_foreign(ZONE, FIRST)
    jobs.tick()
    (unit,) = pool_of(jobs).units
    assert unit.queued_resource(POOL) == NEXT
    jobs.tick()
    (unit,) = pool_of(jobs).units
    assert unit.queued_resource(POOL) == NEXT and unit.state is UnitState.IDLE
    assert untouched(capacity, FIRST)


def test_a_held_units_holding_replaced_by_someone_elses_is_lost_not_written_into(jobs, capacity):
    """A ready unit's FIRST vanishes and someone else makes one of that name: lost, asked for again, FIRST untouched."""
    create(jobs)
    jobs.tick()
    assert pool_of(jobs).units[0].state is UnitState.IDLE
    capacity.vanish(FIRST)
    capacity.plant_foreign(ZONE, FIRST)
    jobs.tick()
    (unit,) = pool_of(jobs).units
    assert unit.queued_resource(POOL) == NEXT
    assert untouched(capacity, FIRST)

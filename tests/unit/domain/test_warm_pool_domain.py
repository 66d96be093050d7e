"""The warm-pool domain (`tpujobs.domain.pools`): every change of a unit's state, resizing,
deleting, idle release, busy and idle accounting, and the checks on requests and jobs. Pure: `now`
is passed in, and every change returns a new pool."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tpujobs.domain import pools
from tpujobs.domain.pools import Pool, PoolError, PoolState, UnitState
from tpujobs.domain.spec import JobSpec, parse_spec

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)
OWNER = "ada@example.com"


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def a_pool(**fields: Any) -> Pool:
    data = {"name": "demo", "accelerator_type": "v4-8", "count": 2, "owner": OWNER, **fields}
    request, _ = pools.parse_pool_request(data, "us-central2-b")
    return pools.new_pool(request, T0)


def ready(pool: Pool, now: datetime) -> Pool:
    """Every unit asked for and ACTIVE at `now`."""
    for unit in pool.units:
        pool = pools.active(pools.requested(pool, unit.index, now), unit.index, now)
    return pool


def a_job(**fields: Any) -> JobSpec:
    data = {"job_id": "j1", "name": "train", "owner": OWNER, "accelerator_type": "v4-8", "command": "true"}
    return parse_spec({**data, **fields})


def test_a_new_pool_waits_for_quota_on_every_unit_at_generation_1():
    """Nothing is asked for until the service claims the quota; the first request keeps g1."""
    pool = a_pool(count=3)
    assert [(u.index, u.state, u.generation, u.written) for u in pool.units] == [
        (i, UnitState.WAITING_FOR_QUOTA, 1, False) for i in range(3)
    ]
    requested = pools.requested(pool, 1, at(1))
    unit = requested.unit(1)
    assert (unit.state, unit.generation, unit.seq, unit.requested_at) == (UnitState.REQUESTED, 1, 1, at(1))
    assert unit.queued_resource("demo") == "demo-u1-g1"
    assert pool.unit(1).state is UnitState.WAITING_FOR_QUOTA, "the pool it came from is unchanged"


def test_every_request_after_the_first_is_a_new_generation():
    """A unit lost, released or re-asked for gets the next queued-resource name."""
    pool = ready(a_pool(), at(0))
    lost = pools.lost(pool, 0, at(5), "preempted")
    assert (lost.unit(0).state, lost.unit(0).queued_resource("demo")) == (UnitState.REQUESTED, "demo-u0-g2")
    released = pools.released(pools.active(lost, 0, at(6)), 0, at(7), "idle")
    woken = pools.requested(released, 0, at(8))
    assert woken.unit(0).generation == 3


def test_active_makes_only_a_requested_unit_idle():
    pool = a_pool()
    assert pools.active(pool, 0, at(1)) == pool, "a unit never asked for is not made ready by a stray status"
    idle = pools.active(pools.requested(pool, 0, at(1)), 0, at(2))
    unit = idle.unit(0)
    assert (unit.state, unit.capacity_state, unit.held_since, unit.since) == (UnitState.IDLE, "ACTIVE", at(2), at(2))
    assert pools.active(idle, 0, at(3)) == idle


def test_assigning_a_unit_makes_it_busy_and_untold_and_only_an_idle_one():
    pool = ready(a_pool(), at(0))
    busy = pools.assigned(pool, 0, "j1", 2, at(1))
    unit = busy.unit(0)
    assert (unit.state, unit.job_id, unit.attempt, unit.seq, unit.written) == (UnitState.BUSY, "j1", 2, 2, False)
    assert busy.unit_of("j1") == unit and busy.unit_of("j1", 2) == unit and busy.unit_of("j1", 1) is None
    assert unit.runs("j1", 2) and not unit.runs("j1", 1) and not unit.runs("j2", 2)
    with pytest.raises(PoolError, match="unit 0 of pool demo is BUSY, not IDLE"):
        pools.assigned(busy, 0, "j2", 1, at(2))
    with pytest.raises(PoolError, match="pool demo has no unit 7"):
        pools.assigned(busy, 7, "j2", 1, at(2))
    assert busy.free_unit().index == 1


def test_marking_written_takes_only_the_current_seq():
    busy = pools.assigned(ready(a_pool(), at(0)), 0, "j1", 1, at(1))
    assert pools.marked_written(busy, 0, 1) == busy, "a write of an older seq does not count"
    told = pools.marked_written(busy, 0, 2)
    assert told.unit(0).written


def test_freeing_a_busy_unit_makes_it_idle_with_a_new_seq_to_tell():
    busy = pools.marked_written(pools.assigned(ready(a_pool(), at(0)), 0, "j1", 1, at(1)), 0, 2)
    free = pools.freed(busy, 0, at(3))
    unit = free.unit(0)
    assert (unit.state, unit.job_id, unit.attempt, unit.seq, unit.written) == (UnitState.IDLE, None, None, 3, False)
    assert free.reason == "Unit 0 is free again (j1 left it)."
    assert pools.freed(free, 0, at(4)) == free, "freeing an idle unit changes nothing"


def test_a_lost_unit_is_asked_for_again_and_a_removed_one_goes():
    busy = pools.assigned(ready(a_pool(), at(0)), 0, "j1", 1, at(1))
    again = pools.lost(busy, 0, at(2), "preempted")
    unit = again.unit(0)
    assert (unit.state, unit.job_id, unit.generation, unit.held_since) == (UnitState.REQUESTED, None, 2, None)
    removing = pools.resized(busy, 1, at(2))
    assert removing.unit(1).removing and not removing.unit(0).removing, "the idle unit goes before the busy one"
    gone = pools.lost(removing, 1, at(3), "preempted")
    assert [u.index for u in gone.units] == [0]


def test_waiting_for_quota_drops_what_the_unit_held():
    pool = ready(a_pool(), at(0))
    waiting = pools.waiting_for_quota(pool, 0, at(1), "Unit 0 waits for quota.")
    unit = waiting.unit(0)
    assert (unit.state, unit.held_since, waiting.reason) == (
        UnitState.WAITING_FOR_QUOTA,
        None,
        "Unit 0 waits for quota.",
    )
    assert waiting.idle_chip_hours > 0, "its idle minute was counted before it let go"


def test_seen_capacity_mirrors_the_tpu_state_only_when_it_changed():
    pool = pools.requested(a_pool(), 0, at(0))
    seen = pools.seen_capacity(pool, 0, "PROVISIONING")
    assert seen.unit(0).capacity_state == "PROVISIONING"
    assert pools.seen_capacity(seen, 0, "PROVISIONING") == seen


def test_resizing_up_adds_units_at_the_free_indexes():
    pool = ready(a_pool(count=2), at(0))
    bigger = pools.resized(pool, 4, at(1))
    assert [(u.index, u.state) for u in bigger.units] == [
        (0, UnitState.IDLE),
        (1, UnitState.IDLE),
        (2, UnitState.WAITING_FOR_QUOTA),
        (3, UnitState.WAITING_FOR_QUOTA),
    ]
    assert (bigger.count, bigger.reason) == (4, "Resized to 4 unit(s).")


def test_resizing_down_marks_idle_units_before_busy_ones_highest_index_first():
    pool = ready(a_pool(count=3), at(0))
    pool = pools.assigned(pool, 2, "j1", 1, at(1))
    smaller = pools.resized(pool, 1, at(2))
    assert [(u.index, u.removing) for u in smaller.units] == [(0, True), (1, True), (2, False)]
    assert smaller.free_unit() is None, "a unit being removed takes no new job"
    again = pools.resized(smaller, 2, at(3))
    assert [u.index for u in again.units] == [0, 1, 2, 3], "a resize up adds a new unit; removed ones still go"
    with pytest.raises(PoolError, match="count must be from 1 to 64, got 0"):
        pools.resized(pool, 0, at(2))


def test_released_units_are_kept_as_released_and_removed_ones_leave_the_pool():
    pool = ready(a_pool(), at(0))
    released = pools.released(pool, 0, at(10), "idle too long")
    unit = released.unit(0)
    assert (unit.state, unit.held_since, unit.capacity_state) == (UnitState.RELEASED, None, None)
    assert released.sleeping_unit() == unit
    deleted = pools.deleting(pool, at(1), "bob@example.com")
    assert deleted.state is PoolState.DELETING and all(u.removing for u in deleted.units)
    assert deleted.reason == "Deleted by bob@example.com."
    assert deleted.sleeping_unit() is None and deleted.free_unit() is None
    empty = pools.released(pools.released(deleted, 0, at(2), "gone"), 1, at(2), "gone")
    assert empty.units == ()


def test_idle_units_past_idle_minutes_are_due_for_release():
    pool = ready(a_pool(idle_minutes=30), at(0))
    pool = pools.assigned(pool, 1, "j1", 1, at(0))
    assert pools.idle_too_long(pool, at(29)) == []
    assert [u.index for u in pools.idle_too_long(pool, at(30))] == [0], "a busy unit is never idle too long"
    assert pools.idle_too_long(ready(a_pool(), at(0)), at(10_000)) == [], "no idle_minutes: kept"


def test_busy_and_idle_chip_hours_are_split_by_stretch():
    """4 chips: idle 30 min, busy 60 min with j1, idle 30 min (still open)."""
    pool = ready(a_pool(count=1), at(0))
    pool = pools.assigned(pool, 0, "j1", 1, at(30))
    pool = pools.freed(pool, 0, at(90))
    assert (pool.idle_chip_hours, pool.busy_chip_hours) == (2.0, 4.0)
    assert [(s.kind, s.start, s.end, s.job_id) for s in pool.recent] == [
        ("idle", at(0), at(30), None),
        ("busy", at(30), at(90), "j1"),
    ]
    total = pools.total_usage(pool, at(120))
    assert (total.busy_chip_hours, total.idle_chip_hours) == (4.0, 4.0)
    assert total.utilisation == 0.5


def test_utilisation_over_the_last_day_counts_only_that_day():
    """A stretch that began before the window counts from the window's start."""
    pool = ready(a_pool(count=1), at(0))
    pool = pools.assigned(pool, 0, "j1", 1, at(60))  # idle 1 h, then busy
    now = at(60 + 24 * 60)  # 24 h busy since
    day = pools.usage_since(pool, now - pools.RECENT_WINDOW, now)
    assert (day.busy_chip_hours, day.idle_chip_hours, day.utilisation) == (96.0, 0.0, 1.0)
    pool = pools.freed(pool, 0, now)
    later = now + timedelta(hours=12)
    day = pools.usage_since(pool, later - pools.RECENT_WINDOW, later)
    assert (day.busy_chip_hours, day.idle_chip_hours) == (48.0, 48.0)
    assert pools.PoolUsage(0.0, 0.0).utilisation is None, "nothing held: no utilisation, not 0"


def test_old_stretches_fall_out_of_recent_but_stay_in_the_totals():
    pool = ready(a_pool(count=1), at(0))
    pool = pools.assigned(pool, 0, "j1", 1, at(60))
    pool = pools.freed(pool, 0, at(120))
    much_later = at(120 + 2 * 24 * 60)
    pool = pools.assigned(pool, 0, "j2", 1, much_later)
    assert [s.kind for s in pool.recent] == ["idle"], "only the idle stretch that ended now is in the last day"
    assert pool.busy_chip_hours == 4.0 and pool.idle_chip_hours == round(4.0 + 4 * 48.0, 6)


def test_a_multislice_pool_counts_every_slice_chips():
    pool = a_pool(accelerator_type="v4-16", slices=2, count=1)
    assert pool.chips_per_unit == 16


def test_misfit_names_what_differs_between_a_job_and_the_pool():
    pool = a_pool()
    assert pools.misfit(a_job(pool="demo"), pool) is None
    assert pools.misfit(a_job(accelerator_type="v4-16"), pool) == (
        "pool demo has units of 1 x v4-8; the job asks for 1 x v4-16"
    )
    assert pools.misfit(a_job(slices=2), pool) == "pool demo has units of 1 x v4-8; the job asks for 2 x v4-8"
    assert pools.misfit(a_job(service_account="trainer@proj-1.iam.gserviceaccount.com"), pool) == (
        "pool demo runs as the deployment's account; the job asks for trainer@proj-1.iam.gserviceaccount.com"
    )
    assert pools.misfit(a_job(tags=["a"], internal_ips=True), pool) == (
        "the job sets internal_ips, tags, but a pool's VMs are the pool's own: leave them out"
    )


def test_may_use_and_may_manage():
    pool = a_pool(users=["bob@example.com", "group:ml"])
    admins = ("root@example.com",)
    assert pools.may_use(pool, OWNER, admins, frozenset({OWNER}))
    assert pools.may_use(pool, "bob@example.com", admins, frozenset({"bob@example.com"}))
    assert pools.may_use(pool, "cy@example.com", admins, frozenset({"cy@example.com", "group:ml"}))
    assert pools.may_use(pool, "root@example.com", admins, frozenset({"root@example.com"}))
    assert not pools.may_use(pool, "eve@example.com", admins, frozenset({"eve@example.com", "group:ops"}))
    assert pools.may_manage(pool, OWNER, admins) and pools.may_manage(pool, "root@example.com", admins)
    assert not pools.may_manage(pool, "bob@example.com", admins), "a user may run jobs, not resize or delete"
    assert not pools.may_manage(pool, "", ("",))


def test_a_pool_request_becomes_a_pool_and_its_shape():
    request, shape = pools.parse_pool_request(
        {
            "name": "demo",
            "owner": OWNER,
            "accelerator_type": "v4-16",
            "slices": 2,
            "count": 3,
            "capacity": "spot",
            "zones": ["us-central2-b", "us-east5-a"],
            "idle_minutes": 15,
            "users": ["bob@example.com"],
        },
        "europe-west4-a",
    )
    assert (request.count, request.zones, request.idle_minutes, request.users) == (
        3,
        ("us-central2-b", "us-east5-a"),
        15,
        ("bob@example.com",),
    )
    assert (shape.accelerator_type, shape.slices, shape.capacity) == ("v4-16", 2, "spot")
    pool = pools.new_pool(request, T0)
    assert pool.shape().preferred_zones == ("us-central2-b", "us-east5-a")
    assert pool.reason == "Created by ada@example.com: 3 x 2 x v4-16."
    defaulted, _ = pools.parse_pool_request({"name": "d2", "owner": OWNER, "accelerator_type": "v4-8"}, "eu-a")
    assert (defaulted.zones, defaulted.count, defaulted.capacity) == (("eu-a",), 1, "on-demand")


@pytest.mark.parametrize(
    ("changes", "sentence"),
    [
        ({"colour": "red"}, "unknown pool field 'colour'; a pool takes accelerator_type, capacity"),
        ({"count": 0}, "count must be a whole number from 1 to 64, got 0"),
        ({"count": 65}, "count must be a whole number from 1 to 64, got 65"),
        ({"count": True}, "count must be a whole number from 1 to 64, got True"),
        ({"idle_minutes": 0}, "idle_minutes must be a whole number of minutes from 1 to 10080, got 0"),
        ({"idle_minutes": "5"}, "idle_minutes must be a whole number of minutes from 1 to 10080, got '5'"),
        ({"users": "bob@example.com"}, "users must be a list of at most 50 e-mail addresses or group:NAME entries"),
        ({"users": [""]}, "users must be a list of at most 50 e-mail addresses or group:NAME entries"),
        ({"name": "Demo"}, "pool name 'Demo' must be 2 to 40 lowercase letters, digits or hyphens"),
        ({"name": "d" * 41}, "must be 2 to 40 lowercase letters"),
        ({"name": None}, "pool name None must be"),
        ({"accelerator_type": "v9-8"}, "accelerator_type"),
        ({"capacity": "cheap"}, "capacity"),
        ({"slices": 0}, "slices"),
    ],
)
def test_a_bad_pool_request_is_one_sentence_naming_the_field(changes, sentence):
    data = {"name": "demo", "owner": OWNER, "accelerator_type": "v4-8", **changes}
    with pytest.raises(PoolError) as raised:
        pools.parse_pool_request(data, "us-central2-b")
    message = str(raised.value)
    assert sentence in message
    assert "\n" not in message and "job spec" not in message, "a pool's error speaks of the pool"


def test_a_pool_request_with_a_topology_is_refused():
    """A pool's shape is its accelerator type: topology is not one of its fields."""
    with pytest.raises(PoolError, match="unknown pool field 'topology'"):
        pools.parse_pool_request(
            {"name": "demo", "owner": OWNER, "accelerator_type": "v4-8", "topology": "2x2x1"}, "us-central2-b"
        )


def test_changes_never_mutate_the_pool_they_are_given():
    pool = ready(a_pool(), at(0))
    before = replace(pool)
    pools.assigned(pool, 0, "j1", 1, at(1))
    pools.resized(pool, 5, at(1))
    pools.deleting(pool, at(1), OWNER)
    assert pool == before

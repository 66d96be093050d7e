"""Warm pools on the fakes and the TPU simulator, through the real TPU client.

The engine creates, heals, resizes and deletes pools and gives their units to jobs; a unit
becomes ready when the reconciler sees its queued resource ACTIVE, as in production. The
simulator's hosts do not run here (`run_workers=False`): these are tests of the control plane,
and a unit's agents are told what to run through its node metadata, read back here with the
TPU API's own GetNode.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from engine_harness import PROJECT, ZONE, Engine

from tpujobs.domain import pools
from tpujobs.domain.pools import Pool, UnitState
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Observation
from tpujobs.engine.jobs.admission import SubmitOutcome
from tpujobs.engine.ports import HostBoot, UnitRequest
from tpujobs.local.testing import OffsetClock, signed, wait_for

ADMIN = "root@example.com"
OWNER = "ada@example.com"
POOL = "demo"


@pytest.fixture
def clock() -> OffsetClock:
    return OffsetClock()


@pytest.fixture
def jobs(engine, clock) -> Engine:
    return engine(clock=clock, admins=(ADMIN,))


def create(jobs: Engine, count: int = 1, caller: str = ADMIN, **fields: Any) -> pools.PoolOutcome:
    data = {"name": POOL, "accelerator_type": "v4-8", "count": count, "users": [OWNER], **fields}
    return jobs.create_pool(data, caller)


def pool_of(jobs: Engine, name: str = POOL) -> Pool:
    found = jobs.warm_pools.get(name)
    assert found is not None, f"pool {name} exists"
    return found


def ready(jobs: Engine, name: str = POOL) -> Pool:
    """Tick the reconciler until every unit not being removed is ACTIVE (idle or busy)."""

    def all_held() -> Pool | None:
        """every unit of the pool to be IDLE or BUSY"""
        jobs.tick()
        pool = jobs.warm_pools.get(name)
        held = pool is not None and all(u.state in pools.HELD for u in pool.units if not u.removing)
        return pool if held else None

    return wait_for(all_held, timeout=20)


def submit(jobs: Engine, job_id: str, **fields: Any) -> SubmitOutcome:
    """A job of OWNER on the pool, through the jobs API's path (a verified owner)."""
    data = {
        "job_id": job_id,
        "name": "train",
        "owner": OWNER,
        "accelerator_type": "v4-8",
        "command": "python train.py",
        "pool": POOL,
        **fields,
    }
    refused = jobs.refusal(data)
    assert refused is None, refused
    return jobs.submit_verified(data)


def job(jobs: Engine, job_id: str) -> Any:
    found = jobs.store.get(job_id)
    assert found is not None
    return found


def live_resources(tpu_client) -> dict[str, dict[str, str]]:
    """Queued resources not being deleted, by name, with their nodes' labels."""
    found = tpu_client.list_queued_resources(parent=f"projects/{PROJECT}/locations/{ZONE}")
    return {
        r.name.rsplit("/", 1)[-1]: dict(r.tpu.node_spec[0].node.labels)
        for r in found
        if r.state.state.name != "DELETING"
    }


def assignment(tpu_client, queued_resource: str) -> dict[str, Any]:
    """The unit's `tpujobs-assignment`, as GetNode shows its node metadata (one slice)."""
    node = tpu_client.get_node(name=f"projects/{PROJECT}/locations/{ZONE}/nodes/{queued_resource}")
    assert set(node.metadata) == {"startup-script", "tpujobs-assignment"}, "the whole map is written each time"
    answer: dict[str, Any] = json.loads(node.metadata["tpujobs-assignment"])
    return answer


def started(jobs: Engine, job_id: str, attempt: int) -> None:
    """The attempt's one host reports it started, signed as its agent signs."""
    payload = {"kind": "started", "job_id": job_id, "attempt": attempt, "slice_id": 0, "worker_id": 0}
    jobs.handle(signed(jobs, "tpujobs-worker-events", payload))
    assert job(jobs, job_id).state is JobState.RUNNING


def assert_consistent(jobs: Engine, name: str = POOL) -> None:
    """No unit runs a job not live on it; no job live on a unit that does not run it, or on two."""
    pool = pool_of(jobs, name)
    for unit in pool.units:
        if unit.state is UnitState.BUSY:
            on = job(jobs, unit.job_id)
            assert on.state in (JobState.PROVISIONING, JobState.RUNNING), (unit, on.state)
            assert (on.attempt, on.warm_pool_unit) == (unit.attempt, unit.queued_resource(name)), unit
    for found in jobs.warm_pools.jobs_on(name):
        if found.state in (JobState.PROVISIONING, JobState.RUNNING):
            units = [u for u in pool.units if u.runs(found.job_id, found.attempt)]
            assert [u.queued_resource(name) for u in units] == [found.warm_pool_unit], found.job_id


# -- creating ------------------------------------------------------------------------------------


def test_create_requests_each_unit_as_a_labelled_queued_resource(jobs, tpu_client):
    """Two units: two queued resources named {pool}-u{i}-g1, labelled with the pool and unit only,
    ACTIVE after the reconciler sees them, each node told it is idle."""
    outcome = create(jobs, count=2)
    assert outcome.kind == "done", outcome
    assert [(u.index, u.state) for u in outcome.pool.units] == [(0, UnitState.REQUESTED), (1, UnitState.REQUESTED)]
    assert live_resources(tpu_client) == {
        "demo-u0-g1": {"tpujobs-pool": "demo", "tpujobs-unit": "0"},
        "demo-u1-g1": {"tpujobs-pool": "demo", "tpujobs-unit": "1"},
    }
    pool = ready(jobs)
    assert [(u.state, u.capacity_state) for u in pool.units] == [(UnitState.IDLE, "ACTIVE")] * 2
    assert assignment(tpu_client, "demo-u0-g1") == {"seq": pool.unit(0).seq}
    again = create(jobs, count=1)
    assert (again.kind, again.reason) == ("exists", "a pool named demo already exists")


def test_a_request_decided_on_an_older_read_of_the_unit_asks_for_nothing(jobs, tpu_client):
    """The pool's creation asks for unit 0 (g1) while a reconciler tick, from its read of the pool
    just before, decides to ask for it too: the tick finds the unit changed and does nothing, so
    one queued resource is made, not g1 and then g2 (the demo's pool once got both)."""
    unit = create(jobs).pool.unit(0)
    assert (unit.state, unit.generation) == (UnitState.REQUESTED, 1)
    as_the_tick_read_it = replace(unit, state=UnitState.WAITING_FOR_QUOTA, requested_at=None, seq=unit.seq - 1)
    jobs.service.warm.units.request(POOL, as_the_tick_read_it)
    assert pool_of(jobs).unit(0).generation == 1
    assert set(live_resources(tpu_client)) == {"demo-u0-g1"}
    jobs.service.warm.units.request(POOL, pool_of(jobs).unit(0), "us-central2-b")  # as seen: it goes ahead
    assert pool_of(jobs).unit(0).generation == 2


def test_create_holds_each_units_chips_in_the_quota(jobs, tpu_client):
    """Quota 8 v4 chips: two 4-chip units hold `pool:demo/0` and `pool:demo/1`."""
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 8)
    assert create(jobs, count=2).kind == "done"
    holders = {(h.job_id, h.chips, h.zone) for h in jobs.pools.view("v4@us-central2").holders}
    assert holders == {("pool:demo/0", 4, ZONE), ("pool:demo/1", 4, ZONE)}
    assert set(live_resources(tpu_client)) == {"demo-u0-g1", "demo-u1-g1"}


def test_create_is_refused_when_the_units_exceed_the_quota(jobs, tpu_client):
    """count x chips above the quota of every zone: refused, nothing written or asked for."""
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 8)
    outcome = create(jobs, count=3)
    assert outcome.kind == "invalid"
    assert outcome.reason.startswith(
        "3 unit(s) of 4 chips need 12 chips, more than the quota of v4 on-demand chips in us-central2-b (8)"
    )
    assert jobs.warm_pools.get(POOL) is None
    assert live_resources(tpu_client) == {}


def test_a_unit_waits_for_quota_that_other_jobs_hold(jobs, tpu_client):
    """Quota 8, a 4-chip job holds half: of two units one is asked for, the other waits, saying why."""
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 8)
    big = {"job_id": "big", "name": "big", "owner": OWNER, "accelerator_type": "v4-8", "command": "true"}
    assert jobs.submit_verified(big).kind == "provisioning"
    create(jobs, count=2)
    pool = pool_of(jobs)
    assert [u.state for u in pool.units] == [UnitState.REQUESTED, UnitState.WAITING_FOR_QUOTA]
    assert pool.reason == (
        "Unit 1 waits for quota: the quota of v4 on-demand chips in us-central2-b is 8, 8 held, and a unit needs 4."
    )
    jobs.cancel("big", "Cancelled by ada.")
    jobs.tick()
    assert pool_of(jobs).unit(1).state is not UnitState.WAITING_FOR_QUOTA
    assert "demo-u1-g1" in live_resources(tpu_client)


def test_create_is_refused_for_a_caller_not_allowed(jobs, tpu_client):
    """Neither an admin nor allowed by config/policies.pools, unverified, or invalid: refused in a sentence."""
    outcome = create(jobs, caller="eve@example.com")
    assert (outcome.kind, outcome.reason) == (
        "forbidden",
        "eve@example.com may not create pools: an admin allows it in config/policies.pools",
    )
    unverified = jobs.create_pool({"name": POOL, "accelerator_type": "v4-8"}, ADMIN, verified=False)
    assert unverified.kind == "forbidden" and "needs a verified caller" in unverified.reason
    invalid = create(jobs, count=0)
    assert (invalid.kind, invalid.reason) == (
        "invalid",
        "Invalid pool: count must be a whole number from 1 to 64, got 0",
    )
    assert jobs.warm_pools.get(POOL) is None and live_resources(tpu_client) == {}


def test_a_job_of_someone_the_pool_does_not_name_is_refused(jobs):
    """A job of an owner the pool does not name, of another shape, or from an unverified owner."""
    create(jobs)
    data = {"job_id": "j9", "name": "train", "owner": "eve@example.com", "accelerator_type": "v4-8", "command": "x"}
    assert jobs.refusal({**data, "pool": POOL}) == (
        "eve@example.com may not run jobs on pool demo: its owner root@example.com names who may"
    )
    assert jobs.refusal({**data, "owner": OWNER, "pool": POOL, "accelerator_type": "v4-16"}) == (
        "pool demo has units of 1 x v4-8; the job asks for 1 x v4-16"
    )
    unverified = jobs.refusal({**data, "owner": OWNER, "pool": POOL}, owner_verified=False)
    assert "needs a verified owner" in (unverified or "")


# -- jobs on units --------------------------------------------------------------------------------


def test_a_job_takes_a_free_unit_and_its_nodes_are_told(jobs, tpu_client):
    """PROVISIONING on the unit, the unit BUSY, the node's assignment names the job's attempt
    with a normal attempt's config; no queued resource of the job's own."""
    create(jobs)
    ready(jobs)
    before = set(live_resources(tpu_client))
    outcome = submit(jobs, "j1")
    assert outcome.kind == "provisioning", outcome
    found = job(jobs, "j1")
    assert (found.state, found.warm_pool, found.warm_pool_unit) == (JobState.PROVISIONING, POOL, "demo-u0-g1")
    unit = pool_of(jobs).unit(0)
    assert (unit.state, unit.job_id, unit.attempt, unit.written) == (UnitState.BUSY, "j1", 1, True)
    told = assignment(tpu_client, "demo-u0-g1")
    assert (told["seq"], told["job_id"], told["attempt"]) == (unit.seq, "j1", 1)
    assert "report_key" not in told and "tpujobs-key-v1:" not in json.dumps(told), "no key where a viewer reads"
    assert told["config"]["queued_resource"] == "demo-u0-g1" and told["config"]["command"] == "python train.py"
    assert set(live_resources(tpu_client)) == before, "no queued resource per job"
    assert_consistent(jobs)


def test_a_second_job_waits_with_a_reason_and_gets_the_unit_when_the_first_ends(jobs, tpu_client):
    """One unit: the second job is QUEUED saying why, and takes the unit at the first's cancel."""
    create(jobs)
    ready(jobs)
    submit(jobs, "j1")
    assert submit(jobs, "j2").kind == "queued"
    waiting = job(jobs, "j2")
    assert (waiting.state, waiting.state_reason) == (
        JobState.QUEUED,
        "Waiting for a free unit of pool demo (1 busy), in the pool's order (priority, then age).",
    )
    jobs.cancel("j1", "Cancelled by ada.")
    assert job(jobs, "j1").state is JobState.CANCELLED
    found = job(jobs, "j2")
    assert (found.state, found.warm_pool_unit) == (JobState.PROVISIONING, "demo-u0-g1")
    assert assignment(tpu_client, "demo-u0-g1")["job_id"] == "j2"
    assert set(live_resources(tpu_client)) == {"demo-u0-g1"}
    assert_consistent(jobs)


def test_the_pools_queue_is_priority_then_age(jobs, clock):
    """Each freed unit goes to the highest priority, the oldest among equals."""
    create(jobs)
    ready(jobs)
    submit(jobs, "first")
    submit(jobs, "old-low", priority="low")
    clock.advance(1)
    submit(jobs, "medium-1")
    clock.advance(1)
    submit(jobs, "medium-2")
    order = []
    for running in ("first", "medium-1", "medium-2", "old-low"):
        assert job(jobs, running).state is JobState.PROVISIONING, running
        order.append(running)
        jobs.cancel(running, "Cancelled by ada.")
    assert order == ["first", "medium-1", "medium-2", "old-low"]
    assert pool_of(jobs).unit(0).state is UnitState.IDLE


def test_pool_fallback_provision_leaves_for_fresh_capacity_when_no_unit_is_free(jobs, tpu_client):
    """No free unit: the job leaves the pool and asks for a queued resource of its own."""
    create(jobs)
    ready(jobs)
    submit(jobs, "j1")
    submit(jobs, "j2", pool_fallback="provision")
    found = job(jobs, "j2")
    assert (found.state, found.warm_pool, found.warm_pool_unit) == (JobState.PROVISIONING, "", "")
    assert found.queued_resource in live_resources(tpu_client)
    assert live_resources(tpu_client)[found.queued_resource]["tpujobs-job"] == "j2"
    assert pool_of(jobs).unit(0).job_id == "j1"


# -- healing --------------------------------------------------------------------------------------


def test_a_preempted_unit_comes_back_as_its_next_generation_and_the_job_resumes_on_it(jobs, tpu_client, simulator_url):
    """One unit preempted mid-job: RECOVERING, QUEUED in the pool, the unit asked for as g2, and attempt 2
    assigned there resuming from the same checkpoint prefix."""
    create(jobs)
    ready(jobs)
    submit(jobs, "j1", on_preemption="resume")
    started(jobs, "j1", 1)
    first = assignment(tpu_client, "demo-u0-g1")
    jobs.simulator.preempt(ZONE, "demo-u0-g1")

    def requeued() -> bool:
        """the job to wait in the pool's queue for attempt 2"""
        jobs.tick()
        found = job(jobs, "j1")
        return found.state in (JobState.QUEUED, JobState.PROVISIONING) and found.attempt == 2

    wait_for(requeued, timeout=20)
    timeline = [e.to_state for e in jobs.store.events("j1")]
    assert JobState.RECOVERING in timeline
    unit = pool_of(jobs).unit(0)
    assert unit.generation == 2, "the unit is asked for again at once, as its next generation"
    ready(jobs)
    found = job(jobs, "j1")
    assert (found.state, found.attempt, found.warm_pool_unit) == (JobState.PROVISIONING, 2, "demo-u0-g2")
    told = assignment(tpu_client, "demo-u0-g2")
    assert (told["job_id"], told["attempt"], told["config"]["resume"]) == ("j1", 2, True)
    assert told["config"]["checkpoint_uri"] == first["config"]["checkpoint_uri"], "the same checkpoint prefix"
    assert set(live_resources(tpu_client)) == {"demo-u0-g2"}, "the lost generation is released"
    assert_consistent(jobs)


def test_a_jobs_own_reboot_claims_replace_its_unit_a_bounded_number_of_times(jobs, tpu_client):
    """A job's code holds its attempt's key, so it can sign `rebooted` at every attempt. The pool
    releases and asks for the unit again only UNITS_REPLACED_PER_JOB times for it; after that
    the unit is freed and kept, and the job still recovers onto it."""
    from tpujobs.engine.warm_pools.units import UNITS_REPLACED_PER_JOB

    create(jobs)
    ready(jobs)
    submit(jobs, "j1", on_preemption="resume", max_restarts=10)
    for attempt in range(1, UNITS_REPLACED_PER_JOB + 3):
        ready(jobs)
        started(jobs, "j1", attempt)
        claim = {"kind": "rebooted", "job_id": "j1", "attempt": attempt, "slice_id": 0, "worker_id": 0}
        jobs.handle(signed(jobs, "tpujobs-worker-events", claim))
        assert job(jobs, "j1").attempt == attempt + 1
    assert pool_of(jobs).unit(0).generation == 1 + UNITS_REPLACED_PER_JOB
    assert set(live_resources(tpu_client)) == {f"demo-u0-g{1 + UNITS_REPLACED_PER_JOB}"}
    assert_consistent(jobs)


def test_a_job_on_a_lost_unit_moves_to_the_next_free_unit(jobs, tpu_client):
    """Two units: the job's next attempt takes the idle one while the lost one comes back."""
    create(jobs, count=2)
    ready(jobs)
    submit(jobs, "j1")
    started(jobs, "j1", 1)
    jobs.simulator.preempt(ZONE, "demo-u0-g1")

    def moved() -> bool:
        """attempt 2 of the job to run on unit 1"""
        jobs.tick()
        found = job(jobs, "j1")
        return found.attempt == 2 and found.warm_pool_unit == "demo-u1-g1"

    wait_for(moved, timeout=20)
    ready(jobs)
    assert pool_of(jobs).unit(0).generation == 2
    assert set(live_resources(tpu_client)) == {"demo-u0-g2", "demo-u1-g1"}
    assert_consistent(jobs)


def test_resize_up_asks_for_more_and_down_releases_idle_units_first(jobs, tpu_client):
    """Up: new units asked for; down: idle units go, the busy one stays; only the owner or an admin."""
    create(jobs, count=1)
    ready(jobs)
    assert jobs.resize_pool(POOL, 3, ADMIN).kind == "done"
    pool = ready(jobs)
    assert [(u.index, u.state) for u in pool.units] == [(i, UnitState.IDLE) for i in range(3)]
    submit(jobs, "j1")
    assert jobs.resize_pool(POOL, 1, "eve@example.com").kind == "forbidden"
    assert jobs.resize_pool(POOL, 1, ADMIN).kind == "done"
    pool = pool_of(jobs)
    assert [(u.index, u.state, u.job_id) for u in pool.units] == [(0, UnitState.BUSY, "j1")]
    assert set(live_resources(tpu_client)) == {"demo-u0-g1"}
    assert pool.count == 1


def test_a_unit_resized_away_while_busy_goes_when_its_job_ends(jobs, tpu_client):
    """A busy unit marked for removal is released when its job ends, not given the next job."""
    create(jobs, count=2)
    ready(jobs)
    submit(jobs, "j1")
    submit(jobs, "j2")
    jobs.resize_pool(POOL, 1, ADMIN)
    busy_removed = [u for u in pool_of(jobs).units if u.removing]
    assert len(busy_removed) == 1 and busy_removed[0].state is UnitState.BUSY
    jobs.cancel(busy_removed[0].job_id, "Cancelled by ada.")
    pool = pool_of(jobs)
    assert len(pool.units) == 1 and not pool.units[0].removing
    assert set(live_resources(tpu_client)) == {pool.units[0].queued_resource(POOL)}


def test_delete_cancels_a_running_job_releases_the_units_and_removes_the_document(jobs, tpu_client):
    """pool delete: the job on it is cancelled, every unit released, the document gone."""
    create(jobs, count=2)
    ready(jobs)
    submit(jobs, "j1")
    started(jobs, "j1", 1)
    assert jobs.delete_pool(POOL, "eve@example.com").kind == "forbidden"
    assert jobs.delete_pool(POOL, ADMIN).kind == "done"
    found = job(jobs, "j1")
    assert found.state is JobState.CANCELLED
    assert found.state_reason.startswith("Pool demo was deleted by root@example.com")
    assert jobs.warm_pools.get(POOL) is None
    assert live_resources(tpu_client) == {}


def test_delete_moves_a_job_with_pool_fallback_provision_to_capacity_of_its_own(jobs, tpu_client):
    """pool delete with pool_fallback provision: attempt 2 on a queued resource of its own, resuming."""
    create(jobs)
    ready(jobs)
    submit(jobs, "j1", pool_fallback="provision")
    started(jobs, "j1", 1)
    jobs.delete_pool(POOL, ADMIN)
    found = job(jobs, "j1")
    assert (found.state, found.attempt, found.warm_pool, found.resume_next) == (JobState.PROVISIONING, 2, "", True)
    assert jobs.warm_pools.get(POOL) is None
    assert set(live_resources(tpu_client)) == {found.queued_resource}


def test_an_idle_unit_is_released_after_idle_minutes_and_woken_by_a_job(jobs, clock, tpu_client):
    """Idle past idle_minutes (a clock the test moves): released; a job that asks wakes it as g2."""
    create(jobs, idle_minutes=5)
    ready(jobs)
    clock.advance(4 * 60)
    jobs.tick()
    assert pool_of(jobs).unit(0).state is UnitState.IDLE
    clock.advance(61)
    jobs.tick()
    unit = pool_of(jobs).unit(0)
    assert unit.state is UnitState.RELEASED
    assert live_resources(tpu_client) == {}
    assert pool_of(jobs).idle_chip_hours > 0, "its idle time is the pool's"
    assert submit(jobs, "j1").kind == "queued"
    assert pool_of(jobs).unit(0).state is UnitState.REQUESTED, "a waiting job wakes it"
    ready(jobs)
    found = job(jobs, "j1")
    assert (found.state, found.warm_pool_unit) == (JobState.PROVISIONING, "demo-u0-g2")


def test_the_reconciler_frees_a_unit_whose_job_ended_without_leaving_it(jobs):
    """The cancel was committed but its instance died before the unit was freed."""
    create(jobs)
    ready(jobs)
    submit(jobs, "j1")
    jobs.store.apply("j1", Observation(EventKind.CANCEL_REQUESTED, None, "user", "Cancelled."), jobs.clock)
    assert pool_of(jobs).unit(0).job_id == "j1"
    jobs.tick()
    unit = pool_of(jobs).unit(0)
    assert (unit.state, unit.job_id) == (UnitState.IDLE, None)


def test_the_reconciler_loses_a_job_whose_unit_no_longer_runs_it(jobs):
    """The pool says the unit is free while the job is live on it: the job recovers by its rules."""
    create(jobs, count=2)
    ready(jobs)
    submit(jobs, "j1")
    jobs.warm_pools.update(POOL, lambda p: pools.freed(p, 0, jobs.clock()))
    jobs.tick()
    found = job(jobs, "j1")
    assert found.attempt == 2 and found.state is JobState.PROVISIONING
    assert found.warm_pool_unit in ("demo-u0-g1", "demo-u1-g1")
    assert_consistent(jobs)


def test_leftover_unit_queued_resources_are_released_and_others_kept(jobs, tpu_client):
    """A unit QR of no current unit (a removed unit, a deleted pool) goes; one without the pool
    label (not made by tpujobs) and the pool's own units stay."""
    create(jobs)
    ready(jobs)
    shape = pool_of(jobs).shape()
    boot = HostBoot(jobs.settings.tpu_service_account, {"startup-script": "true"})
    for name, labels in (
        ("demo-u7-g1", {"tpujobs-pool": "demo", "tpujobs-unit": "7"}),
        ("gone-u0-g3", {"tpujobs-pool": "gone", "tpujobs-unit": "0"}),
        ("demo-u8-g1", {}),
    ):
        jobs.capacity.request_unit(UnitRequest(name, ZONE, shape, labels), boot)
    report = jobs.tick()
    assert sorted(report.released) == ["demo-u7-g1", "gone-u0-g3"]
    assert set(live_resources(tpu_client)) == {"demo-u0-g1", "demo-u8-g1"}

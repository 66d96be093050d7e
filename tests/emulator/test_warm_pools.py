"""Warm pools on the Firestore emulator and the TPU simulator, through the real clients.

`WarmPoolService` (the job service's `warm`) creates, heals, resizes and deletes pools and gives
their units to jobs; a unit becomes ready when the reconciler sees its queued resource ACTIVE, as
in production. The simulator's hosts do not run here (`run_workers=False`): these are tests of the
control plane, and a unit's agents are told what to run through its node metadata, read back here
with the TPU API's own GetNode.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tpujobs.adapters.firestore_pools import FirestorePools
from tpujobs.adapters.firestore_warm_pools import FirestoreWarmPools
from tpujobs.domain import pools
from tpujobs.domain.pools import Pool, UnitState
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Observation
from tpujobs.engine.job_service import JobService, SubmitOutcome
from tpujobs.engine.ports import HostBoot, UnitRequest
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.testing import OffsetClock, reconciler_for, signed, wait_for

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"
ADMIN = "root@example.com"
OWNER = "ada@example.com"
POOL = "demo"


@pytest.fixture
def clock() -> OffsetClock:
    return OffsetClock()


@pytest.fixture
def service(job_service, clock) -> JobService:
    return job_service(clock=clock, admins=(ADMIN,))


@pytest.fixture
def quota(firestore_client) -> FirestorePools:
    return FirestorePools(firestore_client)


@pytest.fixture
def quota_service(job_service, clock, quota, firestore_client) -> JobService:
    """The same service with admission quotas (`config/quotas`) on."""
    base = job_service(clock=clock, admins=(ADMIN,))
    return JobService(
        base.store,
        base.tpu,
        base.settings,
        base.clock,
        base.sleep,
        pools=quota,
        warm_pools=FirestoreWarmPools(firestore_client),
    )


def warm(service: JobService) -> Any:
    assert service.warm is not None
    return service.warm


def create(service: JobService, count: int = 1, caller: str = ADMIN, **fields: Any) -> pools.PoolOutcome:
    data = {"name": POOL, "accelerator_type": "v4-8", "count": count, "users": [OWNER], **fields}
    return warm(service).create(data, caller, verified=True)


def pool_of(service: JobService, name: str = POOL) -> Pool:
    found = warm(service).store.get(name)
    assert found is not None, f"pool {name} exists"
    return found


def ready(service: JobService, name: str = POOL) -> Pool:
    """Tick the reconciler until every unit not being removed is ACTIVE (idle or busy)."""
    reconciler = reconciler_for(service)

    def all_held() -> Pool | None:
        """every unit of the pool to be IDLE or BUSY"""
        reconciler.tick()
        pool = warm(service).store.get(name)
        held = pool is not None and all(u.state in pools.HELD for u in pool.units if not u.removing)
        return pool if held else None

    return wait_for(all_held, timeout=20)


def submit(service: JobService, job_id: str, **fields: Any) -> SubmitOutcome:
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
    spec = service.completed(parse_spec(data))
    refused = service.submission_refusal(spec, owner_verified=True)
    assert refused is None, refused
    return service.submit_verified(spec)


def job(service: JobService, job_id: str) -> Any:
    found = service.store.get(job_id)
    assert found is not None
    return found


def live_resources(tpu_client, project_id: str) -> dict[str, dict[str, str]]:
    """Queued resources not being deleted, by name, with their nodes' labels."""
    found = tpu_client.list_queued_resources(parent=f"projects/{project_id}/locations/{ZONE}")
    return {
        r.name.rsplit("/", 1)[-1]: dict(r.tpu.node_spec[0].node.labels)
        for r in found
        if r.state.state.name != "DELETING"
    }


def assignment(tpu_client, project_id: str, queued_resource: str) -> dict[str, Any]:
    """The unit's `tpujobs-assignment`, as GetNode shows its node metadata (one slice)."""
    node = tpu_client.get_node(name=f"projects/{project_id}/locations/{ZONE}/nodes/{queued_resource}")
    assert set(node.metadata) == {"startup-script", "tpujobs-assignment"}, "the whole map is written each time"
    answer: dict[str, Any] = json.loads(node.metadata["tpujobs-assignment"])
    return answer


def started(service: JobService, job_id: str, attempt: int) -> None:
    """The attempt's one host reports it started, signed as its agent signs."""
    payload = {"kind": "started", "job_id": job_id, "attempt": attempt, "slice_id": 0, "worker_id": 0}
    service.on_worker_report(signed(service, "tpujobs-worker-events", payload))
    assert job(service, job_id).state is JobState.RUNNING


def assert_consistent(service: JobService, name: str = POOL) -> None:
    """No unit runs a job not live on it; no job live on a unit that does not run it, or on two."""
    pool = pool_of(service, name)
    for unit in pool.units:
        if unit.state is UnitState.BUSY:
            on = job(service, unit.job_id)
            assert on.state in (JobState.PROVISIONING, JobState.RUNNING), (unit, on.state)
            assert (on.attempt, on.warm_pool_unit) == (unit.attempt, unit.queued_resource(name)), unit
    for found in warm(service).store.jobs_on(name):
        if found.state in (JobState.PROVISIONING, JobState.RUNNING):
            units = [u for u in pool.units if u.runs(found.job_id, found.attempt)]
            assert [u.queued_resource(name) for u in units] == [found.warm_pool_unit], found.job_id


# -- creating ------------------------------------------------------------------------------------


def test_create_requests_each_unit_as_a_labelled_queued_resource(service, tpu_client, project_id):
    """Two units: two queued resources named {pool}-u{i}-g1, labelled with the pool and unit only,
    ACTIVE after the reconciler sees them, each node told it is idle."""
    outcome = create(service, count=2)
    assert outcome.kind == "done", outcome
    assert [(u.index, u.state) for u in outcome.pool.units] == [(0, UnitState.REQUESTED), (1, UnitState.REQUESTED)]
    assert live_resources(tpu_client, project_id) == {
        "demo-u0-g1": {"tpujobs-pool": "demo", "tpujobs-unit": "0"},
        "demo-u1-g1": {"tpujobs-pool": "demo", "tpujobs-unit": "1"},
    }
    pool = ready(service)
    assert [(u.state, u.capacity_state) for u in pool.units] == [(UnitState.IDLE, "ACTIVE")] * 2
    assert assignment(tpu_client, project_id, "demo-u0-g1") == {"seq": pool.unit(0).seq}
    again = create(service, count=1)
    assert (again.kind, again.reason) == ("exists", "a pool named demo already exists")


def test_create_holds_each_units_chips_in_the_quota(quota_service, quota, tpu_client, project_id):
    """Quota 8 v4 chips: two 4-chip units hold `pool:demo/0` and `pool:demo/1`."""
    quota.set_quota(ZONE, "v4", 8)
    assert create(quota_service, count=2).kind == "done"
    holders = {(h.job_id, h.chips) for h in quota.view(f"v4@{ZONE}").holders}
    assert holders == {("pool:demo/0", 4), ("pool:demo/1", 4)}
    assert set(live_resources(tpu_client, project_id)) == {"demo-u0-g1", "demo-u1-g1"}


def test_create_is_refused_when_the_units_exceed_the_quota(quota_service, quota, tpu_client, project_id):
    """count x chips above the quota of every zone: refused, nothing written or asked for."""
    quota.set_quota(ZONE, "v4", 8)
    outcome = create(quota_service, count=3)
    assert outcome.kind == "invalid"
    assert outcome.reason.startswith("3 unit(s) of 4 chips need 12 chips, more than the quota of v4@us-central2-b")
    assert warm(quota_service).store.get(POOL) is None
    assert live_resources(tpu_client, project_id) == {}


def test_a_unit_waits_for_quota_that_other_jobs_hold(quota_service, quota, tpu_client, project_id):
    """Quota 8, a 4-chip job holds half: of two units one is asked for, the other waits, saying why."""
    quota.set_quota(ZONE, "v4", 8)
    spec = quota_service.completed(
        parse_spec({"job_id": "big", "name": "big", "owner": OWNER, "accelerator_type": "v4-8", "command": "true"})
    )
    assert quota_service.submit_verified(spec).kind == "provisioning"
    create(quota_service, count=2)
    pool = pool_of(quota_service)
    assert [u.state for u in pool.units] == [UnitState.REQUESTED, UnitState.WAITING_FOR_QUOTA]
    assert pool.reason == "Unit 1 waits for quota: v4@us-central2-b has 0 of 8 chips free and a unit needs 4."
    quota_service.cancel("big", "Cancelled by ada.")
    reconciler_for(quota_service).tick()
    assert pool_of(quota_service).unit(1).state is not UnitState.WAITING_FOR_QUOTA
    assert "demo-u1-g1" in live_resources(tpu_client, project_id)


def test_create_is_refused_for_a_caller_not_allowed(service, tpu_client, project_id):
    """Neither an admin nor allowed by config/policies.pools, unverified, or invalid: refused in a sentence."""
    outcome = create(service, caller="eve@example.com")
    assert (outcome.kind, outcome.reason) == (
        "forbidden",
        "eve@example.com may not create pools: an admin allows it in config/policies.pools",
    )
    unverified = warm(service).create({"name": POOL, "accelerator_type": "v4-8"}, ADMIN, verified=False)
    assert unverified.kind == "forbidden" and "needs a verified caller" in unverified.reason
    invalid = create(service, count=0)
    assert (invalid.kind, invalid.reason) == (
        "invalid",
        "Invalid pool: count must be a whole number from 1 to 64, got 0",
    )
    assert warm(service).store.get(POOL) is None and live_resources(tpu_client, project_id) == {}


def test_a_job_of_someone_the_pool_does_not_name_is_refused(service):
    """A job of an owner the pool does not name, of another shape, or from an unverified owner."""
    create(service)
    data = {"job_id": "j9", "name": "train", "owner": "eve@example.com", "accelerator_type": "v4-8", "command": "x"}
    spec = service.completed(parse_spec({**data, "pool": POOL}))
    assert service.submission_refusal(spec, owner_verified=True) == (
        "eve@example.com may not run jobs on pool demo: its owner root@example.com names who may"
    )
    spec = service.completed(parse_spec({**data, "owner": OWNER, "pool": POOL, "accelerator_type": "v4-16"}))
    assert service.submission_refusal(spec, owner_verified=True) == (
        "pool demo has units of 1 x v4-8; the job asks for 1 x v4-16"
    )
    spec = service.completed(parse_spec({**data, "owner": OWNER, "pool": POOL}))
    assert "needs a verified owner" in (service.submission_refusal(spec, owner_verified=False) or "")


# -- jobs on units --------------------------------------------------------------------------------


def test_a_job_takes_a_free_unit_and_its_nodes_are_told(service, tpu_client, project_id):
    """PROVISIONING on the unit, the unit BUSY, the node's assignment names the job's attempt
    with a normal attempt's config; no queued resource of the job's own."""
    create(service)
    ready(service)
    before = set(live_resources(tpu_client, project_id))
    outcome = submit(service, "j1")
    assert outcome.kind == "provisioning", outcome
    found = job(service, "j1")
    assert (found.state, found.warm_pool, found.warm_pool_unit) == (JobState.PROVISIONING, POOL, "demo-u0-g1")
    unit = pool_of(service).unit(0)
    assert (unit.state, unit.job_id, unit.attempt, unit.written) == (UnitState.BUSY, "j1", 1, True)
    told = assignment(tpu_client, project_id, "demo-u0-g1")
    assert (told["seq"], told["job_id"], told["attempt"]) == (unit.seq, "j1", 1)
    assert told["report_key"].startswith("tpujobs-key-v1:")
    assert told["config"]["queued_resource"] == "demo-u0-g1" and told["config"]["command"] == "python train.py"
    assert set(live_resources(tpu_client, project_id)) == before, "no queued resource per job"
    assert_consistent(service)


def test_a_second_job_waits_with_a_reason_and_gets_the_unit_when_the_first_ends(service, tpu_client, project_id):
    """One unit: the second job is QUEUED saying why, and takes the unit at the first's cancel."""
    create(service)
    ready(service)
    submit(service, "j1")
    assert submit(service, "j2").kind == "queued"
    waiting = job(service, "j2")
    assert (waiting.state, waiting.state_reason) == (
        JobState.QUEUED,
        "Waiting for a free unit of pool demo (1 busy), in the pool's order (priority, then age).",
    )
    service.cancel("j1", "Cancelled by ada.")
    assert job(service, "j1").state is JobState.CANCELLED
    found = job(service, "j2")
    assert (found.state, found.warm_pool_unit) == (JobState.PROVISIONING, "demo-u0-g1")
    assert assignment(tpu_client, project_id, "demo-u0-g1")["job_id"] == "j2"
    assert set(live_resources(tpu_client, project_id)) == {"demo-u0-g1"}
    assert_consistent(service)


def test_the_pools_queue_is_priority_then_age(service, clock):
    """Each freed unit goes to the highest priority, the oldest among equals."""
    create(service)
    ready(service)
    submit(service, "first")
    submit(service, "old-low", priority="low")
    clock.advance(1)
    submit(service, "medium-1")
    clock.advance(1)
    submit(service, "medium-2")
    order = []
    for running in ("first", "medium-1", "medium-2", "old-low"):
        assert job(service, running).state is JobState.PROVISIONING, running
        order.append(running)
        service.cancel(running, "Cancelled by ada.")
    assert order == ["first", "medium-1", "medium-2", "old-low"]
    assert pool_of(service).unit(0).state is UnitState.IDLE


def test_pool_fallback_provision_leaves_for_fresh_capacity_when_no_unit_is_free(service, tpu_client, project_id):
    """No free unit: the job leaves the pool and asks for a queued resource of its own."""
    create(service)
    ready(service)
    submit(service, "j1")
    submit(service, "j2", pool_fallback="provision")
    found = job(service, "j2")
    assert (found.state, found.warm_pool, found.warm_pool_unit) == (JobState.PROVISIONING, "", "")
    assert found.queued_resource in live_resources(tpu_client, project_id)
    assert live_resources(tpu_client, project_id)[found.queued_resource]["tpujobs-job"] == "j2"
    assert pool_of(service).unit(0).job_id == "j1"


# -- healing --------------------------------------------------------------------------------------


def test_a_preempted_unit_comes_back_as_its_next_generation_and_the_job_resumes_on_it(
    service, tpu_client, project_id, simulator_url
):
    """One unit preempted mid-job: RECOVERING, QUEUED in the pool, the unit asked for as g2, and attempt 2
    assigned there resuming from the same checkpoint prefix."""
    create(service)
    ready(service)
    submit(service, "j1", on_preemption="resume")
    started(service, "j1", 1)
    first = assignment(tpu_client, project_id, "demo-u0-g1")
    SimulatorControl(simulator_url).preempt(ZONE, "demo-u0-g1")
    reconciler = reconciler_for(service)

    def requeued() -> bool:
        """the job to wait in the pool's queue for attempt 2"""
        reconciler.tick()
        found = job(service, "j1")
        return found.state in (JobState.QUEUED, JobState.PROVISIONING) and found.attempt == 2

    wait_for(requeued, timeout=20)
    timeline = [e.to_state for e in service.store.events("j1")]
    assert JobState.RECOVERING in timeline
    unit = pool_of(service).unit(0)
    assert unit.generation == 2, "the unit is asked for again at once, as its next generation"
    ready(service)
    found = job(service, "j1")
    assert (found.state, found.attempt, found.warm_pool_unit) == (JobState.PROVISIONING, 2, "demo-u0-g2")
    told = assignment(tpu_client, project_id, "demo-u0-g2")
    assert (told["job_id"], told["attempt"], told["config"]["resume"]) == ("j1", 2, True)
    assert told["config"]["checkpoint_uri"] == first["config"]["checkpoint_uri"], "the same checkpoint prefix"
    assert set(live_resources(tpu_client, project_id)) == {"demo-u0-g2"}, "the lost generation is released"
    assert_consistent(service)


def test_a_job_on_a_lost_unit_moves_to_the_next_free_unit(service, tpu_client, project_id, simulator_url):
    """Two units: the job's next attempt takes the idle one while the lost one comes back."""
    create(service, count=2)
    ready(service)
    submit(service, "j1")
    started(service, "j1", 1)
    SimulatorControl(simulator_url).preempt(ZONE, "demo-u0-g1")
    reconciler = reconciler_for(service)

    def moved() -> bool:
        """attempt 2 of the job to run on unit 1"""
        reconciler.tick()
        found = job(service, "j1")
        return found.attempt == 2 and found.warm_pool_unit == "demo-u1-g1"

    wait_for(moved, timeout=20)
    ready(service)
    assert pool_of(service).unit(0).generation == 2
    assert set(live_resources(tpu_client, project_id)) == {"demo-u0-g2", "demo-u1-g1"}
    assert_consistent(service)


def test_resize_up_asks_for_more_and_down_releases_idle_units_first(service, tpu_client, project_id):
    """Up: new units asked for; down: idle units go, the busy one stays; only the owner or an admin."""
    create(service, count=1)
    ready(service)
    assert warm(service).resize(POOL, 3, ADMIN).kind == "done"
    pool = ready(service)
    assert [(u.index, u.state) for u in pool.units] == [(i, UnitState.IDLE) for i in range(3)]
    submit(service, "j1")
    assert warm(service).resize(POOL, 1, "eve@example.com").kind == "forbidden"
    assert warm(service).resize(POOL, 1, ADMIN).kind == "done"
    pool = pool_of(service)
    assert [(u.index, u.state, u.job_id) for u in pool.units] == [(0, UnitState.BUSY, "j1")]
    assert set(live_resources(tpu_client, project_id)) == {"demo-u0-g1"}
    assert pool.count == 1


def test_a_unit_resized_away_while_busy_goes_when_its_job_ends(service, tpu_client, project_id):
    """A busy unit marked for removal is released when its job ends, not given the next job."""
    create(service, count=2)
    ready(service)
    submit(service, "j1")
    submit(service, "j2")
    warm(service).resize(POOL, 1, ADMIN)
    busy_removed = [u for u in pool_of(service).units if u.removing]
    assert len(busy_removed) == 1 and busy_removed[0].state is UnitState.BUSY
    service.cancel(busy_removed[0].job_id, "Cancelled by ada.")
    pool = pool_of(service)
    assert len(pool.units) == 1 and not pool.units[0].removing
    assert set(live_resources(tpu_client, project_id)) == {pool.units[0].queued_resource(POOL)}


def test_delete_cancels_a_running_job_releases_the_units_and_removes_the_document(service, tpu_client, project_id):
    """pool delete: the job on it is cancelled, every unit released, the document gone."""
    create(service, count=2)
    ready(service)
    submit(service, "j1")
    started(service, "j1", 1)
    assert warm(service).delete(POOL, "eve@example.com").kind == "forbidden"
    assert warm(service).delete(POOL, ADMIN).kind == "done"
    found = job(service, "j1")
    assert found.state is JobState.CANCELLED
    assert found.state_reason.startswith("Pool demo was deleted by root@example.com")
    assert warm(service).store.get(POOL) is None
    assert live_resources(tpu_client, project_id) == {}


def test_delete_moves_a_job_with_pool_fallback_provision_to_capacity_of_its_own(service, tpu_client, project_id):
    """pool delete with pool_fallback provision: attempt 2 on a queued resource of its own, resuming."""
    create(service)
    ready(service)
    submit(service, "j1", pool_fallback="provision")
    started(service, "j1", 1)
    warm(service).delete(POOL, ADMIN)
    found = job(service, "j1")
    assert (found.state, found.attempt, found.warm_pool, found.resume_next) == (JobState.PROVISIONING, 2, "", True)
    assert warm(service).store.get(POOL) is None
    assert set(live_resources(tpu_client, project_id)) == {found.queued_resource}


def test_an_idle_unit_is_released_after_idle_minutes_and_woken_by_a_job(service, clock, tpu_client, project_id):
    """Idle past idle_minutes (a clock the test moves): released; a job that asks wakes it as g2."""
    create(service, idle_minutes=5)
    ready(service)
    reconciler = reconciler_for(service)
    clock.advance(4 * 60)
    reconciler.tick()
    assert pool_of(service).unit(0).state is UnitState.IDLE
    clock.advance(61)
    reconciler.tick()
    unit = pool_of(service).unit(0)
    assert unit.state is UnitState.RELEASED
    assert live_resources(tpu_client, project_id) == {}
    assert pool_of(service).idle_chip_hours > 0, "its idle time is the pool's"
    assert submit(service, "j1").kind == "queued"
    assert pool_of(service).unit(0).state is UnitState.REQUESTED, "a waiting job wakes it"
    ready(service)
    found = job(service, "j1")
    assert (found.state, found.warm_pool_unit) == (JobState.PROVISIONING, "demo-u0-g2")


def test_the_reconciler_frees_a_unit_whose_job_ended_without_leaving_it(service):
    """The cancel was committed but its instance died before the unit was freed."""
    create(service)
    ready(service)
    submit(service, "j1")
    service.store.apply("j1", Observation(EventKind.CANCEL_REQUESTED, None, "user", "Cancelled."), service.clock)
    assert pool_of(service).unit(0).job_id == "j1"
    reconciler_for(service).tick()
    unit = pool_of(service).unit(0)
    assert (unit.state, unit.job_id) == (UnitState.IDLE, None)


def test_the_reconciler_loses_a_job_whose_unit_no_longer_runs_it(service):
    """The pool says the unit is free while the job is live on it: the job recovers by its rules."""
    create(service, count=2)
    ready(service)
    submit(service, "j1")
    warm(service).store.update(POOL, lambda p: pools.freed(p, 0, service.clock()))
    reconciler_for(service).tick()
    found = job(service, "j1")
    assert found.attempt == 2 and found.state is JobState.PROVISIONING
    assert found.warm_pool_unit in ("demo-u0-g1", "demo-u1-g1")
    assert_consistent(service)


def test_leftover_unit_queued_resources_are_released_and_others_kept(service, tpu_client, project_id):
    """A unit QR of no current unit (a removed unit, a deleted pool) goes; one without the pool
    label (not made by tpujobs) and the pool's own units stay."""
    create(service)
    ready(service)
    shape = pool_of(service).shape()
    boot = HostBoot(service.settings.tpu_service_account, {"startup-script": "true"})
    for name, labels in (
        ("demo-u7-g1", {"tpujobs-pool": "demo", "tpujobs-unit": "7"}),
        ("gone-u0-g3", {"tpujobs-pool": "gone", "tpujobs-unit": "0"}),
        ("demo-u8-g1", {}),
    ):
        service.tpu.request_unit(UnitRequest(name, ZONE, shape, labels), boot)
    report = reconciler_for(service).tick()
    assert sorted(report.released) == ["demo-u7-g1", "gone-u0-g3"]
    assert set(live_resources(tpu_client, project_id)) == {"demo-u0-g1", "demo-u8-g1"}

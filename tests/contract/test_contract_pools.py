"""The contract of `ports.Pools` (quotas and who holds a pool's chips) and `ports.WarmPoolStore`:
every change a compare-and-set; the queues in admission order."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from contract_data import T0, ZONE, a_job, clock

from tpujobs.domain.admission import Holder
from tpujobs.domain.pools import Pool
from tpujobs.domain.states import EventKind
from tpujobs.domain.transitions import Observation

POOL = f"v4@{ZONE}"


def holder(job_id: str, chips: int = 8) -> Holder:
    return Holder(job_id, chips, 1, "medium", T0)


def test_quotas_are_set_and_removed_per_zone_and_family(backend):
    """set_quota with None removes that one family's limit."""
    pools = backend.pools
    assert pools.quotas() == {}
    pools.set_quota(ZONE, "v4", 32)
    pools.set_quota(ZONE, "v5e", 16)
    pools.set_quota(ZONE, "v5e", None)
    assert pools.quotas() == {ZONE: {"v4": 32}}


def test_a_pools_holders_change_only_if_unchanged_since_read(backend):
    """A view of a new pool has no version; the first change creates it; a stale view loses."""
    pools = backend.pools
    empty = pools.view(POOL)
    assert (empty.holders, empty.version) == ((), None)
    assert pools.change(empty, add=holder("job-b")) is True
    assert pools.change(empty, add=holder("job-x")) is False  # someone created it first
    seen = pools.view(POOL)
    assert pools.change(seen, add=holder("job-a")) is True
    assert pools.change(seen, remove=frozenset({"job-b"})) is False  # stale
    now = pools.view(POOL)
    assert [h.job_id for h in now.holders] == ["job-a", "job-b"]
    assert now.holders[1] == holder("job-b")
    assert pools.change(now, remove=frozenset({"job-b"})) is True
    assert [h.job_id for h in pools.view(POOL).holders] == ["job-a"]
    assert pools.pools() == [POOL]


def test_a_pools_queue_is_priority_then_submission_and_active_jobs_hold(backend):
    """QUEUED jobs of the pool, highest priority first, then oldest; active_in: those past QUEUED, not ended."""
    store, pools = backend.jobs, backend.pools
    store.create(*a_job("job-low-old", minutes=0, priority="low"))
    store.create(*a_job("job-norm-new", minutes=2))
    store.create(*a_job("job-norm-old", minutes=1))
    store.create(*a_job("job-high", minutes=3, priority="high"))
    store.create(*a_job("job-running", minutes=4))
    store.create(*a_job("job-elsewhere", minutes=5, accelerator_type="v5litepod-8"))
    store.apply("job-running", Observation(EventKind.ADMITTED, 1, "submit", capacity_state="ACCEPTED"), clock)
    assert [j.job_id for j in pools.queue(POOL)] == ["job-high", "job-norm-old", "job-norm-new", "job-low-old"]
    assert [j.job_id for j in pools.queue(POOL, limit=2)] == ["job-high", "job-norm-old"]
    assert [j.job_id for j in pools.active_in(POOL)] == ["job-running"]
    assert pools.queue("v4@europe-west4-a") == []


def a_pool(name: str = "pool-a", **changes) -> Pool:
    fields = {"owner": "ada@example.com", "accelerator_type": "v4-8", "slices": 1, "count": 2}
    return Pool(
        name, **{**fields, "capacity": "on-demand", "zones": (ZONE,), "created_at": T0, "updated_at": T0, **changes}
    )


def test_a_warm_pool_is_created_once_and_changed_by_compare_and_set(backend):
    """create is False for a taken name; update returns (before, after) and writes nothing for no change."""
    store = backend.warm_pools
    assert store.get("pool-a") is None and store.update("pool-a", lambda p: p) is None
    assert store.create(a_pool()) is True
    assert store.create(a_pool(owner="eve@example.com")) is False
    before = store.get("pool-a")
    assert before.owner == "ada@example.com" and before.version is not None
    assert store.update("pool-a", lambda p: None) == (before, before)
    later = T0 + timedelta(minutes=1)
    changed = store.update("pool-a", lambda p: dataclasses.replace(p, count=3, updated_at=later))
    assert changed is not None and changed[0] == before and changed[1].count == 3
    after = store.get("pool-a")
    assert (after.count, after.updated_at) == (3, later) and after.version != before.version
    assert store.delete(before) is False  # stale
    assert store.delete(after) is True and store.get("pool-a") is None


def test_warm_pools_are_listed_by_name_and_their_queues_read_from_jobs(backend):
    """list_pools in name order; queue: QUEUED jobs for the pool in admission order; jobs_on: every job not ended."""
    store, jobs = backend.warm_pools, backend.jobs
    store.create(a_pool("pool-b"))
    store.create(a_pool("pool-a"))
    assert [p.name for p in store.list_pools()] == ["pool-a", "pool-b"]
    for job_id, minutes, priority in (("job-1", 0, "medium"), ("job-2", 1, "high"), ("job-3", 2, "medium")):
        job, event = a_job(job_id, minutes=minutes, priority=priority)
        jobs.create(job.evolve(warm_pool="pool-a"), event)
    jobs.create(*a_job("job-other", minutes=3))
    jobs.apply("job-3", Observation(EventKind.CANCEL_REQUESTED, None, "user", reason="Cancelled."), clock)
    assert [j.job_id for j in store.queue("pool-a")] == ["job-2", "job-1"]
    assert sorted(j.job_id for j in store.jobs_on("pool-a")) == ["job-1", "job-2"]
    assert store.queue("pool-b") == [] and store.jobs_on("pool-b") == []

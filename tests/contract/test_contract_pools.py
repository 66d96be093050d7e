"""The contract of `ports.Pools` (quotas and who holds a pool's chips) and `ports.WarmPoolStore`:
every change a compare-and-set; the queues in admission order."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from contract_data import T0, ZONE, a_job, clock

from tpujobs.domain.admission import Holder
from tpujobs.domain.pools import Pool
from tpujobs.domain.quotas import Limits, PoolKey, QuotaEntry
from tpujobs.domain.states import EventKind
from tpujobs.domain.transitions import Observation

POOL = "v4@us-central2"  # the on-demand v4 chips of ZONE's region


def holder(job_id: str, chips: int = 8, zone: str = ZONE) -> Holder:
    return Holder(job_id, chips, 1, "medium", T0, zone=zone)


def test_quotas_are_set_and_removed_per_place_family_and_tier(backend):
    """set_quota with None removes that one limit; a region's and a reservation's are read back too."""
    pools = backend.pools
    assert pools.quotas().entries == []
    pools.set_quota(ZONE, "v4", "on-demand", 32)
    pools.set_quota(ZONE, "v4", "spot", 64)
    pools.set_quota(ZONE, "v5p", "on-demand", 16)
    pools.set_quota(ZONE, "v5p", "on-demand", None)
    pools.set_quota("us-central2", "v4", "spot", 128)
    pools.set_reservation("team-a", 8)
    book = pools.quotas()
    assert book.problems == []
    assert book.entries == [
        QuotaEntry("reservations", "", "reserved", 8, "team-a"),
        QuotaEntry("us-central2", "v4", "spot", 128),
        QuotaEntry(ZONE, "v4", "on-demand", 32),
        QuotaEntry(ZONE, "v4", "spot", 64),
    ]
    assert book.limits(PoolKey("v4", "spot", "us-central2")) == Limits(128, {ZONE: 64})
    pools.set_reservation("team-a", None)
    pools.set_quota(ZONE, "v4", "spot", None)
    pools.set_quota("us-central2", "v4", "spot", None)
    assert pools.quotas().entries == [QuotaEntry(ZONE, "v4", "on-demand", 32)]


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
    assert now.holders[1] == holder("job-b")  # its zone read back with it
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
    store.create(*a_job("job-spot", minutes=6, capacity="spot"))  # the same zone's spot chips: another pool
    store.apply("job-running", Observation(EventKind.ADMITTED, 1, "submit", capacity_state="ACCEPTED"), clock)
    assert [j.job_id for j in pools.queue(POOL)] == ["job-high", "job-norm-old", "job-norm-new", "job-low-old"]
    assert [j.job_id for j in pools.queue(POOL, limit=2)] == ["job-high", "job-norm-old"]
    assert [j.job_id for j in pools.active_in(POOL)] == ["job-running"]
    assert [j.job_id for j in pools.queue(f"{POOL}:spot")] == ["job-spot"]
    assert pools.queue("v4@europe-west4") == []


def test_a_zones_pool_from_before_regions_can_still_be_read_and_emptied(backend):
    """`v4@us-central2-b` (a zone, no pool id now): its holders are read and dropped like any pool's."""
    pools = backend.pools
    old = f"v4@{ZONE}"
    assert pools.change(pools.view(old), add=Holder("job-a", 8, 1, "medium", T0)) is True
    (held,) = pools.view(old).holders
    assert held.zone == ""  # written before holders had a zone
    assert pools.change(pools.view(old), remove=frozenset({"job-a"})) is True
    assert pools.view(old).holders == ()


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

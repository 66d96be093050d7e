"""A reconcile tick fans out, on the fakes and the TPU simulator: the coordinator cuts the active
jobs into shards by zone and job id, each shard is its own invocation, and together they cover
every job and every queued resource exactly once, with no cap. Shards carried by Pub/Sub, and
the Firestore store's paged shard reads, are tests/emulator/test_reconcile_shards.py.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from engine_harness import ZONE, Engine

from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.shards import Shard
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Observation
from tpujobs.engine.topology import RECONCILE
from tpujobs.local.testing import ManualClock, inbound

OTHER = "us-east5-a"
SHARD_SIZE = 2


class Collected:
    """The coordinator's shard port, keeping what it was given."""

    def __init__(self) -> None:
        self.shards: list[Shard] = []

    def publish_shards(self, shards: list[Shard]) -> None:
        self.shards += shards


class ShardReads:
    """The job store, keeping the job ids each shard's read returned."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.by_shard: dict[tuple[str, str, str], list[str]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def active_in_shard(self, zone: str, after: str, through: str, page_size: int = 500) -> Any:
        jobs = self._store.active_in_shard(zone, after, through, page_size)
        self.by_shard[(zone, after, through)] = [job.job_id for job in jobs]
        return jobs


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def jobs(engine, clock) -> Engine:
    return engine(clock=clock, reconcile_shard_size=SHARD_SIZE, stuck_after_seconds=30.0)


def submitted(jobs: Engine, job_id: str, zone: str = ZONE) -> None:
    body = {"job_id": job_id, "name": "train", "owner": "ada@example.com", "accelerator_type": "v4-8",
            "command": "x", "zone": zone}  # fmt: skip
    assert jobs.submit(body).kind == "provisioning"


def test_the_shards_of_a_tick_cover_every_active_job_exactly_once(jobs):
    """Five jobs in one zone and two in another, shards of two: the coordinator publishes three
    shards for the first zone and one for the second, ranges that cover each zone's whole id
    space; run one by one, their reads hold each active job once, and no ended job."""
    first = [f"job-{n}" for n in range(5)]
    second = ["east-a", "east-b"]
    for job_id in first:
        submitted(jobs, job_id)
    for job_id in second:
        submitted(jobs, job_id, zone=OTHER)
    submitted(jobs, "ended")
    jobs.cancel("ended", "not needed")
    reads, collected = ShardReads(jobs.store), Collected()
    reconciler = jobs.reconciler(store=reads, shards=collected)

    report = reconciler.handle(inbound(RECONCILE, {"tick": "now"}))

    assert report.jobs == 7 and report.shards == [shard.name for shard in collected.shards]
    assert Counter(shard.zone for shard in collected.shards) == {ZONE: 3, OTHER: 1}
    for zone in (ZONE, OTHER):
        ranges = sorted((s.after, s.through) for s in collected.shards if s.zone == zone)  # a tick starts anywhere
        assert ranges[0][0] == "" and ranges[-1][1] == ""  # open at both ends
        assert all(ranges[i][1] == ranges[i + 1][0] for i in range(len(ranges) - 1))  # no gap, no overlap
    for shard in collected.shards:
        assert reconciler.handle(inbound(RECONCILE, shard.message())).shards == [shard.name]
    read = [job_id for ids in reads.by_shard.values() for job_id in ids]
    assert sorted(read) == sorted(first + second)
    assert max(len(ids) for ids in reads.by_shard.values()) == SHARD_SIZE


def test_a_tick_in_one_process_runs_every_shard_and_repairs_each_job(jobs):
    """tick() runs the coordinator and each shard inline: five PROVISIONING jobs whose queued
    resources vanished, in three shards, are all asked for again, once each."""
    names = [f"job-{n}" for n in range(5)]
    for job_id in names:
        submitted(jobs, job_id)
        jobs.capacity.release(ZONE, f"{job_id}-a1")

    report = jobs.tick()

    assert report.jobs == 5 and len(report.shards) == 3 and report.tpu_lists == 3
    assert sorted(report.re_requested) == [f"{job_id}-a1" for job_id in names]
    assert all(jobs.capacity.status(ZONE, f"{job_id}-a1") is not None for job_id in names)


def test_a_leftover_queued_resource_is_released_by_exactly_one_shard(jobs, clock):
    """A cancelled job whose release never happened (its handler died after the commit) leaves its
    queued resource in a zone of three shards: only the shard whose range holds its id releases
    it, and the zone's other shards leave it alone."""
    for job_id in ("job-a", "job-c", "job-e", "job-g"):
        submitted(jobs, job_id)
    submitted(jobs, "job-d")
    jobs.store.apply("job-d", Observation(EventKind.CANCEL_REQUESTED, None, "user", "cancelled"), clock)
    assert jobs.job("job-d").state is JobState.CANCELLED
    assert jobs.capacity.status(ZONE, "job-d-a1") is not None
    collected = Collected()
    reconciler = jobs.reconciler(shards=collected)
    reconciler.coordinate()
    zone_shards = sorted((shard for shard in collected.shards if shard.zone == ZONE), key=lambda s: s.after)
    assert len(zone_shards) == 2  # job-a, job-c | job-e, job-g: job-d falls in the second

    released = {shard.name: reconciler.run_shard(shard).released for shard in zone_shards}

    assert sorted(name for name, gone in released.items() if gone) == [zone_shards[1].name]
    assert released[zone_shards[1].name] == ["job-d-a1"]
    status = jobs.capacity.status(ZONE, "job-d-a1")
    assert status is None or status.state is HoldingState.RELEASING


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"shard": {"zone": "Not A Zone", "after": "", "through": ""}}, "shard.zone"),
        ({"shard": {"zone": ZONE, "after": "job-b", "through": "job-a"}}, "shard.through"),
        ({"shard": {"zone": ZONE, "after": 7}}, "shard.after"),
        ({"shard": {"zone": ZONE, "limit": 10}}, "shard.limit"),
        ({"shard": [ZONE]}, "shard"),
    ],
)
def test_a_malformed_shard_message_is_recorded_and_acknowledged(jobs, body, field):
    """A shard message that cannot be used is recorded in `rejections` with a sentence naming the
    field, and handled without raising (so acknowledged, never redelivered in a loop); no job is
    touched."""
    submitted(jobs, "job-a")
    jobs.capacity.release(ZONE, "job-a-a1")
    message = inbound(RECONCILE, body)

    report = jobs.reconciler().handle(message)

    (rejection,) = jobs.rejections()
    assert rejection.message_id == message.message_id and f"'{field}'" in rejection.reason
    assert report.shards == [] and report.re_requested == [] and report.failed
    assert jobs.capacity.status(ZONE, "job-a-a1") is None


def test_a_ticks_reads_grow_with_active_jobs_not_finished_ones(jobs):
    """Ten ended jobs beside three active ones add nothing to what a tick reads: the
    coordinator's placements and the shards' reads hold only the active jobs."""
    for job_id in ("job-a", "job-b", "job-c"):
        submitted(jobs, job_id)
    reads = ShardReads(jobs.store)
    before = jobs.tick(store=reads)
    for n in range(10):
        submitted(jobs, f"done-{n}")
        jobs.cancel(f"done-{n}", "finished")
    reads.by_shard.clear()

    after = jobs.tick(store=reads)

    assert (before.jobs, before.jobs_read) == (after.jobs, after.jobs_read) == (3, 6)
    assert sorted(job_id for ids in reads.by_shard.values() for job_id in ids) == ["job-a", "job-b", "job-c"]

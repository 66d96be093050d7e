"""A reconcile tick fans out: the coordinator cuts the active jobs into shards by zone and job id,
each shard is its own invocation, and together they cover every job and every queued resource
exactly once, with no cap."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tpujobs.adapters.pubsub import Publisher
from tpujobs.domain.shards import Shard
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Observation
from tpujobs.engine.reconciler import Reconciler
from tpujobs.engine.services import Engine
from tpujobs.engine.topology import RECONCILE
from tpujobs.local.testing import ManualClock, inbound, reconciler_for

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"
OTHER = "us-east5-a"
SHARD_SIZE = 2


Clock = ManualClock


class Collected:
    """The coordinator's shard port, keeping what it was given (the Pub/Sub path is tested apart)."""

    def __init__(self) -> None:
        self.shards: list[Shard] = []

    def publish_shards(self, shards) -> None:
        self.shards += shards


class ShardReads:
    """The real store, keeping the job ids each shard's read returned and counting every read."""

    def __init__(self, store) -> None:
        self._store = store
        self.by_shard: dict[tuple[str, str, str], list[str]] = {}
        self.pages: Counter[str] = Counter()

    def __getattr__(self, name):
        return getattr(self._store, name)

    def active_placements(self, page_size: int = 500):
        self.pages["placements"] += 1
        return self._store.active_placements(page_size)

    def active_in_shard(self, zone: str, after: str, through: str, page_size: int = 500):
        jobs = self._store.active_in_shard(zone, after, through, page_size)
        self.by_shard[(zone, after, through)] = [job.job_id for job in jobs]
        return jobs


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def service(job_service, clock) -> Engine:
    return job_service(clock=clock, reconcile_shard_size=SHARD_SIZE, stuck_after_seconds=30.0)


def submitted(service: Engine, job_id: str, zone: str = ZONE) -> None:
    body = {"job_id": job_id, "name": "train", "owner": "ada@example.com", "accelerator_type": "v4-8",
            "command": "x", "zone": zone}  # fmt: skip
    assert service.submission.submit(inbound("tpujobs-submit", body)).kind == "provisioning"


def coordinator(service: Engine) -> tuple[Reconciler, Collected]:
    collected = Collected()
    reconciler = reconciler_for(service)
    reconciler.shards = collected
    return reconciler, collected


def test_the_shards_of_a_tick_cover_every_active_job_exactly_once(service):
    """Five jobs in one zone and two in another, shards of two: the coordinator publishes three
    shards for the first zone and one for the second, ranges that cover each zone's whole id
    space; run one by one, their reads hold each active job once, and no ended job."""
    first = [f"job-{n}" for n in range(5)]
    second = ["east-a", "east-b"]
    for job_id in first:
        submitted(service, job_id)
    for job_id in second:
        submitted(service, job_id, zone=OTHER)
    submitted(service, "ended")
    service.cancel("ended", "not needed")
    reads = ShardReads(service.store)
    service.store = reads
    reconciler, collected = coordinator(service)

    report = reconciler.handle(inbound(RECONCILE, {"tick": "now"}))

    assert report.jobs == 7 and report.shards == [shard.name for shard in collected.shards]
    by_zone = Counter(shard.zone for shard in collected.shards)
    assert by_zone == {ZONE: 3, OTHER: 1}
    for zone in (ZONE, OTHER):
        ranges = [(s.after, s.through) for s in collected.shards if s.zone == zone]
        assert ranges[0][0] == "" and ranges[-1][1] == ""  # open at both ends
        assert all(ranges[i][1] == ranges[i + 1][0] for i in range(len(ranges) - 1))  # no gap, no overlap
    for shard in collected.shards:
        assert reconciler.handle(inbound(RECONCILE, shard.message())).shards == [shard.name]
    read = [job_id for ids in reads.by_shard.values() for job_id in ids]
    assert sorted(read) == sorted(first + second)
    assert max(len(ids) for ids in reads.by_shard.values()) == SHARD_SIZE


def test_a_tick_in_one_process_runs_every_shard_and_repairs_each_job(service):
    """tick() runs the coordinator and each shard inline: five PROVISIONING jobs whose queued
    resources vanished, in three shards, are all asked for again, once each."""
    names = [f"job-{n}" for n in range(5)]
    for job_id in names:
        submitted(service, job_id)
        service.capacity.release(ZONE, f"{job_id}-a1")

    report = reconciler_for(service).tick()

    assert report.jobs == 5 and len(report.shards) == 3 and report.tpu_lists == 3
    assert sorted(report.re_requested) == [f"{job_id}-a1" for job_id in names]
    assert all(service.capacity.status(ZONE, f"{job_id}-a1") is not None for job_id in names)


def test_a_leftover_queued_resource_is_released_by_exactly_one_shard(service, clock):
    """A cancelled job whose release never happened (its handler died after the commit) leaves its
    queued resource in a zone of three shards: only the shard whose range holds its id releases
    it, and the zone's other shards leave it alone."""
    for job_id in ("job-a", "job-c", "job-e", "job-g"):
        submitted(service, job_id)
    submitted(service, "job-d")
    service.store.apply("job-d", Observation(EventKind.CANCEL_REQUESTED, None, "user", "cancelled"), clock)
    assert service.store.get("job-d").state is JobState.CANCELLED
    assert service.capacity.status(ZONE, "job-d-a1") is not None
    reconciler, collected = coordinator(service)
    reconciler.coordinate()
    zone_shards = [shard for shard in collected.shards if shard.zone == ZONE]
    assert len(zone_shards) == 2  # job-a, job-c | job-e, job-g: job-d falls in the second

    released = {shard.name: reconciler.run_shard(shard).released for shard in zone_shards}

    assert sorted(name for name, gone in released.items() if gone) == [zone_shards[1].name]
    assert released[zone_shards[1].name] == ["job-d-a1"]
    status = service.capacity.status(ZONE, "job-d-a1")
    assert status is None or status.state == "DELETING"


def test_a_shard_published_on_pubsub_is_decoded_and_run(service, project_id):
    """The coordinator publishes its shards on tpujobs-reconcile (the real adapter, the Pub/Sub
    emulator); each pulled message, handled as the function would, runs that shard."""
    from google.cloud import pubsub_v1

    for job_id in ("job-a", "job-b", "job-c"):
        submitted(service, job_id)
        service.capacity.release(ZONE, f"{job_id}-a1")
    publisher = pubsub_v1.PublisherClient()
    subscriber = pubsub_v1.SubscriberClient()
    topic = publisher.create_topic(name=publisher.topic_path(project_id, RECONCILE)).name
    watch = subscriber.subscription_path(project_id, "reconcile-watch")
    subscriber.create_subscription(name=watch, topic=topic)
    reconciler = reconciler_for(service)
    reconciler.shards = Publisher.build(project_id, service.settings.prefix)

    coordinated = reconciler.handle(inbound(RECONCILE, {"tick": "now"}))
    assert coordinated.re_requested == []  # the coordinator repairs no job itself
    received = []
    for _ in range(20):
        answer = subscriber.pull(subscription=watch, max_messages=10, timeout=5)
        if answer.received_messages:
            subscriber.acknowledge(subscription=watch, ack_ids=[m.ack_id for m in answer.received_messages])
            received += [m.message for m in answer.received_messages]
        if len(received) >= len(coordinated.shards):
            break
    subscriber.close()

    assert sorted(json.loads(m.data)["shard"]["zone"] for m in received) == [ZONE, ZONE]
    assert {m.attributes["zone"] for m in received} == {ZONE}
    repaired = [
        name for m in received for name in reconciler.handle(inbound(RECONCILE, m.data, m.message_id)).re_requested
    ]
    assert sorted(repaired) == ["job-a-a1", "job-b-a1", "job-c-a1"]


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
def test_a_malformed_shard_message_is_recorded_and_acknowledged(service, body, field):
    """A shard message that cannot be used is recorded in `rejections` with a sentence naming the
    field, and handled without raising (so acknowledged, never redelivered in a loop); no job is
    touched."""
    submitted(service, "job-a")
    service.capacity.release(ZONE, "job-a-a1")
    message = inbound(RECONCILE, body)

    report = reconciler_for(service).handle(message)

    (rejection,) = service.store.recent_rejections()
    assert rejection.message_id == message.message_id and f"'{field}'" in rejection.reason
    assert report.shards == [] and report.re_requested == [] and report.failed
    assert service.capacity.status(ZONE, "job-a-a1") is None


def test_more_jobs_than_a_page_are_all_sharded_and_read(service):
    """Pages of two: the coordinator's read and a shard's read each go past one page, and every
    job is placed and read (no cap)."""
    names = [f"job-{n}" for n in range(5)]
    for job_id in names:
        submitted(service, job_id)
    placements = service.store.active_placements(page_size=2)
    assert sorted(p.job_id for p in placements) == names and {p.zone for p in placements} == {ZONE}
    assert [j.job_id for j in service.store.active_in_shard(ZONE, "", "", page_size=2)] == names
    assert [j.job_id for j in service.store.active_in_shard(ZONE, "job-1", "job-3", page_size=2)] == ["job-2", "job-3"]
    assert [j.job_id for j in service.store.active_in_shard(ZONE, "job-3", "", page_size=1)] == ["job-4"]
    assert [j.job_id for j in service.store.active_in_shard(OTHER, "", "", page_size=2)] == []
    outline = service.store.active_in_shard(ZONE, "", "job-0")[0]
    assert outline.spec.env == {} and outline.state is JobState.PROVISIONING  # projected to OUTLINE_FIELDS


def test_a_ticks_reads_grow_with_active_jobs_not_finished_ones(service):
    """Ten ended jobs beside three active ones add nothing to what a tick reads: the
    coordinator's placements and the shards' reads hold only the active jobs."""
    for job_id in ("job-a", "job-b", "job-c"):
        submitted(service, job_id)
    reads = ShardReads(service.store)
    service.store = reads
    before = reconciler_for(service).tick()
    for n in range(10):
        submitted(service, f"done-{n}")
        service.cancel(f"done-{n}", "finished")
    reads.by_shard.clear()

    after = reconciler_for(service).tick()

    assert (before.jobs, before.jobs_read) == (after.jobs, after.jobs_read) == (3, 6)
    assert sorted(job_id for ids in reads.by_shard.values() for job_id in ids) == ["job-a", "job-b", "job-c"]

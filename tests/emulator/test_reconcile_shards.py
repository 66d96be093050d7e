"""A reconcile tick's shards where only the emulators can show them: carried by Pub/Sub, and read
through the Firestore store's paged queries. How the coordinator cuts a tick into shards, and
how the shards repair jobs, is tests/unit/engine/test_engine_reconcile_shards.py."""

from __future__ import annotations

import json

import pytest

from tpujobs.adapters.pubsub import Publisher
from tpujobs.domain.states import JobState
from tpujobs.engine.services import Engine
from tpujobs.engine.topology import RECONCILE
from tpujobs.local.testing import ManualClock, inbound, reconciler_for

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"
OTHER = "us-east5-a"
SHARD_SIZE = 2


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def service(job_service, clock) -> Engine:
    return job_service(clock=clock, reconcile_shard_size=SHARD_SIZE, stuck_after_seconds=30.0)


def submitted(service: Engine, job_id: str, zone: str = ZONE) -> None:
    body = {"job_id": job_id, "name": "train", "owner": "ada@example.com", "accelerator_type": "v4-8",
            "command": "x", "zone": zone}  # fmt: skip
    assert service.submission.submit(inbound("tpujobs-submit", body)).kind == "provisioning"


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

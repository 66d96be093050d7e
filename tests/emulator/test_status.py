"""Every state change is announced on tpujobs-status, in order, through the Pub/Sub emulator:
its ordering key and attributes. (The order and the reconciler's late announcements, on the
fakes: tests/unit/engine/test_engine_status.py.)"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.adapters.pubsub import Publisher
from tpujobs.adapters.tpu import CloudTpu
from tpujobs.engine.services import Engine
from tpujobs.engine.topology import STATUS
from tpujobs.local.testing import inbound as message
from tpujobs.local.testing import local_settings, signed

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"


@pytest.fixture
def status_subscription(project_id):
    """The status topic and an ordered pull subscription on it, in the test's project."""
    from google.cloud import pubsub_v1

    publisher = pubsub_v1.PublisherClient()
    subscriber = pubsub_v1.SubscriberClient()
    topic = publisher.topic_path(project_id, STATUS)
    publisher.create_topic(name=topic)
    path = subscriber.subscription_path(project_id, "status-watcher")
    subscriber.create_subscription(request={"name": path, "topic": topic, "enable_message_ordering": True})
    yield subscriber, path
    subscriber.close()


def pull_all(subscriber, path: str, expected: int) -> list:
    received = []
    for _ in range(20):
        answer = subscriber.pull(subscription=path, max_messages=100, timeout=5)
        if answer.received_messages:
            subscriber.acknowledge(subscription=path, ack_ids=[m.ack_id for m in answer.received_messages])
            received.extend(m.message for m in answer.received_messages)
        if len(received) >= expected:
            break
    return received


def build(firestore_client, tpu_client, project_id, simulator_url, status) -> Engine:
    settings = local_settings(project=project_id, default_zone=ZONE, tpu_endpoint=simulator_url, logs_bucket="logs")
    return Engine(
        FirestoreJobStore(firestore_client),
        CloudTpu(tpu_client, project_id),
        settings,
        lambda: datetime.now(timezone.utc),
        lambda s: None,
        status,
    )


def lifecycle(service: Engine) -> None:
    spec = {
        "job_id": "train-1",
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-8",
        "command": "x",
    }
    service.submission.submit(message("tpujobs-submit", spec))
    report = {"job_id": "train-1", "slice_id": 0, "worker_id": 0}
    worker_events = "tpujobs-worker-events"
    service.worker_events.on_worker_report(signed(service, worker_events, {**report, "kind": "started", "attempt": 1}))
    service.capacity_events.on_preemption(signed(service, "tpujobs-preemption", {**report, "attempt": 1}))
    service.worker_events.on_worker_report(signed(service, worker_events, {**report, "kind": "started", "attempt": 2}))
    exited = {**report, "kind": "exited", "attempt": 2, "exit_code": 0}
    service.worker_events.on_worker_report(signed(service, worker_events, exited))


def test_a_full_lifecycle_is_announced_in_order_with_filterable_attributes(
    firestore_client, tpu_client, project_id, simulator_url, status_subscription
):
    """QUEUED .. SUCCEEDED through a preemption: one message per change, in order, with attributes."""
    subscriber, path = status_subscription
    service = build(firestore_client, tpu_client, project_id, simulator_url, Publisher.build(project_id))
    lifecycle(service)
    timeline = service.store.events("train-1")
    received = pull_all(subscriber, path, len(timeline))
    payloads = [json.loads(m.data) for m in received]
    assert [p["to_state"] for p in payloads] == [e.to_state.value for e in timeline]
    assert [p["to_state"] for p in payloads] == [
        "QUEUED", "PROVISIONING", "RUNNING", "RECOVERING", "PROVISIONING", "RUNNING", "SUCCEEDED",
    ]  # fmt: skip
    assert [p["seq"] for p in payloads] == list(range(1, len(timeline) + 1))
    first, last = payloads[0], payloads[-1]
    assert first["from_state"] is None and first["owner"] == "ada@example.com" and first["attempt"] == 1
    assert last["from_state"] == "RUNNING" and last["attempt"] == 2 and last["reason"]
    assert all(set(p) >= {"job_id", "from_state", "to_state", "reason", "attempt", "owner", "at"} for p in payloads)
    attributes = dict(received[-1].attributes)
    assert attributes == {"job_id": "train-1", "owner": "ada@example.com", "to_state": "SUCCEEDED"}
    assert all(m.ordering_key == "train-1" for m in received)

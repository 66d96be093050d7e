"""Every state change is announced on tpujobs-status, in order, through the Pub/Sub emulator."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.adapters.pubsub import Publisher
from tpujobs.adapters.tpu import CloudTpu
from tpujobs.engine.errors import TransientError
from tpujobs.engine.job_service import JobService
from tpujobs.engine.topology import STATUS
from tpujobs.local.testing import inbound as message
from tpujobs.local.testing import local_settings, reconciler_for, signed

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


def build(firestore_client, tpu_client, project_id, simulator_url, status) -> JobService:
    settings = local_settings(project=project_id, default_zone=ZONE, tpu_endpoint=simulator_url, logs_bucket="logs")
    return JobService(
        FirestoreJobStore(firestore_client),
        CloudTpu(tpu_client, project_id),
        settings,
        lambda: datetime.now(timezone.utc),
        lambda s: None,
        status,
    )


def lifecycle(service: JobService) -> None:
    spec = {
        "job_id": "train-1",
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-8",
        "command": "x",
    }
    service.submit(message("tpujobs-submit", spec))
    report = {"job_id": "train-1", "slice_id": 0, "worker_id": 0}
    service.on_worker_report(signed(service, "tpujobs-worker-events", {**report, "kind": "started", "attempt": 1}))
    service.on_preemption(signed(service, "tpujobs-preemption", {**report, "attempt": 1}))
    service.on_worker_report(signed(service, "tpujobs-worker-events", {**report, "kind": "started", "attempt": 2}))
    service.on_worker_report(
        signed(service, "tpujobs-worker-events", {**report, "kind": "exited", "attempt": 2, "exit_code": 0})
    )


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


class _Down:
    """tpujobs-status unreachable: every announcement fails for now."""

    def announce(self, change) -> None:
        raise TransientError("Pub/Sub is down")


def test_an_announcement_that_failed_is_made_by_the_reconciler(
    firestore_client, tpu_client, project_id, simulator_url, status_subscription
):
    """Changes committed while Pub/Sub was down are announced by a later tick, none lost."""
    subscriber, path = status_subscription
    down = build(firestore_client, tpu_client, project_id, simulator_url, _Down())
    lifecycle(down)
    later = datetime.now(timezone.utc) + timedelta(minutes=1)
    up = build(firestore_client, tpu_client, project_id, simulator_url, Publisher.build(project_id))
    up.clock = lambda: later
    report = reconciler_for(up).tick()
    timeline = up.store.events("train-1")
    assert len(report.announced) == len(timeline) == 7
    received = pull_all(subscriber, path, len(timeline))
    assert sorted(json.loads(m.data)["seq"] for m in received) == list(range(1, 8))
    assert up.store.unannounced_events(later) == []
    assert reconciler_for(up).tick().announced == []  # once only

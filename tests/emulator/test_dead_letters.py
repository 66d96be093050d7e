"""Dead letters on the real Pub/Sub and Firestore emulators.

A dead letter is produced for real: a push subscription wired as tpujobs wires them
(`wiring.push_subscription`: retry with backoff, dead-letter after 5 attempts) delivers to a
tiny local server that always answers 500, and the dead-lettered copy is pulled from a pull
subscription on the dead-letter topic, then fed to the recorder through the same decoder the
`record_dead_letter` function uses.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tpujobs.adapters.firestore_dead_letters import DEAD_LETTERS, FirestoreDeadLetters
from tpujobs.adapters.pubsub_republisher import PubsubRepublisher
from tpujobs.engine import dead_letters as letters
from tpujobs.engine import topology
from tpujobs.engine.inbound import InboundMessage, from_cloud_event
from tpujobs.local import wiring
from tpujobs.local.testing import local_settings, wait_for

pytestmark = pytest.mark.emulator

PREFIX = "t9-"
NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
SUBMIT_ROUTE = next(r for r in topology.FUNCTIONS if r.topic == topology.SUBMIT)
DEAD_LETTER_ROUTE = next(r for r in topology.FUNCTIONS if r.topic == topology.DEAD_LETTER)


class FailingEndpoint:
    """A local HTTP server that answers every push with 500, and remembers when it was called."""

    def __init__(self) -> None:
        hits = self.hits = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hits.append(time.monotonic())
                self.send_response(500)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def failing_endpoint() -> Iterator[FailingEndpoint]:
    endpoint = FailingEndpoint()
    try:
        yield endpoint
    finally:
        endpoint.server.shutdown()
        endpoint.server.server_close()


@pytest.fixture
def pubsub(emulators, project_id):
    """Admin clients on the Pub/Sub emulator, and this test's topics (with a prefix)."""
    host = emulators["PUBSUB_EMULATOR_HOST"]
    publisher = wiring.publisher_client(host)
    subscriber = wiring.subscriber_client(host)
    for base in (topology.SUBMIT, topology.DEAD_LETTER):
        publisher.create_topic(name=topic_path(publisher, project_id, base))
    try:
        yield publisher, subscriber
    finally:
        publisher.transport.close()
        subscriber.transport.close()


@pytest.fixture
def service(firestore_client, project_id, pubsub) -> letters.DeadLetters:
    publisher, _ = pubsub
    return letters.DeadLetters(
        FirestoreDeadLetters(firestore_client),
        local_settings(project=project_id, prefix=PREFIX),
        lambda: NOW,
        publisher=lambda: PubsubRepublisher(publisher, project_id, PREFIX),
    )


def topic_path(publisher, project_id: str, base: str) -> str:
    return publisher.topic_path(project_id, topology.topic_name(base, PREFIX))


def pull_subscription(subscriber, project_id: str, topic: str, name: str) -> str:
    path = subscriber.subscription_path(project_id, name)
    subscriber.create_subscription(name=path, topic=topic, ack_deadline_seconds=10)
    return path


def pull_one(subscriber, subscription: str, timeout: float = 60.0):
    """The next message on a pull subscription (acknowledged), waiting up to timeout."""

    from google.api_core.exceptions import DeadlineExceeded

    def probe():
        """a message on the pull subscription"""
        try:
            answer = subscriber.pull(subscription=subscription, max_messages=1, timeout=2.0)
        except DeadlineExceeded:  # nothing yet: the pull waited as long as it was allowed to
            return None
        return answer.received_messages[0] if answer.received_messages else None

    received = wait_for(probe, timeout=timeout, interval=0.2)
    subscriber.acknowledge(subscription=subscription, ack_ids=[received.ack_id])
    return received.message


def as_delivered(message, project_id: str) -> InboundMessage:
    """A pulled dead letter as `record_dead_letter` gets it: the push envelope's CloudEvent data,
    decoded by `tpujobs.engine.inbound` exactly as the function does."""
    source = f"//pubsub.googleapis.com/projects/{project_id}/topics/{PREFIX}{topology.DEAD_LETTER}"
    data = {
        "message": {
            "data": base64.b64encode(message.data).decode("ascii"),
            "attributes": dict(message.attributes),
            "messageId": message.message_id,
        },
        "subscription": f"projects/{project_id}/subscriptions/x",
    }
    return from_cloud_event(message.message_id, source, data)


def a_dead_letter(project_id: str, data: bytes, message_id: str = "9001", **attributes: str) -> InboundMessage:
    """A dead letter shaped like the emulator's (see the first test), without waiting for one."""
    return InboundMessage(
        message_id,
        f"{PREFIX}{topology.DEAD_LETTER}",
        data,
        {
            **attributes,
            letters.DELIVERY_COUNT: "5",
            letters.SOURCE_SUBSCRIPTION: topology.push_subscription_name(SUBMIT_ROUTE, PREFIX),
            letters.SOURCE_PROJECT: project_id,
            letters.SOURCE_PUBLISH_TIME: "2026-03-01T11:59:30.123Z",
        },
    )


def stored(firestore_client, message_id: str) -> dict[str, Any]:
    snapshot = firestore_client.collection(DEAD_LETTERS).document(message_id).get()
    assert snapshot.exists, f"no dead_letters/{message_id}"
    return snapshot.to_dict()


def test_a_message_that_fails_five_pushes_is_dead_lettered_and_recorded_with_its_origin(
    pubsub, service, firestore_client, project_id, failing_endpoint
):
    """Five failed pushes, then Pub/Sub's dead letter (its 4 attributes) is stored field by field."""
    publisher, subscriber = pubsub
    submit = topic_path(publisher, project_id, topology.SUBMIT)
    dead_letter_topic = topic_path(publisher, project_id, topology.DEAD_LETTER)
    pulled = pull_subscription(subscriber, project_id, dead_letter_topic, "dead-letters-pull")
    source = subscriber.subscription_path(project_id, topology.push_subscription_name(SUBMIT_ROUTE, PREFIX))
    subscriber.create_subscription(
        request=wiring.push_subscription(
            source,
            submit,
            wiring.push_endpoint(failing_endpoint.url),
            dead_letter_topic=dead_letter_topic,
        )
    )
    data = b'{"name": "poison"}\n\xff\xfe'  # not UTF-8: stored with backslash escapes
    published_at = datetime.now(timezone.utc)
    original_id = publisher.publish(
        topic=submit,
        messages=[{"data": data, "attributes": {"submitted-by": "test", "data": "an attribute"}}],
    ).message_ids[0]

    dead = pull_one(subscriber, pulled)

    assert len(failing_endpoint.hits) == wiring.MAX_DELIVERY_ATTEMPTS
    assert dead.data == data
    assert dead.message_id != original_id  # Pub/Sub gives the dead-lettered copy a new id
    added = {k: v for k, v in dead.attributes.items() if k.startswith("CloudPubSubDeadLetter")}
    assert added.keys() == {
        letters.DELIVERY_COUNT,
        letters.SOURCE_SUBSCRIPTION,
        letters.SOURCE_PROJECT,
        letters.SOURCE_PUBLISH_TIME,
    }
    assert added[letters.DELIVERY_COUNT] == "5"
    assert added[letters.SOURCE_SUBSCRIPTION] == f"{PREFIX}tpujobs-submit--submit_job"  # short name
    assert added[letters.SOURCE_PROJECT] == project_id
    original_time = letters.parse_timestamp(added[letters.SOURCE_PUBLISH_TIME])
    assert original_time is not None
    assert abs(original_time - published_at) < timedelta(seconds=5)

    letter = service.record(as_delivered(dead, project_id))

    assert letter is not None
    doc = stored(firestore_client, dead.message_id)
    assert doc["at"] == NOW
    assert doc["topic"] == topology.SUBMIT  # the base name: the deployment prefix is added on replay
    assert doc["subscription"] == source
    assert doc["delivery_attempts"] == 5
    assert doc["payload"] == '{"name": "poison"}\n\\xff\\xfe'
    assert doc["attributes"] == {"submitted-by": "test", "data": "an attribute"}
    assert doc["replayed_at"] is None
    assert doc["data"] == data
    assert doc["published_at"] == original_time


def test_replay_republishes_the_original_bytes_and_attributes_and_marks_replayed_at(
    pubsub, service, firestore_client, project_id
):
    """The original data and attributes go back to the prefixed topic; replayed_at and the new id are kept."""
    publisher, subscriber = pubsub
    watch = pull_subscription(
        subscriber, project_id, topic_path(publisher, project_id, topology.SUBMIT), "submit-watch"
    )
    data = b'{"job_id": "again"}\xff'
    service.record(a_dead_letter(project_id, data, "9001", owner="ada", topic="an attribute"))

    letter, new_id = service.replay("9001")

    again = pull_one(subscriber, watch)
    assert again.message_id == new_id
    assert again.data == data
    assert dict(again.attributes) == {"owner": "ada", "topic": "an attribute"}
    assert letter.topic == topology.SUBMIT
    doc = stored(firestore_client, "9001")
    assert doc["replayed_at"] == NOW
    assert doc["replay_message_id"] == new_id


def test_a_redelivered_dead_letter_leaves_the_record_and_its_replay_alone(
    pubsub, service, firestore_client, project_id
):
    """Recording the same dead letter twice keeps one document and does not clear replayed_at."""
    message = a_dead_letter(project_id, b"{}", "9002")
    service.record(message)
    service.replay("9002")

    service.record(message)

    assert stored(firestore_client, "9002")["replayed_at"] == NOW
    assert len(list(firestore_client.collection(DEAD_LETTERS).stream())) == 1


def test_an_attribute_firestore_refuses_as_a_map_key_is_kept_as_json_and_replayed(
    pubsub, service, firestore_client, project_id
):
    """An attribute named like a reserved Firestore field (__x__) neither loops nor is lost."""
    publisher, subscriber = pubsub
    watch = pull_subscription(
        subscriber, project_id, topic_path(publisher, project_id, topology.SUBMIT), "submit-watch"
    )
    service.record(a_dead_letter(project_id, b"{}", "9003", __x__="1"))

    doc = stored(firestore_client, "9003")
    assert doc["attributes"] == {}
    assert doc["attributes_json"] == '{"__x__": "1"}'
    service.replay("9003")
    assert dict(pull_one(subscriber, watch).attributes) == {"__x__": "1"}


def test_a_message_that_is_no_dead_letter_is_recorded_without_origin_and_not_replayed(service, firestore_client):
    """Bad input never raises: undecodable data or missing attributes are recorded as such."""
    service.record(InboundMessage("9004", "tpujobs-dead-letter", None, {}, "message data is not valid base64"))

    doc = stored(firestore_client, "9004")
    assert doc["topic"] == "" and doc["delivery_attempts"] is None and doc["data"] is None
    assert "not valid base64" in doc["note"]
    with pytest.raises(letters.NotReplayable):
        service.replay("9004")


def test_replaying_an_unknown_id_is_a_clear_error(service):
    """An id that names no dead letter raises UnknownDeadLetter, naming the id."""
    with pytest.raises(letters.UnknownDeadLetter, match="'404'"):
        service.replay("404")


def test_the_list_is_newest_first_and_filters_by_topic(firestore_client, project_id):
    """list() orders by `at` descending and keeps only the asked topic."""
    times = iter([NOW, NOW + timedelta(seconds=1), NOW + timedelta(seconds=2)])
    service = letters.DeadLetters(
        FirestoreDeadLetters(firestore_client),
        local_settings(project=project_id, prefix=PREFIX),
        lambda: next(times),
        publisher=lambda: pytest.fail("listing publishes nothing"),
    )
    control = a_dead_letter(project_id, b"{}", "3")
    control = InboundMessage(
        control.message_id,
        control.topic,
        control.data,
        {**control.attributes, letters.SOURCE_SUBSCRIPTION: f"{PREFIX}tpujobs-control--on_control"},
    )
    for message in (a_dead_letter(project_id, b"{}", "1"), a_dead_letter(project_id, b"{}", "2"), control):
        service.record(message)

    assert [letter.message_id for letter in service.list_dead_letters()] == ["3", "2", "1"]
    assert [letter.message_id for letter in service.list_dead_letters(topic=topology.SUBMIT)] == ["2", "1"]
    assert [letter.topic for letter in service.list_dead_letters(topic=topology.CONTROL)] == [topology.CONTROL]


@pytest.mark.parametrize(
    ("subscription", "prefix", "topic"),
    [
        ("tpujobs-submit--submit_job", "", "tpujobs-submit"),
        ("dev--tpujobs-qr-state--on_qr_state", "dev--", "tpujobs-qr-state"),
        ("projects/p/subscriptions/t1-tpujobs-control--on_control", "t1-", "tpujobs-control"),
        ("someone-elses-topic--reader", "", "someone-elses-topic"),
        ("no-separator", "", ""),
    ],
)
def test_the_original_topic_is_read_from_the_subscription_name(subscription, prefix, topic):
    """`{prefix}{topic}--{target}` gives the topic's base name, whatever the prefix holds."""
    assert letters.source_topic(subscription, prefix) == topic


def test_rewiring_brings_existing_subscriptions_policies_up_to_date(emulators, project_id):
    """wire_pubsub gives every push subscription retry and dead-letter policies (none on the
    dead-letter topic's own), repairs a drifted one in place, and changes nothing when in step."""
    host = emulators["PUBSUB_EMULATOR_HOST"]
    urls = {route.target: f"http://127.0.0.1:9/{route.target}/" for route in topology.FUNCTIONS}
    wired = wiring.wire_pubsub(host, project_id, PREFIX, urls)
    subscriber = wiring.subscriber_client(host)
    try:
        dead_letter_topic = f"projects/{project_id}/topics/{PREFIX}{topology.DEAD_LETTER}"
        own = subscriber.subscription_path(project_id, topology.push_subscription_name(DEAD_LETTER_ROUTE, PREFIX))
        for path in wired.subscriptions:
            got = subscriber.get_subscription(subscription=path)
            assert got.retry_policy == wiring.retry_policy(wiring.LOCAL_MINIMUM_BACKOFF_S)
            if path == own:
                assert "dead_letter_policy" not in got
            else:
                assert got.dead_letter_policy.dead_letter_topic == dead_letter_topic
                assert got.dead_letter_policy.max_delivery_attempts == wiring.MAX_DELIVERY_ATTEMPTS

        from google.protobuf.field_mask_pb2 import FieldMask
        from google.pubsub_v1 import Subscription

        submit = subscriber.subscription_path(project_id, topology.push_subscription_name(SUBMIT_ROUTE, PREFIX))
        subscriber.update_subscription(
            request={
                "subscription": Subscription(name=submit),
                "update_mask": FieldMask(paths=["retry_policy", "dead_letter_policy"]),
            }
        )
        moved = {**urls, SUBMIT_ROUTE.target: "http://127.0.0.1:10/moved/"}
        wiring.wire_pubsub(host, project_id, PREFIX, moved, minimum_backoff_s=2.5)

        got = subscriber.get_subscription(subscription=submit)
        assert got.retry_policy == wiring.retry_policy(2.5)
        assert got.dead_letter_policy.max_delivery_attempts == wiring.MAX_DELIVERY_ATTEMPTS
        assert got.push_config.push_endpoint.startswith("http://127.0.0.1:10/moved/")
        wanted = wiring.route_subscription(
            SUBMIT_ROUTE, project_id, PREFIX, moved[SUBMIT_ROUTE.target], minimum_backoff_s=2.5
        )
        assert wiring.changed_fields(got, wanted) == []  # wiring again would change nothing
    finally:
        subscriber.transport.close()

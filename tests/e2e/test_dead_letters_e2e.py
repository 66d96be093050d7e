"""Dead letters end to end on the local stack: a push that keeps failing -> 5 attempts with the
stack's retry backoff -> tpujobs-dead-letter -> record_dead_letter under functions-framework ->
Firestore `dead_letters` -> `tpujobs dead-letters` lists it and replays it.

A poison message is not easy to make: every tpujobs handler records bad input and
acknowledges it, and the Pub/Sub emulator always puts `data` in the push envelope (`""` for an
empty message), so functions-framework converts every envelope it gets. What does fail for
real is a subscription functions-framework cannot read at all: one created with payload
unwrapping ("no wrapper"), which pushes the bare bytes with a form content type, so the
real submit_job function answers 415 to every delivery. The test adds such a subscription on
tpujobs-submit, with the policies the stack wires, and removes it at the end.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpujobs.engine import topology
from tpujobs.local import stack, wiring
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

PROJECT = "tpujobs-e2e"  # the project of the e2e conftest's stack
SUBMIT_ROUTE = next(r for r in topology.FUNCTIONS if r.topic == topology.SUBMIT)


@pytest.fixture(scope="module")
def admin(local_stack):
    """Admin Publisher and Subscriber clients on the stack's Pub/Sub emulator."""
    publisher = wiring.publisher_client(local_stack["PUBSUB_EMULATOR_HOST"])
    subscriber = wiring.subscriber_client(local_stack["PUBSUB_EMULATOR_HOST"])
    try:
        yield publisher, subscriber
    finally:
        publisher.transport.close()
        subscriber.transport.close()


@pytest.fixture
def unreadable_subscription(admin, local_stack) -> Iterator[str]:
    """A push subscription on tpujobs-submit, wired like the stack's, that the real submit_job
    function cannot read (payload unwrapping on): every delivery fails."""
    from google.pubsub_v1 import PushConfig

    publisher, subscriber = admin
    state = stack.load(Path(os.environ["TPUJOBS_STATE_DIR"]))
    assert state is not None
    topic = publisher.topic_path(PROJECT, topology.SUBMIT)
    name = f"{topology.SUBMIT}--unwrapped_{uuid.uuid4().hex[:8]}"  # named as the stack names them
    subscription = wiring.push_subscription(
        subscriber.subscription_path(PROJECT, name),
        topic,
        wiring.push_endpoint(state.functions[SUBMIT_ROUTE.target]),
        dead_letter_topic=publisher.topic_path(PROJECT, topology.DEAD_LETTER),
    )
    subscription.push_config.no_wrapper = PushConfig.NoWrapper(write_metadata=True)
    subscriber.create_subscription(request=subscription)
    try:
        yield subscription.name
    finally:
        subscriber.delete_subscription(subscription=subscription.name)


def test_the_stack_wires_retry_and_dead_letter_policies_on_every_push_subscription(admin):
    """Every function's subscription retries with backoff and dead-letters after 5 attempts,
    except the dead-letter topic's own, which only retries."""
    publisher, subscriber = admin
    dead_letter_topic = publisher.topic_path(PROJECT, topology.DEAD_LETTER)
    for route in topology.FUNCTIONS:
        if route.signature != "cloudevent":
            continue
        path = subscriber.subscription_path(PROJECT, topology.push_subscription_name(route))
        got = subscriber.get_subscription(subscription=path)
        assert got.retry_policy == wiring.retry_policy(wiring.LOCAL_MINIMUM_BACKOFF_S), route.target
        if route.topic == topology.DEAD_LETTER:
            assert "dead_letter_policy" not in got
        else:
            assert got.dead_letter_policy.dead_letter_topic == dead_letter_topic, route.target
            assert got.dead_letter_policy.max_delivery_attempts == wiring.MAX_DELIVERY_ATTEMPTS


def test_a_message_no_delivery_can_handle_becomes_a_listed_replayable_dead_letter(admin, unreadable_subscription):
    """After 5 failed deliveries a dead_letters document appears with its topic and attempts;
    `tpujobs dead-letters` lists it, and --replay sends it back to tpujobs-submit."""
    from google.cloud import firestore
    from typer.testing import CliRunner

    from tpujobs.cli import app

    publisher, _ = admin
    marker = uuid.uuid4().hex
    payload = f'{{"note": "dead-letter e2e {marker}"}}'.encode()
    publisher.publish(
        topic=publisher.topic_path(PROJECT, topology.SUBMIT),
        messages=[{"data": payload, "attributes": {"e2e_marker": marker}}],
    )
    db = firestore.Client(project=PROJECT)
    query = db.collection("dead_letters").where(filter=firestore.FieldFilter("attributes.e2e_marker", "==", marker))

    def recorded():
        """the dead letter in Firestore"""
        return next(iter(query.stream()), None)

    snapshot = wait_for(recorded, timeout=60, interval=0.25)
    doc = snapshot.to_dict()
    assert doc["topic"] == topology.SUBMIT
    assert doc["subscription"] == unreadable_subscription
    assert doc["delivery_attempts"] >= wiring.MAX_DELIVERY_ATTEMPTS
    assert doc["payload"] == payload.decode()
    assert doc["attributes"] == {"e2e_marker": marker}
    assert doc["replayed_at"] is None

    runner = CliRunner()
    wide = {"COLUMNS": "200"}  # what rich reads; the payload excerpt takes what is left
    listed = runner.invoke(app, ["dead-letters", "--topic", topology.SUBMIT], env=wide)
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.output.splitlines() if f" {snapshot.id} " in line)
    assert topology.SUBMIT in row and f" {doc['delivery_attempts']} " in row
    assert f"dead-letter e2e {marker[:20]}" in row
    elsewhere = runner.invoke(app, ["dead-letters", "--topic", topology.CONTROL], env=wide)
    assert f" {snapshot.id} " not in elsewhere.output

    replayed = runner.invoke(app, ["dead-letters", "--replay", snapshot.id], env=wide)
    assert replayed.exit_code == 0, replayed.output
    assert f"Replayed dead letter {snapshot.id} to {topology.SUBMIT}" in replayed.output
    after = db.collection("dead_letters").document(snapshot.id).get().to_dict()
    assert after["replayed_at"] is not None and after["replay_message_id"]

    unknown = runner.invoke(app, ["dead-letters", "--replay", "no-such-id"])
    assert unknown.exit_code == 1
    assert "No dead letter 'no-such-id'" in unknown.output

"""The contract of `ports.Republisher`: `RecordingRepublisher` and `PubsubRepublisher` on the Pub/Sub
emulator publish a dead letter's bytes and attributes exactly as they were (even attributes named as
a publish call's own arguments), answer a new message id each time, and refuse a missing topic for
good."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from pubsub_wire import PREFIX, EmulatorTopics

from tpujobs.engine.errors import PermanentError
from tpujobs.engine.topology import CONTROL, SUBMIT
from tpujobs.local.fakes.dead_letters import RecordingRepublisher

Arrived = tuple[bytes, dict[str, str]]


@dataclass
class Replays:
    """A republisher, what arrived on a topic (`arrived(topic, how many are expected)`), and how a
    test takes a topic away."""

    port: Any
    arrived: Callable[[str, int], list[Arrived]]
    drop_topic: Callable[[str], None]


@pytest.fixture(params=["memory", pytest.param("pubsub", marks=pytest.mark.emulator)])
def replays(request: pytest.FixtureRequest) -> Iterator[Replays]:
    if request.param == "memory":
        fake = RecordingRepublisher()
        yield Replays(
            fake,
            lambda topic, _: [(data, attributes) for base, data, attributes in fake.published if base == topic],
            fake.missing_topics.add,
        )
        return
    from tpujobs.adapters.pubsub_republisher import PubsubRepublisher

    emulators, project = request.getfixturevalue("emulators"), request.getfixturevalue("project_id")
    topics = EmulatorTopics(emulators["PUBSUB_EMULATOR_HOST"], project, (SUBMIT, CONTROL))
    try:
        yield Replays(
            PubsubRepublisher(topics.publisher, project, PREFIX),
            lambda topic, expected: [(m.data, dict(m.attributes)) for m in topics.received(topic, expected)],
            topics.delete,
        )
    finally:
        topics.close()


def test_a_replay_publishes_the_bytes_and_attributes_as_they_were(replays):
    """Bytes that are not JSON (nor UTF-8) and attributes named data, topic or timeout arrive as they
    were, on the topic named; each publish answers an id of its own."""
    data = b'\xff{"job_id": "train-1"'
    attributes = {"data": "x", "topic": "y", "timeout": "z", "origin": "cli"}
    ids = [replays.port.publish(SUBMIT, data, attributes), replays.port.publish(CONTROL, b"{}", {})]
    assert replays.arrived(SUBMIT, 1) == [(data, attributes)]
    assert replays.arrived(CONTROL, 1) == [(b"{}", {})]
    assert len(set(ids)) == 2 and all(i.isdigit() for i in ids)


def test_a_replay_to_a_missing_topic_is_refused_for_good(replays):
    """No retry can make a topic: PermanentError, naming it."""
    replays.drop_topic(SUBMIT)
    with pytest.raises(PermanentError, match=SUBMIT):
        replays.port.publish(SUBMIT, b"{}", {"origin": "cli"})

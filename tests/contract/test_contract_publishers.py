"""The contract of what the engine publishes (`ports.StatusPublisher`, `ports.ReconcileShards`,
`ports.LogExportRequests`, `ports.CapacityHandoff`): `RecordingPublisher` and the Pub/Sub
`Publisher` on the emulator put the same messages on the same topics, with the same attributes
and ordering keys, that the functions reading those topics decode; and fail alike when a topic
is missing: an announcement transiently (the reconciler announces it again), the rest for good.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from contract_data import T0
from pubsub_wire import PREFIX, EmulatorTopics

from tpujobs.domain import shards as sharding
from tpujobs.domain.shards import Shard
from tpujobs.engine.converge_requests import ConvergeJob, ConvergePool, decode_converge
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.notifications import decode_change
from tpujobs.engine.ports import StatusChange
from tpujobs.engine.topology import CONVERGE, LOG_EXPORT, RECONCILE, STATUS
from tpujobs.local.fakes.publishers import RecordingPublisher, Sent
from tpujobs.local.testing import inbound

TOPICS = (STATUS, RECONCILE, LOG_EXPORT, CONVERGE)
T1 = T0.isoformat()  # a coordinator's tick


@dataclass
class Wire:
    """A publisher, and what arrived on a topic (`sent(topic, how many are expected)`)."""

    port: Any  # StatusPublisher, ReconcileShards, LogExportRequests and CapacityHandoff at once
    sent: Callable[[str, int], list[Sent]]
    drop_topic: Callable[[str], None]
    restore_topic: Callable[[str], None]


@pytest.fixture(params=["memory", pytest.param("pubsub", marks=pytest.mark.emulator)])
def wire(request: pytest.FixtureRequest) -> Iterator[Wire]:
    if request.param == "memory":
        fake = RecordingPublisher()
        yield Wire(
            fake,
            lambda topic, _: [message for message in fake.sent if message.topic == topic],
            fake.missing_topics.add,
            fake.missing_topics.discard,
        )
        return
    from tpujobs.adapters.pubsub import Publisher

    emulators, project = request.getfixturevalue("emulators"), request.getfixturevalue("project_id")
    topics = EmulatorTopics(emulators["PUBSUB_EMULATOR_HOST"], project, TOPICS)
    try:
        yield Wire(Publisher.build(project, PREFIX), topics.sent, topics.delete, topics.create)
    finally:
        topics.close()


def change(job_id: str, seq: int, to_state: str, from_state: str | None = None) -> StatusChange:
    at = T0 + timedelta(seconds=seq)
    return StatusChange(job_id, "ada@example.com", from_state, to_state, f"reason {seq}", 1, at, seq)


def test_each_change_is_announced_in_order_keyed_by_its_job(wire):
    """tpujobs-status: the change's payload, attributes to filter on, the job id as ordering key;
    one job's changes in the order announced; what the notifier decodes."""
    a = [change("train-a", 1, "QUEUED"), change("train-a", 2, "PROVISIONING", "QUEUED")]
    b = [change("train-b", 1, "QUEUED")]
    for announced in (a[0], b[0], a[1]):
        wire.port.announce(announced)
    sent = wire.sent(STATUS, 3)
    for job in (a, b):
        job_id = job[0].job_id
        assert [m for m in sent if m.ordering_key == job_id] == [
            Sent(STATUS, c.payload(), {"job_id": job_id, "owner": "ada@example.com", "to_state": c.to_state}, job_id)
            for c in job
        ]
    [last] = [m for m in sent if m.payload["seq"] == 2]
    notice = decode_change(inbound(STATUS, last.payload))
    assert notice is not None and (notice.job_id, notice.state, notice.seq) == ("train-a", "PROVISIONING", 2)


def test_each_reconcile_shard_is_a_message_of_its_own_named_by_its_zone(wire):
    """tpujobs-reconcile: one message per shard (its lane in `then`), its zone an attribute, no
    ordering key; what the shard handler decodes. No shard, no message."""
    plan = [
        Shard("us-central2-b", "", "train-m", T1),
        Shard("us-central2-b", "train-m", "", T1),
        Shard("us-east5-a", "", ""),
    ]
    heads = sharding.lanes(plan, 2)
    wire.port.publish_shards(heads)
    wire.port.publish_shards([])
    sent = wire.sent(RECONCILE, len(heads))
    expected = [Sent(RECONCILE, shard.message(), {"zone": shard.zone}) for shard in heads]
    assert sorted(sent, key=repr) == sorted(expected, key=repr)
    assert sorted((sharding.decode(inbound(RECONCILE, m.payload).data) for m in sent), key=repr) == sorted(
        heads, key=repr
    )


def test_an_export_request_names_the_job_and_its_attempt(wire):
    """tpujobs-log-export: {job_id, attempt}, both attributes too (the attempt as text)."""
    wire.port.request_export("train-1", 3)
    assert wire.sent(LOG_EXPORT, 1) == [
        Sent(LOG_EXPORT, {"job_id": "train-1", "attempt": 3}, {"job_id": "train-1", "attempt": "3"})
    ]


def test_a_hand_off_names_only_the_job_or_the_pool(wire):
    """tpujobs-converge: an action and an id or name, nothing else; what `converge` decodes."""
    wire.port.hand_off_job("train-1")
    wire.port.hand_off_pool("demo")
    sent = wire.sent(CONVERGE, 2)
    assert sorted(sent, key=repr) == [
        Sent(CONVERGE, {"action": "converge", "job_id": "train-1"}),
        Sent(CONVERGE, {"action": "pool-converge", "name": "demo"}),
    ]
    decoded = {type(decode_converge(inbound(CONVERGE, m.payload).data)) for m in sent}
    assert decoded == {ConvergeJob, ConvergePool}


def test_a_missing_topic_fails_an_announcement_for_now_and_every_other_send_for_good(wire):
    """A topic that does not exist: TransientError from announce (a missed announcement is made
    again by the reconciler), PermanentError from the rest (no retry can make the topic)."""
    sends: dict[str, Callable[[], None]] = {
        RECONCILE: lambda: wire.port.publish_shards([Shard("us-central2-b")]),
        LOG_EXPORT: lambda: wire.port.request_export("train-1", 1),
        CONVERGE: lambda: wire.port.hand_off_job("train-1"),
    }
    wire.drop_topic(STATUS)
    with pytest.raises(TransientError):
        wire.port.announce(change("train-1", 1, "QUEUED"))
    for topic, send in sends.items():
        wire.drop_topic(topic)
        with pytest.raises(PermanentError, match=f"{PREFIX}{topic}|{topic}"):
            send()


def test_a_failed_announcement_holds_up_none_of_its_jobs_later_ones(wire):
    """Once the topic is back, the job's next announcement goes out (its ordering key resumed)."""
    wire.drop_topic(STATUS)
    with pytest.raises(TransientError):
        wire.port.announce(change("train-1", 1, "QUEUED"))
    wire.restore_topic(STATUS)
    wire.port.announce(change("train-1", 1, "QUEUED"))
    wire.port.announce(change("train-1", 2, "PROVISIONING", "QUEUED"))
    assert [m.payload["seq"] for m in wire.sent(STATUS, 2)] == [1, 2]

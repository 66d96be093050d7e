"""The contract of `ports.DeadLetterStore`: a message recorded once, its replay kept, newest first."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from contract_data import T0

from tpujobs.engine.ports import DeadLetter


def letter(message_id: str = "42", minutes: float = 0, **changes) -> DeadLetter:
    fields = {
        "message_id": message_id,
        "at": T0 + timedelta(minutes=minutes),
        "topic": "tpujobs-submit",
        "subscription": "projects/p/subscriptions/tpujobs-submit-push",
        "delivery_attempts": 5,
        "payload": '{"job_id": "train-1"}',
        "attributes": {"origin": "cli"},
        "data": b'{"job_id": "train-1"}',
        "size": 21,
        "published_at": T0,
        **changes,
    }
    return DeadLetter(**fields)


def test_a_dead_letter_is_recorded_once_and_its_replay_kept(backend):
    """A redelivered dead letter is False and does not clear the replay recorded since."""
    store = backend.dead_letters
    assert store.add(letter()) is True
    store.mark_replayed("42", T0 + timedelta(minutes=5), "777")
    assert store.add(letter()) is False
    stored = store.get("42")
    assert (stored.replayed_at, stored.replay_message_id) == (T0 + timedelta(minutes=5), "777")
    assert stored.original_attributes() == {"origin": "cli"} and stored.data == letter().data
    assert store.get("43") is None


def test_another_message_under_a_known_id_replaces_it(backend):
    """A restarted emulator counts ids from 1 again: a different message under the id is the newer record."""
    store = backend.dead_letters
    store.add(letter())
    newer = letter(minutes=10, payload="{}", size=2, data=b"{}")
    assert store.add(newer) is True
    assert store.get("42").payload == "{}"


def test_dead_letters_are_listed_newest_first_and_by_topic(backend):
    """list_dead_letters orders by `at`, newest first; a topic narrows it; the limit keeps the newest."""
    store = backend.dead_letters
    store.add(letter("1", minutes=0))
    store.add(letter("2", minutes=2, topic="tpujobs-control"))
    store.add(letter("3", minutes=1))
    assert [d.message_id for d in store.list_dead_letters()] == ["2", "3", "1"]
    assert [d.message_id for d in store.list_dead_letters(topic="tpujobs-submit")] == ["3", "1"]
    assert [d.message_id for d in store.list_dead_letters(limit=1)] == ["2"]
    assert replace(store.get("1"), note="") == letter("1")

"""The one compare-and-set loop (tpujobs.adapters.firestore_cas) against the Firestore emulator.

A rival write is made for real between the read and the commit, so the precondition fails the
way it does in production.
"""

from __future__ import annotations

import pytest
from google.api_core import exceptions

from tpujobs.adapters.firestore_cas import CAS_ATTEMPTS, compare_and_set, wrote
from tpujobs.adapters.firestore_store import transient_on_failure
from tpujobs.engine.errors import PermanentError, TransientError

pytestmark = pytest.mark.emulator


@pytest.fixture
def counter(firestore_client):
    ref = firestore_client.collection("cas").document("counter")
    ref.set({"n": 0})
    return ref


def increment(db, ref, rivals: int = 0):
    """A change adding 1 to `n`; the first `rivals` times, a rival writes after the read."""
    seen: list[int] = []

    def change(snapshot):
        seen.append(snapshot.get("n"))
        if len(seen) <= rivals:
            ref.update({"n": snapshot.get("n") + 100})  # someone else moved it meanwhile
        option = db.write_option(last_update_time=snapshot.update_time)
        return snapshot.get("n") + 1, lambda: ref.update({"n": snapshot.get("n") + 1}, option=option)

    return change, seen


def test_a_lost_race_is_decided_again_on_a_fresh_read(firestore_client, counter):
    """The rival's write fails the first commit; the second decides on what the rival wrote."""
    change, seen = increment(firestore_client, counter, rivals=1)
    result = compare_and_set(counter, change, what="counter", doing="increment it")
    assert seen == [0, 100]
    assert result == 101
    assert counter.get().get("n") == 101


def test_nothing_to_write_returns_at_once_without_a_write(firestore_client, counter):
    """A change with no write (the job is already past it) returns its answer after one read."""
    before = counter.get().update_time
    assert compare_and_set(counter, lambda snapshot: ("unchanged", None), what="counter", doing="look") == "unchanged"
    assert counter.get().update_time == before


def test_losing_every_race_is_a_transient_error_saying_so(firestore_client, counter):
    """After CAS_ATTEMPTS lost races the message is redelivered, with a sentence naming the document."""
    change, seen = increment(firestore_client, counter, rivals=CAS_ATTEMPTS)
    with pytest.raises(TransientError) as raised:
        compare_and_set(counter, change, what="job train-1", doing="note a checkpoint")
    assert str(raised.value) == f"job train-1 changed under {CAS_ATTEMPTS} attempts to note a checkpoint"
    assert len(seen) == CAS_ATTEMPTS


def test_a_create_that_finds_the_document_lost_the_race(firestore_client, counter):
    """`wrote` is False when a create meets an existing document, True when it commits."""
    other = firestore_client.collection("cas").document("fresh")
    assert wrote(lambda: other.create({"n": 1}), "create fresh") is True
    assert wrote(lambda: other.create({"n": 2}), "create fresh") is False
    assert other.get().get("n") == 1


def test_an_error_other_than_a_lost_race_is_translated(firestore_client):
    """Updating a missing document is NotFound, not a race: PermanentError naming the action."""
    missing = firestore_client.collection("cas").document("missing")
    with pytest.raises(PermanentError) as raised:
        wrote(lambda: missing.update({"n": 1}), "update missing")
    assert str(raised.value).startswith("Firestore refused to update missing: 404 ")
    assert isinstance(raised.value.__cause__, exceptions.NotFound)


def test_the_store_translation_raises_permanent_errors_for_refusals(firestore_client):
    """Firestore's refusals leave the job store as PermanentError, no longer as library errors."""
    with pytest.raises(PermanentError), transient_on_failure("update a missing job"):
        firestore_client.collection("jobs").document("nope").update({"state": "RUNNING"})

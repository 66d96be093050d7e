"""The `dead_letters` collection on Firestore (`tpujobs.engine.dead_letters` says what it holds and why).

Flat fields the Firestore console reads well, id = the dead-lettered message's id. Firestore's
errors become TransientError / PermanentError through the one table (adapters/google_errors.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from tpujobs.adapters.google_errors import translated
from tpujobs.engine.errors import PermanentError
from tpujobs.engine.ports import DeadLetter

if TYPE_CHECKING:
    from google.cloud import firestore

DEAD_LETTERS = "dead_letters"  # the Firestore collection


def dead_letter_from_document(document_id: str, data: Mapping[str, Any]) -> DeadLetter:
    return DeadLetter(
        message_id=data.get("message_id") or document_id,
        at=data["at"],
        topic=data.get("topic") or "",
        subscription=data.get("subscription") or "",
        delivery_attempts=data.get("delivery_attempts"),
        payload=data.get("payload") or "",
        attributes=dict(data.get("attributes") or {}),
        data=data.get("data"),
        size=data.get("size"),
        published_at=data.get("published_at"),
        replayed_at=data.get("replayed_at"),
        replay_message_id=data.get("replay_message_id"),
        note=data.get("note") or "",
        attributes_json=data.get("attributes_json"),
    )


class FirestoreDeadLetters:
    """The `dead_letters` collection; Firestore errors become TransientError / PermanentError."""

    def __init__(self, client: firestore.Client, retention: timedelta = timedelta(days=30)) -> None:
        """`retention`: how long a dead letter is kept (TPUJOBS_DEAD_LETTER_RETENTION_DAYS): Firestore's
        TTL deletes it at `expire_at` (infra/firestore.tf)."""
        self._db = client
        self._retention = retention

    def _ref(self, message_id: str) -> firestore.DocumentReference:
        return self._db.collection(DEAD_LETTERS).document(_document_id(message_id))

    def add(self, letter: DeadLetter) -> bool:
        """Create the record; False when this very message is already recorded.

        Create, not set: a redelivered dead letter must not clear a replay recorded since.
        Only when the id holds a different message (a restarted Pub/Sub emulator counts
        message ids from 1 again) is it overwritten by the newer one.
        """
        from google.api_core.exceptions import AlreadyExists

        ref = self._ref(letter.message_id)
        document = {**letter.to_document(), "expire_at": letter.at + self._retention}
        with _translated("record dead letter"):
            try:
                ref.create(document)
                return True
            except AlreadyExists:
                existing = ref.get()
                if existing.exists and _same_message(existing.to_dict() or {}, document):
                    return False
                ref.set(document)
                return True

    def get(self, message_id: str) -> DeadLetter | None:
        with _translated("read dead letter"):
            snapshot = self._ref(message_id).get()
        return dead_letter_from_document(snapshot.id, snapshot.to_dict() or {}) if snapshot.exists else None

    def list_dead_letters(self, topic: str | None = None, limit: int = 50) -> list[DeadLetter]:
        """Newest first. With a topic, Firestore in production needs the composite index
        (topic ASC, at DESC) on `dead_letters`; the emulator needs none."""
        from google.cloud import firestore

        query: Any = self._db.collection(DEAD_LETTERS)
        if topic:
            query = query.where(filter=firestore.FieldFilter("topic", "==", topic))
        query = query.order_by("at", direction=firestore.Query.DESCENDING).limit(limit)
        with _translated("list dead letters"):
            return [dead_letter_from_document(doc.id, doc.to_dict() or {}) for doc in query.stream()]

    def mark_replayed(self, message_id: str, at: datetime, replay_message_id: str) -> None:
        with _translated("record the replay"):
            self._ref(message_id).update({"replayed_at": at, "replay_message_id": replay_message_id})


def _same_message(stored: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    keys = ("subscription", "published_at", "payload", "size", "attributes", "attributes_json")
    return all(stored.get(key) == new.get(key) for key in keys)


def _document_id(message_id: str) -> str:
    """Firestore ids may not contain '/' nor be '.', '..' or `__x__`; Pub/Sub ids are digits."""
    cleaned = message_id.replace("/", "_")[:1500]
    if cleaned in ("", ".", "..") or (cleaned.startswith("__") and cleaned.endswith("__")):
        return f"_{cleaned}_"
    return cleaned


@contextlib.contextmanager
def _translated(doing: str) -> Iterator[None]:
    """Firestore's errors through the one table; the client's own ValueError or TypeError for a
    document it will not even send (an empty map key) is a refusal too."""
    with translated("Firestore", doing):
        try:
            yield
        except (ValueError, TypeError) as error:
            raise PermanentError(f"Firestore refused to {doing}: {error}") from error

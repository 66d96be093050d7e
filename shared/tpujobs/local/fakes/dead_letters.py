"""Dead letters in memory, and a republisher that records: `FirestoreDeadLetters` and
`PubsubRepublisher` without Google."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime

from tpujobs.engine.errors import PermanentError
from tpujobs.engine.ports import DeadLetter

_SAME_MESSAGE = ("subscription", "published_at", "payload", "size", "attributes", "attributes_json")


class InMemoryDeadLetters:
    """`ports.DeadLetterStore` in memory, newest first as the adapter lists them."""

    def __init__(self) -> None:
        self._letters: dict[str, DeadLetter] = {}
        self._lock = threading.Lock()

    def add(self, letter: DeadLetter) -> bool:
        """Create the record; False when this very message is recorded (its replay kept); a
        different message under the same id (a restarted emulator's ids) replaces it."""
        with self._lock:
            existing = self._letters.get(letter.message_id)
            if existing is not None:
                stored, new = existing.to_document(), letter.to_document()
                if all(stored[key] == new[key] for key in _SAME_MESSAGE):
                    return False
            self._letters[letter.message_id] = letter
            return True

    def get(self, message_id: str) -> DeadLetter | None:
        with self._lock:
            return self._letters.get(message_id)

    def list_dead_letters(self, topic: str | None = None, limit: int = 50) -> list[DeadLetter]:
        with self._lock:
            found = [d for d in self._letters.values() if not topic or d.topic == topic]
        return sorted(found, key=lambda d: (d.at, d.message_id), reverse=True)[:limit]

    def mark_replayed(self, message_id: str, at: datetime, replay_message_id: str) -> None:
        with self._lock:
            letter = self._letters.get(message_id)
            if letter is None:  # Firestore's update of a missing document: NOT_FOUND, permanent
                raise PermanentError(f"Firestore refused to record the replay: no dead letter {message_id}")
            self._letters[message_id] = replace(letter, replayed_at=at, replay_message_id=replay_message_id)


class RecordingRepublisher:
    """`ports.Republisher` that keeps (topic, data, attributes) and answers ids of digits; a topic
    in `missing_topics` is PermanentError, as the adapter says of a topic that does not exist."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes, dict[str, str]]] = []
        self.missing_topics: set[str] = set()
        self._ids = itertools.count(9_000_001)

    def publish(self, base_topic: str, data: bytes, attributes: Mapping[str, str]) -> str:
        if base_topic in self.missing_topics:
            raise PermanentError(f"topic {base_topic} does not exist")
        self.published.append((base_topic, data, dict(attributes)))
        return str(next(self._ids))

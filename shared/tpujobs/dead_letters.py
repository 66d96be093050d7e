"""Dead letters: messages Pub/Sub gave up delivering, kept readable and replayable.

Every push subscription hands a message to `tpujobs-dead-letter` after MAX_DELIVERY_ATTEMPTS
failed deliveries (`tpujobs.dev.wiring`; Terraform in production). The dead-letter topic's own
push subscription delivers to `record_dead_letter`, which keeps each one in the Firestore
collection `dead_letters`, id = the dead-lettered message's id, in flat fields the Firestore
console reads well: `at`, `topic`, `subscription`, `delivery_attempts`, `payload` (the data
as text, first 4 KiB), `attributes`, `replayed_at`. `tpujobs dead-letters` lists them and
replays one: the original bytes and attributes go back to the original topic.

Pub/Sub gives the dead-lettered copy a new message id and adds four attributes (the emulator
does too): CloudPubSubDeadLetterSourceDeliveryCount, ...SourceSubscription (the short
subscription name), ...SourceSubscriptionProject and ...SourceTopicPublishTime. The original
topic is not among them, so it is read from the subscription's name, which tpujobs builds as
`{prefix}{topic}--{target}` (`topology.push_subscription_name`).

Recording never raises for bad input: the dead-letter topic's subscription cannot itself
dead-letter, so a message the recorder refused would come back until it expires. Only
transient trouble (Firestore unavailable) raises, to be retried with backoff.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from tpujobs import topology
from tpujobs.domain import signing
from tpujobs.errors import PermanentError
from tpujobs.inbound import InboundMessage

if TYPE_CHECKING:
    from google.cloud import firestore
    from google.pubsub_v1 import PublisherClient

    from tpujobs.config import Settings
    from tpujobs.ports import Clock

log = logging.getLogger(__name__)

DEAD_LETTERS = "dead_letters"  # the Firestore collection
MAX_PAYLOAD_CHARS = 4096  # `payload`: what a person reads, as in `rejections`
# `data` keeps the exact bytes for a replay, up to this size: well inside Firestore's 1 MiB
# per document next to at most 100 attributes of 256 + 1024 bytes. Larger messages are
# listed but cannot be replayed (Pub/Sub allows 10 MB).
MAX_KEPT_DATA_BYTES = 512 * 1024

DEAD_LETTER_ATTRIBUTE_PREFIX = "CloudPubSubDeadLetter"
DELIVERY_COUNT = "CloudPubSubDeadLetterSourceDeliveryCount"
SOURCE_SUBSCRIPTION = "CloudPubSubDeadLetterSourceSubscription"
SOURCE_PROJECT = "CloudPubSubDeadLetterSourceSubscriptionProject"
SOURCE_PUBLISH_TIME = "CloudPubSubDeadLetterSourceTopicPublishTime"

_RFC3339 = re.compile(r"^(?P<base>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(?P<fraction>\d+))?(?P<zone>Z|[+-]\d\d:\d\d)$")


class UnknownDeadLetter(PermanentError):
    """No dead letter has this id."""


class NotReplayable(PermanentError):
    """The dead letter is recorded, but what a replay needs was not kept."""


@dataclass(frozen=True)
class DeadLetter:
    """One message that failed too many deliveries, as `dead_letters/{message_id}` holds it."""

    message_id: str  # of the dead-lettered copy (Pub/Sub gives it a new one)
    at: datetime  # when it was recorded
    topic: str  # the original topic's contract name, without prefix; "" when unknown
    subscription: str  # projects/P/subscriptions/S that gave up on it; "" when unknown
    delivery_attempts: int | None
    payload: str  # the data as text, first 4 KiB, bytes that are not UTF-8 escaped
    attributes: Mapping[str, str] = field(default_factory=dict)  # the original ones
    data: bytes | None = None  # the exact original bytes, when kept (see MAX_KEPT_DATA_BYTES)
    size: int | None = None  # of the original data, in bytes
    published_at: datetime | None = None  # when the original was published
    replayed_at: datetime | None = None
    replay_message_id: str | None = None
    note: str = ""  # what could not be kept, if anything
    attributes_json: str | None = None  # the attributes, when Firestore refused them as a map

    def original_attributes(self) -> dict[str, str]:
        """The attributes to publish again: exactly those the original message had."""
        if self.attributes_json is not None:
            return dict(json.loads(self.attributes_json))
        return dict(self.attributes)

    def to_document(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "at": self.at,
            "topic": self.topic,
            "subscription": self.subscription,
            "delivery_attempts": self.delivery_attempts,
            "payload": self.payload,
            "attributes": dict(self.attributes),
            "size": self.size,
            "published_at": self.published_at,
            "replayed_at": self.replayed_at,
            "replay_message_id": self.replay_message_id,
            "note": self.note,
            "attributes_json": self.attributes_json,
            "data": self.data,
        }

    @classmethod
    def from_document(cls, document_id: str, data: Mapping[str, Any]) -> DeadLetter:
        return cls(
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


# --- reading a dead-lettered message (pure, total) -------------------------------------


def dead_letter_from_message(message: InboundMessage, at: datetime, prefix: str = "") -> DeadLetter:
    """What a dead-lettered message says about the original; never raises."""
    attributes = {str(k): str(v) for k, v in message.attributes.items()}
    source = attributes.get(SOURCE_SUBSCRIPTION, "")
    project = attributes.get(SOURCE_PROJECT, "")
    short = source.rsplit("/", 1)[-1]
    if "/" in source:
        subscription = source
    elif source and project:
        subscription = f"projects/{project}/subscriptions/{source}"
    else:
        subscription = source
    data = None if message.data is None else signing.scrub_bytes(message.data)  # never an attempt key
    notes = []
    if data is None:
        notes.append(message.undecodable or "the message data could not be read")
    elif len(data) > MAX_KEPT_DATA_BYTES:
        notes.append(f"the data is {len(data)} bytes, more than the {MAX_KEPT_DATA_BYTES} kept for a replay")
    if not source:
        notes.append(f"no {SOURCE_SUBSCRIPTION} attribute: not dead-lettered by Pub/Sub")
    return DeadLetter(
        message_id=message.message_id,
        at=at,
        topic=source_topic(short, prefix),
        subscription=subscription,
        delivery_attempts=_int_or_none(attributes.get(DELIVERY_COUNT)),
        payload=signing.scrub(message.payload_text(MAX_PAYLOAD_CHARS)),
        attributes={k: v for k, v in attributes.items() if not k.startswith(DEAD_LETTER_ATTRIBUTE_PREFIX)},
        data=data if data is not None and len(data) <= MAX_KEPT_DATA_BYTES else None,
        size=None if data is None else len(data),
        published_at=parse_timestamp(attributes.get(SOURCE_PUBLISH_TIME, "")),
        note="; ".join(notes),
    )


def source_topic(subscription: str, prefix: str = "") -> str:
    """The contract name of the topic a tpujobs subscription reads, from its name
    `{prefix}{topic}--{target}`; "" when the name says nothing."""
    name = subscription.rsplit("/", 1)[-1]
    if prefix and name.startswith(prefix):
        name = name[len(prefix) :]
    for base in topology.ALL_TOPICS:
        if name.startswith(f"{base}--"):
            return base
    head, separator, _ = name.rpartition("--")  # a subscription named like ours, on another topic
    return head if separator else ""


def parse_timestamp(text: str) -> datetime | None:
    """An RFC 3339 time as Pub/Sub writes it (Z, up to nanoseconds); None if it is not one."""
    match = _RFC3339.match(text.strip())
    if match is None:
        return None
    zone = "+00:00" if match["zone"] == "Z" else match["zone"]
    fraction = (match["fraction"] or "0")[:6].ljust(6, "0")
    try:
        return datetime.fromisoformat(f"{match['base']}.{fraction}{zone}").astimezone(timezone.utc)
    except ValueError:
        return None


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


# --- the use cases -------------------------------------------------------------------


class DeadLetters:
    """Record, list and replay dead letters, on an explicit store, clock and publisher."""

    def __init__(
        self,
        store: FirestoreDeadLetters,
        settings: Settings,
        clock: Clock,
        publisher: Callable[[], Republisher],
    ) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self._publisher_factory = publisher  # built on the first replay only: the function never needs it
        self._publisher: Republisher | None = None

    def record(self, message: InboundMessage) -> DeadLetter | None:
        """Keep one dead-lettered message; None when it could not be kept (logged, never raised).

        Idempotent: a redelivered dead letter leaves the first record, and its replay, as
        they are. Only TransientError escapes, so Pub/Sub retries later.
        """
        try:
            letter = dead_letter_from_message(message, self.clock(), self.settings.prefix)
        except Exception:  # the reader is total; if it ever is not, do not loop on the message
            log.exception("could not read dead letter %s; dropped", message.message_id)
            return None
        try:
            self.store.add(letter)
        except PermanentError as error:
            # Firestore refuses some map keys Pub/Sub allows (`__name__`-like ones): keep the
            # attributes as JSON text instead, so the record and its replay survive.
            log.warning("dead letter %s: %s; keeping its attributes as JSON", letter.message_id, error)
            letter = replace(
                letter,
                attributes={},
                attributes_json=json.dumps(dict(letter.attributes), sort_keys=True),
                note="; ".join(filter(None, [letter.note, f"attributes kept as JSON: {error}"])),
            )
            try:
                self.store.add(letter)
            except PermanentError:
                log.exception("could not record dead letter %s; dropped", letter.message_id)
                return None
        log.warning(
            "dead letter %s from %s after %s deliveries",
            letter.message_id,
            letter.subscription or "an unknown subscription",
            "?" if letter.delivery_attempts is None else letter.delivery_attempts,
        )
        return letter

    def list(self, topic: str | None = None, limit: int = 50) -> list[DeadLetter]:
        """Newest first; only those of one topic (contract name) when given."""
        return self.store.list(topic=topic, limit=limit)

    def get(self, message_id: str) -> DeadLetter | None:
        return self.store.get(message_id)

    def replay(self, message_id: str) -> tuple[DeadLetter, str]:
        """Publish the original data and attributes to the original topic again and record
        when; the dead letter as it was, and the new message's id.

        It publishes first and records after: if recording fails, the message was sent and
        a second replay sends it again, which tpujobs handlers absorb (a job_id is one job).
        """
        letter = self.store.get(message_id)
        if letter is None:
            raise UnknownDeadLetter(f"no dead letter {message_id!r}")
        if not letter.topic:
            raise NotReplayable(
                f"dead letter {message_id} does not say which topic it came from "
                f"({letter.note or 'no source subscription'})"
            )
        if letter.data is None:
            raise NotReplayable(f"dead letter {message_id} cannot be replayed: its data was not kept ({letter.note})")
        if self._publisher is None:
            self._publisher = self._publisher_factory()
        new_id = self._publisher.publish(letter.topic, letter.data, letter.original_attributes())
        self.store.mark_replayed(letter.message_id, self.clock(), new_id)
        return letter, new_id


# --- Firestore and Pub/Sub -----------------------------------------------------------


class FirestoreDeadLetters:
    """The `dead_letters` collection; Firestore errors become TransientError / PermanentError."""

    def __init__(self, client: firestore.Client) -> None:
        self._db = client

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
        document = letter.to_document()
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
        return DeadLetter.from_document(snapshot.id, snapshot.to_dict() or {}) if snapshot.exists else None

    def list(self, topic: str | None = None, limit: int = 50) -> list[DeadLetter]:
        """Newest first. With a topic, Firestore in production needs the composite index
        (topic ASC, at DESC) on `dead_letters`; the emulator needs none."""
        from google.cloud import firestore

        query: Any = self._db.collection(DEAD_LETTERS)
        if topic:
            query = query.where(filter=firestore.FieldFilter("topic", "==", topic))
        query = query.order_by("at", direction=firestore.Query.DESCENDING).limit(limit)
        with _translated("list dead letters"):
            return [DeadLetter.from_document(doc.id, doc.to_dict() or {}) for doc in query.stream()]

    def mark_replayed(self, message_id: str, at: datetime, replay_message_id: str) -> None:
        with _translated("record the replay"):
            self._ref(message_id).update({"replayed_at": at, "replay_message_id": replay_message_id})


class Republisher:
    """Publishes a dead letter's bytes and attributes as they were, and returns the new id.

    The GAPIC client, not `adapters.pubsub.Publisher`: attributes go in as a map, so even
    ones named `data` or `topic` survive, and the id comes back synchronously (no batching
    thread for a one-off CLI call). It honours PUBSUB_EMULATOR_HOST.
    """

    def __init__(self, client: PublisherClient, project: str, prefix: str = "") -> None:
        self._client = client
        self._project = project
        self._prefix = prefix

    @classmethod
    def build(cls, project: str, prefix: str = "") -> Republisher:
        from google.pubsub_v1 import PublisherClient

        return cls(PublisherClient(), project, prefix)

    def publish(self, base_topic: str, data: bytes, attributes: Mapping[str, str]) -> str:
        from google.api_core import exceptions as api_exceptions
        from google.pubsub_v1 import PubsubMessage

        from tpujobs.adapters.google_errors import translated

        name = topology.topic_name(base_topic, self._prefix)
        path = self._client.topic_path(self._project, name)
        with translated("Pub/Sub", f"publish to {name}"):
            try:
                answer = self._client.publish(
                    topic=path,
                    messages=[PubsubMessage(data=data, attributes=dict(attributes))],
                    timeout=30,
                )
            except api_exceptions.NotFound as error:
                raise PermanentError(f"topic {name} does not exist: {error}") from error
        return str(answer.message_ids[0])


def build(settings: Settings, clock: Clock) -> DeadLetters:
    """DeadLetters on real clients (the emulators when their variables are set)."""
    from google.cloud import firestore

    return DeadLetters(
        FirestoreDeadLetters(firestore.Client(project=settings.project)),
        settings,
        clock,
        publisher=lambda: Republisher.build(settings.project, settings.prefix),
    )


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
    """Firestore's errors through the one table (adapters/google_errors.py); the client's own
    ValueError or TypeError for a document it will not even send (an empty map key) is a
    refusal too."""
    from tpujobs.adapters.google_errors import translated

    with translated("Firestore", doing):
        try:
            yield
        except (ValueError, TypeError) as error:
            raise PermanentError(f"Firestore refused to {doing}: {error}") from error

"""Dead letters: messages Pub/Sub gave up delivering, kept readable and replayable.

`record_dead_letter` keeps each message the dead-letter topic delivers in the Firestore collection
`dead_letters` (id: the dead-lettered message's id), reading its original topic back from the source
subscription's name; `tpujobs dead-letters` lists and replays them. It never raises for bad input: the
dead-letter subscription cannot itself dead-letter, so a refused message would come back until it
expires. See docs/operations.md#dead-letters.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from tpujobs.domain import signing
from tpujobs.engine import metric_events, topology
from tpujobs.engine.errors import PermanentError
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.ports import DeadLetter as DeadLetter  # the record: the port's, so adapters can build it
from tpujobs.engine.ports import DeadLetterStore, Republisher

if TYPE_CHECKING:
    from tpujobs.engine.ports import Clock
    from tpujobs.engine.settings import Settings

log = logging.getLogger(__name__)

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
    """The base name (no prefix) of the topic a tpujobs subscription reads, from its name
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
    """Record, list and replay dead letters, on an explicit store, clock and publisher
    (`adapters.firestore_dead_letters`, `adapters.pubsub_republisher`; `runtime` wires them)."""

    def __init__(
        self,
        store: DeadLetterStore,
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
        metric_events.emit(log, metric_events.dead_lettered(letter.topic, letter.delivery_attempts), logging.WARNING)
        return letter

    def list_dead_letters(self, topic: str | None = None, limit: int = 50) -> list[DeadLetter]:
        """Newest first; only those of one topic (its base name, no prefix) when given."""
        return self.store.list_dead_letters(topic=topic, limit=limit)

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

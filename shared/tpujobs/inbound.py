"""Pub/Sub messages as they reach a function, decoded from the CloudEvent.

Two shapes arrive: Eventarc's (`{"message": {...}, "subscription": ...}` with the topic
in the event's source) and the local stack's push envelope, which functions-framework
converts to the same shape with the topic taken from the push URL's path. Anything
that cannot be decoded becomes an `InboundMessage` with `data=None` and the reason, so
the handler can record it instead of failing the delivery forever.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_TOPIC_IN_SOURCE = re.compile(r"topics/(?P<topic>[^/?]+)$")
_MESSAGE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


@dataclass(frozen=True)
class InboundMessage:
    """One Pub/Sub message: its id, bytes and attributes, or why it could not be read."""

    message_id: str
    topic: str
    data: bytes | None
    attributes: Mapping[str, str] = field(default_factory=dict)
    undecodable: str = ""  # the reason, when data is None

    def payload_text(self, limit: int = 4096) -> str:
        """The message as text for a rejection record: bytes that are not UTF-8 are escaped."""
        if self.data is None:
            return ""
        return self.data[: limit * 4].decode("utf-8", errors="backslashreplace")[:limit]


def from_cloud_event(event_id: str, source: str, data: Any) -> InboundMessage:
    """Decode a Pub/Sub CloudEvent's parts; never raises."""
    match = _TOPIC_IN_SOURCE.search(source or "")
    topic = match["topic"] if match else ""
    message = data.get("message") if isinstance(data, dict) else None
    if not isinstance(message, dict):
        return InboundMessage(event_id, topic, None, undecodable="the event carries no Pub/Sub message")
    raw_id = message.get("messageId") or message.get("message_id") or event_id
    message_id = raw_id if isinstance(raw_id, str) else ""
    if not _MESSAGE_ID.fullmatch(message_id):
        # Pub/Sub ids are digits; anything else is a forged envelope. Keep a safe id for
        # the rejection document (Firestore ids have rules of their own).
        digest = hashlib.sha256(message_id.encode("utf-8", "backslashreplace")).hexdigest()[:24]
        return InboundMessage(f"invalid-{digest}", topic, None, undecodable="the message id is not a Pub/Sub message id")
    attributes = message.get("attributes") or {}
    if not isinstance(attributes, dict):
        attributes = {}
    encoded = message.get("data", "")
    if not isinstance(encoded, str):
        return InboundMessage(message_id, topic, None, attributes, "message data is not base64 text")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return InboundMessage(message_id, topic, None, attributes, "message data is not valid base64")
    return InboundMessage(message_id, topic, raw, attributes)

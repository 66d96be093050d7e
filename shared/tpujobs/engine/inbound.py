"""Pub/Sub messages as they reach a function, decoded from the CloudEvent, with their topic.

A push envelope (production's push subscriptions, and the local stack's) loses its subscription when
functions-framework makes the CloudEvent, so the function passes it in and the topic is read back from its
name (`topology.route_of_subscription`); an Eventarc CloudEvent carries its topic in its source. A message
whose topic cannot be told, or that cannot be decoded, becomes an `InboundMessage` with `data=None` and
the reason, so the handler records it instead of failing the delivery forever.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tpujobs.engine import topology

_TOPIC_IN_SOURCE = re.compile(r"topics/(?P<topic>[^/?]+)$")
_MESSAGE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_MAX_QUOTED = 200  # characters of a subscription name quoted in a reason


@dataclass(frozen=True)
class InboundMessage:
    """One Pub/Sub message: its id, topic, bytes and attributes, or why it cannot be used."""

    message_id: str
    topic: str  # the deployed name ({prefix}{topic}); "" when it could not be told
    data: bytes | None
    attributes: Mapping[str, str] = field(default_factory=dict)
    undecodable: str = ""  # the reason, when data is None
    refused_data: bytes | None = None  # the bytes of a readable message refused for its origin

    def payload_text(self, limit: int = 4096) -> str:
        """The message as text for a rejection record: bytes that are not UTF-8 are escaped."""
        raw = self.data if self.data is not None else self.refused_data
        if raw is None:
            return ""
        return raw[: limit * 4].decode("utf-8", errors="backslashreplace")[:limit]


def subscription_of(body: Any) -> str:
    """The `subscription` of a push envelope (the request body a push delivers), or ""."""
    subscription = body.get("subscription") if isinstance(body, dict) else None
    return subscription if isinstance(subscription, str) else ""


def from_cloud_event(
    event_id: str,
    source: str,
    data: Any,
    *,
    push_subscription: str = "",
    prefix: str = "",
    target: str | None = None,
) -> InboundMessage:
    """Decode a Pub/Sub CloudEvent's parts; never raises.

    `push_subscription` is the push envelope's subscription when the CloudEvent lost it
    (functions-framework's conversion does); `prefix` is the deployment's topic prefix;
    `target`, when given, is the function being called, which reads one topic only.
    """
    message = _decode(event_id, data)
    subscription = subscription_of(data) or push_subscription
    topic, refusal = _topic(source, subscription, prefix, target)
    message = replace(message, topic=topic)
    if refusal and message.data is not None:
        return replace(message, data=None, undecodable=refusal, refused_data=message.data)
    return message


def _decode(event_id: str, data: Any) -> InboundMessage:
    """The message's id, attributes and bytes, or why they cannot be read (topic left empty)."""
    message = data.get("message") if isinstance(data, dict) else None
    if not isinstance(message, dict):
        return InboundMessage(event_id, "", None, undecodable="the event carries no Pub/Sub message")
    raw_id = message.get("messageId") or message.get("message_id") or event_id
    message_id = raw_id if isinstance(raw_id, str) else ""
    if not _MESSAGE_ID.fullmatch(message_id):
        # Pub/Sub ids are digits; anything else is a forged envelope. Keep a safe id for
        # the rejection document (Firestore ids have rules of their own).
        digest = hashlib.sha256(message_id.encode("utf-8", "backslashreplace")).hexdigest()[:24]
        return InboundMessage(f"invalid-{digest}", "", None, undecodable="the message id is not a Pub/Sub message id")
    attributes = message.get("attributes") or {}
    if not isinstance(attributes, dict):
        attributes = {}
    encoded = message.get("data", "")
    if not isinstance(encoded, str):
        return InboundMessage(message_id, "", None, attributes, "message data is not base64 text")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return InboundMessage(message_id, "", None, attributes, "message data is not valid base64")
    return InboundMessage(message_id, "", raw, attributes)


def _topic(source: str, subscription: str, prefix: str, target: str | None) -> tuple[str, str]:
    """(the deployed topic name, "" or why the message must be refused).

    An Eventarc source names the topic; otherwise the subscription must be one of this
    deployment's push subscriptions, whose name says the topic. With `target`, the topic
    must be the one that function reads.
    """
    match = _TOPIC_IN_SOURCE.search(source or "")
    if match:
        topic = match["topic"]
    else:
        route = topology.route_of_subscription(subscription, prefix)
        if route is None or route.topic is None:
            quoted = repr(subscription[:_MAX_QUOTED]) if subscription else "none"
            return "", (
                f"the message names no topic and its push subscription ({quoted}) is not one of "
                f"this deployment's, which are named {prefix}TOPIC--FUNCTION"
            )
        topic = topology.topic_name(route.topic, prefix)
    if target is not None:
        wanted = topology.route_of_target(target).topic
        if wanted is not None and topic != topology.topic_name(wanted, prefix):
            return topic, (
                f"a message on {topic} reached {target}, which reads only {topology.topic_name(wanted, prefix)}"
            )
    return topic, ""

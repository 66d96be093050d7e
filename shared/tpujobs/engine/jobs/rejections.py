"""Messages that could not be used: recorded with why, then acknowledged."""

from __future__ import annotations

import logging

from tpujobs.domain import signing
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.ports import Clock, MessageRecords, Rejection

log = logging.getLogger(__name__)


class Rejections:
    """Records why a message was refused, scrubbed of attempt keys."""

    def __init__(self, store: MessageRecords, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    def reject(self, message: InboundMessage, reason: str) -> None:
        """Record why a message could not be used; the caller then acknowledges it. A reason
        may quote the message, so it is scrubbed of attempt keys like the payload."""
        reason = signing.scrub(reason)
        log.warning("rejected message %s on %s: %s", message.message_id, message.topic, reason)
        self.store.reject(
            Rejection(message.message_id, self.clock(), reason, signing.scrub(message.payload_text()), message.topic)
        )

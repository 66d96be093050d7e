"""What the publisher contracts read on the Pub/Sub emulator: this test's topics (with a deployment
prefix) and a pull subscription on each, and what arrived on one, as the fakes record it (not
fixtures: `conftest` is no module to import from)."""

from __future__ import annotations

import json
import uuid
import warnings
from typing import Any

from tpujobs.engine import topology
from tpujobs.local import wiring
from tpujobs.local.fakes.publishers import Sent

PREFIX = "c1-"
PULL_TRIES = 20  # pulls of up to PULL_WAIT_S each before a test gives up waiting for its messages
PULL_WAIT_S = 5.0


class EmulatorTopics:
    """Topics of one test's project on the emulator, each with a pull subscription (ordered, so
    one ordering key's messages come in the order published)."""

    def __init__(self, host: str, project: str, bases: tuple[str, ...]) -> None:
        self.project = project
        self.publisher = wiring.publisher_client(host)
        self.subscriber = wiring.subscriber_client(host)
        self.subscriptions: dict[str, str] = {}
        for base in bases:
            self.create(base)

    def path(self, base: str) -> str:
        return self.publisher.topic_path(self.project, topology.topic_name(base, PREFIX))

    def create(self, base: str) -> None:
        """The topic, and a fresh subscription on it (a deleted topic's subscriptions are detached)."""
        self.publisher.create_topic(name=self.path(base))
        name = self.subscriber.subscription_path(self.project, f"{base}-{uuid.uuid4().hex[:6]}")
        request = {"name": name, "topic": self.path(base), "enable_message_ordering": True}
        self.subscriber.create_subscription(request=request)
        self.subscriptions[base] = name

    def delete(self, base: str) -> None:
        self.publisher.delete_topic(topic=self.path(base))

    def received(self, base: str, expected: int) -> list[Any]:
        """The messages on `base`, acknowledged: pulled until `expected` came, then once more at
        once, so a message more than expected is seen too."""
        subscription, messages = self.subscriptions[base], []
        for _ in range(PULL_TRIES if expected else 0):
            messages += self._pull(subscription, wait=True)
            if len(messages) >= expected:
                break
        return messages + self._pull(subscription, wait=False)

    def _pull(self, subscription: str, *, wait: bool) -> list[Any]:
        from google.api_core.exceptions import DeadlineExceeded

        request = {"subscription": subscription, "max_messages": 100, "return_immediately": not wait}
        try:
            with warnings.catch_warnings():  # return_immediately is deprecated, and what the check needs
                warnings.simplefilter("ignore", DeprecationWarning)
                answer = self.subscriber.pull(request=request, timeout=PULL_WAIT_S)
        except DeadlineExceeded:  # nothing came while the pull waited
            return []
        if answer.received_messages:
            ack_ids = [m.ack_id for m in answer.received_messages]
            self.subscriber.acknowledge(subscription=subscription, ack_ids=ack_ids)
        return [m.message for m in answer.received_messages]

    def sent(self, base: str, expected: int) -> list[Sent]:
        """What arrived on `base`, as `RecordingPublisher.sent` records it."""
        return [
            Sent(base, json.loads(m.data), dict(m.attributes), m.ordering_key) for m in self.received(base, expected)
        ]

    def close(self) -> None:
        self.publisher.transport.close()
        self.subscriber.transport.close()

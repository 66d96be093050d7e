"""Publishing to tpujobs topics with google-cloud-pubsub (the emulator when PUBSUB_EMULATOR_HOST is set)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from google.api_core import exceptions as api_exceptions

from tpujobs.errors import PermanentError, TransientError
from tpujobs.topology import topic_name

if TYPE_CHECKING:
    from google.cloud import pubsub_v1


class Publisher:
    """Publishes JSON payloads to tpujobs topics of one project and prefix."""

    def __init__(self, client: pubsub_v1.PublisherClient, project: str, prefix: str = "") -> None:
        self._client = client
        self._project = project
        self._prefix = prefix

    @classmethod
    def build(cls, project: str, prefix: str = "") -> Publisher:
        from google.cloud import pubsub_v1

        return cls(pubsub_v1.PublisherClient(), project, prefix)

    def topic_path(self, base: str) -> str:
        return self._client.topic_path(self._project, topic_name(base, self._prefix))

    def publish_bytes(self, base_topic: str, data: bytes, **attributes: str) -> str:
        """Publish raw bytes and wait for the message id."""
        try:
            return self._client.publish(self.topic_path(base_topic), data, **attributes).result(timeout=30)
        except api_exceptions.NotFound as error:
            raise PermanentError(f"topic {topic_name(base_topic, self._prefix)} does not exist: {error}") from error
        except (api_exceptions.GoogleAPICallError, TimeoutError) as error:
            raise TransientError(f"publishing to {base_topic} failed: {error}") from error

    def publish_json(self, base_topic: str, payload: Any, **attributes: str) -> str:
        return self.publish_bytes(base_topic, json.dumps(payload).encode("utf-8"), **attributes)

"""Publishing a dead letter again, exactly as it was (`tpujobs.engine.dead_letters`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from tpujobs.adapters.google_errors import translated
from tpujobs.engine import topology
from tpujobs.engine.errors import PermanentError

if TYPE_CHECKING:
    from google.pubsub_v1 import PublisherClient


class PubsubRepublisher:
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
    def build(cls, project: str, prefix: str = "") -> PubsubRepublisher:
        from google.pubsub_v1 import PublisherClient

        return cls(PublisherClient(), project, prefix)

    def publish(self, base_topic: str, data: bytes, attributes: Mapping[str, str]) -> str:
        from google.api_core import exceptions as api_exceptions
        from google.pubsub_v1 import PubsubMessage

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

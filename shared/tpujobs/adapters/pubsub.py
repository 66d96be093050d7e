"""Publishing to tpujobs topics with google-cloud-pubsub (the emulator when PUBSUB_EMULATOR_HOST is set)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from google.api_core import exceptions as api_exceptions

from tpujobs.adapters.google_errors import translated
from tpujobs.domain.shards import Shard
from tpujobs.engine.converge_requests import ConvergeJob, ConvergePool
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.ports import StatusChange
from tpujobs.engine.topology import CONVERGE, LOG_EXPORT, RECONCILE, STATUS, topic_name

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

        # Ordering keys keep one job's status changes in order for ordered subscribers.
        options = pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
        # Every publish here waits for its message id, and a batch holds one ordering key's
        # messages, so the default 10 ms wait for a batch to fill was 10 ms added to every
        # announcement (20 of a submission's ~90 ms, measured); 1 ms still batches a loop.
        batching = pubsub_v1.types.BatchSettings(max_latency=0.001)
        return cls(pubsub_v1.PublisherClient(batch_settings=batching, publisher_options=options), project, prefix)

    def announce(self, change: StatusChange) -> None:
        """A job's state change to tpujobs-status, with attributes subscribers can filter on."""
        topic = self.topic_path(STATUS)
        data = json.dumps(change.payload()).encode("utf-8")
        try:
            self._client.publish(
                topic,
                data,
                ordering_key=change.job_id,
                job_id=change.job_id,
                owner=change.owner,
                to_state=change.to_state,
            ).result(timeout=30)
        except Exception as error:
            # A failed publish pauses its ordering key until resumed; resume it for the retry.
            # Whatever failed, the change is announced again later (the reconciler looks for
            # unannounced events), so the port promises TransientError here, never Permanent.
            self._client.resume_publish(topic, change.job_id)
            raise TransientError(f"announcing {change.job_id} {change.to_state} failed: {error}") from error

    def topic_path(self, base: str) -> str:
        return self._client.topic_path(self._project, topic_name(base, self._prefix))

    def publish_bytes(self, base_topic: str, data: bytes, attributes: Mapping[str, str] | None = None) -> str:
        """Publish raw bytes and wait for the message id (a wait that times out is transient).

        Attributes come as a mapping, not keywords, and publish() gets its own arguments named:
        an attribute named retry or timeout is then an error rather than taken for that argument.
        """
        from google.api_core import gapic_v1  # loaded by the Pub/Sub client already

        name = topic_name(base_topic, self._prefix)
        with translated("Pub/Sub", f"publish to {name}"):
            try:
                future = self._client.publish(
                    self.topic_path(base_topic),
                    data,
                    ordering_key="",
                    retry=gapic_v1.method.DEFAULT,
                    timeout=gapic_v1.method.DEFAULT,
                    **(attributes or {}),
                )
                return future.result(timeout=30)
            except api_exceptions.NotFound as error:
                raise PermanentError(f"topic {name} does not exist: {error}") from error

    def publish_json(self, base_topic: str, payload: Any, attributes: Mapping[str, str] | None = None) -> str:
        return self.publish_bytes(base_topic, json.dumps(payload).encode("utf-8"), attributes)

    def publish_shards(self, shards: Sequence[Shard]) -> None:
        """The shards of a reconcile tick on tpujobs-reconcile, each for its own invocation:
        all handed to the client at once (it batches them), then each one waited for."""
        from google.api_core import gapic_v1  # loaded by the Pub/Sub client already

        name = topic_name(RECONCILE, self._prefix)
        with translated("Pub/Sub", f"publish reconcile shards to {name}"):
            try:
                futures = [
                    self._client.publish(
                        self.topic_path(RECONCILE),
                        json.dumps(shard.message()).encode("utf-8"),
                        ordering_key="",
                        retry=gapic_v1.method.DEFAULT,
                        timeout=gapic_v1.method.DEFAULT,
                        zone=shard.zone,
                    )
                    for shard in shards
                ]
                for future in futures:
                    future.result(timeout=30)
            except api_exceptions.NotFound as error:
                raise PermanentError(f"topic {name} does not exist: {error}") from error

    def request_export(self, job_id: str, attempt: int) -> None:
        """Ask `export_logs` to put an ended attempt's output together (tpujobs-log-export)."""
        payload = {"job_id": job_id, "attempt": attempt}
        self.publish_json(LOG_EXPORT, payload, {"job_id": job_id, "attempt": str(attempt)})

    def hand_off_job(self, job_id: str) -> None:
        """The jobs API's hand-off (`ports.CapacityHandoff`): on tpujobs-converge, the job's id only."""
        self.publish_json(CONVERGE, ConvergeJob(action="converge", job_id=job_id).payload())

    def hand_off_pool(self, name: str) -> None:
        """The same for a warm pool: its name only."""
        self.publish_json(CONVERGE, ConvergePool(action="pool-converge", name=name).payload())

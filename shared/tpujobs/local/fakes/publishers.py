"""A recording publisher: what the engine would have sent on Pub/Sub, kept in lists a test reads.

It stands for `adapters.pubsub.Publisher` in all four of its roles (`StatusPublisher`,
`ReconcileShards`, `LogExportRequests`, `CapacityHandoff`). `sent` holds each message as the
adapter puts it on the wire (topic, JSON payload, attributes, ordering key), which
tests/contract/test_contract_publishers.py holds to the adapter on the Pub/Sub emulator.
`failing` makes every send raise TransientError, as the adapter does when Pub/Sub cannot be
reached; a topic in `missing_topics` fails as the adapter fails on a topic that does not exist.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tpujobs.domain.shards import Shard
from tpujobs.engine.converge_requests import ConvergeJob, ConvergePool
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.ports import StatusChange
from tpujobs.engine.topology import CONVERGE, LOG_EXPORT, RECONCILE, STATUS


@dataclass(frozen=True)
class Sent:
    """One message as published: its topic's base name, JSON payload, attributes and ordering key."""

    topic: str
    payload: object
    attributes: Mapping[str, str] = field(default_factory=dict)
    ordering_key: str = ""


class RecordingPublisher:
    """Every announcement, shard and export request, in the order sent."""

    def __init__(self) -> None:
        self.announced: list[StatusChange] = []
        self.shards: list[Shard] = []
        self.exports: list[tuple[str, int]] = []  # (job id, attempt)
        self.handed_off: list[tuple[str, str]] = []  # ("job" | "pool", its id or name)
        self.sent: list[Sent] = []  # every message above, as it goes on the wire
        self.failing = False
        self.missing_topics: set[str] = set()  # base names of topics that do not exist
        self._lock = threading.Lock()

    def _send(self, what: str, topic: str, *, missing_is_permanent: bool = True) -> None:
        """Fail as the adapter would: unreachable is transient; a missing topic is permanent, but
        for an announcement, which the reconciler makes again (so the adapter says transient)."""
        if self.failing:
            raise TransientError(f"Pub/Sub could not be reached to {what}")
        if topic in self.missing_topics:
            kind = PermanentError if missing_is_permanent else TransientError
            raise kind(f"topic {topic} does not exist: could not {what}")

    def announce(self, change: StatusChange) -> None:
        self._send("announce a change", STATUS, missing_is_permanent=False)
        attributes = {"job_id": change.job_id, "owner": change.owner, "to_state": change.to_state}
        with self._lock:
            self.announced.append(change)
            self.sent.append(Sent(STATUS, change.payload(), attributes, ordering_key=change.job_id))

    def publish_shards(self, shards: Sequence[Shard]) -> None:
        self._send("publish reconcile shards", RECONCILE)
        with self._lock:
            self.shards += shards
            self.sent += [Sent(RECONCILE, shard.message(), {"zone": shard.zone}) for shard in shards]

    def request_export(self, job_id: str, attempt: int) -> None:
        self._send("request an export", LOG_EXPORT)
        attributes = {"job_id": job_id, "attempt": str(attempt)}
        with self._lock:
            self.exports.append((job_id, attempt))
            self.sent.append(Sent(LOG_EXPORT, {"job_id": job_id, "attempt": attempt}, attributes))

    def hand_off_job(self, job_id: str) -> None:
        self._send("hand a job's capacity work off", CONVERGE)
        with self._lock:
            self.handed_off.append(("job", job_id))
            self.sent.append(Sent(CONVERGE, ConvergeJob(action="converge", job_id=job_id).payload()))

    def hand_off_pool(self, name: str) -> None:
        self._send("hand a pool's capacity work off", CONVERGE)
        with self._lock:
            self.handed_off.append(("pool", name))
            self.sent.append(Sent(CONVERGE, ConvergePool(action="pool-converge", name=name).payload()))

    def take_handoffs(self) -> list[tuple[str, str]]:
        """The hand-offs sent since the last call, oldest first (what tpujobs-converge would deliver)."""
        with self._lock:
            taken, self.handed_off = self.handed_off, []
        return taken

"""A recording publisher: what the engine would have sent on Pub/Sub, kept in lists a test reads.

It stands for `adapters.pubsub.Publisher` in all four of its roles (`StatusPublisher`,
`ReconcileShards`, `LogExportRequests`, `CapacityHandoff`). `failing` makes every send raise TransientError, as the
adapter does when Pub/Sub cannot be reached.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from tpujobs.domain.shards import Shard
from tpujobs.engine.errors import TransientError
from tpujobs.engine.ports import StatusChange


class RecordingPublisher:
    """Every announcement, shard and export request, in the order sent."""

    def __init__(self) -> None:
        self.announced: list[StatusChange] = []
        self.shards: list[Shard] = []
        self.exports: list[tuple[str, int]] = []  # (job id, attempt)
        self.handed_off: list[tuple[str, str]] = []  # ("job" | "pool", its id or name)
        self.failing = False
        self._lock = threading.Lock()

    def _send(self, what: str) -> None:
        if self.failing:
            raise TransientError(f"Pub/Sub could not be reached to {what}")

    def announce(self, change: StatusChange) -> None:
        self._send("announce a change")
        with self._lock:
            self.announced.append(change)

    def publish_shards(self, shards: Sequence[Shard]) -> None:
        self._send("publish reconcile shards")
        with self._lock:
            self.shards += shards

    def request_export(self, job_id: str, attempt: int) -> None:
        self._send("request an export")
        with self._lock:
            self.exports.append((job_id, attempt))

    def hand_off_job(self, job_id: str) -> None:
        self._send("hand a job's capacity work off")
        with self._lock:
            self.handed_off.append(("job", job_id))

    def hand_off_pool(self, name: str) -> None:
        self._send("hand a pool's capacity work off")
        with self._lock:
            self.handed_off.append(("pool", name))

    def take_handoffs(self) -> list[tuple[str, str]]:
        """The hand-offs sent since the last call, oldest first (what tpujobs-converge would deliver)."""
        with self._lock:
            taken, self.handed_off = self.handed_off, []
        return taken

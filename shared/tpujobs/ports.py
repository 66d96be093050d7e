"""The small interfaces the service needs from the outside world.

Adapters in `tpujobs.adapters` implement them with Google's libraries; tests and the
benchmarks use the same adapters against the emulators and the TPU simulator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from tpujobs.domain.job import Job, JobEvent
from tpujobs.domain.transitions import Decision, Ignored, Observation

Clock = Callable[[], datetime]


@dataclass(frozen=True)
class Rejection:
    """A message that could not become a job (contract section 3, `rejections`)."""

    message_id: str
    at: datetime
    reason: str
    payload: str  # the first 4 KiB of the message, as text
    topic: str


class JobStore(Protocol):
    def create(self, job: Job, event: JobEvent) -> bool:
        """Create the job and its first event if the job id is new; False if it existed."""

    def get(self, job_id: str) -> Job | None: ...

    def apply(self, job_id: str, seen: Observation, clock: Clock) -> Decision | Ignored:
        """Decide and commit in one transaction: compare-and-set on the job, plus its event."""

    def events(self, job_id: str) -> list[JobEvent]: ...

    def list(self, state: str | None = None, owner: str | None = None, limit: int = 100) -> list[Job]: ...

    def reject(self, rejection: Rejection) -> None:
        """Record a rejection once per message id."""


@dataclass(frozen=True)
class CapacityStatus:
    """What the TPU API says about one queued resource."""

    name: str
    zone: str
    state: str  # the QueuedResource state name: WAITING_FOR_RESOURCES, ACTIVE, ...


class Tpu(Protocol):
    def request(self, job: Job, startup_script: str) -> CapacityStatus:
        """Ask for the queued resource of the job's current attempt; an existing one is adopted."""

    def status(self, zone: str, name: str) -> CapacityStatus | None: ...

    def release(self, zone: str, name: str) -> None:
        """Delete the queued resource and its nodes (force); absent is fine."""

    def list(self, zone: str) -> Sequence[CapacityStatus]: ...

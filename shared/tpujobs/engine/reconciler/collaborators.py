"""What the reconciler repairs through: the services that act for the event functions.

The reconciler reads what is through its own ports (job store, capacity, pools) and changes
nothing itself: each repair goes through the service that owns that change, so a repair takes
the same path as the event it stands in for. These Protocols name exactly what it calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tpujobs.domain.holdings import HoldingState
    from tpujobs.domain.job import Job, JobEvent, Source
    from tpujobs.domain.pools import Pool
    from tpujobs.domain.transitions import Decision, Ignored, Observation
    from tpujobs.engine.inbound import InboundMessage
    from tpujobs.engine.ports import CapacityStatus


class JobRepairs(Protocol):
    """A job's changes, as the event functions make them."""

    def reject(self, message: InboundMessage, reason: str) -> None:
        """Record a message that cannot be used (`rejections`); it is acknowledged."""

    def announce(self, job: Job, event: JobEvent) -> None:
        """Publish a committed change whose announcement was missed."""

    def note_repair_failure(self, job_id: str, doing: str, error: Exception) -> Decision | Ignored:
        """Say on the job why a repair failed for good (its reason and timeline)."""

    def observe(self, job_id: str, seen: Observation) -> Decision | Ignored:
        """Apply what was seen to the job, by its rules, and act on the outcome."""

    def observe_capacity(
        self,
        queued_resource: str,
        state: HoldingState,
        detail: str = "",
        unhealthy_hosts: int = 0,
        source: Source = "tpu",
    ) -> Decision | Ignored | None:
        """A holding's state, as the capacity port says it (GONE: it no longer exists)."""

    def converge(self, job_id: str) -> None:
        """Finish what a QUEUED, RECOVERING or ended job's handler left undone."""

    def note_suspect_hosts(
        self, job_id: str, attempt: int, hosts: tuple[tuple[str, str], ...], reason: str
    ) -> Decision | Ignored:
        """Remember the hosts in a condition that often passes, and since when."""

    def request_again(self, job_id: str) -> Decision | Ignored | None:
        """Ask again for a PROVISIONING job's missing holding."""

    def finish_held_over(self, job_id: str) -> list[str]:
        """Release the job's held-over holdings whose hosts are gone or grace is over; their names."""

    def request_export(self, job_id: str, attempt: int) -> None:
        """Ask for an ended attempt's output to be exported."""

    def admit_waiting(self, pool: str, leaving: frozenset[str] = frozenset()) -> list[str]:
        """Admit the jobs waiting for a quota pool that now fit."""


class PoolRepairs(Protocol):
    """A warm pool's changes, made from its document and what the zones show."""

    def repair(self, pool: Pool, seen: Mapping[str, CapacityStatus], live: Mapping[str, Job]) -> list[str]:
        """Make the pool what its document says; what it did, for the report."""

    def release_leftovers(self, seen: Mapping[str, CapacityStatus], known: Mapping[str, Pool]) -> list[str]:
        """Release the unit queued resources no pool owns; the names released."""

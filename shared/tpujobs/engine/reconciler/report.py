"""What one reconcile tick saw and did, and the guard that keeps each item's failure its own.

Nothing one job does stops a tick: a transient error leaves the item for the next tick, a
permanent one is recorded on its job (where its owner looks), anything else is logged; the next
item and the next phase still run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tpujobs.engine.errors import PermanentError, TransientError

if TYPE_CHECKING:
    from tpujobs.engine.reconciler.collaborators import JobRepairs

log = logging.getLogger("tpujobs.engine.reconciler")


@dataclass
class ReconcileReport:
    """What one tick saw and did, for logs and tests."""

    jobs: int = 0
    zones_listed: int = 0
    zones_skipped: list[str] = field(default_factory=list)
    observed: list[str] = field(default_factory=list)  # "job: what was observed"
    re_requested: list[str] = field(default_factory=list)
    converged: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    announced: list[str] = field(default_factory=list)  # "job#seq" of late status messages
    failed: list[str] = field(default_factory=list)  # "what: error" of items that failed for good
    pruned: list[str] = field(default_factory=list)  # jobs deleted past their expire_at
    shards: list[str] = field(default_factory=list)  # the shards published (coordinator) or run (shard, tick())
    tpu_lists: int = 0  # zone listings asked for (each is two TPU list calls: queued resources, nodes)
    jobs_read: int = 0  # job documents the listings returned (the coordinator's placements, a shard's jobs)

    def merge(self, other: ReconcileReport) -> None:
        """Add what a shard saw and did (`tick()` runs them all in one process); `jobs` stays
        the coordinator's count of active jobs."""
        self.zones_listed += other.zones_listed
        self.zones_skipped += [zone for zone in other.zones_skipped if zone not in self.zones_skipped]
        self.tpu_lists += other.tpu_lists
        self.jobs_read += other.jobs_read
        for name in ("observed", "re_requested", "converged", "released", "announced", "failed", "pruned"):
            getattr(self, name).extend(getattr(other, name))


@dataclass(frozen=True)
class Guard:
    """Runs a phase or one item's repair so that whatever escapes it is that item's alone."""

    jobs: JobRepairs  # where a permanent failure is recorded, on its job

    def phase(self, report: ReconcileReport, doing: str, phase: Callable[[], None]) -> None:
        """Run one phase; whatever escapes it is logged, and the next phase still runs."""
        try:
            phase()
        except TransientError as error:  # its query failed: the next tick runs it again
            log.warning("reconcile: could not %s this tick: %s", doing, error)
        except Exception as error:
            log.exception("reconcile: could not %s this tick", doing)
            report.failed.append(f"{doing}: {error}")

    def item(self, report: ReconcileReport, doing: str, action: Callable[[], None], job_id: str | None = None) -> None:
        """Do one item's repair; its failure is that item's alone.

        Transient: left for the next tick. Permanent: recorded on the job (`job_id`), where its
        owner looks, once per distinct error. Anything else: logged with its traceback.
        """
        what = f"{job_id}: {doing}" if job_id else doing
        try:
            action()
        except TransientError as error:
            log.warning("reconcile: %s left for the next tick: %s", what, error)
        except PermanentError as error:
            log.error("reconcile: %s failed for good: %s", what, error)
            report.failed.append(f"{what}: {error}")
            if job_id is not None:
                try:
                    self.jobs.note_repair_failure(job_id, doing, error)
                except Exception:
                    log.exception("reconcile: could not record on %s why its repair failed", job_id)
        except Exception as error:
            log.exception("reconcile: %s failed unexpectedly", what)
            report.failed.append(f"{what}: {error!r}")

"""The reconciler's export phase: ask again for the output of attempts whose export was missed.

The handler that ends an attempt asks once, best effort; the coordinator asks again for the jobs
that ended in the window, each shard for its active jobs' earlier attempts.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from tpujobs.domain.job import Job
from tpujobs.domain.naming import exported_attempt
from tpujobs.engine.ports import JobStore, LogExportRequests
from tpujobs.engine.reconciler.collaborators import JobRepairs
from tpujobs.engine.reconciler.report import ReconcileReport

EXPORT_GRACE_S = 60.0  # an export asked for by the handler has had this long to finish
EXPORT_WINDOW_S = 600.0  # after that, the reconciler asks again for this long


def export_window(now: datetime) -> tuple[datetime, datetime]:
    """[oldest, newest): when an attempt ended for its export to be asked for again now."""
    newest = now - timedelta(seconds=EXPORT_GRACE_S)
    return newest - timedelta(seconds=EXPORT_WINDOW_S), newest


class ExportPhase:
    """Asks again, through the job service, for exports that ended attempts still lack."""

    def __init__(self, jobs: JobRepairs, store: JobStore, exports: LogExportRequests | None) -> None:
        """No `exports`: this deployment exports nothing, so nothing is asked again."""
        self.jobs = jobs
        self.store = store
        self.exports = exports

    def request_ended(self, now: datetime, report: ReconcileReport) -> None:
        """The coordinator's part of `request_missing`: the jobs that ended in the window (one
        paged, projected query); each shard does its own active jobs."""
        if self.exports is not None:
            oldest, newest = export_window(now)
            self.request_missing(self.store.ended_between(oldest, newest), now, report)

    def request_missing(self, jobs: list[Job], now: datetime, report: ReconcileReport) -> None:
        """Ask again for the export of attempts that ended a while ago and are not exported.

        Each attempt that held capacity and ended between EXPORT_GRACE_S and EXPORT_GRACE_S +
        EXPORT_WINDOW_S ago, newer than the job's latest exported one, is asked for again at every
        tick of that window: the export is idempotent, and an attempt without output stays as it is.
        """
        if self.exports is None:
            return
        oldest, newest = export_window(now)
        for job in jobs:
            exported = exported_attempt(job.log_uri) or 0
            for usage in job.usage:
                due = usage.ended_at is not None and oldest <= usage.ended_at < newest
                if due and usage.held_from is not None and usage.attempt > exported:
                    self.jobs.request_export(job.job_id, usage.attempt)
                    report.observed.append(f"{job.job_id}: export of attempt {usage.attempt} asked again")

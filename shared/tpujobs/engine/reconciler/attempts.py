"""The reconciler's attempt checks: hosts that went silent or never reported, time limits, hangs.

Each finds an attempt that no event will end (a host that dies without a word, a limit passed, a
command that stopped making progress) and tells the job service, whose rules decide what follows.
What each costs is pure arithmetic on the listed jobs until a deadline has passed: only then are
an attempt's worker documents read.
"""

from __future__ import annotations

from datetime import datetime
from functools import partial

from tpujobs.domain import limits, maintenance
from tpujobs.domain.job import Job
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Observation
from tpujobs.engine.ports import JobStore, SilentWorker
from tpujobs.engine.reconciler.collaborators import JobRepairs
from tpujobs.engine.reconciler.report import Guard, ReconcileReport


class AttemptChecks:
    """Finds lost hosts, limits reached and hung attempts, and observes them on their jobs."""

    def __init__(self, jobs: JobRepairs, store: JobStore, boot_timeout_s: float, guard: Guard) -> None:
        self.jobs = jobs
        self.store = store
        self.boot_timeout_s = boot_timeout_s
        self.guard = guard

    def _lost(self, job_id: str, seen: Observation, report: ReconcileReport) -> None:
        self.jobs.observe(job_id, seen)
        report.observed.append(f"{job_id}: {seen.reason}")

    # -- silent workers: the coordinator's ------------------------------------------------

    def find_silent_workers(self, now: datetime, report: ReconcileReport) -> None:
        """A RUNNING attempt whose worker is past its `silent_after` deadline is lost.

        Each report that marks a host live moves its deadline to at least the heartbeat timeout
        and two of its own heartbeat periods later, so one late or lost heartbeat never counts;
        a host worker 0 of its slice speaks for has no deadline here (worker 0 reports it at
        once: `peer_silent`); workers of attempts that are over are retired, so each is looked
        at once. The jobs are read when first asked for: one read per job with a silent worker.
        """
        live = _ReadOnDemand(self.store)
        for silent in self.store.silent_workers(now):
            doing = f"act on the silence of worker {silent.worker} of attempt {silent.attempt}"
            self.guard.item(report, doing, partial(self._silent_worker, silent, live, now, report), silent.job_id)

    def _silent_worker(
        self, silent: SilentWorker, live: dict[str, Job], now: datetime, report: ReconcileReport
    ) -> None:
        job = live.get(silent.job_id)
        current = (
            job is not None
            and job.state is JobState.RUNNING
            and job.attempt == silent.attempt
            and silent.worker not in job.workers_done
        )
        if not current:
            self.store.retire_worker(silent.job_id, silent.attempt, silent.worker)
            return
        quiet = (now - silent.last_report_at).total_seconds()
        what = f"Worker {silent.worker} of attempt {silent.attempt} sent nothing for {quiet:.0f} s; the host is lost"
        if silent.after_its_exit:  # its peers, spoken for by it alone, are heard by no one now
            what = (
                f"Worker {silent.worker} of attempt {silent.attempt} sent nothing for {quiet:.0f} s after its "
                "command ended, while it spoke for the peers of its slice; the host is lost"
            )
        seen = Observation(EventKind.CAPACITY_LOST, silent.attempt, "reconciler", reason=what, worker=silent.worker)
        self._lost(silent.job_id, seen, report)

    # -- a shard's jobs -------------------------------------------------------------------

    def find_hosts_that_never_reported(self, jobs: list[Job], now: datetime, report: ReconcileReport) -> None:
        """An attempt holding capacity whose hosts have not all reported within the boot timeout
        has lost the silent ones: the job's rules decide what follows, as for any lost host.

        Counted from the first host's `started` when one said it (the others boot alongside),
        else from the capacity becoming ACTIVE (no agent at all: the hosts never booted it).

        What it costs: `Job.booting_since` is pure, on the listed jobs. Only an attempt past its
        timeout and not yet known up has its worker documents read (one query); then either some
        host is missing and the attempt is lost, or every host is there and that is noted on the
        attempt's usage (`all_started_at`), so no tick reads it again: one read per host per
        multi-host attempt, once, never a read per job per tick.
        """
        for job in jobs:
            since = job.booting_since()
            if since is not None and (now - since).total_seconds() > self.boot_timeout_s:
                check = partial(self._check_boot, job, since, now, report)
                self.guard.item(report, "check that its hosts booted", check, job.job_id)

    def _check_boot(self, job: Job, since: datetime, now: datetime, report: ReconcileReport) -> None:
        heard = {w.worker for w in self.store.attempt_workers(job.job_id, job.attempt)}
        silent = [key for key in job.worker_keys if key not in heard and key not in job.workers_done]
        if not silent:
            self.store.record_all_started(job.job_id, job.attempt, now)
            return
        fresh = self.store.get(job.job_id)  # a `started` may have come since the listing
        if fresh is None or _where(fresh) != _where(job):
            return
        waited = (now - since).total_seconds()
        if not heard and job.state is JobState.PROVISIONING:
            capacity = job.warm_pool_unit or job.queued_resource  # a pool's unit, or its own
            what = (
                f"Queued resource {capacity} has been ACTIVE for {waited:.0f} s and no "
                "worker agent reported: the hosts never booted the agent"
            )
        else:
            usage = job.usage_of()
            first = usage is not None and usage.started_at is not None
            after = "the first host started" if first else "the capacity became ACTIVE"
            names = ", ".join(silent)
            whose = "its host is" if len(silent) == 1 else "their hosts are"
            what = (
                f"{'Worker' if len(silent) == 1 else 'Workers'} {names} of attempt {job.attempt} never "
                f"reported, {waited:.0f} s after {after}: {whose} lost"
            )
        one = silent[0] if len(silent) == 1 else None
        self._lost(
            job.job_id, Observation(EventKind.CAPACITY_LOST, job.attempt, "reconciler", what, worker=one), report
        )

    def enforce_time_limits(self, jobs: list[Job], now: datetime, report: ReconcileReport) -> None:
        """A job past its `time_limit` or `attempt_time_limit` ends FAILED, naming the limit and
        the time used; ending releases its capacity (its workers get SIGTERM, then SIGKILL after
        the grace). Pure arithmetic on the listed jobs: no read, whatever the number of jobs."""
        for job in jobs:
            reached = limits.limit_reached(job, now)
            if reached is not None:
                what = f"{reached.reason}."
                seen = Observation(EventKind.TIME_LIMIT_REACHED, job.attempt, "reconciler", what, limit=reached.limit)
                enforce = partial(self._lost, job.job_id, seen, report)
                self.guard.item(report, f"enforce its {reached.limit}", enforce, job.job_id)

    def move_ahead_of_maintenance(
        self, jobs: list[Job], now: datetime, lead_seconds: float, report: ReconcileReport
    ) -> None:
        """A job with `on_maintenance: checkpoint-and-move` whose hosts' announced maintenance
        starts within the lead leaves them now: its attempt ends (SIGTERM: the job saves) and
        the next resumes elsewhere. Pure arithmetic on the listed jobs: no read."""
        for job in jobs:
            window = maintenance.move_due(job, now, lead_seconds)
            if window is not None:
                what = (
                    f"Host maintenance on {window.host} starts {window.window_start}: moving attempt "
                    f"{job.attempt} off its hosts ahead of it (on_maintenance: checkpoint-and-move); "
                    f"attempt {job.attempt + 1} resumes from its checkpoint on other capacity."
                )
                seen = Observation(EventKind.MAINTENANCE_MOVE, job.attempt, "reconciler", reason=what)
                self.guard.item(
                    report, "move it ahead of maintenance", partial(self._lost, job.job_id, seen, report), job.job_id
                )

    def find_hung_attempts(self, jobs: list[Job], now: datetime, report: ReconcileReport) -> None:
        """A RUNNING attempt none of whose workers printed a line or reported a checkpoint within
        its `hang_timeout` is hung: `on_hang` decides, within `max_restarts`.

        What it costs: `limits.might_hang` is pure, on the listed job (its attempt's start and
        last checkpoint), so only an attempt with a hang_timeout and no sign of progress the job
        itself knows of within it has its workers' documents read (one query, one document per
        host): the last-output times live on the worker documents, which heartbeats write.
        """
        for job in jobs:
            if limits.might_hang(job, now):
                check = partial(self._check_hung, job, now, report)
                self.guard.item(report, "check whether it is hung", check, job.job_id)

    def _check_hung(self, job: Job, now: datetime, report: ReconcileReport) -> None:
        workers = [
            limits.WorkerProgress(w.worker, w.last_output_at, w.checkpoint_at, w.started_at, w.exit_code)
            for w in self.store.attempt_workers(job.job_id, job.attempt)
        ]
        found = limits.hung(job, workers, now)
        if found is not None:
            seen = Observation(EventKind.HUNG, job.attempt, "reconciler", reason=f"{found.reason}.")
            self._lost(job.job_id, seen, report)


class _ReadOnDemand(dict[str, Job]):
    """The live jobs the silent-worker phase asks about, each read when first asked for (one
    read per job with a silent worker, never the active set); an ended job is not live."""

    def __init__(self, store: JobStore) -> None:
        super().__init__()
        self._store = store
        self._read: set[str] = set()

    def get(self, job_id: str, default: Job | None = None) -> Job | None:  # type: ignore[override]
        if job_id not in self._read:
            self._read.add(job_id)
            job = self._store.get(job_id)
            if job is not None and not job.state.is_terminal:
                self[job_id] = job
        return super().get(job_id, default)


def _where(job: Job) -> tuple[JobState, int, datetime | None]:
    """What the boot check decided on: a change since (a host's `started`) makes it wait a tick."""
    return job.state, job.attempt, job.booting_since()

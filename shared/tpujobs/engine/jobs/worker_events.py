"""tpujobs-worker-events: one host's word (started, heartbeat, exited, checkpoint, aborted,
rebooted, peer_silent), believed only when signed with its attempt's key.

A `started` or an exit 0 is counted on the worker records, so the job document of a job of
1,000 hosts changes once per attempt for them, not once per host; the rest is observed at once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from tpujobs.domain.job import Job, worker_key
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Decision, Ignored, Observation
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.jobs.lifecycle import JobLifecycle
from tpujobs.engine.jobs.rejections import Rejections
from tpujobs.engine.jobs.signed_reports import SignedReports
from tpujobs.engine.jobs.worker_records import counted_on_workers, silent_after, worker_observation, worker_record
from tpujobs.engine.ports import Clock, JobRecords, WorkerRecords
from tpujobs.engine.settings import Settings
from tpujobs.engine.worker_reports import WorkerReport


class _HostStore(JobRecords, WorkerRecords, Protocol):
    """The job, its workers' records and what the attempt's usage notes."""


class WorkerEvents:
    """Turns a believed worker report into its record and its job's observation."""

    def __init__(
        self,
        store: _HostStore,
        settings: Settings,
        clock: Clock,
        reports: SignedReports,
        rejections: Rejections,
        lifecycle: JobLifecycle,
    ) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.reports = reports
        self.rejections = rejections
        self.lifecycle = lifecycle

    def on_worker_report(self, message: InboundMessage) -> Decision | Ignored | None:
        """tpujobs-worker-events: started, heartbeat, exited, checkpoint, aborted or rebooted,
        from one worker host, believed only when signed with its attempt's key (`SignedReports.believed`)."""
        report = self.reports.decode(WorkerReport, message)
        job = None if report is None else self.reports.believed(report, message)
        if report is None or job is None:
            return None
        if report.kind == "peer_silent":
            return self._peer_silent(report, job, message)
        now = self.clock()
        at = report.at or now
        worker = worker_key(report.slice_id, report.worker_id)
        record = replace(worker_record(report, worker, now, at), silent_after=silent_after(report, now, self.settings))
        seen = worker_observation(report, worker)
        counted = counted_on_workers(seen)
        if counted:  # the job counts these hosts from their records: the record comes first
            self.store.record_worker(report.job_id, record)
        outcome = None if seen is None else self._observe_host(job, seen)
        if report.peers_silent and job.state is JobState.RUNNING and job.attempt == report.attempt:
            outcome = self._peer_silent_again(report, job, message)
        if report.kind == "checkpoint":
            self.store.record_checkpoint(report.job_id, report.attempt, at, report.step)
        if report.kind == "started" and report.image_digest is not None:
            # The first host's digest is the attempt's; another host's different one (its tag
            # moved between two pulls) is kept beside it, so `describe` shows both.
            self.store.record_image_digest(report.job_id, report.attempt, report.image_digest)
        # Any other record comes after the job's commit: had it come first, a crash in between
        # would leave a worker marked (exited, rebooted) whose word the job never took. A counted
        # one comes first, since the count reads it; a redelivery counts again.
        if not counted:
            self.store.record_worker(report.job_id, record)
        if report.kind == "stopped":
            self._release_when_stopped(job, report.attempt)
        return outcome

    def _release_when_stopped(self, job: Job, attempt: int) -> None:
        """A host of a held-over attempt (preempted, reclaimed) stopped its command: once every
        host that started has, its save is done, so the holding goes now, not at its grace's end."""
        if not any(held.attempt == attempt for held in job.held_over):
            return
        if any(w.started_at and not w.exited_at for w in self.store.attempt_workers(job.job_id, attempt)):
            return
        self.lifecycle.finish_held_over(job.job_id, stopped=attempt)

    def _observe_host(self, job: Job, seen: Observation) -> Decision | Ignored:
        """One host's word about `job` (as read when the report was believed): a `started` or an
        exit 0 is counted on the worker records, so the job document changes once per attempt
        for them, not once per host; the rest at once."""
        if seen.kind is EventKind.WORKERS_STARTED:
            return self._host_started(job, seen)
        if seen.kind is EventKind.WORKER_SUCCEEDED:
            return self._host_succeeded(job, seen)
        return self.lifecycle.observe(job.job_id, seen)

    def _host_started(self, job: Job, seen: Observation) -> Decision | Ignored:
        """The first `started` moves the job to RUNNING; the others write only their worker's
        record, and the one that completes the count notes `all_started_at` on the job."""
        running: Job | None = job
        if job.state is JobState.RUNNING and job.attempt == seen.attempt:
            outcome: Decision | Ignored = Ignored(f"attempt {job.attempt} is RUNNING already")
        else:  # PROVISIONING (or stale, ended: observed as before, which finishes earlier work)
            outcome = self.lifecycle.observe(job.job_id, seen)
            running = outcome.job if isinstance(outcome, Decision) else None
        if running is not None and running.state is JobState.RUNNING and running.attempt == seen.attempt:
            self._note_all_started(running)
        return outcome

    def _note_all_started(self, job: Job) -> None:
        """Note on the attempt's usage that every host has reported, when its records say so
        (one count query; `record_all_started` writes only the first time)."""
        usage = job.usage_of()
        if usage is None or usage.all_started_at is not None:
            return
        if self.store.attempt_workers_heard(job.job_id, job.attempt) >= job.total_workers:
            self.store.record_all_started(job.job_id, job.attempt, self.clock())

    def _host_succeeded(self, job: Job, seen: Observation) -> Decision | Ignored:
        """An exit 0, counted from the records of the attempt's hosts (this one's is written):
        the job is written when the count is complete (SUCCEEDED) or to leave PROVISIONING;
        redelivered or reordered exits count once each, since a record is one per host. The
        count decides, so `job` may be as read before this host's record was written."""
        assert seen.attempt is not None
        done = self.store.attempt_workers_succeeded(job.job_id, seen.attempt)
        live = job.state is JobState.RUNNING and job.attempt == seen.attempt
        if live and done < job.total_workers:
            return Ignored(f"worker {seen.worker} exited 0; {done} of {job.total_workers} workers are done")
        return self.lifecycle.observe(job.job_id, replace(seen, workers_done_count=done))

    def _peer_silent(self, report: WorkerReport, job: Job, message: InboundMessage) -> Decision | Ignored | None:
        """Worker 0 of a slice heard nothing from one of its peers for its peer timeout: that
        host is lost, as a silent worker is (found here in seconds, not at a reconcile tick).
        Only worker 0 speaks for a slice, and only of a peer the job has."""
        peer = report.peer_worker_id
        if report.worker_id != 0 or peer is None or peer >= job.spec.hosts_per_slice:  # >= 1: the schema
            who = "only worker 0 of a slice reports its peers" if report.worker_id != 0 else f"no peer {peer}"
            self.rejections.reject(
                message, f"Report for {report.job_id} attempt {report.attempt} refused: peer_worker_id: {who}."
            )
            return None
        worker = worker_key(report.slice_id, peer)
        said = report.detail or f"worker {worker_key(report.slice_id, 0)} stopped hearing it"
        why = f"Worker {worker} of attempt {report.attempt} went silent ({said}); the host is lost"
        seen = Observation(EventKind.CAPACITY_LOST, report.attempt, "agent", why, worker=worker)
        return self.lifecycle.observe(report.job_id, seen)

    def _peer_silent_again(self, report: WorkerReport, job: Job, message: InboundMessage) -> Decision | Ignored | None:
        """Worker 0's heartbeat names a peer it reported silent while the attempt still runs:
        that `peer_silent` never took effect (lost, or dead-lettered), so it is taken now."""
        peer = report.peers_silent[0] if report.peers_silent else None
        said = f"worker {worker_key(report.slice_id, 0)} reported it silent and has not heard it since"
        again = report.model_copy(update={"kind": "peer_silent", "peer_worker_id": peer, "detail": said})
        return self._peer_silent(again, job, message)

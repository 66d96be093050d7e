"""What one host's report means: for its worker's record, and for its job.

A report changes the host's record (`jobs/{id}/workers`) and, for most kinds, makes an
observation of the job; a record carries its own `silent_after` deadline, which the
reconciler watches.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from tpujobs.domain.job import ScheduledMaintenance
from tpujobs.domain.states import EventKind
from tpujobs.domain.transitions import Observation
from tpujobs.engine.ports import WorkerRecord
from tpujobs.engine.settings import Settings
from tpujobs.engine.worker_reports import WorkerReport


def worker_record(report: WorkerReport, worker: str, now: datetime, at: datetime) -> WorkerRecord:
    """What a report changes in its worker's record (`jobs/{id}/workers`); None leaves a field as it was."""
    record = WorkerRecord(report.attempt, worker, report.slice_id, report.worker_id, now)
    if report.kind == "started":
        return replace(record, started_at=at, live=True)
    if report.kind == "stopped":  # after a preemption notice: its command ended (its save is done)
        return replace(record, exited_at=at, exit_code=report.exit_code, live=False)
    if report.kind in ("exited", "aborted"):
        speaking = speaks_after_exit(report)  # live on, watched, for the peers only it hears
        return replace(
            record, exited_at=at, exit_code=report.exit_code, live=speaking, speaks_for_peers=speaking or None
        )
    if report.kind == "checkpoint":
        return replace(record, checkpoint_step=report.step, checkpoint_at=at, live=True)
    if report.kind == "heartbeat":  # worker 0's adds its slice's latest checkpoint
        return replace(
            record, live=True, last_output_at=report.last_output_at, checkpoint_step=report.step,
            checkpoint_at=report.checkpoint_at if report.step is not None else None,
        )  # fmt: skip
    if report.kind == "maintenance":  # a warning: the host runs on as it was
        return record
    return replace(record, live=False)  # rebooted: the command it ran is gone with the host


# A host's record says it is silent SILENT_PERIODS of its own periods after its last word, and
# never sooner than the deployment's heartbeat_timeout_seconds; a host worker 0 of its slice
# speaks for is never silent by its record (SPOKEN_FOR): worker 0 reports it (`peer_silent`).
SILENT_PERIODS = 2
SPOKEN_FOR = datetime(2200, 1, 1, tzinfo=timezone.utc)


def silent_after(report: WorkerReport, now: datetime, settings: Settings) -> datetime | None:
    """The `silent_after` a report sets on its worker's record (None: leaves it as it was),
    counted from `now`, when the service heard it. A report without `next_report_seconds`
    or `watch` comes from an agent from before them: its heartbeats are every
    `heartbeat_seconds`, so its record keeps today's timeout."""
    if report.kind not in ("started", "heartbeat") and not speaks_after_exit(report):
        return None
    if report.watch == "slice":
        return SPOKEN_FOR
    period = report.next_report_seconds or settings.heartbeat_seconds
    return now + timedelta(seconds=max(settings.heartbeat_timeout_seconds, SILENT_PERIODS * period))


def speaks_after_exit(report: WorkerReport) -> bool:
    """Worker 0 whose command exited 0 while it still heard peers of its slice (`peers_heard`):
    it goes on heartbeating for them until they end, so its record stays live and is found
    silent like any host's; otherwise a worker 0 that died then would leave its peers,
    spoken for and never silent by their own records, watched by no one."""
    return (
        report.kind == "exited"
        and report.exit_code == 0
        and report.limit is None
        and report.worker_id == 0
        and bool(report.peers_heard)
    )


def counted_on_workers(seen: Observation | None) -> bool:
    """A `started` or an exit 0: the job counts these from the worker records (`_observe_host`)."""
    return seen is not None and seen.kind in (EventKind.WORKERS_STARTED, EventKind.WORKER_SUCCEEDED)


def worker_observation(report: WorkerReport, worker: str) -> Observation | None:
    """What a report means for its job; None for those that only touch the worker's record
    (heartbeat, checkpoint)."""
    if report.kind == "started":
        digest = report.image_digest
        why = f"Workers of attempt {report.attempt} started the command in image {digest}." if digest else ""
        return Observation(EventKind.WORKERS_STARTED, report.attempt, "agent", why, worker=worker)
    if report.kind == "exited":
        code = report.exit_code if report.exit_code is not None else -1
        if report.limit is not None:  # the agent stopped it at its deadline: the limit, even if it exited 0
            return Observation(
                EventKind.TIME_LIMIT_REACHED, report.attempt, "agent", exit_code=code, worker=worker, limit=report.limit
            )
        if code == 0:
            return Observation(
                EventKind.WORKER_SUCCEEDED,
                report.attempt,
                "agent",
                exit_code=0,
                worker=worker,
                held_since=report.command_started_at,
            )
        # The agent's own words when it ended the attempt itself (an image it could not pull).
        why = f"Worker {worker} exited with {code}: {report.detail}" if report.detail else ""
        # The agent's claim that a retry_on.output pattern matched is believed for this job only
        # (`tpujobs.domain.error_classes`): patterns never run here, where they could stall every team.
        pattern, line = report.retry_pattern, report.retry_line or ""
        return Observation(
            EventKind.COMMAND_FAILED,
            report.attempt,
            "agent",
            why,
            exit_code=code,
            worker=worker,
            retry_pattern=pattern,
            retry_line=line,
            held_since=report.command_started_at,
        )
    if report.kind == "aborted":
        why = report.detail or "the agent could not start the command"
        return Observation(
            EventKind.ATTEMPT_ABORTED, report.attempt, "agent", reason=why, exit_code=report.exit_code, worker=worker
        )
    if report.kind == "rebooted":  # the host's agent started over: that host is lost
        found = report.detail or "its startup script ran again"
        why = f"Rebooted: worker {worker} of attempt {report.attempt} started over ({found})"
        return Observation(EventKind.CAPACITY_LOST, report.attempt, "agent", reason=why, worker=worker)
    if report.kind == "maintenance" and report.window_start is not None:
        window = ScheduledMaintenance(
            f"worker {worker}",
            report.window_start.isoformat(),
            report.window_end.isoformat() if report.window_end else "",
            report.maintenance_type or "",
        )
        return Observation(
            EventKind.MAINTENANCE_SCHEDULED, report.attempt, "agent", worker=worker, maintenance=(window,)
        )
    return None

"""When a job that asked to move (`on_maintenance: checkpoint-and-move`) must leave its hosts:
a lead before the earliest maintenance window Google announced for them. Pure."""

from __future__ import annotations

from datetime import datetime, timedelta

from tpujobs.domain.job import Job, ScheduledMaintenance
from tpujobs.domain.states import JobState
from tpujobs.domain.times import rfc3339

MOVING_STATES = (JobState.PROVISIONING, JobState.RUNNING)


def window_start(window: ScheduledMaintenance) -> datetime | None:
    """The window's start as a time, or None when Google's text is not RFC 3339."""
    return rfc3339(window.window_start)


def move_due(job: Job, now: datetime, lead_seconds: float) -> ScheduledMaintenance | None:
    """The announced window the job must leave its hosts for now (the earliest that starts within
    `lead_seconds`), or None: a job that rides maintenance out, or none is that close."""
    if job.spec.on_maintenance != "checkpoint-and-move" or job.state not in MOVING_STATES:
        return None
    close = [
        (start, window)
        for window in job.maintenance
        if (start := window_start(window)) is not None and start - timedelta(seconds=lead_seconds) <= now
    ]
    return min(close, key=lambda pair: pair[0])[1] if close else None

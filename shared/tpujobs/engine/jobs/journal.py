"""Commit a job's change, then announce it and ask for an ended attempt's output.

Every service changes a job through `JobJournal.commit`: the observation goes through the
store's compare-and-set with its event in the same write; a change is then published on
tpujobs-status and, when it ended an attempt, its output's export is requested.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tpujobs.domain.job import Job, JobEvent
from tpujobs.domain.states import ATTEMPT_LIVE, EventKind, JobState
from tpujobs.domain.transitions import Decision, Ignored, Observation
from tpujobs.engine import metric_events
from tpujobs.engine.errors import TransientError
from tpujobs.engine.ports import Clock, JobRecords, LogExportRequests, StatusChange, StatusPublisher

log = logging.getLogger(__name__)

# An attempt whose job moves from ATTEMPT_LIVE to one of these has ended: export its output.
_ATTEMPT_OVER = frozenset(
    {JobState.RECOVERING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.QUEUED}
)


def ended_attempt(decision: Decision) -> int | None:
    """The attempt a committed change ended, or None.

    From PROVISIONING or RUNNING to RECOVERING, SUCCEEDED, FAILED or CANCELLED; a cancel only
    once the job has started (before, there is no output). A move out of RECOVERING or QUEUED
    ends nothing: the attempt it names ended earlier, or never ran.
    """
    event = decision.event
    if event.from_state not in ATTEMPT_LIVE or event.to_state not in _ATTEMPT_OVER:
        return None
    if event.to_state is JobState.CANCELLED and decision.job.started_at is None:
        return None
    return event.attempt


def cancellation(reason: str) -> Observation:
    """A user's (or a deleted pool's) cancel of a job, whoever checked the right to."""
    return Observation(EventKind.CANCEL_REQUESTED, None, "user", reason=reason)


class JobJournal:
    """Commits observations and announces the changes they made."""

    def __init__(
        self,
        store: JobRecords,
        clock: Clock,
        status: StatusPublisher | None = None,
        exports: LogExportRequests | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.status = status
        self.exports = exports

    def commit(self, job_id: str, seen: Observation) -> Decision | Ignored:
        """Commit an observation without acting on the job's new state; announce the change it
        made, if any (a caller that acts on the state itself, or one with nothing to do)."""
        outcome = self.store.apply(job_id, seen, self.clock)
        if isinstance(outcome, Decision):
            event = outcome.event
            log.info("job %s: %s -> %s: %s", job_id, event.from_state, event.to_state.value, event.reason)
            for line in metric_events.for_change(seen, outcome):
                metric_events.emit(log, line)
            self.announce(outcome.job, event)
            ended = ended_attempt(outcome)
            if ended is not None:
                self.request_export(job_id, ended)
        return outcome

    def announce(self, job: Job, event: JobEvent) -> None:
        """Publish a committed change to tpujobs-status, then mark its event as announced.

        A failure is left for the reconciler, which announces every event still unmarked:
        the change itself is committed, and redelivering the message would not repeat it.
        """
        if self.status is None:
            return
        change = StatusChange(
            job.job_id,
            job.owner,
            event.from_state.value if event.from_state else None,
            event.to_state.value,
            event.reason,
            event.attempt,
            event.at,
            event.seq,
        )
        try:
            self.status.announce(change)
            self.store.mark_announced(job.job_id, event)
        except TransientError as error:
            log.warning("status of %s not announced yet (the reconciler will): %s", job.job_id, error)

    def request_export(self, job_id: str, attempt: int) -> None:
        """Ask for an ended attempt's output to be exported (`tpujobs.engine.output_export`).

        Best effort: the change is committed, and failing the handler would not repeat the
        request (a redelivered message finds nothing left to change), so a failure is only
        logged; the reconciler asks again for attempts still unexported a minute later.
        """
        if self.exports is None:
            return
        try:
            self.exports.request_export(job_id, attempt)
        except Exception:  # whatever went wrong, the job's own handling is done
            log.exception("could not request the export of %s attempt %d's logs", job_id, attempt)


Observe = Callable[[str, Observation], "Decision | Ignored"]
"""Commit an observation and act on the job's new state (`JobLifecycle.observe`). The services
below the lifecycle get it as this callable: acting on one job (admitting it, giving it a unit)
can make a new observation of it (a request that failed at once, a pool gone), acted on in turn."""

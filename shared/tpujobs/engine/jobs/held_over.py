"""Earlier attempts' holdings kept through their hosts' shutdown grace, and released after it.

A preempted attempt's hosts save on SIGTERM within Google's grace; deleting their holding
before it is over could end that save (Google does not say it would not). So the lifecycle
requests the next attempt first and keeps the lost one (`Job.held_over`, its chips counted in
its pool); `finish` releases each once its hosts are gone or its grace is over, and the
reconciler calls it every tick for the jobs that still hold one (`domain.grace`). Idempotent:
releasing what is gone is fine, and the job forgets a holding once, by compare-and-set.
"""

from __future__ import annotations

from tpujobs.domain.grace import release_due
from tpujobs.domain.job import HeldOver, Job, Source
from tpujobs.domain.states import EventKind
from tpujobs.domain.transitions import Observation
from tpujobs.engine.jobs.admission import Admission
from tpujobs.engine.jobs.attempts import AttemptCapacity
from tpujobs.engine.jobs.journal import JobJournal
from tpujobs.engine.ports import Clock, JobRecords


class HeldOverReleases:
    """Counts a held-over holding's chips while it is kept, and releases it when it is due."""

    def __init__(
        self, store: JobRecords, clock: Clock, journal: JobJournal, attempts: AttemptCapacity, admission: Admission
    ) -> None:
        self.store = store
        self.clock = clock
        self.journal = journal
        self.attempts = attempts
        self.admission = admission

    def keep(self, job: Job, held: HeldOver) -> None:
        """Count the held-over holding's chips in its pool until it is released."""
        self.admission.count_held_over(job, held)

    def finish(
        self, job_id: str, job: Job | None = None, source: Source = "reconciler", stopped: int | None = None
    ) -> list[str]:
        """Release each held-over holding of the job whose hosts are gone or whose grace is over,
        uncount its chips and record it on the job; the names released. `job`: as just read or
        committed (else read here). A holding still within its grace is read once (is it gone?).
        `stopped`: an attempt whose hosts have all said its command stopped (its save is done)."""
        job = job or self.store.get(job_id)
        if job is None:
            return []
        released: list[str] = []
        for held in job.held_over:
            why = "its hosts stopped the command" if held.attempt == stopped else self._due(held)
            if why is None:
                continue
            self.attempts.release(held.zone, held.holding)
            self.admission.uncount_held_over(held)
            reason = f"Released attempt {held.attempt}'s {held.holding}, kept until then: {why}."
            seen = Observation(EventKind.HELD_OVER_RELEASED, None, source, reason, holding=held.holding)
            self.journal.commit(job_id, seen)
            released.append(held.holding)
        return released

    def _due(self, held: HeldOver) -> str | None:
        """Why the holding may go now; None while its hosts may still be saving."""
        now = self.clock()
        if now >= held.release_after:
            return "its hosts' shutdown grace is over"
        status = self.attempts.status(held.zone, held.holding)
        state = status.state if status is not None else None
        if not release_due(held, now, state):
            return None
        return "its hosts are gone" if state is None else f"its hosts are gone ({state})"

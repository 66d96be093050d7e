"""A job's attempts, acted on: commit what an observation means, then do what the state asks.

The order is always the same: commit the decision in one transaction, then perform the actions
the job's new state implies (`converge`). A crash in between leaves a job whose record says
what should happen next; the redelivered message or the reconciler calls `converge` again and
finishes it, because every action is idempotent: capacity names are deterministic and
releasing what is gone is fine.

An engine without capacity of its own (the jobs API's) is built with a `handoff`: it commits as
any other, and then hands the job's id to the `converge` function (`ports.CapacityHandoff`), whose
own lifecycle converges it, instead of acting here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tpujobs.domain import signing
from tpujobs.domain.grace import hold_over, saving_until
from tpujobs.domain.job import Job, Source
from tpujobs.domain.quotas import QuotaBook
from tpujobs.domain.restart_rules import BACKOFF_CAP_SECONDS
from tpujobs.domain.states import ATTEMPT_LIVE, GOOGLE_QUOTA_WAITS, EventKind, JobState
from tpujobs.domain.transitions import Decision, Ignored, Observation
from tpujobs.engine import process_log
from tpujobs.engine.errors import PermanentError, QuotaExhausted
from tpujobs.engine.jobs.admission import Admission, SubmitOutcome, failed_at_once
from tpujobs.engine.jobs.attempts import AttemptCapacity, quota_capacity_state, quota_reason
from tpujobs.engine.jobs.held_over import HeldOverReleases
from tpujobs.engine.jobs.journal import JobJournal, cancellation
from tpujobs.engine.ports import CapacityHandoff, CapacityStatus, Clock, JobRecords


class WarmPoolJobs(Protocol):
    """What the lifecycle asks of the warm pools for a job of a pool (`warm_pools.PoolJobs`)."""

    def admit(self, job: Job) -> SubmitOutcome:
        """A QUEUED job of a pool: a free unit now, in the pool's order, or it waits."""

    def leave_attempt(self, job: Job) -> None:
        """An ended or recovering job's current attempt leaves its unit."""


def _sent_back_to_queue(decision: Decision) -> bool:
    """Sent back to QUEUED from a live attempt: evicted, or moved to the next zone."""
    event = decision.event
    return event.to_state is JobState.QUEUED and event.from_state in ATTEMPT_LIVE | {JobState.RECOVERING}


class JobLifecycle:
    """Observes jobs and converges them: admission, the next attempt, release at the end."""

    def __init__(
        self,
        store: JobRecords,
        clock: Clock,
        sleep: Callable[[float], None],
        journal: JobJournal,
        attempts: AttemptCapacity,
        admission: Admission,
        warm: WarmPoolJobs | None = None,
        handoff: CapacityHandoff | None = None,
    ) -> None:
        """`handoff`: where the capacity work goes after each commit (the jobs API's engine);
        None: it is done here (the functions that hold capacity)."""
        self.store = store
        self.clock = clock
        self.sleep = sleep
        self.journal = journal
        self.attempts = attempts
        self.admission = admission
        self.warm = warm  # None: no warm pools in this deployment
        self.handoff = handoff
        self.held_over = HeldOverReleases(store, clock, journal, attempts, admission)

    def observe(self, job_id: str, seen: Observation) -> Decision | Ignored:
        """Commit what an observation means for the job, then perform what its state implies."""
        process_log.bind_job(job_id)
        outcome = self.journal.commit(job_id, seen)
        if self.handoff is not None:  # committed: the converge function does the rest
            self.handoff.hand_off_job(job_id)
        elif isinstance(outcome, Decision):
            if _sent_back_to_queue(outcome):
                self.admission.left_attempt(outcome.job)
            self._act(outcome.job)  # the job as just committed: no need to read it again
        else:
            self.converge(job_id)  # nothing changed, but earlier work may be unfinished
        return outcome

    def converge(self, job_id: str) -> None:
        """Do what the job's state asks for; safe to repeat, whoever calls it and however often.

        QUEUED: request capacity. RECOVERING: request the next attempt's capacity, then
        release the lost attempt's (or keep it through its hosts' shutdown grace: `held_over`).
        Ended: release the capacity. Anything else waits for events.
        """
        if self.handoff is not None:
            self.handoff.hand_off_job(job_id)
            return
        job = self.store.get(job_id)
        if job is not None:
            self._act(job)

    def cancel(self, job_id: str, reason: str) -> Decision | Ignored:
        """Cancel a job (its caller has checked the right to) and release its capacity."""
        return self.observe(job_id, cancellation(reason))

    def admit(self, job: Job, quotas: QuotaBook | None = None) -> SubmitOutcome:
        """A QUEUED job: capacity of its own through admission, or a unit of its warm pool (handed
        off, with a `handoff`: it stays QUEUED until the converge function admits it)."""
        if self.handoff is not None:
            self.handoff.hand_off_job(job.job_id)
            return SubmitOutcome("queued", job.job_id, "queued: tpujobs asks for its capacity")
        if job.warm_pool and self.warm is not None:
            return self.warm.admit(job)
        return self.admission.admit(job, quotas)

    def _act(self, job: Job) -> None:
        if job.state is JobState.QUEUED:
            self.admit(job)
        elif job.state is JobState.RECOVERING:
            self._start_next_attempt(job)
        elif job.state.is_terminal:
            if job.warm_pool and self.warm is not None:
                self.warm.leave_attempt(job)  # its unit goes back to the pool; it had no resource of its own
            elif job.queued_resource and not self._saving(job):
                self.attempts.release(job.zone, job.queued_resource)
            for held in job.held_over:  # an ended job's holdings all go now
                self.attempts.release(held.zone, held.holding)
            self.admission.free_chips(job)

    def _saving(self, job: Job) -> bool:
        """An ended job whose last attempt Google is taking back (preempted with no restart left, or
        `on_preemption: fail`): its hosts may be saving within their grace, so the reconciler's
        sweep releases the holding after it (`grace.saving_until`). Read only when it was lost."""
        usage = job.usage_of()
        if usage is None or not usage.capacity_lost:
            return False
        lost = self.attempts.status(job.zone, job.queued_resource)
        if lost is None:
            return False
        return saving_until(job, lost.state, lost.unhealthy_hosts, self.clock()) is not None

    def _start_next_attempt(self, job: Job) -> None:
        warm = self.warm if job.warm_pool else None
        if warm is not None:  # the unit goes back (or, lost, is asked for again) now, not after the backoff
            warm.leave_attempt(job)
        if job.next_attempt_at is not None:
            wait = (job.next_attempt_at - self.clock()).total_seconds()
            if wait > 0:
                self.sleep(min(wait, BACKOFF_CAP_SECONDS))
        if warm is not None:  # the next attempt waits in the pool's queue
            self.observe(job.job_id, Observation(EventKind.POOL_REQUEUED, job.attempt, "tpu"))
            return
        following = job.as_next_attempt()
        try:  # the next attempt first: the lost one's release waits (`held_over`) or follows
            asked = self.attempts.request_or_wait(following)  # a full quota: it waits, as at admission
        except PermanentError as error:
            seen = Observation(EventKind.CAPACITY_REQUEST_FAILED, job.attempt, "tpu", reason=str(error))
            failed = self.journal.commit(job.job_id, seen)
            if isinstance(failed, Decision):
                self._act(failed.job)  # ended: its holdings are released
            return
        lost = self.attempts.status(job.zone, job.queued_resource)
        held = hold_over(job, lost.state if lost else None, lost.unhealthy_hosts if lost else 0)
        if held is not None:
            self.held_over.keep(job, held)  # its chips stay counted while it is kept
        else:  # its hosts are gone, or only tpujobs ends them: released after the request, before the
            self.attempts.release(job.zone, job.queued_resource)  # commit, so a redelivery finishes it
        status = asked.status
        seen = Observation(EventKind.NEXT_ATTEMPT_REQUESTED, job.attempt, "tpu", asked.reason, asked.capacity_state,
                           operation=status.operation, held_over=held)  # fmt: skip
        outcome = self.journal.commit(job.job_id, seen)
        if isinstance(outcome, Ignored):
            self.attempts.release_if_orphaned(following)
        else:
            self._observe_failed_at_once(job.job_id, following.attempt, status)

    def _observe_failed_at_once(self, job_id: str, attempt: int, status: CapacityStatus) -> None:
        failed = failed_at_once(attempt, status)
        if failed is not None:
            self.observe(job_id, failed)

    # -- what the reconciler asks of the lifecycle ----------------------------------------

    def request_again(self, job_id: str) -> Decision | Ignored | None:
        """Ask again for a PROVISIONING job's capacity, missing or refused for quota.

        Read first: the reconciler's listing is an outline, without the command and env the
        hosts boot with. Within the zone wait only (the reconciler checks): `requested_at`
        stays the first request's, so this never loops for ever. Refused for quota: it waits
        on, saying so once; refused for good: FAILED, as at admission.
        """
        job = self.store.get(job_id)
        if job is None or job.state is not JobState.PROVISIONING:
            return None
        try:
            status = self.attempts.request(job)
        except QuotaExhausted as error:
            seen = Observation(EventKind.REQUESTED_AGAIN, job.attempt, "reconciler",
                               quota_reason(job, error), quota_capacity_state(error))  # fmt: skip
            return self.journal.commit(job_id, seen)
        except PermanentError as error:
            seen = Observation(EventKind.CAPACITY_REQUEST_FAILED, job.attempt, "tpu", reason=str(error))
            return self.observe(job_id, seen)
        reason = ""
        if job.capacity_state in GOOGLE_QUOTA_WAITS:
            reason = f"The TPU quota in {job.zone} has room now: queued resource {job.queued_resource} requested."
        seen = Observation(EventKind.REQUESTED_AGAIN, job.attempt, "reconciler", reason, status.state.value,
                           operation=status.operation)  # fmt: skip
        outcome = self.journal.commit(job_id, seen)
        if isinstance(outcome, Ignored):
            self.attempts.release_if_orphaned(job)
        else:
            self._observe_failed_at_once(job_id, job.attempt, status)
        return outcome

    def finish_held_over(self, job_id: str, stopped: int | None = None) -> list[str]:
        """Release the job's held-over holdings whose hosts are gone or whose shutdown grace is
        over (`held_over.HeldOverReleases.finish`), and attempt `stopped`'s, whose hosts have all
        stopped its command; the names released."""
        source: Source = "reconciler" if stopped is None else "agent"
        return self.held_over.finish(job_id, source=source, stopped=stopped)

    def note_suspect_hosts(
        self, job_id: str, attempt: int, hosts: tuple[tuple[str, str], ...], reason: str
    ) -> Decision | Ignored:
        """Remember which hosts of the attempt are in a grace-gated condition, and since when
        (`Job.suspect_hosts`); the same hosts in the same conditions again write nothing."""
        seen = Observation(EventKind.HOSTS_SUSPECT, attempt, "reconciler", reason, hosts=hosts)
        return self.journal.commit(job_id, seen)

    def note_repair_failure(self, job_id: str, doing: str, error: Exception) -> Decision | Ignored:
        """Record on the job that the reconciler's repair met a permanent error: its reason and
        timeline say so (once per distinct error), its state stays, and the tick goes on."""
        reason = signing.scrub(f"The reconciler could not {doing}: {error}. It tries again at every tick.")
        return self.journal.commit(job_id, Observation(EventKind.REPAIR_FAILED, None, "reconciler", reason=reason))

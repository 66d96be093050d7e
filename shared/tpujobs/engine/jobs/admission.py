"""The quota queue: a QUEUED job gets its chips in its admission pool's order, then its capacity.

Each change is a compare-and-set on the pool's document (`Pools.change`), so concurrent calls
never hand out a chip twice: the loser reads again. A high-priority head may evict lower ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from tpujobs.domain.admission import (
    Holder,
    chips_held,
    fits,
    never_fits,
    never_fits_reason,
    pool_id,
    quota_of,
    victims_for,
    waiting_reason,
)
from tpujobs.domain.job import Job
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Decision, Ignored, Observation
from tpujobs.engine.errors import PermanentError
from tpujobs.engine.jobs.attempts import AttemptCapacity
from tpujobs.engine.jobs.journal import JobJournal, Observe
from tpujobs.engine.ports import CapacityStatus, Clock, Pools, PoolView
from tpujobs.engine.queue_rounds import QUEUE_PEEK, jittered_rounds

Quotas = Mapping[str, Mapping[str, int]]  # config/quotas: zone -> family -> chips
ADMISSION_ROUNDS = 50  # admissions (or lost races) one call may make before leaving the rest


@dataclass(frozen=True)
class SubmitOutcome:
    """What became of one submission message (or one admission)."""

    kind: Literal["provisioning", "queued", "duplicate", "rejected", "failed"]
    job_id: str | None
    reason: str


@dataclass(frozen=True)
class _PoolQueue:
    """One read of a limited pool: its document as read (for the compare-and-set), the holds
    that stay and those that go with the next write, and the jobs still waiting, in order."""

    view: PoolView
    staying: list[Holder]
    going: frozenset[str]
    waiting: list[Job]


def failed_at_once(attempt: int, status: CapacityStatus) -> Observation | None:
    """A request whose operation had already failed when it answered: a failed provisioning,
    under the job's rules (its next zone, a restart, or the end), at once."""
    if status.state != "FAILED":
        return None
    what = f"Queued resource {status.name} was never created: {status.detail}"
    return Observation(EventKind.CAPACITY_LOST, attempt, "tpu", what, "FAILED")


class Admission:
    """Admits jobs that ask for capacity of their own, in their admission pool's order."""

    def __init__(
        self,
        pools: Pools | None,
        clock: Clock,
        sleep: Callable[[float], None],
        journal: JobJournal,
        attempts: AttemptCapacity,
        observe: Observe,
    ) -> None:
        self.pools = pools  # None: no quotas, every job is admitted at once
        self.clock = clock
        self.sleep = sleep
        self.journal = journal
        self.attempts = attempts
        self.observe = observe

    def quotas(self, wanted: bool = True) -> Quotas | None:
        """The quotas, read once for a submission's size check and its admission; None without quotas."""
        return self.pools.quotas() if self.pools is not None and wanted else None

    def admit(self, job: Job, quotas: Quotas | None = None) -> SubmitOutcome:
        """A QUEUED job: request its capacity now if its pool has no quota, else in queue order.
        `quotas`: as the caller read them for this job (a submission reads them once), else read here."""
        pool = pool_id(job.spec, job.zone)
        limit = self._quota(pool) if quotas is None else quota_of(quotas, pool)
        if limit is None:
            return self.request(job)
        if never_fits(limit, job.spec.chips):
            return self._quota_exceeded(job, pool, limit)
        admitted = self.admit_waiting(pool, limit)
        if job.job_id in admitted:
            return SubmitOutcome("provisioning", job.job_id, f"admitted in {pool}")
        return SubmitOutcome("queued", job.job_id, f"waiting for quota in {pool}")

    def _quota(self, pool: str) -> int | None:
        return None if self.pools is None else quota_of(self.pools.quotas(), pool)

    def admit_waiting(self, pool: str, limit: int | None = None, leaving: frozenset[str] = frozenset()) -> list[str]:
        """Admit the pool's queue in order while its chips fit; a high-priority head may evict.

        Driven by the events that free chips (a job ends, is evicted, moves zone) and by
        submissions; the reconciler calls it too. `leaving` are jobs whose hold goes in the
        same write as the next claim. Each change is a compare-and-set on the pool's
        document, so concurrent calls never hand out a chip twice: the loser reads again.
        A head bigger than the whole quota (lowered after it was submitted) never stops the
        queue: it moves on to its next zone or fails, and the jobs behind it are looked at.
        """
        if self.pools is None:
            return []
        if limit is None:
            limit = self._quota(pool)
        admitted: list[str] = []
        for _ in jittered_rounds(ADMISSION_ROUNDS, self.sleep):
            queue = self._read_queue(pool, leaving)
            if not queue.waiting:
                if self._drop_holds(queue):
                    return admitted
                continue
            head = queue.waiting[0]
            if limit is not None and never_fits(limit, head.spec.chips):  # a quota lowered under it:
                self._quota_exceeded(head, pool, limit)  # it moves on or fails, and the queue goes on
                continue
            claim = self._claim(head)
            victims = self._victims(head, queue.staying, limit)
            if limit is not None and victims is None:  # no room, and none it may make
                if not self._drop_holds(queue):
                    continue
                self._say_waiting(head, pool, limit)
                return admitted
            for victim in victims or ():
                self._evict(victim.job_id, head)
            evicted = frozenset(v.job_id for v in victims or ())
            leaving = leaving | evicted  # until a write takes their holds away
            if not self.pools.change(queue.view, add=claim, remove=queue.going | evicted):
                continue
            leaving = frozenset()
            self.request(head)
            admitted.append(head.job_id)
            staying = [h for h in queue.staying if h.job_id not in evicted]
            if limit is not None and chips_held(staying) + claim.chips >= limit:
                return admitted  # the pool is full: no need to look at the next job
        return admitted

    def _read_queue(self, pool: str, leaving: frozenset[str]) -> _PoolQueue:
        """Read the pool's holds and the head of its queue; finish the claims a call made and
        left half-way (idempotent), and mark the holds that go with the next write: `leaving`,
        and those of a queued job's earlier attempt."""
        assert self.pools is not None
        view = self.pools.view(pool)
        held = {h.job_id: h for h in view.holders}
        peeked = self.pools.queue(pool, QUEUE_PEEK)
        claimed = [j for j in peeked if j.job_id in held and held[j.job_id].attempt == j.attempt]
        for job in claimed:
            self.request(job)
        waiting = [j for j in peeked if j not in claimed]
        stale = frozenset(j.job_id for j in waiting if j.job_id in held)
        going = (leaving | stale) & held.keys()
        staying = [h for h in view.holders if h.job_id not in going]
        return _PoolQueue(view, staying, going, waiting)

    def _drop_holds(self, queue: _PoolQueue) -> bool:
        """Take the holds that go off the pool; False when the pool changed since it was read."""
        assert self.pools is not None
        return not queue.going or self.pools.change(queue.view, remove=queue.going)

    def _claim(self, head: Job) -> Holder:
        """The hold the head of the queue takes: its chips, for its current attempt."""
        spec = head.spec
        return Holder(
            head.job_id, spec.chips, head.attempt, spec.priority, self.clock(), evictable=spec.on_preemption != "fail"
        )

    @staticmethod
    def _victims(head: Job, staying: list[Holder], limit: int | None) -> list[Holder] | None:
        """The holders the head must evict to fit: none when it fits; None when it may not
        make room (its priority evicts nobody, or evicting every lower one would not do)."""
        chips = head.spec.chips
        if limit is None or fits(limit, staying, chips):
            return []
        return victims_for(limit, staying, chips, head.spec.priority) or None

    def _say_waiting(self, head: Job, pool: str, limit: int) -> None:
        """The head waits for chips: its reason says so, once (the same words write nothing)."""
        why = waiting_reason(pool, limit, head.spec.chips)
        if head.state_reason != why:
            self.journal.commit(
                head.job_id, Observation(EventKind.WAITING_FOR_QUOTA, head.attempt, "submit", reason=why)
            )

    def _quota_exceeded(self, job: Job, pool: str, limit: int) -> SubmitOutcome:
        """A QUEUED job bigger than its pool's whole quota moves on to its next zone (and is
        admitted there, in that pool's order), or fails when it has none.

        Its current attempt never asked for capacity (a claimed job is finished before the
        head is looked at), so there is nothing to release; in the instant between a claim and
        its request, a leftover is the reconciler's to drop (a terminal job's claim and
        queued resource are stale).
        """
        why = f"The job {never_fits_reason(pool, limit, job.spec.chips)}"
        seen = Observation(EventKind.QUOTA_EXCEEDED, job.attempt, "submit", reason=why)
        outcome = self.journal.commit(job.job_id, seen)
        if isinstance(outcome, Ignored):
            return SubmitOutcome("duplicate", job.job_id, outcome.reason)
        if outcome.job.state is JobState.QUEUED:
            return self.admit(outcome.job)
        return SubmitOutcome("failed", job.job_id, outcome.event.reason)

    def _evict(self, job_id: str, by: Job) -> None:
        """Send a lower-priority job back to QUEUED so `by` fits; its capacity is released."""
        spec = by.spec
        why = f"Evicted by {by.job_id} (priority {spec.priority}), which needs {spec.chips} chips"
        outcome = self.journal.commit(job_id, Observation(EventKind.EVICTED, None, "submit", reason=why))
        if isinstance(outcome, Decision):
            self.left_attempt(outcome.job)

    def left_attempt(self, job: Job) -> None:
        """A job sent back to QUEUED (evicted, or moving zone): free what its last attempt held.
        An attempt on a warm pool's unit had no queued resource of its own (the pool's service
        takes it off the unit)."""
        previous = job.usage_of(job.attempt - 1)
        zone = (previous.zone if previous else "") or job.zone
        if previous is None or not previous.pool:
            self.attempts.release(zone, job.holding_of(job.attempt - 1))
        old_pool = pool_id(job.spec, zone)
        if old_pool != pool_id(job.spec, job.zone):
            self.drop_hold(job.job_id, old_pool)

    def free_chips(self, job: Job) -> None:
        """An ended job gives its chips back, and the next waiting jobs get them at once."""
        self.drop_hold(job.job_id, pool_id(job.spec, job.zone))

    def drop_hold(self, job_id: str, pool: str) -> None:
        """Take a holder (a job, or a warm pool's unit) off an admission pool, in the same write
        as the next admission if any."""
        if self.pools is None:
            return
        view = self.pools.view(pool)
        if any(h.job_id == job_id for h in view.holders):
            self.admit_waiting(pool, leaving=frozenset({job_id}))

    def request(self, job: Job) -> SubmitOutcome:
        """Request the attempt's capacity, then record PROVISIONING (or FAILED for good).

        A request refused because the TPU quota is exhausted is PROVISIONING too, saying so
        (`QUOTA_EXHAUSTED`): tpujobs admitted the job, Google has no room yet, and the message
        is done with (redelivering it would only end in the dead-letter topic); the reconciler
        asks again every tick, within the zone wait like any wait for capacity.
        """
        try:
            status, reason = self.attempts.request_or_wait(job)
        except PermanentError as error:
            self.journal.commit(
                job.job_id,
                Observation(EventKind.CAPACITY_REQUEST_FAILED, job.attempt, "tpu", reason=str(error)),
            )
            return SubmitOutcome("failed", job.job_id, str(error))
        seen = Observation(EventKind.ADMITTED, job.attempt, "submit", reason, status.state, operation=status.operation)
        outcome = self.journal.commit(job.job_id, seen)
        if isinstance(outcome, Decision):
            failed = failed_at_once(job.attempt, status)
            if failed is not None:
                self.observe(job.job_id, failed)
            return SubmitOutcome("provisioning", job.job_id, outcome.event.reason)
        self.attempts.release_if_orphaned(job)
        return SubmitOutcome("duplicate", job.job_id, outcome.reason)

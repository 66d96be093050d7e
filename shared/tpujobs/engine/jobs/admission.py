"""The quota queue: a QUEUED job gets its chips in its admission pool's order, then its capacity.

Each change is a compare-and-set on the pool's document (`Pools.change`), so concurrent calls
never hand out a chip twice: the loser reads again. A high-priority head may evict lower ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from tpujobs.domain.admission import (
    Holder,
    blocked_by,
    job_pool,
    never_fits_reason,
    pool_id,
    victims_for,
    waiting_reason,
)
from tpujobs.domain.grace import held_holder
from tpujobs.domain.job import HeldOver, Job
from tpujobs.domain.quotas import Limits, PoolKey, QuotaBook, Scope
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Decision, Ignored, Observation
from tpujobs.engine.errors import PermanentError
from tpujobs.engine.jobs.attempts import AttemptCapacity
from tpujobs.engine.jobs.journal import JobJournal, Observe
from tpujobs.engine.ports import CapacityStatus, Clock, Pools, PoolView
from tpujobs.engine.queue_rounds import QUEUE_PEEK, jittered_rounds

ADMISSION_ROUNDS = 50  # admissions (or lost races) one call may make before leaving the rest
# Queued jobs a read looks at when the first ones all wait in zones whose quota is full: jobs of
# other zones further back are admitted past them (a backlog longer than this in one zone hides
# them until that zone's head moves).
WIDE_PEEK = 25


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
    peeked: int = 0  # queued jobs the read returned, claims being finished included


def failed_at_once(attempt: int, status: CapacityStatus) -> Observation | None:
    """A request whose operation had already failed when it answered: a failed provisioning,
    under the job's rules (its next zone, a restart, or the end), at once."""
    if status.state != "FAILED":
        return None
    what = f"Queued resource {status.name} was never created: {status.detail}"
    return Observation(EventKind.CAPACITY_LOST, attempt, "tpu", what, "FAILED")


def _pools_held(job: Job, zone: str) -> set[str]:
    """The pools the job's earlier attempts in `zone` may hold chips of: its spec's capacity, and
    on-demand once a spot job continues on it (the switch comes between two attempts)."""
    return {pool_id(job.spec, zone, capacity) for capacity in (job.spec.capacity, job.capacity)}


def _worth_reading_further(queue: _PoolQueue, peek: int, for_zone: str, closed: set[str]) -> bool:
    """Whether jobs of other zones may wait behind those read, which all wait in closed zones:
    the read was full, and the call is not for a zone now closed."""
    return queue.peeked >= peek and peek < WIDE_PEEK and for_zone not in closed


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

    def quotas(self, wanted: bool = True) -> QuotaBook | None:
        """The quotas, read once for a submission's size check and its admission; None without quotas."""
        return self.pools.quotas() if self.pools is not None and wanted else None

    def admit(self, job: Job, quotas: QuotaBook | None = None) -> SubmitOutcome:
        """A QUEUED job: request its capacity now if its pool has no limit, else in queue order.
        `quotas`: as the caller read them for this job (a submission reads them once), else read here."""
        pool = job_pool(job)
        limits = self._limits(pool) if quotas is None else quotas.limits(pool)
        if limits.unlimited:
            return self.request(job)
        scope = limits.never_fits(job.zone, job.spec.chips)
        if scope is not None:
            return self._quota_exceeded(job, pool, limits, scope)
        admitted = self.admit_waiting(pool.id, limits, for_zone=job.zone)
        if job.job_id in admitted:
            return SubmitOutcome("provisioning", job.job_id, f"admitted in {pool.id}")
        return SubmitOutcome("queued", job.job_id, f"waiting for quota in {pool.id}")

    def _limits(self, pool: PoolKey) -> Limits:
        return Limits() if self.pools is None else self.pools.quotas().limits(pool)

    def admit_waiting(
        self, pool: str, limits: Limits | None = None, leaving: frozenset[str] = frozenset(), for_zone: str = ""
    ) -> list[str]:
        """Admit the pool's queue in order while its chips fit; a high-priority head may evict.

        Driven by the events that free chips (a job ends, is evicted, moves zone) and by
        submissions; the reconciler calls it too. `leaving` are jobs whose hold goes in the
        same write as the next claim. Each change is a compare-and-set on the pool's
        document, so concurrent calls never hand out a chip twice: the loser reads again.

        The queue is strict within each limit: a job held back by its zone's quota closes that
        zone for the rest of this call, and the jobs of other zones behind it are looked at; one
        held back by the region's quota (or a reservation's) ends the call. A job bigger than a
        whole limit (lowered after it was submitted) never stops the queue: it moves on to its
        next zone or fails, and the jobs behind it are looked at. `for_zone`: the zone whose
        chips (or job) the call is for; once that zone is closed the call reads no further (the
        chips went to that zone's head, or its job waits behind it), so a backlog in one zone
        costs an event one read of the queue's head.
        """
        if self.pools is None:
            return []
        key = PoolKey.parse(pool)
        if limits is None:
            limits = self._limits(key)
        admitted: list[str] = []
        closed: set[str] = set()  # zones whose quota holds their head back: strict within each zone
        peek = QUEUE_PEEK
        for _ in jittered_rounds(ADMISSION_ROUNDS, self.sleep):
            queue = self._read_queue(pool, leaving, peek)
            if not queue.waiting:
                if self._drop_holds(queue):
                    return admitted
                continue
            head, victims, held_back = self._next_candidate(key, limits, queue, closed)
            if head is None:
                if not self._drop_holds(queue):
                    continue
                if held_back == "zone" and _worth_reading_further(queue, peek, for_zone, closed):
                    peek = WIDE_PEEK  # every job read waits in a closed zone: look further back, once
                    continue
                return admitted
            scope = limits.never_fits(head.zone, head.spec.chips)
            if scope is not None:  # a limit lowered under it: it moves on or fails, and the queue goes on
                self._quota_exceeded(head, key, limits, scope)
                continue
            for victim in victims:
                self._evict(victim.job_id, head)
            evicted = frozenset(v.job_id for v in victims)
            leaving = leaving | evicted  # until a write takes their holds away
            claim = self._claim(head)
            if not self.pools.change(queue.view, add=claim, remove=queue.going | evicted):
                continue
            leaving = frozenset()
            self.request(head)
            admitted.append(head.job_id)
            held = [h for h in queue.staying if h.job_id not in evicted] + [claim]
            full = blocked_by(limits, held, head.zone, 1)
            if full == "region":
                return admitted  # the pool is full: no need to look at the next job
            if full == "zone":
                closed.add(head.zone)  # its zone is full: its next job waits
            behind = queue.waiting[queue.waiting.index(head) + 1 :]
            if all(j.zone in closed for j in behind) and not _worth_reading_further(queue, peek, for_zone, closed):
                return admitted  # no one else in this read may go now
        return admitted

    def _next_candidate(
        self, pool: PoolKey, limits: Limits, queue: _PoolQueue, closed: set[str]
    ) -> tuple[Job | None, list[Holder], Scope | None]:
        """The first waiting job, in order, that fits (or may evict its way in), or is bigger
        than a whole limit; the ones held back say why and close their zone (`closed`, kept
        for the rest of the call). None when the queue stops: held back by the region's
        quota, or every job read waits in a closed zone; with the scope of the last hold-back."""
        held_back: Scope | None = None
        for job in queue.waiting:
            if job.zone in closed:
                continue
            chips = job.spec.chips
            if limits.never_fits(job.zone, chips) is not None:
                return job, [], None
            scope = blocked_by(limits, queue.staying, job.zone, chips)
            if scope is None:
                return job, [], None
            victims = victims_for(limits, queue.staying, job.zone, chips, job.spec.priority)
            if victims:
                return job, victims, None
            self._say_waiting(job, pool, limits, scope)
            if scope == "region":
                return None, [], scope
            closed.add(job.zone)
            held_back = scope
        return None, [], held_back

    def _read_queue(self, pool: str, leaving: frozenset[str], peek: int = QUEUE_PEEK) -> _PoolQueue:
        """Read the pool's holds and the head of its queue; finish the claims a call made and
        left half-way (idempotent), and mark the holds that go with the next write: `leaving`,
        and those of a queued job's earlier attempt."""
        assert self.pools is not None
        view = self.pools.view(pool)
        held = {h.job_id: h for h in view.holders}
        peeked = self.pools.queue(pool, peek)
        claimed = [j for j in peeked if j.job_id in held and held[j.job_id].attempt == j.attempt]
        for job in claimed:
            self.request(job)
        waiting = [j for j in peeked if j not in claimed]
        stale = frozenset(j.job_id for j in waiting if j.job_id in held)
        going = (leaving | stale) & held.keys()
        staying = [h for h in view.holders if h.job_id not in going]
        return _PoolQueue(view, staying, going, waiting, len(peeked))

    def _drop_holds(self, queue: _PoolQueue) -> bool:
        """Take the holds that go off the pool; False when the pool changed since it was read."""
        assert self.pools is not None
        return not queue.going or self.pools.change(queue.view, remove=queue.going)

    def _claim(self, head: Job) -> Holder:
        """The hold the head of the queue takes: its chips in its zone, for its current attempt."""
        spec = head.spec
        evictable = spec.on_preemption != "fail"
        return Holder(head.job_id, spec.chips, head.attempt, spec.priority, self.clock(), evictable, head.zone)

    def _say_waiting(self, job: Job, pool: PoolKey, limits: Limits, scope: Scope) -> None:
        """A job waits for chips: its reason says so, once (the same words write nothing)."""
        why = waiting_reason(pool, scope, job.zone, limits.of(scope, job.zone) or 0, job.spec.chips)
        if job.state_reason != why:
            self.journal.commit(job.job_id, Observation(EventKind.WAITING_FOR_QUOTA, job.attempt, "submit", reason=why))

    def _quota_exceeded(self, job: Job, pool: PoolKey, limits: Limits, scope: Scope) -> SubmitOutcome:
        """A QUEUED job bigger than a whole limit of its pool moves on to its next zone (and is
        admitted there, in that pool's order), or fails when it has none. A region's quota
        sends it out of the region: its other zones share that quota.

        Its current attempt never asked for capacity (a claimed job is finished before the
        head is looked at), so there is nothing to release; in the instant between a claim and
        its request, a leftover is the reconciler's to drop (a terminal job's claim and
        queued resource are stale).
        """
        limit = limits.of(scope, job.zone) or 0
        why = f"The job {never_fits_reason(pool, scope, job.zone, limit, job.spec.chips)}"
        region = pool.region if scope == "region" and not pool.reservation else ""
        seen = Observation(EventKind.QUOTA_EXCEEDED, job.attempt, "submit", reason=why, quota_region=region)
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
        for pool in _pools_held(job, zone) - {job_pool(job).id}:
            self.drop_hold(job.job_id, pool)

    def free_chips(self, job: Job) -> None:
        """An ended job gives its chips back, and the next waiting jobs get them at once (its
        held-over holdings' too: an ended job's holdings are all released)."""
        for pool in _pools_held(job, job.zone):
            self.drop_hold(job.job_id, pool)
        for held in job.held_over:
            self.drop_hold(held_holder(held.holding), held.pool)

    def count_held_over(self, job: Job, held: HeldOver) -> None:
        """Count a lost attempt's holding, kept through its hosts' shutdown grace, in its pool
        beside the job's own hold (`held:{holding}`, never evicted): Google counts both against
        the quota until it is deleted, so the queue waits for it too. Idempotent."""
        if self.pools is None or self._limits(PoolKey.parse(held.pool)).unlimited:
            return  # no quota there: no one waits for these chips
        hold = Holder(held_holder(held.holding), held.chips, held.attempt, job.spec.priority, self.clock(),
                      evictable=False, zone=held.zone)  # fmt: skip
        for _ in range(ADMISSION_ROUNDS):
            view = self.pools.view(held.pool)
            if any(h.job_id == hold.job_id for h in view.holders) or self.pools.change(view, add=hold):
                return

    def uncount_held_over(self, held: HeldOver) -> None:
        """A held-over holding was released: its chips leave its pool, and waiting jobs get them."""
        self.drop_hold(held_holder(held.holding), held.pool)

    def drop_hold(self, job_id: str, pool: str) -> None:
        """Take a holder (a job, or a warm pool's unit) off an admission pool, in the same write
        as the next admission if any."""
        if self.pools is None:
            return
        view = self.pools.view(pool)
        for holder in view.holders:
            if holder.job_id == job_id:
                self.admit_waiting(pool, leaving=frozenset({job_id}), for_zone=holder.zone)
                return

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

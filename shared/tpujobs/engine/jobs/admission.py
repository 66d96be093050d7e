"""The quota queue: a QUEUED job gets its chips by its team's share, then its capacity.

Each round reads the pool's holders and every job waiting for it, and `domain.fair_share`
orders them: no window, so a backlog in one zone or team never hides another's job. Its
admissions (and the holders they take back) go in one compare-and-set on the pool's document
(`Pools.change`), so concurrent calls never hand out a chip twice: the loser reads again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from tpujobs.domain.admission import Holder, job_pool, never_fits_reason, pool_id
from tpujobs.domain.fair_share import Admit, Limit, Waiting, plan_round, pool_limits, team_shares
from tpujobs.domain.grace import held_holder, hold_while_stopping
from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.job import HeldOver, Job
from tpujobs.domain.quotas import Limits, PoolKey, QuotaBook, Scope
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.teams import TeamBook
from tpujobs.domain.transitions import Decision, Ignored, Observation
from tpujobs.engine.errors import PermanentError
from tpujobs.engine.jobs.attempts import AttemptCapacity
from tpujobs.engine.jobs.journal import JobJournal, Observe
from tpujobs.engine.ports import CapacityStatus, Clock, Pools, PoolView, Teams
from tpujobs.engine.queue_rounds import jittered_rounds

ADMISSION_ROUNDS = 50  # lost races one call may retry before leaving the rest to the next event


@dataclass(frozen=True)
class SubmitOutcome:
    """What became of one submission message (or one admission)."""

    kind: Literal["provisioning", "queued", "duplicate", "rejected", "failed"]
    job_id: str | None
    reason: str


@dataclass(frozen=True)
class _PoolRead:
    """One read of a limited pool: its document as read (for the compare-and-set), the holds that
    stay and those that go with the next write, and the jobs still waiting."""

    view: PoolView
    staying: list[Holder]
    going: frozenset[str]
    waiting: list[Waiting]


def failed_at_once(attempt: int, status: CapacityStatus) -> Observation | None:
    """A request whose operation had already failed when it answered: a failed provisioning,
    under the job's rules (its next zone, a restart, or the end), at once."""
    if status.state is not HoldingState.FAILED:
        return None
    what = f"Queued resource {status.name} was never created: {status.detail}"
    return Observation(EventKind.CAPACITY_LOST, attempt, "tpu", what, HoldingState.FAILED.value)


def _pools_held(job: Job, zone: str) -> set[str]:
    """The pools the job's earlier attempts in `zone` may hold chips of: its spec's capacity, and
    on-demand once a spot job continues on it (the switch comes between two attempts)."""
    return {pool_id(job.spec, zone, capacity) for capacity in (job.spec.capacity, job.capacity)}


def as_waiting(job: Job) -> Waiting:
    """A job as the queue reads it."""
    spec = job.spec
    created = job.created_at or job.updated_at
    assert created is not None, "a stored job has its creation time"
    evictable = spec.on_preemption != "fail"
    return Waiting(job.job_id, job.team, job.zone, spec.chips, spec.priority, created, job.attempt,
                   job.state_reason, evictable)  # fmt: skip


class Admission:
    """Admits jobs that ask for capacity of their own, in their pool's share order."""

    def __init__(
        self,
        pools: Pools | None,
        clock: Clock,
        sleep: Callable[[float], None],
        journal: JobJournal,
        attempts: AttemptCapacity,
        observe: Observe,
        teams: Teams | None = None,
        paused: Callable[[TeamBook], Mapping[str, str]] | None = None,
    ) -> None:
        self.pools = pools  # None: no quotas, every job is admitted at once
        self.clock = clock
        self.sleep = sleep
        self.journal = journal
        self.attempts = attempts
        self.observe = observe
        self.teams = teams  # None: no teams, one queue per limit
        self.paused = paused  # teams whose new jobs wait (over budget), with why

    def quotas(self, wanted: bool = True) -> QuotaBook | None:
        """The quotas, read once for a submission's size check and its admission; None without quotas."""
        return self.pools.quotas() if self.pools is not None and wanted else None

    def admit(self, job: Job, quotas: QuotaBook | None = None) -> SubmitOutcome:
        """A QUEUED job: request its capacity now if its pool has no limit, else in share order.
        `quotas`: as the caller read them for this job (a submission reads them once), else read here."""
        pool = job_pool(job)
        limits = self._limits(pool) if quotas is None else quotas.limits(pool)
        if limits.unlimited:
            return self.request(job)
        scope = limits.never_fits(job.zone, job.spec.chips)
        if scope is not None:
            return self._quota_exceeded(job, pool, limits, scope)
        admitted = self.admit_waiting(pool.id, limits, arriving=job)
        if job.job_id in admitted:
            return SubmitOutcome("provisioning", job.job_id, f"admitted in {pool.id}")
        return SubmitOutcome("queued", job.job_id, f"waiting for quota in {pool.id}")

    def _limits(self, pool: PoolKey, quotas: QuotaBook | None = None) -> Limits:
        if quotas is not None:
            return quotas.limits(pool)
        return Limits() if self.pools is None else self.pools.quotas().limits(pool)

    def admit_waiting(
        self,
        pool: str,
        limits: Limits | None = None,
        leaving: frozenset[str] = frozenset(),
        arriving: Job | None = None,
    ) -> list[str]:
        """Admit the pool's waiting jobs while they fit, in share order, taking back what they may.

        Driven by the events that free chips (a job ends, is evicted, moves zone) and by
        submissions; the reconciler calls it too. `leaving` are jobs whose hold goes in the same
        write as the next claims. `arriving`: a submitted job; when it could not go even with no
        one ahead of it, it says why and the queue is not read (a burst of submissions to a full
        pool costs one read each).
        """
        if self.pools is None:
            return []
        key = PoolKey.parse(pool)
        book = self.teams.teams() if self.teams is not None else TeamBook(None)
        quotas = self.pools.quotas() if limits is None or book.teams else None
        shaped = pool_limits(limits or self._limits(key, quotas), key.region, book.shares_of(key))
        paused = self.paused(book) if self.paused is not None else {}
        elsewhere: dict[str, float] | None = None
        for _ in jittered_rounds(ADMISSION_ROUNDS, self.sleep):
            read = self._read(pool, leaving, arriving, shaped, paused)
            if read is None:
                return []
            if elsewhere is None:
                elsewhere = self._shares_elsewhere(book, key, quotas) if any(lim.shares for lim in shaped) else {}
            plan = plan_round(key, shaped, read.staying, read.waiting, paused, elsewhere)
            for job in plan.too_big:
                self._set_aside(job, key)
            self._say_waiting(read.waiting, plan.held_back)
            if not plan.admitted:
                if not read.going or self.pools.change(read.view, remove=read.going):
                    return []
                continue
            if any(admit.evicted or admit.reclaimed for admit in plan.admitted):
                self._take_back(plan.admitted)  # then read again: a stopping holder keeps its chips
                leaving = frozenset()
                continue
            claims = [self._claim(admit.job) for admit in plan.admitted]
            if not self.pools.change(read.view, add=claims, remove=read.going):
                continue
            for admit in plan.admitted:
                self._request_by_id(admit.job.job_id)
            return [admit.job.job_id for admit in plan.admitted]
        return []

    def _shares_elsewhere(self, book: TeamBook, here: PoolKey, quotas: QuotaBook | None) -> dict[str, float]:
        """Each team's highest weighted share in the other pools its teams have shares of (one
        read of each): borrowers are ordered by their dominant share, across families."""
        assert self.pools is not None
        found: dict[str, float] = {}
        quotas = quotas or self.pools.quotas()
        for other in sorted({s.pool for team in book.teams for s in team.shares} - {here}, key=lambda k: k.id):
            shaped = pool_limits(quotas.limits(other), other.region, book.shares_of(other))
            for team, share in team_shares(shaped, self.pools.view(other.id).holders).items():
                found[team] = max(found.get(team, 0.0), share)
        return found

    def _read(
        self, pool: str, leaving: frozenset[str], arriving: Job | None, shaped: list[Limit], paused: Mapping[str, str]
    ) -> _PoolRead | None:
        """Read the pool's holds and its queue; finish the claims a call made and left half-way
        (idempotent), and mark the holds that go with the next write: `leaving`, and those of a
        queued job's earlier attempt. None: the `arriving` job waits, and said why."""
        assert self.pools is not None
        view = self.pools.view(pool)
        held = {h.job_id: h for h in view.holders}
        if arriving is not None:
            mine = held.get(arriving.job_id)
            if mine is not None and mine.attempt == arriving.attempt:
                self.request(arriving)  # claimed by an earlier delivery: finish it
                return None
            alone = as_waiting(arriving)
            solo = plan_round(PoolKey.parse(pool), shaped, [h for h in view.holders if h.job_id not in leaving],
                              [alone], paused)  # fmt: skip
            if not solo.admitted:
                self._say_waiting([alone], solo.held_back)
                return None
        queued = self.pools.waiting(pool)
        claimed = [w for w in queued if w.job_id in held and held[w.job_id].attempt == w.attempt]
        for job in claimed:
            self._request_by_id(job.job_id)
        waiting = [w for w in queued if w not in claimed]
        stale = frozenset(w.job_id for w in waiting if w.job_id in held)
        going = (leaving | stale) & held.keys()
        staying = [h for h in view.holders if h.job_id not in going]
        return _PoolRead(view, staying, going, waiting)

    def _take_back(self, admitted: tuple[Admit, ...]) -> None:
        """Send the holders the round takes back to QUEUED: evicted by a higher priority of their
        team, or reclaimed by a team under its nominal share. A running one's hosts are asked to
        stop its command (its save on SIGTERM is not cut short), and its holding stays counted,
        held over, until they have (`domain.grace.hold_while_stopping`); any other is released."""
        for admit in admitted:
            by = admit.job
            for victim in admit.evicted:
                why = f"Evicted by {by.job_id} (priority {by.priority}), which needs {by.chips} chips"
                self._send_back(victim.job_id, EventKind.EVICTED, why)
            for victim in admit.reclaimed:
                self._send_back(
                    victim.job_id, EventKind.RECLAIMED, f"Reclaimed by {by.team} (its nominal share), for {by.job_id}"
                )

    def _send_back(self, job_id: str, kind: EventKind, why: str) -> None:
        job = self.journal.store.get(job_id)
        if job is None:
            return
        held = hold_while_stopping(job, self.clock())
        outcome = self.journal.commit(job_id, Observation(kind, None, "submit", reason=why, held_over=held))
        if not isinstance(outcome, Decision):
            return
        if held is None:
            self.left_attempt(outcome.job)
            return
        self.count_held_over(outcome.job, held)
        unasked = self.attempts.ask_to_stop(job, why)
        if unasked is not None:  # a delete stops them too, with less time: better than waiting it out
            self.attempts.release(held.zone, held.holding)
            said = f"Released attempt {held.attempt}'s {held.holding} at once: its hosts could not be asked to stop"
            said += f" ({unasked})."
            self.journal.commit(
                job_id, Observation(EventKind.HELD_OVER_RELEASED, None, "submit", said, holding=held.holding)
            )
            self.uncount_held_over(held)
        for pool in _pools_held(outcome.job, job.zone) - {job_pool(outcome.job).id}:
            self.drop_hold(job_id, pool)

    def _request_by_id(self, job_id: str) -> None:
        job = self.journal.store.get(job_id)
        if job is not None and job.state is JobState.QUEUED:
            self.request(job)

    def _set_aside(self, waiting: Waiting, pool: PoolKey) -> None:
        """A waiting job bigger than a whole limit now (lowered after it was submitted)."""
        job = self.journal.store.get(waiting.job_id)
        if job is None or job.state is not JobState.QUEUED:
            return
        limits = self._limits(pool)
        scope = limits.never_fits(job.zone, job.spec.chips)
        if scope is not None:
            self._quota_exceeded(job, pool, limits, scope)

    def _claim(self, job: Waiting) -> Holder:
        """The hold an admitted job takes: its chips in its zone, for its current attempt, in its team."""
        return Holder(job.job_id, job.chips, job.attempt, job.priority, self.clock(), job.evictable, job.zone, job.team)

    def _say_waiting(self, waiting: list[Waiting], held_back: Mapping[str, str]) -> None:
        """Jobs wait for chips: each says why, once (the same words write nothing)."""
        for job in waiting:
            why = held_back.get(job.job_id)
            if why is not None and job.state_reason != why:
                seen = Observation(EventKind.WAITING_FOR_QUOTA, job.attempt, "submit", reason=why)
                self.journal.commit(job.job_id, seen)

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
                      evictable=False, zone=held.zone, team=job.team)  # fmt: skip
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
                self.admit_waiting(pool, leaving=frozenset({job_id}))
                return

    def request(self, job: Job) -> SubmitOutcome:
        """Request the attempt's capacity, then record PROVISIONING (or FAILED for good).

        A request refused because the TPU quota is exhausted is PROVISIONING too, saying so
        (`QUOTA_EXHAUSTED`): tpujobs admitted the job, Google has no room yet, and the message
        is done with (redelivering it would only end in the dead-letter topic); the reconciler
        asks again every tick, within the zone wait like any wait for capacity.
        """
        try:
            asked = self.attempts.request_or_wait(job)
        except PermanentError as error:
            self.journal.commit(
                job.job_id,
                Observation(EventKind.CAPACITY_REQUEST_FAILED, job.attempt, "tpu", reason=str(error)),
            )
            return SubmitOutcome("failed", job.job_id, str(error))
        status = asked.status
        seen = Observation(EventKind.ADMITTED, job.attempt, "submit", asked.reason, asked.capacity_state,
                           operation=status.operation)  # fmt: skip
        outcome = self.journal.commit(job.job_id, seen)
        if isinstance(outcome, Decision):
            failed = failed_at_once(job.attempt, status)
            if failed is not None:
                self.observe(job.job_id, failed)
            return SubmitOutcome("provisioning", job.job_id, outcome.event.reason)
        self.attempts.release_if_orphaned(job)
        return SubmitOutcome("duplicate", job.job_id, outcome.reason)

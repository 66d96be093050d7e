"""The reconciler: level-based repair of whatever the events missed.

There is no preemption event in Cloud Logging, a host can die without a word, and a
handler can die between its commit and its action. On every tick (Cloud Scheduler,
every minute; every few seconds in the local stack) the reconciler reads what is, the
active jobs from Firestore and the queued resources of their zones from the TPU API,
compares, and repairs through the same service the event functions use:

- a PROVISIONING job whose queued resource is missing gets it requested again, within the
  zone wait only (counted from its first request): a create whose operation failed, or a
  resource that never appears, then moves the job to its next zone or ends the attempt by
  its rules; a job waiting for TPU quota (`QUOTA_EXHAUSTED`) is asked for again every tick,
  and moves on when the zone wait allows;
- a queued resource that is SUSPENDED, FAILED, or has lost hosts becomes the
  observation the event functions would have received (the job recovers by its rules);
- a host whose node is in a condition that often passes (health TIMEOUT, state RESTARTING,
  UNKNOWN: `adapters.tpu.NODE_STATES`) is remembered on the job with the time it was first
  seen so (`suspect_hosts`), and is lost only once that lasts past the grace;
- a RUNNING job whose queued resource vanished has lost its capacity;
- a RUNNING attempt whose worker stopped sending heartbeats for longer than the
  timeout (several heartbeats) has lost that host;
- capacity ACTIVE while a host's agent never reported, for longer than the boot timeout
  (from the first host's `started`, else from the capacity becoming ACTIVE), has lost that
  host: paid capacity is never held silently;
- a job past its `time_limit` or `attempt_time_limit` ends FAILED and its capacity is released;
- a RUNNING attempt none of whose workers printed a line or reported a checkpoint within its
  `hang_timeout` is hung, and `on_hang` decides (`tpujobs.domain.limits`);
- QUEUED and RECOVERING jobs untouched for a while are converged (a crashed handler);
- a tpujobs queued resource that no live attempt owns is deleted.

It acts only on what it saw and confirmed: a zone whose listing failed is skipped this
tick, so an API error never looks like a lost resource; a vanished resource is read
again before it counts; one missed heartbeat is not a silent worker.

Nothing one job does stops the tick: every job and every item of a later phase (pools,
exports, silent workers, hosts that never reported, announcements, unowned resources) is
repaired on its own. A transient error leaves that item for the next tick; a permanent one
is recorded on its job (`JobService.note_repair_failure`: the job's reason and timeline,
where its owner looks, once per distinct error); anything unexpected is logged, and the next
item and the next phase still run. Only the listing of active jobs, without which nothing
can be compared, ends a tick.

Its cost is O(active jobs): one query per 500 active jobs, projected to what is compared
(never a job's env, command or setup, so memory does not grow with what users write), two
list calls per zone (queued resources and nodes), one query that returns only silent
workers, whatever the number of finished jobs; and, once per multi-host attempt past its
boot timeout, one read of its workers' documents; and, per tick, one such read for each RUNNING
attempt with a `hang_timeout` whose last known sign of progress (start, checkpoint) is older than it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

from tpujobs.domain import limits
from tpujobs.domain.admission import Holder, pool_id
from tpujobs.domain.job import Job, JobEvent
from tpujobs.domain.naming import exported_attempt, parse_queued_resource_name
from tpujobs.domain.states import QUOTA_EXHAUSTED, EventKind, JobState
from tpujobs.domain.transitions import Decision, Observation, next_zone
from tpujobs.domain.warm_pools import QUOTA_HELD, Pool
from tpujobs.errors import PermanentError, TransientError
from tpujobs.ports import (
    CapacityStatus,
    Clock,
    JobStore,
    LogExportRequests,
    Pools,
    SilentWorker,
    StatusPublisher,
    Tpu,
)
from tpujobs.service import CAPACITY_GONE, JobService
from tpujobs.warm_pools import parse_unit_holder

if TYPE_CHECKING:
    from tpujobs.config import Settings

log = logging.getLogger(__name__)

# Queued-resource states that mean "no capacity yet" (a zone failover may end the wait).
WAITING_FOR_CAPACITY = frozenset({"CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES"})
EXPORT_GRACE_S = 60.0  # an export asked for by the handler has had this long to finish
EXPORT_WINDOW_S = 600.0  # after that, the reconciler asks again for this long
PRUNE_PER_TICK = 100  # expired jobs deleted per tick: a backlog drains over a few ticks
ANNOUNCE_AFTER_S = 10.0  # a change newer than this is still being announced by its handler


@dataclass
class ReconcileReport:
    """What one tick saw and did, for logs and tests."""

    jobs: int = 0
    zones_listed: int = 0
    zones_skipped: list[str] = field(default_factory=list)
    observed: list[str] = field(default_factory=list)  # "job: what was observed"
    re_requested: list[str] = field(default_factory=list)
    converged: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    announced: list[str] = field(default_factory=list)  # "job#seq" of late status messages
    failed: list[str] = field(default_factory=list)  # "what: error" of items that failed for good
    pruned: list[str] = field(default_factory=list)  # jobs deleted past their expire_at


class Reconciler:
    """Compares stored jobs with observed queued resources and repairs the difference."""

    def __init__(
        self,
        service: JobService,
        store: JobStore,
        tpu: Tpu,
        settings: Settings,
        clock: Clock,
        pools: Pools | None = None,
        exports: LogExportRequests | None = None,
        status: StatusPublisher | None = None,
    ) -> None:
        """Reads through the ports it is given; repairs through `service`, the one that acts
        for the event functions (so give it the same ports: `runtime` does).
        No `pools`: admission is off; no `exports` or `status`: nothing to ask again."""
        self.service = service
        self.store = store
        self.tpu = tpu
        self.settings = settings
        self.clock = clock
        self.pools = pools
        self.exports = exports
        self.status = status
        self._limited: set[str] = set()  # pools with a quota, read once per tick

    def tick(self) -> ReconcileReport:
        report = ReconcileReport()
        jobs = self.store.list_active()  # without it nothing can be compared: its error ends the tick
        report.jobs = len(jobs)
        warm_pools = self._read_warm_pools(report)
        # Every zone an active job may have used (an attempt that moved zone leaves one behind),
        # and every zone of a warm pool.
        zones = sorted(
            {job.zone for job in jobs}
            | {zone for job in jobs for zone in job.spec.preferred_zones}
            | {zone for pool in warm_pools for zone in (*pool.zones, *(u.zone for u in pool.units))}
            | {self.settings.default_zone}
        )
        seen: dict[tuple[str, str], CapacityStatus] = {}
        for zone in zones:
            try:
                for status in self.tpu.list_capacity(zone):
                    seen[(zone, status.name)] = status
                report.zones_listed += 1
            except Exception as error:  # whatever it was, this zone's jobs wait for the next tick
                log.warning("reconcile: skipping zone %s this tick: %s", zone, error)
                report.zones_skipped.append(zone)

        now = self.clock()
        stuck_before = now - timedelta(seconds=self.settings.stuck_after_seconds)
        self._limited = set()
        self._phase(report, "read the quotas", self._read_limited_pools)
        for job in jobs:
            if job.zone in report.zones_skipped:
                continue
            repair = partial(self._repair, job, seen.get((job.zone, job.queued_resource)), stuck_before, report)
            self._guarded(report, "repair the job", repair, job.job_id)

        live = {job.job_id: job for job in jobs}
        self._phase(report, "repair the pools", lambda: self._repair_pools(report))
        self._phase(report, "repair the warm pools", lambda: self._repair_warm_pools(warm_pools, seen, live, report))
        self._phase(report, "ask again for exports", lambda: self._request_missing_exports(jobs, now, report))
        self._phase(report, "find silent workers", lambda: self._find_silent_workers(live, now, report))
        self._phase(
            report, "find hosts that never reported", lambda: self._find_hosts_that_never_reported(jobs, now, report)
        )
        self._phase(report, "enforce time limits", lambda: self._enforce_time_limits(jobs, now, report))
        self._phase(report, "find hung attempts", lambda: self._find_hung_attempts(jobs, now, report))
        self._phase(report, "announce missed changes", lambda: self._announce_missed(now, report))
        self._phase(report, "release unowned resources", lambda: self._release_unowned(seen, live, report))
        self._phase(report, "delete expired jobs", lambda: self._prune_expired(now, report))
        return report

    def _read_warm_pools(self, report: ReconcileReport) -> list[Pool]:
        """Every warm pool, read once a tick; none when the service has no pools or the read
        failed (then the pools wait for the next tick, and the jobs' repair goes on)."""
        warm = self.service.warm
        if warm is None:
            return []
        try:
            return warm.store.list_pools()
        except Exception as error:
            log.warning("reconcile: could not read the warm pools this tick: %s", error)
            report.failed.append(f"read the warm pools: {error}")
            return []

    def _repair_warm_pools(
        self,
        warm_pools: list[Pool],
        seen: dict[tuple[str, str], CapacityStatus],
        live: dict[str, Job],
        report: ReconcileReport,
    ) -> None:
        """Each warm pool made what its document says (`WarmPoolService.repair`): units asked
        for, ready, lost, told, released; a unit whose job is gone freed, a job whose unit is gone
        lost; then the queue filled. Then unit queued resources no pool owns are released."""
        warm = self.service.warm
        if warm is None:
            return
        by_name = {name: status for (_, name), status in seen.items()}
        for pool in warm_pools:
            repair = partial(self._repair_warm_pool, pool, by_name, live, report)
            self._guarded(report, f"repair warm pool {pool.name}", repair)
        known = {pool.name: pool for pool in warm_pools}
        leftovers = partial(self._release_unit_leftovers, by_name, known, report)
        self._guarded(report, "release warm-pool leftovers", leftovers)

    def _repair_warm_pool(
        self, pool: Pool, seen: dict[str, CapacityStatus], live: dict[str, Job], report: ReconcileReport
    ) -> None:
        assert self.service.warm is not None
        report.observed += self.service.warm.repair(pool, seen, live)

    def _release_unit_leftovers(
        self, seen: dict[str, CapacityStatus], known: dict[str, Pool], report: ReconcileReport
    ) -> None:
        assert self.service.warm is not None
        report.released += self.service.warm.release_leftovers(seen, known)

    def _prune_expired(self, now: datetime, report: ReconcileReport) -> None:
        """Ended jobs past their `expire_at` go with their timeline, workers and attempts, a
        bounded number per tick: Firestore's TTL would leave the subcollections behind."""
        report.pruned += self.store.prune_expired_jobs(now, limit=PRUNE_PER_TICK)

    def _phase(self, report: ReconcileReport, doing: str, phase: Callable[[], None]) -> None:
        """Run one phase; whatever escapes it is logged, and the next phase still runs."""
        try:
            phase()
        except TransientError as error:  # its query failed: the next tick runs it again
            log.warning("reconcile: could not %s this tick: %s", doing, error)
        except Exception as error:
            log.exception("reconcile: could not %s this tick", doing)
            report.failed.append(f"{doing}: {error}")

    def _guarded(
        self, report: ReconcileReport, doing: str, action: Callable[[], None], job_id: str | None = None
    ) -> None:
        """Do one item's repair; its failure is that item's alone.

        Transient: left for the next tick. Permanent: recorded on the job (`job_id`), where its
        owner looks, once per distinct error. Anything else: logged with its traceback.
        """
        what = f"{job_id}: {doing}" if job_id else doing
        try:
            action()
        except TransientError as error:
            log.warning("reconcile: %s left for the next tick: %s", what, error)
        except PermanentError as error:
            log.error("reconcile: %s failed for good: %s", what, error)
            report.failed.append(f"{what}: {error}")
            if job_id is not None:
                try:
                    self.service.note_repair_failure(job_id, doing, error)
                except Exception:
                    log.exception("reconcile: could not record on %s why its repair failed", job_id)
        except Exception as error:
            log.exception("reconcile: %s failed unexpectedly", what)
            report.failed.append(f"{what}: {error!r}")

    def _repair(self, job: Job, status: CapacityStatus | None, stuck_before: datetime, report: ReconcileReport) -> None:
        service = self.service
        if job.state in (JobState.QUEUED, JobState.RECOVERING):
            limited = pool_id(job.spec, job.zone) in self._limited and not job.warm_pool
            if job.state is JobState.QUEUED and limited:
                return  # waits for quota: its pool is admitted once, in _repair_pools
            if job.updated_at is None or job.updated_at < stuck_before:
                service.converge(job.job_id)
                report.converged.append(job.job_id)
            return
        if job.warm_pool:
            return  # on a warm pool's unit (or waiting for one): the warm pools' phase compares it
        if status is None:
            if job.state is JobState.PROVISIONING:
                self._provision_missing(job, report)
            elif self.tpu.status(job.zone, job.queued_resource) is None:  # confirm first
                what = f"queued resource {job.queued_resource} no longer exists"
                service.observe_capacity(job.queued_resource, "SUSPENDED", what, source="reconciler")
                report.observed.append(f"{job.job_id}: {what}")
            return
        lost = status.state in CAPACITY_GONE or status.unhealthy_hosts > 0
        changed = job.state is JobState.PROVISIONING and status.state != job.capacity_state
        if self._waited_too_long(job, status):
            waited = (self.clock() - job.requested_at).total_seconds() if job.requested_at else 0
            what = f"Queued resource {job.queued_resource} waited {waited / 60:.0f} min for capacity"
            service.observe(job.job_id, Observation(EventKind.ZONE_FAILOVER, job.attempt, "reconciler", reason=what))
            report.observed.append(f"{job.job_id}: {what}")
            return
        if lost or changed:
            service.observe_capacity(
                status.name, status.state, status.detail, status.unhealthy_hosts, source="reconciler"
            )
            report.observed.append(f"{job.job_id}: {status.state}")
        if not lost and (status.suspect_hosts or job.suspect_hosts):
            self._watch_suspect_hosts(job, status, report)

    def _provision_missing(self, job: Job, report: ReconcileReport) -> None:
        """A PROVISIONING job without its queued resource: ask again, within the zone wait.

        Waiting for TPU quota, nothing was made: ask again (the quota may have room now) until
        the zone wait moves the job to its next zone; in its last zone it waits on, saying so.
        Otherwise the create was made: read the resource again (it may be newer than the
        listing), then what its operation said. A failed create is a failed provisioning, under
        the job's rules; a resource still missing is asked for again until the zone wait is
        over, then moves the job to its next zone or ends the attempt by its rules. So a job is
        never asked for again and again for ever.
        """
        service = self.service
        quota = job.capacity_state == QUOTA_EXHAUSTED
        if not quota and self.tpu.status(job.zone, job.queued_resource) is not None:
            return  # created since the listing: the next tick compares it
        failed = None if quota else self.tpu.create_error(job.create_operation)
        if failed:
            what = f"Queued resource {job.queued_resource} was never created: {failed}"
            service.observe(job.job_id, Observation(EventKind.CAPACITY_LOST, job.attempt, "reconciler", what, "FAILED"))
            report.observed.append(f"{job.job_id}: {what}")
            return
        waited = (self.clock() - job.requested_at).total_seconds() if job.requested_at else 0.0
        if waited > self.settings.zone_wait_seconds and (not quota or next_zone(job) is not None):
            if quota:
                what = f"The TPU quota had no room for {waited / 60:.0f} min"
                seen = Observation(EventKind.ZONE_FAILOVER, job.attempt, "reconciler", reason=what)
            else:
                what = (
                    f"Queued resource {job.queued_resource} never appeared "
                    f"in the {waited / 60:.0f} min after its request"
                )
                seen = Observation(EventKind.CAPACITY_LOST, job.attempt, "reconciler", what, "FAILED")
            service.observe(job.job_id, seen)
            report.observed.append(f"{job.job_id}: {what}")
            return
        outcome = service.request_again(job.job_id)
        report.re_requested.append(job.queued_resource)
        if isinstance(outcome, Decision):
            report.observed.append(f"{job.job_id}: {outcome.event.reason}")

    def _watch_suspect_hosts(self, job: Job, status: CapacityStatus, report: ReconcileReport) -> None:
        """Remember since when each host has been in a condition that often passes; a host whose
        condition outlasts the grace is lost, under the job's rules like any lost host."""
        service = self.service
        grace = self.settings.unhealthy_grace_seconds
        hosts = tuple(sorted(status.suspect_hosts))
        if hosts != tuple((h.node, h.condition) for h in job.suspect_hosts):
            if hosts:
                said = "; ".join(f"node {node} is {condition}" for node, condition in hosts)
                reason = f"Watching: {said}; a host is lost if its condition lasts {grace:.0f} s."
            else:
                reason = f"Every host of attempt {job.attempt} is back to a definite, healthy state."
            outcome = service.note_suspect_hosts(job.job_id, job.attempt, hosts, reason)
            if isinstance(outcome, Decision):
                job = outcome.job  # with the times each was first seen
                report.observed.append(f"{job.job_id}: {reason}")
        now = self.clock()
        still = {node for node, _ in hosts}  # never a host this listing shows recovered
        lost = [h for h in job.hosts_lost_after(grace, now) if h.node in still]
        if lost:
            said = ", ".join(
                f"node {h.node} has been {h.condition} for {(now - h.first_seen_at).total_seconds():.0f} s"
                for h in lost
            )
            what = f"{said[0].upper()}{said[1:]}, past the {grace:.0f} s grace: the host is lost"
            service.observe(job.job_id, Observation(EventKind.CAPACITY_LOST, job.attempt, "reconciler", reason=what))
            report.observed.append(f"{job.job_id}: {what}")

    def _request_missing_exports(self, active: list[Job], now: datetime, report: ReconcileReport) -> None:
        """Ask again for the export of attempts that ended a while ago and are not exported.

        The handler that ended an attempt asks once, best effort. Here each attempt that
        held capacity and ended between EXPORT_GRACE_S and EXPORT_GRACE_S + EXPORT_WINDOW_S
        ago, newer than the job's latest exported one, is asked for again at every tick of
        that window: the export is idempotent, and an attempt without output stays as it is.
        """
        service = self.service
        if self.exports is None:
            return
        newest = now - timedelta(seconds=EXPORT_GRACE_S)
        oldest = newest - timedelta(seconds=EXPORT_WINDOW_S)
        ended = self.store.ended_between(oldest, newest)
        for job in [*active, *ended]:
            exported = exported_attempt(job.log_uri) or 0
            for usage in job.usage:
                due = usage.ended_at is not None and oldest <= usage.ended_at < newest
                if due and usage.held_from is not None and usage.attempt > exported:
                    service.request_export(job.job_id, usage.attempt)
                    report.observed.append(f"{job.job_id}: export of attempt {usage.attempt} asked again")

    def _waited_too_long(self, job: Job, status: CapacityStatus) -> bool:
        """Still waiting for capacity past the limit, with another zone of `zones` to try."""
        limit = self.settings.zone_wait_seconds
        return (
            job.state is JobState.PROVISIONING
            and status.state in WAITING_FOR_CAPACITY
            and job.requested_at is not None
            and (self.clock() - job.requested_at).total_seconds() > limit
            and next_zone(job) is not None
        )

    def _read_limited_pools(self) -> None:
        """The pools that have a quota now; none when admission is off or the quotas unreadable
        (then QUEUED jobs are converged one by one, which admits them in their pool's order)."""
        pools = self.pools
        if pools is not None:
            quotas = pools.quotas()
            self._limited = {f"{family}@{zone}" for zone, limits in quotas.items() for family in limits}

    def _repair_pools(self, report: ReconcileReport) -> None:
        """Make each limited pool's holders match its jobs, then admit what fits.

        A holder whose job ended, vanished, moved to another pool or was requeued (a claim
        for an older attempt) is dropped; a job that holds capacity without a claim (it was
        admitted before the quota existed) is counted. A claim left half-way is finished.
        """
        pools = self.pools
        if pools is None:
            return
        for pool in sorted(set(pools.pools()) | self._limited):
            self._guarded(report, f"repair pool {pool}", partial(self._repair_pool, pool, report))

    def _repair_pool(self, pool: str, report: ReconcileReport) -> None:
        service = self.service
        pools = self.pools
        assert pools is not None
        view = pools.view(pool)
        active = {job.job_id: job for job in pools.active_in(pool)}
        stale = {h.job_id for h in view.holders if h.job_id not in active and self._stale(h, pool)}
        held = {h.job_id for h in view.holders}
        for job in active.values():
            if job.job_id not in held:
                claim = Holder(
                    job.job_id,
                    job.spec.chips,
                    job.attempt,
                    job.spec.priority,
                    job.created_at or self.clock(),
                    job.spec.on_preemption != "fail",
                )
                if pools.change(view, add=claim, remove=frozenset(stale)):
                    report.observed.append(f"{pool}: counted {job.job_id}")
                    view, stale = pools.view(pool), set()
        if stale and pools.change(view, remove=frozenset(stale)):
            report.observed.append(f"{pool}: dropped {', '.join(sorted(stale))}")
        service.admit_waiting(pool)

    def _stale(self, holder: Holder, pool: str) -> bool:
        """A claim whose job ended, vanished, moved pool or was requeued (an older attempt's);
        a warm pool's unit that no longer asks for or holds capacity. Only holders not among the
        pool's active jobs get here: one read each."""
        unit_of = parse_unit_holder(holder.job_id)
        if unit_of is not None:
            warm = self.service.warm
            found = warm.store.get(unit_of[0]) if warm is not None else None
            unit = found.unit(unit_of[1]) if found is not None else None
            return unit is None or unit.state not in QUOTA_HELD
        job = self.store.get(holder.job_id)
        return (
            job is None
            or job.state.is_terminal
            or pool_id(job.spec, job.zone) != pool
            or (job.state is JobState.QUEUED and job.attempt != holder.attempt)
        )

    def _find_silent_workers(self, live: dict[str, Job], now: datetime, report: ReconcileReport) -> None:
        """A RUNNING attempt whose worker is past its `silent_after` deadline is lost.

        Each report that marks a host live moves its deadline to at least the heartbeat timeout
        and two of its own heartbeat periods later (`service.silent_after`), so one late or
        lost heartbeat never counts; a host worker 0 of its slice speaks for has no deadline
        here (worker 0 reports it at once: `peer_silent`); workers of attempts that are over
        are retired, so each is looked at once.
        """
        for silent in self.store.silent_workers(now):
            doing = f"act on the silence of worker {silent.worker} of attempt {silent.attempt}"
            self._guarded(report, doing, partial(self._silent_worker, silent, live, now, report), silent.job_id)

    def _silent_worker(
        self, silent: SilentWorker, live: dict[str, Job], now: datetime, report: ReconcileReport
    ) -> None:
        service = self.service
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
        seen = Observation(EventKind.CAPACITY_LOST, silent.attempt, "reconciler", reason=what, worker=silent.worker)
        service.observe(silent.job_id, seen)
        report.observed.append(f"{silent.job_id}: {what}")

    def _find_hosts_that_never_reported(self, jobs: list[Job], now: datetime, report: ReconcileReport) -> None:
        """An attempt holding capacity whose hosts have not all reported within the boot timeout
        has lost the silent ones: the job's rules decide what follows, as for any lost host.

        Counted from the first host's `started` when one said it (the others boot alongside),
        else from the capacity becoming ACTIVE (no agent at all: the hosts never booted it).

        What it costs: `Job.booting_since` is pure, on the jobs the tick already listed, so an
        attempt within its timeout, or whose hosts are all known up, costs nothing. Only an
        attempt past its timeout and not yet known up has its worker documents read (one
        query, one document per host that ever reported). Then either some host is missing
        and the attempt is lost, or every host is there and that is noted on the attempt's
        usage (`all_started_at`), so no tick reads it again. A single-host attempt is noted by
        its `started` itself, and never read. That is one read per host per multi-host attempt,
        once, after its timeout, never a read per job per tick.
        """
        timeout = self.settings.boot_timeout_seconds
        for job in jobs:
            since = job.booting_since()
            if since is not None and (now - since).total_seconds() > timeout:
                check = partial(self._check_boot, job, since, now, report)
                self._guarded(report, "check that its hosts booted", check, job.job_id)

    def _check_boot(self, job: Job, since: datetime, now: datetime, report: ReconcileReport) -> None:
        service = self.service
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
        seen = Observation(EventKind.CAPACITY_LOST, job.attempt, "reconciler", reason=what, worker=one)
        service.observe(job.job_id, seen)
        report.observed.append(f"{job.job_id}: {what}")

    def _enforce_time_limits(self, jobs: list[Job], now: datetime, report: ReconcileReport) -> None:
        """A job past its `time_limit` or `attempt_time_limit` ends FAILED, naming the limit and
        the time used; ending releases its capacity (its workers get SIGTERM, then SIGKILL after
        the grace). Pure arithmetic on the listed jobs: no read, whatever the number of jobs."""
        for job in jobs:
            reached = limits.limit_reached(job, now)
            if reached is not None:
                enforce = partial(self._end_for_limit, job, reached, report)
                self._guarded(report, f"enforce its {reached.limit}", enforce, job.job_id)

    def _end_for_limit(self, job: Job, reached: limits.LimitReached, report: ReconcileReport) -> None:
        what = f"{reached.reason}."
        seen = Observation(EventKind.TIME_LIMIT_REACHED, job.attempt, "reconciler", reason=what, limit=reached.limit)
        self.service.observe(job.job_id, seen)
        report.observed.append(f"{job.job_id}: {what}")

    def _find_hung_attempts(self, jobs: list[Job], now: datetime, report: ReconcileReport) -> None:
        """A RUNNING attempt none of whose workers printed a line or reported a checkpoint within
        its `hang_timeout` is hung: `on_hang` decides, within `max_restarts`.

        What it costs: `limits.might_hang` is pure, on the listed job (its attempt's start and
        last checkpoint), so only an attempt with a hang_timeout and no sign of progress the job
        itself knows of within it has its workers' documents read (one query, one document per
        host). A job that keeps printing is read once a tick once its last checkpoint is older
        than its hang_timeout: the last-output times live on the worker documents, which
        heartbeats write, never on the job's.
        """
        for job in jobs:
            if limits.might_hang(job, now):
                check = partial(self._check_hung, job, now, report)
                self._guarded(report, "check whether it is hung", check, job.job_id)

    def _check_hung(self, job: Job, now: datetime, report: ReconcileReport) -> None:
        workers = [
            limits.WorkerProgress(w.worker, w.last_output_at, w.checkpoint_at, w.started_at)
            for w in self.store.attempt_workers(job.job_id, job.attempt)
        ]
        found = limits.hung(job, workers, now)
        if found is None:
            return
        what = f"{found.reason}."
        self.service.observe(job.job_id, Observation(EventKind.HUNG, job.attempt, "reconciler", reason=what))
        report.observed.append(f"{job.job_id}: {what}")

    def _announce_missed(self, now: datetime, report: ReconcileReport) -> None:
        """Publish the state changes whose announcement failed (older than a few seconds)."""
        if self.status is None:
            return
        for job_id, event in self.store.unannounced_events(now - timedelta(seconds=ANNOUNCE_AFTER_S)):
            # Not recorded on the job: a publishing failure is the deployment's, not the job's.
            self._guarded(report, f"announce {job_id}#{event.seq}", partial(self._announce, job_id, event, report))

    def _announce(self, job_id: str, event: JobEvent, report: ReconcileReport) -> None:
        job = self.store.get(job_id)
        if job is not None:
            self.service.announce(job, event)
            report.announced.append(f"{job_id}#{event.seq}")

    def _release_unowned(
        self, seen: dict[tuple[str, str], CapacityStatus], live: dict[str, Job], report: ReconcileReport
    ) -> None:
        """Delete each tpujobs queued resource that no live attempt owns, read again first."""
        for (zone, name), status in seen.items():
            self._guarded(report, f"release {name}", partial(self._release_if_unowned, zone, status, live, report))

    def _release_if_unowned(
        self, zone: str, status: CapacityStatus, live: dict[str, Job], report: ReconcileReport
    ) -> None:
        if status.state == "DELETING":
            return  # already going (deletion takes minutes): asking again costs a read and a call a tick
        if self._unowned(status, live) and self._unowned(status, self._fresh(status)):
            self.tpu.release(zone, status.name)
            report.released.append(status.name)

    def _fresh(self, status: CapacityStatus) -> dict[str, Job]:
        """The owner's job read again: it may have started after the listing of active jobs."""
        owner = parse_queued_resource_name(status.name)
        job = self.store.get(owner[0]) if owner else None
        return {job.job_id: job} if job is not None and not job.state.is_terminal else {}

    @staticmethod
    def _unowned(status: CapacityStatus, live: dict[str, Job]) -> bool:
        """A tpujobs resource whose job ended or is gone, or that belongs to an older attempt."""
        owner = parse_queued_resource_name(status.name)
        if status.job_label is None or owner is None or owner[0] != status.job_label:
            return False  # not made by tpujobs: never touch it
        job = live.get(owner[0])
        if job is None:
            return True
        return owner[1] < job.attempt


def _where(job: Job) -> tuple[JobState, int, datetime | None]:
    """What the boot check decided on: a change since (a host's `started`) makes it wait a tick."""
    return job.state, job.attempt, job.booting_since()

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

A tick fans out (`tpujobs.domain.shards`). The scheduler's message starts the COORDINATOR: it
reads where every active job is (zone and preferred zones, nothing else), cuts each zone's job
ids into shards of at most `reconcile_shard_size` that cover the whole id space, and publishes
one message per shard on tpujobs-reconcile; then it runs the phases that are not per job: the
quota pools, the warm pools (reading only the jobs on their units, and listing only their
zones), the exports of ended jobs, silent workers, missed announcements and pruning. Each SHARD
message is its own invocation, in parallel with the others: it reads its jobs (zone and id
range), lists its zone once, and runs every per-job phase for them, then releases the zone's
unowned queued resources whose job id falls in its range (the first shard of a zone also the
warm-pool unit leftovers). A shard's failure is its own, and redelivery repeats it (every
repair is idempotent). A job whose zone changed between the coordinator's read and its
shard's read is in neither shard's read this tick, and is picked up by the next one.
`tick()` runs the coordinator and every shard in this process, one after another.

Its cost is O(active jobs), and nothing per finished job: the coordinator reads each active job
once, projected to three fields (a few dozen bytes, whatever the spec), one query per 500; each
shard reads its jobs once more, projected to what is compared (never a job's env, command or
setup, so memory does not grow with what users write), and makes two list calls for its zone
(queued resources and nodes); one query returns only silent workers. On top: once per
multi-host attempt past its boot timeout, one read of its workers' documents; and, per tick,
one such read for each RUNNING attempt with a `hang_timeout` whose last known sign of progress
(start, checkpoint) is older than it. One invocation holds at most one zone's listing and one
shard's jobs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

from tpujobs.domain import limits
from tpujobs.domain import shards as sharding
from tpujobs.domain.admission import Holder, pool_id
from tpujobs.domain.job import Job, JobEvent
from tpujobs.domain.naming import exported_attempt, parse_queued_resource_name, parse_unit_queued_resource_name
from tpujobs.domain.pools import QUOTA_HELD, Pool
from tpujobs.domain.shards import Placement, Shard, ShardError
from tpujobs.domain.states import QUOTA_EXHAUSTED, EventKind, JobState
from tpujobs.domain.transitions import Decision, Observation, next_zone
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.job_service import CAPACITY_GONE, JobService
from tpujobs.engine.pool_service import parse_unit_holder
from tpujobs.engine.ports import (
    CapacityStatus,
    Clock,
    JobStore,
    LogExportRequests,
    Pools,
    ReconcileShards,
    SilentWorker,
    StatusPublisher,
    Tpu,
)

if TYPE_CHECKING:
    from tpujobs.engine.settings import Settings

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
    shards: list[str] = field(default_factory=list)  # the shards published (coordinator) or run (shard, tick())
    tpu_lists: int = 0  # zone listings asked for (each is two TPU list calls: queued resources, nodes)
    jobs_read: int = 0  # job documents the listings returned (the coordinator's placements, a shard's jobs)

    def merge(self, other: ReconcileReport) -> None:
        """Add what a shard saw and did (`tick()` runs them all in one process); `jobs` stays
        the coordinator's count of active jobs."""
        self.zones_listed += other.zones_listed
        self.zones_skipped += [zone for zone in other.zones_skipped if zone not in self.zones_skipped]
        self.tpu_lists += other.tpu_lists
        self.jobs_read += other.jobs_read
        for name in ("observed", "re_requested", "converged", "released", "announced", "failed", "pruned"):
            getattr(self, name).extend(getattr(other, name))


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
        shards: ReconcileShards | None = None,
    ) -> None:
        """Reads through the ports it is given; repairs through `service`, the one that acts
        for the event functions (so give it the same ports: `runtime` does).
        No `pools`: admission is off; no `exports` or `status`: nothing to ask again; no
        `shards`: a tick runs its shards in this process."""
        self.service = service
        self.store = store
        self.tpu = tpu
        self.settings = settings
        self.clock = clock
        self.pools = pools
        self.exports = exports
        self.status = status
        self.shards = shards

    def tick(self) -> ReconcileReport:
        """The whole tick in this process: the coordinator, then each of its shards in turn."""
        return self.coordinate(inline=True)

    def handle(self, message: InboundMessage) -> ReconcileReport:
        """A message on tpujobs-reconcile: a shard runs its shard; a malformed shard message is
        recorded (`rejections`) and acknowledged, never redelivered; anything else is the
        scheduler's tick, whatever its body."""
        try:
            shard = sharding.decode(message.data)
        except ShardError as error:
            self.service.reject(message, str(error))
            return ReconcileReport(failed=[f"shard message {message.message_id}: {error}"])
        if shard is not None:
            return self.run_shard(shard)
        return self.coordinate(inline=self.shards is None)

    def coordinate(self, inline: bool = False) -> ReconcileReport:
        """Cut the tick into shards and publish them (`inline`: run them here, in turn), then run
        the phases that are not per job. The read of where active jobs are, without which
        nothing can be shared out, ends the tick on error (the message is redelivered), and so
        does a failed publish."""
        report = ReconcileReport()
        placements = self.store.active_placements()
        report.jobs = report.jobs_read = len(placements)
        now = self.clock()
        warm_pools = self._read_warm_pools(report)
        plan = self._plan(placements, warm_pools, now, report)
        report.shards = [shard.name for shard in plan]
        if inline:
            for shard in plan:
                report.merge(self.run_shard(shard))
        else:
            assert self.shards is not None, "a coordinator without a shard publisher runs them inline"
            self.shards.publish_shards(plan)
        limited = self._read_limited(report)
        self._phase(report, "repair the pools", lambda: self._repair_pools(limited, report))
        self._phase(report, "repair the warm pools", lambda: self._repair_warm_pools(placements, report))
        self._phase(report, "ask again for exports", lambda: self._request_ended_exports(now, report))
        live = _ReadOnDemand(self.store)  # the jobs of silent workers, read when asked for
        self._phase(report, "find silent workers", lambda: self._find_silent_workers(live, now, report))
        self._phase(report, "announce missed changes", lambda: self._announce_missed(now, report))
        self._phase(report, "delete expired jobs", lambda: self._prune_expired(now, report))
        log.info("reconcile: %d active jobs, %d shards %s", report.jobs, len(plan), "run" if inline else "published")
        return report

    def _plan(
        self, placements: list[Placement], warm_pools: list[Pool], now: datetime, report: ReconcileReport
    ) -> list[Shard]:
        """The tick's shards: every zone an active job is in, cut by job id; every other zone an
        active job may have used (an attempt that moved zone leaves one behind), every zone of a
        warm pool, and the default zone, whole."""
        also = (
            {zone for placement in placements for zone in placement.preferred_zones}
            | {zone for pool in warm_pools for zone in (*pool.zones, *(u.zone for u in pool.units))}
            | {self.settings.default_zone}
        )
        placed = [placement for placement in placements if sharding.ZONE.fullmatch(placement.zone)]
        for placement in placements:
            if not sharding.ZONE.fullmatch(placement.zone):
                report.failed.append(f"{placement.job_id}: no zone to reconcile it in ({placement.zone!r})")
        also = {zone for zone in also if sharding.ZONE.fullmatch(zone)}
        tick = now.isoformat(timespec="milliseconds")
        return sharding.plan(placed, also, self.settings.reconcile_shard_size, tick)

    def run_shard(self, shard: Shard) -> ReconcileReport:
        """One shard: its jobs compared with its zone's listing and repaired, phase by phase,
        then the zone's unowned queued resources whose job falls in its range released. The
        read of its jobs ends it on error (the message is redelivered); a zone whose listing
        failed has its repairs and releases left for the next tick, its other phases run."""
        report = ReconcileReport(shards=[shard.name])
        jobs = self.store.active_in_shard(shard.zone, shard.after, shard.through)
        report.jobs = report.jobs_read = len(jobs)
        seen = self._list_zone(shard.zone, report)
        now = self.clock()
        stuck_before = now - timedelta(seconds=self.settings.stuck_after_seconds)
        queued = any(job.state is JobState.QUEUED for job in jobs)
        limited = self._read_limited(report) if queued else set()  # only a QUEUED job's repair asks
        if seen is not None:
            for job in jobs:
                status = seen.get(job.queued_resource)
                repair = partial(self._repair, job, status, stuck_before, limited, report)
                self._guarded(report, "repair the job", repair, job.job_id)
        self._phase(report, "ask again for exports", lambda: self._request_missing_exports(jobs, now, report))
        self._phase(
            report, "find hosts that never reported", lambda: self._find_hosts_that_never_reported(jobs, now, report)
        )
        self._phase(report, "enforce time limits", lambda: self._enforce_time_limits(jobs, now, report))
        self._phase(report, "find hung attempts", lambda: self._find_hung_attempts(jobs, now, report))
        if seen is not None:
            live = {job.job_id: job for job in jobs}
            mine = {(shard.zone, name): status for name, status in seen.items() if _owner_in(shard, name)}
            self._phase(report, "release unowned resources", lambda: self._release_unowned(mine, live, report))
            if not shard.after:  # a zone's unit leftovers: its first shard's
                units = {name: status for name, status in seen.items() if parse_unit_queued_resource_name(name)}
                leftovers = partial(self._release_unit_leftovers, units, report)
                self._guarded(report, "release warm-pool leftovers", leftovers)
        log.info("reconcile: shard %s of tick %s: %d jobs", shard.name, shard.tick or "-", report.jobs)
        return report

    def _list_zone(self, zone: str, report: ReconcileReport) -> dict[str, CapacityStatus] | None:
        """The zone's capacity by queued-resource name; None when its listing failed (then
        nothing of the zone is compared this tick, so an API error never looks like a loss)."""
        report.tpu_lists += 1
        try:
            seen = {status.name: status for status in self.tpu.list_capacity(zone)}
        except Exception as error:  # whatever it was, this zone's jobs wait for the next tick
            log.warning("reconcile: skipping zone %s this tick: %s", zone, error)
            if zone not in report.zones_skipped:
                report.zones_skipped.append(zone)
            return None
        report.zones_listed += 1
        return seen

    def _read_limited(self, report: ReconcileReport) -> set[str]:
        """The pools that have a quota now (`family@zone`); none when admission is off or the
        quotas unreadable (then QUEUED jobs are converged one by one, which admits them in
        their pool's order)."""
        limited: set[str] = set()

        def read() -> None:
            if self.pools is not None:
                quotas = self.pools.quotas()
                limited.update(f"{family}@{zone}" for zone, limits in quotas.items() for family in limits)

        self._phase(report, "read the quotas", read)
        return limited

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

    def _repair_warm_pools(self, placements: list[Placement], report: ReconcileReport) -> None:
        """Each warm pool made what its document says (`WarmPoolService.repair`): units asked
        for, ready, lost, told, released; a unit whose job is gone freed, a job whose unit is gone
        lost; then the queue filled. It reads only the jobs that were on a unit (by id, in
        batches), never the whole active set, and lists only the pools' zones. The jobs are read
        BEFORE the pools, as shards may be placing jobs on units meanwhile: a job newer than its
        pool's document could look lost from a unit that does run it; a pool newer than its job
        only finishes a placement (`WarmPoolService.repair`). The unit queued resources no pool
        owns are released by the first shard of their zone."""
        warm = self.service.warm
        if warm is None:
            return
        ids = sorted(placement.job_id for placement in placements if placement.warm_pool_unit)
        live = {job.job_id: job for job in self.store.outlines(ids) if not job.state.is_terminal} if ids else {}
        warm_pools = self._read_warm_pools(report)
        seen: dict[str, CapacityStatus] = {}
        for zone in sorted({zone for pool in warm_pools for zone in (*pool.zones, *(u.zone for u in pool.units))}):
            seen.update(self._list_zone(zone, report) or {})
        for pool in warm_pools:
            repair = partial(self._repair_warm_pool, pool, seen, live, report)
            self._guarded(report, f"repair warm pool {pool.name}", repair)

    def _repair_warm_pool(
        self, pool: Pool, seen: dict[str, CapacityStatus], live: dict[str, Job], report: ReconcileReport
    ) -> None:
        assert self.service.warm is not None
        report.observed += self.service.warm.repair(pool, seen, live)

    def _release_unit_leftovers(self, units: dict[str, CapacityStatus], report: ReconcileReport) -> None:
        """Delete the unit queued resources of one zone that no pool owns now (the pools read
        once, and each pool again before a release: `WarmPoolService.release_leftovers`)."""
        warm = self.service.warm
        if warm is None or not units:
            return
        known = {pool.name: pool for pool in warm.store.list_pools()}
        report.released += warm.release_leftovers(units, known)

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

    def _repair(
        self,
        job: Job,
        status: CapacityStatus | None,
        stuck_before: datetime,
        limited: set[str],
        report: ReconcileReport,
    ) -> None:
        service = self.service
        if job.state in (JobState.QUEUED, JobState.RECOVERING):
            waits = pool_id(job.spec, job.zone) in limited and not job.warm_pool
            if job.state is JobState.QUEUED and waits:
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

    def _request_ended_exports(self, now: datetime, report: ReconcileReport) -> None:
        """The coordinator's part of `_request_missing_exports`: the jobs that ended in the
        window (one paged, projected query); each shard does its own active jobs."""
        if self.exports is not None:
            oldest, newest = _export_window(now)
            self._request_missing_exports(self.store.ended_between(oldest, newest), now, report)

    def _request_missing_exports(self, jobs: list[Job], now: datetime, report: ReconcileReport) -> None:
        """Ask again for the export of attempts that ended a while ago and are not exported.

        The handler that ended an attempt asks once, best effort. Here each attempt that
        held capacity and ended between EXPORT_GRACE_S and EXPORT_GRACE_S + EXPORT_WINDOW_S
        ago, newer than the job's latest exported one, is asked for again at every tick of
        that window: the export is idempotent, and an attempt without output stays as it is.
        """
        service = self.service
        if self.exports is None:
            return
        oldest, newest = _export_window(now)
        for job in jobs:
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

    def _repair_pools(self, limited: set[str], report: ReconcileReport) -> None:
        """Make each limited pool's holders match its jobs, then admit what fits.

        A holder whose job ended, vanished, moved to another pool or was requeued (a claim
        for an older attempt) is dropped; a job that holds capacity without a claim (it was
        admitted before the quota existed) is counted. A claim left half-way is finished.
        """
        pools = self.pools
        if pools is None:
            return
        for pool in sorted(set(pools.pools()) | limited):
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
        if silent.after_its_exit:  # its peers, spoken for by it alone, are heard by no one now
            what = (
                f"Worker {silent.worker} of attempt {silent.attempt} sent nothing for {quiet:.0f} s after its "
                "command ended, while it spoke for the peers of its slice; the host is lost"
            )
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
            limits.WorkerProgress(w.worker, w.last_output_at, w.checkpoint_at, w.started_at, w.exit_code)
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


def _export_window(now: datetime) -> tuple[datetime, datetime]:
    """[oldest, newest): when an attempt ended for its export to be asked for again now."""
    newest = now - timedelta(seconds=EXPORT_GRACE_S)
    return newest - timedelta(seconds=EXPORT_WINDOW_S), newest


def _owner_in(shard: Shard, name: str) -> bool:
    """Whether a queued resource's job (by its name) falls in the shard's range."""
    owner = parse_queued_resource_name(name)
    return owner is not None and shard.holds(owner[0])


class _ReadOnDemand(dict[str, Job]):
    """The live jobs the coordinator's silent-worker phase asks about, each read when first
    asked for (one read per job with a silent worker, never the active set); an ended job
    is not live."""

    def __init__(self, store: JobStore) -> None:
        super().__init__()
        self._store = store
        self._read: set[str] = set()

    def get(self, job_id: str, default: Job | None = None) -> Job | None:  # type: ignore[override]
        if job_id not in self._read:
            self._read.add(job_id)
            job = self._store.get(job_id)
            if job is not None and not job.state.is_terminal:
                self[job_id] = job
        return super().get(job_id, default)


def _where(job: Job) -> tuple[JobState, int, datetime | None]:
    """What the boot check decided on: a change since (a host's `started`) makes it wait a tick."""
    return job.state, job.attempt, job.booting_since()

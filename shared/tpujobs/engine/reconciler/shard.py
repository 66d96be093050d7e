"""One shard of a tick: its jobs (one zone, one range of ids) compared with the zone's capacity.

Each job is repaired on its own, phase by phase: capacity missing, lost, waiting too long or in a
doubtful state; then the attempt checks and the exports asked again; then the zone's unowned
queued resources in its range released. Redelivery repeats a shard: every repair is idempotent.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

from tpujobs.domain.admission import job_pool
from tpujobs.domain.grace import release_due, saving_until
from tpujobs.domain.holdings import HOLDING_LOST, HoldingState
from tpujobs.domain.job import Job, ScheduledMaintenance
from tpujobs.domain.naming import parse_queued_resource_name, parse_unit_queued_resource_name
from tpujobs.domain.quotas import region_of
from tpujobs.domain.shards import Shard
from tpujobs.domain.states import GOOGLE_QUOTA_WAITS, REGION_QUOTA_EXHAUSTED, EventKind, JobState
from tpujobs.domain.times import rfc3339
from tpujobs.domain.transitions import Decision, Observation, next_zone
from tpujobs.engine import metric_events
from tpujobs.engine.ports import Capacity, CapacityStatus, Clock, JobStore, Pools
from tpujobs.engine.reconciler.attempts import AttemptChecks
from tpujobs.engine.reconciler.collaborators import JobRepairs
from tpujobs.engine.reconciler.exports import ExportPhase
from tpujobs.engine.reconciler.pools import PoolPhases
from tpujobs.engine.reconciler.reads import list_zone, read_limited
from tpujobs.engine.reconciler.report import Guard, ReconcileReport, log

if TYPE_CHECKING:
    from tpujobs.engine.settings import Settings


class ShardRun:
    """Runs shards: reads each one's jobs and zone, and repairs every difference."""

    def __init__(
        self,
        jobs: JobRepairs,
        store: JobStore,
        capacity: Capacity,
        settings: Settings,
        clock: Clock,
        pools: Pools | None,
        guard: Guard,
        phases: tuple[AttemptChecks, ExportPhase, PoolPhases],
    ) -> None:
        self.jobs = jobs
        self.store = store
        self.capacity = capacity
        self.settings = settings
        self.clock = clock
        self.pools = pools
        self.guard = guard
        self.attempts, self.exports, self.pool_phases = phases

    def run(self, shard: Shard) -> ReconcileReport:
        """One shard: its jobs compared with its zone's listing and repaired, phase by phase,
        then the zone's unowned queued resources whose job falls in its range released. The
        read of its jobs ends it on error (the message is redelivered); a zone whose listing
        failed has its repairs and releases left for the next tick, its other phases run."""
        report = ReconcileReport(shards=[shard.name])
        jobs = self.store.active_in_shard(shard.zone, shard.after, shard.through)
        report.jobs = report.jobs_read = len(jobs)
        seen = list_zone(self.capacity, shard.zone, report)
        now = self.clock()
        stuck_before = now - timedelta(seconds=self.settings.stuck_after_seconds)
        queued = any(job.state is JobState.QUEUED for job in jobs)
        limited = read_limited(self.pools, self.guard, report) if queued else set()  # only a QUEUED job's repair asks
        phase = partial(self.guard.phase, report)
        if seen is not None:
            for job in jobs:
                repair = partial(self._repair, job, seen.get(job.queued_resource), stuck_before, limited, report)
                self.guard.item(report, "repair the job", repair, job.job_id)
        phase("ask again for exports", lambda: self.exports.request_missing(jobs, now, report))
        phase("find hosts that never reported", lambda: self.attempts.find_hosts_that_never_reported(jobs, now, report))
        phase("enforce time limits", lambda: self.attempts.enforce_time_limits(jobs, now, report))
        phase("find hung attempts", lambda: self.attempts.find_hung_attempts(jobs, now, report))
        lead = self.settings.maintenance_lead_seconds
        phase("move ahead of maintenance", lambda: self.attempts.move_ahead_of_maintenance(jobs, now, lead, report))
        if seen is not None:
            phase("release held-over holdings", lambda: self._release_held_over(jobs, seen, now, report))
            live = {job.job_id: job for job in jobs}
            mine = {(shard.zone, name): status for name, status in seen.items() if _owner_in(shard, name)}
            phase("release unowned resources", lambda: self._release_unowned(mine, live, report))
            if not shard.after:  # a zone's unit leftovers: its first shard's
                units = {name: status for name, status in seen.items() if parse_unit_queued_resource_name(name)}
                leftovers = partial(self.pool_phases.release_unit_leftovers, units, report)
                self.guard.item(report, "release warm-pool leftovers", leftovers)
        log.info("reconcile: shard %s of tick %s: %d jobs", shard.name, shard.tick or "-", report.jobs)
        return report

    def _repair(
        self,
        job: Job,
        status: CapacityStatus | None,
        stuck_before: datetime,
        limited: set[str],
        report: ReconcileReport,
    ) -> None:
        jobs = self.jobs
        if job.state in (JobState.QUEUED, JobState.RECOVERING):
            waits = job_pool(job).id in limited and not job.warm_pool
            if job.state is JobState.QUEUED and waits:
                return  # waits for quota: its pool is admitted once, in the pools' phase
            if job.updated_at is None or job.updated_at < stuck_before:
                metric_events.emit(log, metric_events.stuck(job, self.clock()), logging.WARNING)
                jobs.converge(job.job_id)
                report.converged.append(job.job_id)
            return
        if job.warm_pool:
            return  # on a warm pool's unit (or waiting for one): the warm pools' phase compares it
        if status is None:
            if job.state is JobState.PROVISIONING:
                self._provision_missing(job, report)
            elif self.capacity.status(job.zone, job.queued_resource) is None:  # confirm first
                what = f"queued resource {job.queued_resource} no longer exists"
                jobs.observe_capacity(job.queued_resource, HoldingState.GONE, what, source="reconciler")
                report.observed.append(f"{job.job_id}: {what}")
            return
        lost = status.state in HOLDING_LOST or status.unhealthy_hosts > 0
        changed = job.state is JobState.PROVISIONING and status.state != job.capacity_state
        full_region = self._past_zone_wait(job, status)
        if full_region is not None:
            waited = (self.clock() - job.requested_at).total_seconds() if job.requested_at else 0
            what = f"Queued resource {job.queued_resource} waited {waited / 60:.0f} min for capacity"
            what += f" ({status.detail})" if status.detail else ""  # a partial slice: how many hosts came
            seen = Observation(EventKind.ZONE_FAILOVER, job.attempt, "reconciler", what, quota_region=full_region)
            outcome = jobs.observe(job.job_id, seen)
            if next_zone(job, full_region) is not None:
                report.observed.append(f"{job.job_id}: {what}")
                return
            if isinstance(outcome, Decision):  # no zone outside the full region: it waits, saying why
                report.observed.append(f"{job.job_id}: {outcome.event.reason}")
        if lost or changed:
            jobs.observe_capacity(status.name, status.state, status.detail, status.unhealthy_hosts, source="reconciler")
            report.observed.append(f"{job.job_id}: {status.state}")
        if not lost and (status.suspect_hosts or job.suspect_hosts):
            self._watch_suspect_hosts(job, status, report)
        known = {(m.host, m.window_start) for m in job.maintenance}
        announced = tuple(ScheduledMaintenance(host, start) for host, start in status.maintenance)
        if not lost and any((m.host, m.window_start) not in known for m in announced):
            jobs.observe(
                job.job_id,
                Observation(EventKind.MAINTENANCE_SCHEDULED, job.attempt, "reconciler", maintenance=announced),
            )
            report.observed.append(f"{job.job_id}: host maintenance scheduled")
        run_ends = rfc3339(status.run_ends)
        if not lost and run_ends is not None and run_ends != job.run_ends_at:
            seen = Observation(EventKind.RUN_END_SCHEDULED, job.attempt, "reconciler", run_ends_at=run_ends)
            jobs.observe(job.job_id, seen)
            report.observed.append(f"{job.job_id}: its VMs' run duration ends {status.run_ends}")

    def _provision_missing(self, job: Job, report: ReconcileReport) -> None:
        """A PROVISIONING job without its queued resource: ask again, within the zone wait.

        Waiting for TPU quota, nothing was made: ask again (the quota may have room now) until
        the zone wait moves the job to its next zone (outside its region when Google said the
        region's quota is full); with none, it waits on, saying so.
        Otherwise the create was made: read the resource again (it may be newer than the
        listing), then what its operation said. A failed create is a failed provisioning, under
        the job's rules; a resource still missing is asked for again until the zone wait is
        over, then moves the job to its next zone or ends the attempt by its rules. So a job is
        never asked for again and again for ever.
        """
        quota = job.capacity_state in GOOGLE_QUOTA_WAITS
        full_region = region_of(job.zone) if job.capacity_state == REGION_QUOTA_EXHAUSTED else ""
        if not quota and self.capacity.status(job.zone, job.queued_resource) is not None:
            return  # created since the listing: the next tick compares it
        failed = None if quota else self.capacity.create_error(job.create_operation)
        if failed:
            what = f"Queued resource {job.queued_resource} was never created: {failed}"
            seen = Observation(EventKind.CAPACITY_LOST, job.attempt, "reconciler", what, HoldingState.FAILED.value)
            self.jobs.observe(job.job_id, seen)
            report.observed.append(f"{job.job_id}: {what}")
            return
        waited = (self.clock() - job.requested_at).total_seconds() if job.requested_at else 0.0
        if waited > self.settings.zone_wait_seconds and (not quota or next_zone(job, full_region) is not None):
            if quota:
                what = f"The TPU quota had no room for {waited / 60:.0f} min"
                seen = Observation(EventKind.ZONE_FAILOVER, job.attempt, "reconciler", what, quota_region=full_region)
            else:
                what = (
                    f"Queued resource {job.queued_resource} never appeared "
                    f"in the {waited / 60:.0f} min after its request"
                )
                seen = Observation(EventKind.CAPACITY_LOST, job.attempt, "reconciler", what, HoldingState.FAILED.value)
            self.jobs.observe(job.job_id, seen)
            report.observed.append(f"{job.job_id}: {what}")
            return
        outcome = self.jobs.request_again(job.job_id)
        report.re_requested.append(job.queued_resource)
        if isinstance(outcome, Decision):
            report.observed.append(f"{job.job_id}: {outcome.event.reason}")

    def _watch_suspect_hosts(self, job: Job, status: CapacityStatus, report: ReconcileReport) -> None:
        """Remember since when each host has been in a condition that often passes; a host whose
        condition outlasts the grace is lost, under the job's rules like any lost host."""
        grace = self.settings.unhealthy_grace_seconds
        hosts = tuple(sorted(status.suspect_hosts))
        if hosts != tuple((h.node, h.condition) for h in job.suspect_hosts):
            if hosts:
                said = "; ".join(f"node {node} is {condition}" for node, condition in hosts)
                reason = f"Watching: {said}; a host is lost if its condition lasts {grace:.0f} s."
            else:
                reason = f"Every host of attempt {job.attempt} is back to a definite, healthy state."
            outcome = self.jobs.note_suspect_hosts(job.job_id, job.attempt, hosts, reason)
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
            self.jobs.observe(job.job_id, Observation(EventKind.CAPACITY_LOST, job.attempt, "reconciler", reason=what))
            report.observed.append(f"{job.job_id}: {what}")

    def _past_zone_wait(self, job: Job, status: CapacityStatus) -> str | None:
        """Still waiting for capacity past the limit, with another zone of `zones` after this one:
        the region whose full quota holds the job back ("" when none is known); None otherwise.
        A region's full quota leaves its other zones no room: the failover skips them, and with
        no zone outside it, the job waits where it is (`domain.transitions`)."""
        waiting = (
            job.state is JobState.PROVISIONING
            and status.state is HoldingState.WAITING  # no capacity yet: a failover may end the wait
            and job.requested_at is not None
            and (self.clock() - job.requested_at).total_seconds() > self.settings.zone_wait_seconds
        )
        following = next_zone(job) if waiting else None
        if following is None:
            return None
        if status.quota_region or region_of(following) != region_of(job.zone):
            return status.quota_region
        return self._quota_region(job)  # it decides only where the next zone shares the region

    def _quota_region(self, job: Job) -> str:
        """The region whose quota the holding's hosts exceeded: a zone's listing leaves out their
        creation errors (Compute Engine's managed instances), a read of the holding has them."""
        precise = self.capacity.status(job.zone, job.queued_resource)
        return precise.quota_region if precise is not None else ""

    def _release_held_over(
        self, jobs: list[Job], seen: dict[str, CapacityStatus], now: datetime, report: ReconcileReport
    ) -> None:
        """Finish the release of earlier attempts' holdings kept through their hosts' shutdown
        grace (`Job.held_over`): each job with one whose hosts are gone (by this listing: not
        listed, or LOST or FAILED) or whose grace is over asks its lifecycle to release it.
        Pure on the listing until then: no read, whatever the number of jobs."""
        listed = {name: status.state for name, status in seen.items()}
        for job in jobs:
            # another zone's (the job moved on) is not in this listing: the lifecycle reads it
            if any(h.zone != job.zone or release_due(h, now, listed.get(h.holding)) for h in job.held_over):
                finish = partial(self._finish_held_over, job.job_id, report)
                self.guard.item(report, "release its held-over holdings", finish, job.job_id)

    def _finish_held_over(self, job_id: str, report: ReconcileReport) -> None:
        report.released += self.jobs.finish_held_over(job_id)

    def _release_unowned(
        self, seen: dict[tuple[str, str], CapacityStatus], live: dict[str, Job], report: ReconcileReport
    ) -> None:
        """Delete each tpujobs queued resource that no live attempt owns, read again first."""
        for (zone, name), status in seen.items():
            release = partial(self._release_if_unowned, zone, status, live, report)
            self.guard.item(report, f"release {name}", release)

    def _release_if_unowned(
        self, zone: str, status: CapacityStatus, live: dict[str, Job], report: ReconcileReport
    ) -> None:
        if status.state is HoldingState.RELEASING:
            return  # already going (deletion takes minutes): asking again costs a read and a call a tick
        if not _unowned(status, live):
            return
        owner = parse_queued_resource_name(status.name)
        job = self.store.get(owner[0]) if owner else None  # read again: it may have started since
        if job is not None and not job.state.is_terminal and not _unowned(status, {job.job_id: job}):
            return
        if job is not None and job.state.is_terminal and _saving(job, status, self.clock()):
            return  # ended as Google took it back: its hosts may be saving within their grace
        self.capacity.release(zone, status.name)
        report.released.append(status.name)


def _unowned(status: CapacityStatus, live: dict[str, Job]) -> bool:
    """A tpujobs resource whose job ended or is gone, or that belongs to an older attempt."""
    owner = parse_queued_resource_name(status.name)
    if status.job_label is None or owner is None or owner[0] != status.job_label:
        return False  # not made by tpujobs: never touch it
    job = live.get(owner[0])
    if job is None:
        return True
    if any(h.holding == status.name for h in job.held_over):
        return False  # kept through its hosts' shutdown grace: `_release_held_over` finishes it
    return owner[1] < job.attempt


def _saving(job: Job, status: CapacityStatus, now: datetime) -> bool:
    """The ended job's last holding, Google taking it back, its hosts still within their grace."""
    return (
        job.queued_resource == status.name and saving_until(job, status.state, status.unhealthy_hosts, now) is not None
    )


def _owner_in(shard: Shard, name: str) -> bool:
    """Whether a queued resource's job (by its name) falls in the shard's range."""
    owner = parse_queued_resource_name(name)
    return owner is not None and shard.holds(owner[0])

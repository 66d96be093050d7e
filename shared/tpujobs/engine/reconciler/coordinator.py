"""The reconciler's entry: a tick's coordinator, which cuts the active jobs into shards and runs
the phases that are not per job (pools, exports, silent workers, announcements, pruning).

The scheduler's message starts the coordinator; each shard it publishes is an invocation of its
own (`shard.py`). `Reconciler.tick()` runs the coordinator and every shard in this process.

Never more shards in flight than the function takes at once: Cloud Run holds a request over
max instances x concurrency only a few seconds, then fails it (429), and five failures
dead-letter it. So the coordinator publishes only the heads of `reconcile_shards_in_flight`
lanes (`domain.shards.lanes`); each shard, once run, publishes the next of its lane, and a lane
has one shard in flight at a time. It is idempotent under at-least-once delivery: the next shard
is published only after the shard's work, so a shard that fails is redelivered before its lane
goes on, and a redelivered shard repeats repairs that are idempotent.

Ticks must not overlap either: a shard hands nothing on when a next shard as slow as itself would
still run when the next tick begins (`reconcile_tick_seconds`). The next tick's lanes cover the
same jobs, begun one wave further on, so no shard is left out of every tick when ticks are cut
short. What this does not bound: a duplicate delivery forks its lane for the rest of the tick,
and a shard much slower than the one before it may meet the next tick's heads; that excess waits
in Cloud Run's queue or is retried with the push subscription's backoff (infra/pubsub.tf), long
enough for a shard to end.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

from tpujobs.domain import shards as sharding
from tpujobs.domain.job import JobEvent
from tpujobs.domain.pools import Pool
from tpujobs.domain.shards import Placement, Shard, ShardError
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.ports import (
    Capacity,
    Clock,
    JobStore,
    LogExportRequests,
    Pools,
    ReconcileShards,
    StatusPublisher,
    WarmPoolStore,
)
from tpujobs.engine.reconciler.attempts import AttemptChecks
from tpujobs.engine.reconciler.collaborators import JobRepairs, PoolRepairs
from tpujobs.engine.reconciler.exports import ExportPhase
from tpujobs.engine.reconciler.pools import PoolPhases
from tpujobs.engine.reconciler.reads import read_limited
from tpujobs.engine.reconciler.report import Guard, ReconcileReport, log
from tpujobs.engine.reconciler.shard import ShardRun

if TYPE_CHECKING:
    from tpujobs.engine.settings import Settings

PRUNE_PER_TICK = 100  # expired jobs deleted per tick: a backlog drains over a few ticks
ANNOUNCE_AFTER_S = 10.0  # a change newer than this is still being announced by its handler


class Reconciler:
    """Compares stored jobs with observed queued resources and repairs the difference."""

    def __init__(
        self,
        service: JobRepairs,
        store: JobStore,
        capacity: Capacity,
        settings: Settings,
        clock: Clock,
        pools: Pools | None = None,
        exports: LogExportRequests | None = None,
        status: StatusPublisher | None = None,
        shards: ReconcileShards | None = None,
        warm: PoolRepairs | None = None,
        warm_pools: WarmPoolStore | None = None,
    ) -> None:
        """Reads through the ports it is given; repairs jobs through `service` and warm pools
        through `warm`, the services that act for the event functions (so give them the same
        ports: `runtime` does). No `pools`: admission is off; no `exports` or `status`: nothing
        to ask again; no `warm` or `warm_pools`: no warm pools; no `shards`: a tick runs its
        shards in this process."""
        self.service = service
        self.store = store
        self.clock = clock
        self.settings = settings
        self.pools = pools
        self.status = status
        self.shards = shards
        self.guard = Guard(service)
        self.pool_phases = PoolPhases(service, store, capacity, clock, self.guard, pools, warm, warm_pools)
        self.export_phase = ExportPhase(service, store, exports)
        self.attempts = AttemptChecks(service, store, settings.boot_timeout_seconds, self.guard)
        phases = (self.attempts, self.export_phase, self.pool_phases)
        self.shard_run = ShardRun(service, store, capacity, settings, clock, pools, self.guard, phases)

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
            began = self.clock()
            report = self.run_shard(shard)
            self._hand_on(shard, self.clock() - began)
            return report
        return self.coordinate(inline=self.shards is None)

    def _hand_on(self, shard: Shard, took: timedelta) -> None:
        """Publish the next shard of this one's lane, unless the lane ended or the next shard,
        taking as long as this one `took`, would still run when the next tick begins. A failed
        publish raises: the shard is redelivered, run again, and hands on then."""
        following = shard.next()
        if following is None or self.shards is None:
            return
        if self._superseded(shard.tick, took):
            left = len(shard.then)
            log.info("reconcile: the lane of %s stops before the next tick, %d shards left", shard.name, left)
            return
        self.shards.publish_shards([following])

    def run_shard(self, shard: Shard) -> ReconcileReport:
        """One shard's jobs compared with its zone and repaired (`ShardRun.run`)."""
        return self.shard_run.run(shard)

    def coordinate(self, inline: bool = False) -> ReconcileReport:
        """Cut the tick into shards and publish them (`inline`: run them here, in turn), then run
        the phases that are not per job. The read of where active jobs are, without which
        nothing can be shared out, ends the tick on error (the message is redelivered), and so
        does a failed publish."""
        report = ReconcileReport()
        placements = self.store.active_placements()
        report.jobs = report.jobs_read = len(placements)
        now = self.clock()
        plan = self._plan(placements, self.pool_phases.read_warm_pools(report), now, report)
        if not inline:
            plan = self._rotated(plan, now)
        report.shards = [shard.name for shard in plan]
        if inline:
            for shard in plan:
                report.merge(self.run_shard(shard))
        else:
            assert self.shards is not None, "a coordinator without a shard publisher runs them inline"
            self.shards.publish_shards(sharding.lanes(plan, self.settings.reconcile_shards_in_flight))
        limited = read_limited(self.pools, self.guard, report)
        phase = partial(self.guard.phase, report)
        phase("repair the pools", lambda: self.pool_phases.repair_pools(limited, report))
        phase("repair the warm pools", lambda: self.pool_phases.repair_warm_pools(placements, report))
        phase("ask again for exports", lambda: self.export_phase.request_ended(now, report))
        phase("find silent workers", lambda: self.attempts.find_silent_workers(now, report))
        phase("announce missed changes", lambda: self._announce_missed(now, report))
        phase("delete expired jobs", lambda: self._prune_expired(now, report))
        lanes = "run here" if inline else f"in {min(len(plan), self.settings.reconcile_shards_in_flight)} lanes"
        log.info("reconcile: %d active jobs, %d shards %s", report.jobs, len(plan), lanes)
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

    def _rotated(self, plan: list[Shard], now: datetime) -> list[Shard]:
        """The plan begun one wave further on each tick: a tick cut short by the next one (its
        lanes stop) leaves its last waves undone, and the ticks after it start there in turn, so
        every shard is a first-wave shard at least once every len(plan) / lanes ticks."""
        if not plan:
            return plan
        ticks = int(now.timestamp() // self.settings.reconcile_tick_seconds)
        start = ticks * self.settings.reconcile_shards_in_flight % len(plan)
        return plan[start:] + plan[:start]

    def _superseded(self, tick: str, took: timedelta) -> bool:
        """Whether the next tick begins before a shard started now and taking `took` would end
        (a tick without a readable time never is): its lanes must not meet the next tick's."""
        try:
            age = self.clock() + took - datetime.fromisoformat(tick)
        except (ValueError, TypeError):  # not a time, or one without its zone
            return False
        return age.total_seconds() >= self.settings.reconcile_tick_seconds

    def _announce_missed(self, now: datetime, report: ReconcileReport) -> None:
        """Publish the state changes whose announcement failed (older than a few seconds)."""
        if self.status is None:
            return
        for job_id, event in self.store.unannounced_events(now - timedelta(seconds=ANNOUNCE_AFTER_S)):
            # Not recorded on the job: a publishing failure is the deployment's, not the job's.
            self.guard.item(report, f"announce {job_id}#{event.seq}", partial(self._announce, job_id, event, report))

    def _announce(self, job_id: str, event: JobEvent, report: ReconcileReport) -> None:
        job = self.store.get(job_id)
        if job is not None:
            self.service.announce(job, event)
            report.announced.append(f"{job_id}#{event.seq}")

    def _prune_expired(self, now: datetime, report: ReconcileReport) -> None:
        """Ended jobs past their `expire_at` go with their timeline, workers and attempts, a
        bounded number per tick: Firestore's TTL would leave the subcollections behind."""
        report.pruned += self.store.prune_expired_jobs(now, limit=PRUNE_PER_TICK)

"""The reconciler's pool phases: quota pools' holders made to match their jobs, and warm pools
made what their documents say.

Both run once a tick, in the coordinator (a zone's unit leftovers in its first shard). A warm
pool's phase reads only the jobs that were on a unit and lists only the pools' zones.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from tpujobs.domain.admission import Holder, job_pool, pool_of
from tpujobs.domain.grace import parse_held_holder
from tpujobs.domain.job import Job
from tpujobs.domain.naming import parse_queued_resource_name
from tpujobs.domain.pools import QUOTA_HELD, Pool
from tpujobs.domain.quotas import PoolKey
from tpujobs.domain.shards import Placement
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Observation
from tpujobs.engine.ports import Capacity, CapacityStatus, Clock, JobStore, Pools, WarmPoolStore
from tpujobs.engine.reconciler.collaborators import JobRepairs, PoolRepairs
from tpujobs.engine.reconciler.reads import list_zone
from tpujobs.engine.reconciler.report import Guard, ReconcileReport, log
from tpujobs.engine.warm_pools.quota import CLAIM_TRIES, parse_unit_holder

RETIRED_QUEUE_READ = 100  # queued jobs of a retired zone pool moved to their regional pool per tick


def _hold_in(pools: Pools, pool: str, holder: Holder) -> bool:
    """Add `holder` to `pool` unless it is there; False when the pool kept changing under it."""
    for _ in range(CLAIM_TRIES):
        view = pools.view(pool)
        if any(h.job_id == holder.job_id for h in view.holders):
            return False
        if pools.change(view, add=holder):
            return True
    return False


class PoolPhases:
    """Quota pools and warm pools, repaired through the services that own them."""

    def __init__(
        self,
        jobs: JobRepairs,
        store: JobStore,
        capacity: Capacity,
        clock: Clock,
        guard: Guard,
        pools: Pools | None,
        warm: PoolRepairs | None,
        warm_pools: WarmPoolStore | None,
    ) -> None:
        """No `pools`: admission is off. No `warm` or `warm_pools`: no warm pools to repair."""
        self.jobs = jobs
        self.store = store
        self.capacity = capacity
        self.clock = clock
        self.guard = guard
        self.pools = pools
        self.warm = warm if warm_pools is not None else None
        self.warm_pools = warm_pools

    # -- quota pools -----------------------------------------------------------------------

    def repair_pools(self, limited: set[str], report: ReconcileReport) -> None:
        """Make each limited pool's holders match its jobs, then admit what fits.

        A holder whose job ended, vanished, moved to another pool or was requeued (a claim
        for an older attempt) is dropped; a job that holds capacity without a claim (it was
        admitted before the quota existed) is counted. A claim left half-way is finished. A
        zone's pool from before pools were regional is retired into the regional ones.
        """
        if self.pools is None:
            return
        for pool in sorted(set(self.pools.pools()) | limited):
            self.guard.item(report, f"repair pool {pool}", partial(self._repair_pool, self.pools, pool, report))

    def _repair_pool(self, pools: Pools, pool: str, report: ReconcileReport) -> None:
        try:
            PoolKey.parse(pool)
        except ValueError:  # a zone's pool from before pools were regional
            self._retire_zone_pool(pools, pool, report)
            return
        view = pools.view(pool)
        active = {job.job_id: job for job in pools.active_in(pool)}
        stale = {h.job_id for h in view.holders if h.job_id not in active and self._stale(h, pool)}
        held = {h.job_id for h in view.holders}
        for job in active.values():
            if job.job_id not in held:
                evictable = job.spec.on_preemption != "fail"
                since = job.created_at or self.clock()
                claim = Holder(
                    job.job_id, job.spec.chips, job.attempt, job.spec.priority, since, evictable, job.zone, job.team
                )
                if pools.change(view, add=claim, remove=frozenset(stale)):
                    report.observed.append(f"{pool}: counted {job.job_id}")
                    view, stale = pools.view(pool), set()
        if stale and pools.change(view, remove=frozenset(stale)):
            report.observed.append(f"{pool}: dropped {', '.join(sorted(stale))}")
        self.jobs.admit_waiting(pool)

    def _retire_zone_pool(self, pools: Pools, pool: str, report: ReconcileReport) -> None:
        """A pool document of a zone (`v4@us-central2-b`), from before pools were regional: each
        hold that still holds chips moves to its regional pool, and each job still queued there
        says so again, which rewrites its document into its new pool's queue (a job's `pool` is
        written with the job); then the old document is emptied, never read as a pool."""
        view = pools.view(pool)
        for holder in view.holders:
            home = self._regional_home(holder)
            if home is not None and _hold_in(pools, home[0], replace(holder, zone=home[1])):
                report.observed.append(f"{pool}: {holder.job_id} now counted in {home[0]}")
        for job in pools.queue(pool, RETIRED_QUEUE_READ):
            why = f"Waiting for quota in {job_pool(job).id} (quota pools are regional now)."
            self.jobs.observe(job.job_id, Observation(EventKind.WAITING_FOR_QUOTA, job.attempt, "reconciler", why))
        if view.holders and pools.change(view, remove=frozenset(h.job_id for h in view.holders)):
            report.observed.append(f"{pool}: no longer a pool, dropped {', '.join(h.job_id for h in view.holders)}")

    def _regional_home(self, holder: Holder) -> tuple[str, str] | None:
        """(pool, zone) where an old zone pool's holder holds chips now; None when it holds none."""
        unit_of = parse_unit_holder(holder.job_id)
        if unit_of is not None:
            found = self.warm_pools.get(unit_of[0]) if self.warm_pools is not None else None
            unit = found.unit(unit_of[1]) if found is not None else None
            if found is None or unit is None or unit.state not in QUOTA_HELD:
                return None
            return pool_of(found.shape(), unit.zone).id, unit.zone
        job = self.store.get(holder.job_id)
        if job is None or job.state.is_terminal or job.state is JobState.QUEUED or job.warm_pool:
            return None
        return job_pool(job).id, job.zone

    def _stale(self, holder: Holder, pool: str) -> bool:
        """A claim whose job ended, vanished, moved pool or was requeued (an older attempt's);
        a warm pool's unit that no longer asks for or holds capacity. Only holders not among the
        pool's active jobs get here: one read each."""
        unit_of = parse_unit_holder(holder.job_id)
        if unit_of is not None:
            found = self.warm_pools.get(unit_of[0]) if self.warm_pools is not None else None
            unit = found.unit(unit_of[1]) if found is not None else None
            return unit is None or unit.state not in QUOTA_HELD
        held = parse_held_holder(holder.job_id)
        if held is not None:  # a held-over holding: counted while its job keeps it (or is about to)
            owner = parse_queued_resource_name(held)
            job = self.store.get(owner[0]) if owner else None
            keeps = job is not None and not job.state.is_terminal and any(h.holding == held for h in job.held_over)
            return not keeps and not (job is not None and job.state is JobState.RECOVERING)
        job = self.store.get(holder.job_id)
        return (
            job is None
            or job.state.is_terminal
            or job_pool(job).id != pool
            or (job.state is JobState.QUEUED and job.attempt != holder.attempt)
        )

    # -- warm pools ------------------------------------------------------------------------

    def read_warm_pools(self, report: ReconcileReport) -> list[Pool]:
        """Every warm pool, read once a tick; none when there are no warm pools or the read
        failed (then the pools wait for the next tick, and the jobs' repair goes on)."""
        if self.warm is None or self.warm_pools is None:
            return []
        try:
            return self.warm_pools.list_pools()
        except Exception as error:
            log.warning("reconcile: could not read the warm pools this tick: %s", error)
            report.failed.append(f"read the warm pools: {error}")
            return []

    def repair_warm_pools(self, placements: list[Placement], report: ReconcileReport) -> None:
        """Each warm pool made what its document says (`PoolRepairs.repair`): units asked
        for, ready, lost, told, released; a unit whose job is gone freed, a job whose unit is gone
        lost; then the queue filled. It reads only the jobs that were on a unit (by id, in
        batches), never the whole active set, and lists only the pools' zones. The jobs are read
        BEFORE the pools, as shards may be placing jobs on units meanwhile: a job newer than its
        pool's document could look lost from a unit that does run it; a pool newer than its job
        only finishes a placement. The unit queued resources no pool owns are released by the
        first shard of their zone (`release_unit_leftovers`)."""
        warm = self.warm
        if warm is None:
            return
        ids = sorted(placement.job_id for placement in placements if placement.warm_pool_unit)
        live = {job.job_id: job for job in self.store.outlines(ids) if not job.state.is_terminal} if ids else {}
        warm_pools = self.read_warm_pools(report)
        seen: dict[str, CapacityStatus] = {}
        for zone in sorted({zone for pool in warm_pools for zone in (*pool.zones, *(u.zone for u in pool.units))}):
            seen.update(list_zone(self.capacity, zone, report) or {})
        for pool in warm_pools:
            repair = partial(self._repair_warm_pool, warm, pool, seen, live, report)
            self.guard.item(report, f"repair warm pool {pool.name}", repair)

    @staticmethod
    def _repair_warm_pool(
        warm: PoolRepairs, pool: Pool, seen: dict[str, CapacityStatus], live: dict[str, Job], report: ReconcileReport
    ) -> None:
        report.observed += warm.repair(pool, seen, live)

    def release_unit_leftovers(self, units: dict[str, CapacityStatus], report: ReconcileReport) -> None:
        """Delete the unit queued resources of one zone that no pool owns now (the pools read
        once, and each pool again before a release: `PoolRepairs.release_leftovers`)."""
        if self.warm is None or self.warm_pools is None or not units:
            return
        known = {pool.name: pool for pool in self.warm_pools.list_pools()}
        report.released += self.warm.release_leftovers(units, known)

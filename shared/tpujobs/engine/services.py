"""The engine's services wired on one set of ports: what `runtime` builds once per function
instance, and tests build on the emulators or the fakes.

Each service gets only the ports it uses, and the services it calls; they are built lowest
first: the journal, admission, the warm pools' units, the lifecycle, then the handlers of each
topic. `Engine` also answers for the reconciler (`JobRepairs`) and the jobs API, by delegation.

The jobs API's Engine is built with a `handoff` and `capacity_handoff.NoCapacity`: its lifecycle
and pool management commit, then hand the job's id or the pool's name to the `converge` function
(tpujobs-converge), whose Engine's `convergence` does the capacity work.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.job import Job, JobEvent, Source
from tpujobs.domain.pools import Pool
from tpujobs.domain.restart_overrides import RestartAction
from tpujobs.domain.transitions import Decision, Ignored, Observation
from tpujobs.engine.budgets import TeamBudgets
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.jobs.admission import Admission
from tpujobs.engine.jobs.attempts import AttemptCapacity
from tpujobs.engine.jobs.audit_entries import AuditEntries
from tpujobs.engine.jobs.capacity_events import CapacityEvents
from tpujobs.engine.jobs.controls import Controls, RestartOutcome
from tpujobs.engine.jobs.convergence import Convergence
from tpujobs.engine.jobs.journal import JobJournal, Observe
from tpujobs.engine.jobs.lifecycle import JobLifecycle
from tpujobs.engine.jobs.rejections import Rejections
from tpujobs.engine.jobs.signed_reports import SignedReports
from tpujobs.engine.jobs.submission import Submission
from tpujobs.engine.jobs.vetting import Vetting
from tpujobs.engine.jobs.worker_events import WorkerEvents
from tpujobs.engine.pool_requests import PoolOutcome
from tpujobs.engine.ports import (
    AccessPolicyReader,
    Capacity,
    CapacityHandoff,
    CapacityStatus,
    Clock,
    JobStore,
    LogExportRequests,
    Pools,
    StatusPublisher,
    Teams,
    WarmPoolStore,
)
from tpujobs.engine.settings import Settings
from tpujobs.engine.warm_pools.agents import UnitAgents
from tpujobs.engine.warm_pools.jobs import PoolJobs
from tpujobs.engine.warm_pools.management import PoolManagement
from tpujobs.engine.warm_pools.quota import UnitQuota
from tpujobs.engine.warm_pools.repair import PoolRepair
from tpujobs.engine.warm_pools.units import PoolUnits


@dataclass(frozen=True)
class WarmPools:
    """The warm pools' services; the reconciler's `PoolRepairs` and the jobs API's pool actions."""

    store: WarmPoolStore
    units: PoolUnits
    jobs: PoolJobs
    management: PoolManagement
    repairs: PoolRepair

    def create(self, data: dict[str, object], caller: str, *, verified: bool) -> PoolOutcome:
        return self.management.create(data, caller, verified=verified)

    def resize(self, name: str, count: int, caller: str) -> PoolOutcome:  # the jobs API's verified caller
        return self.management.resize(name, count, caller, verified=True)

    def delete(self, name: str, caller: str) -> PoolOutcome:  # the jobs API's verified caller
        return self.management.delete(name, caller, verified=True)

    def observe_unit(
        self, queued_resource: str, state: HoldingState, detail: str = "", unhealthy_hosts: int = 0
    ) -> None:
        self.units.observe_unit(queued_resource, state, detail, unhealthy_hosts)

    def repair(self, pool: Pool, seen: Mapping[str, CapacityStatus], live: Mapping[str, Job]) -> list[str]:
        return self.repairs.repair(pool, seen, live)

    def release_leftovers(self, seen: Mapping[str, CapacityStatus], known: Mapping[str, Pool]) -> list[str]:
        return self.repairs.release_leftovers(seen, known)


@dataclass(frozen=True)
class _PoolParts:
    """The warm pools' services below the job lifecycle, which it calls (units, jobs on them)."""

    store: WarmPoolStore
    agents: UnitAgents
    quota: UnitQuota
    units: PoolUnits
    jobs: PoolJobs

    @staticmethod
    def build(
        store: WarmPoolStore,
        jobs: JobStore,
        capacity: Capacity,
        settings: Settings,
        clock: Clock,
        sleep: Callable[[float], None],
        journal: JobJournal,
        quota: UnitQuota,
        observe: Observe,
    ) -> _PoolParts:
        agents = UnitAgents(store, jobs, capacity, settings)
        units = PoolUnits(store, jobs, capacity, clock, sleep, journal, quota, agents, observe)
        pool_jobs = PoolJobs(store, jobs, tuple(settings.admins), journal, units, observe)
        return _PoolParts(store, agents, quota, units, pool_jobs)

    def complete(
        self,
        jobs: JobStore,
        capacity: Capacity,
        settings: Settings,
        clock: Clock,
        access: AccessPolicyReader | None,
        vetting: Vetting,
        lifecycle: JobLifecycle,
        handoff: CapacityHandoff | None,
    ) -> WarmPools:
        """The services above the lifecycle too: management, and the reconciler's repair."""
        management = PoolManagement(
            self.store, settings, clock, access, vetting, self.quota, self.units, self.jobs, handoff
        )
        repairs = PoolRepair(
            self.store, jobs, capacity, clock, settings.zone_wait_seconds,
            self.units, self.agents, self.quota, self.jobs, lifecycle,
        )  # fmt: skip
        return WarmPools(self.store, self.units, self.jobs, management, repairs)


class Engine:
    """Every use case of the job engine, on explicit ports: no global clients, no clock of its own.

    The ports stay readable here (a test's reads, the reconciler's wiring), but each service got
    its own at construction: build another Engine to change one.
    """

    def __init__(
        self,
        store: JobStore,
        capacity: Capacity,
        settings: Settings,
        clock: Clock,
        sleep: Callable[[float], None] = time.sleep,
        status: StatusPublisher | None = None,
        exports: LogExportRequests | None = None,
        pools: Pools | None = None,
        access: AccessPolicyReader | None = None,
        warm_pools: WarmPoolStore | None = None,
        handoff: CapacityHandoff | None = None,
        teams: Teams | None = None,
        budgets: TeamBudgets | None = None,
    ) -> None:
        """`handoff`: where capacity work goes after each commit, for an engine whose `capacity`
        cannot act (the jobs API's); None: done here, on `capacity`. `teams`: config/teams
        (None: no teams, every job in none). `budgets`: the teams' monthly chip-hours, whose
        new jobs wait once over budget (None: no budgets kept)."""
        self.store = store
        self.capacity = capacity
        self.settings = settings
        self.clock = clock
        self.sleep = sleep
        self.status = status
        self.exports = exports
        self.pools = pools  # None: no quotas, every job is admitted at once
        self.access = access  # None: no access policies (an engine built by hand for a test)
        self.handoff = handoff
        self.teams = teams
        self.rejections = Rejections(store, clock)
        self.journal = JobJournal(store, clock, status, exports)
        self.attempts = AttemptCapacity(capacity, store, settings)
        # `self.observe` closes the one loop: acting on a job can observe it again (`journal.Observe`).
        paused = budgets.over_budget if budgets is not None else None
        self.admission = Admission(pools, clock, sleep, self.journal, self.attempts, self.observe, teams, paused)
        parts = None  # the warm pools' parts below the lifecycle, given each port they use
        if warm_pools is not None:
            quota = UnitQuota(pools, clock, self.admission, teams, access)
            parts = _PoolParts.build(
                warm_pools, store, capacity, settings, clock, sleep, self.journal, quota, self.observe
            )
        pool_jobs = parts.jobs if parts is not None else None
        self.vetting = Vetting(settings, access, pools, pool_jobs)
        self.lifecycle = JobLifecycle(
            store, clock, sleep, self.journal, self.attempts, self.admission, pool_jobs, handoff
        )
        self.warm = None  # None: built without warm pools
        if parts is not None:
            self.warm = parts.complete(store, capacity, settings, clock, access, self.vetting, self.lifecycle, handoff)
        self.reports = reports = SignedReports(store, settings.master_keys(), clock, self.rejections)
        self.submission = Submission(
            store, settings, clock, self.vetting, self.journal, self.rejections, self.lifecycle, teams, access
        )
        self.worker_events = WorkerEvents(store, settings, clock, reports, self.rejections, self.lifecycle)
        units = parts.units if parts else None
        audits = AuditEntries((settings.project, settings.project_number), store, reports.forgeries, units)
        self.capacity_events = CapacityEvents(capacity, reports, self.lifecycle, audits, units)
        management = self.warm.management if self.warm is not None else None
        self.controls = Controls(store, settings, self.vetting, self.rejections, self.lifecycle, management, access)
        self.convergence = Convergence(self.lifecycle, self.rejections, management)

    # -- the reconciler's `JobRepairs`, and the jobs API's actions, each on its service ------

    def reject(self, message: InboundMessage, reason: str) -> None:
        self.rejections.reject(message, reason)

    def announce(self, job: Job, event: JobEvent) -> None:
        self.journal.announce(job, event)

    def request_export(self, job_id: str, attempt: int) -> None:
        self.journal.request_export(job_id, attempt)

    def observe(self, job_id: str, seen: Observation) -> Decision | Ignored:
        return self.lifecycle.observe(job_id, seen)

    def converge(self, job_id: str) -> None:
        self.lifecycle.converge(job_id)

    def request_again(self, job_id: str) -> Decision | Ignored | None:
        return self.lifecycle.request_again(job_id)

    def finish_held_over(self, job_id: str) -> list[str]:
        return self.lifecycle.finish_held_over(job_id)

    def note_suspect_hosts(
        self, job_id: str, attempt: int, hosts: tuple[tuple[str, str], ...], reason: str
    ) -> Decision | Ignored:
        return self.lifecycle.note_suspect_hosts(job_id, attempt, hosts, reason)

    def note_repair_failure(self, job_id: str, doing: str, error: Exception) -> Decision | Ignored:
        return self.lifecycle.note_repair_failure(job_id, doing, error)

    def admit_waiting(self, pool: str, leaving: frozenset[str] = frozenset()) -> list[str]:
        return self.admission.admit_waiting(pool, leaving=leaving)

    def observe_capacity(
        self,
        queued_resource: str,
        state: HoldingState,
        detail: str = "",
        unhealthy_hosts: int = 0,
        source: Source = "tpu",
    ) -> Decision | Ignored | None:
        return self.capacity_events.observe_capacity(queued_resource, state, detail, unhealthy_hosts, source)

    def cancel(self, job_id: str, reason: str) -> Decision | Ignored:
        return self.controls.cancel(job_id, reason)

    def restart(
        self,
        job_id: str,
        action: RestartAction,
        caller: str,
        request_id: str,
        overrides: Mapping[str, Any],
        *,
        verified: bool = False,
    ) -> RestartOutcome:
        return self.controls.restart(job_id, action, caller, request_id, overrides, verified=verified)

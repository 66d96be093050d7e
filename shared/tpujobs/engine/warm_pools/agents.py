"""A unit's agents, told what to run by writing its hosts' metadata (their assignment, or idle)."""

from __future__ import annotations

import logging

from tpujobs.domain import pools
from tpujobs.domain.job import Job
from tpujobs.domain.pools import Pool, Unit, UnitState
from tpujobs.domain.spec import JobSpec, with_deployment_defaults
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.ports import Capacity, HostBoot, JobRecords, WarmPoolStore
from tpujobs.engine.settings import Settings
from tpujobs.engine.startup_script import (
    assignment_text,
    idle_assignment_text,
    render_unit_startup_script,
    unit_metadata,
)

log = logging.getLogger(__name__)


class UnitAgents:
    """Writes a unit's metadata as its pool document says, then marks it told."""

    def __init__(self, store: WarmPoolStore, jobs: JobRecords, capacity: Capacity, settings: Settings) -> None:
        self.store = store
        self.jobs = jobs
        self.capacity = capacity
        self.settings = settings

    def shape(self, pool: Pool) -> JobSpec:
        """The pool's shape with the deployment's VM defaults, as its units are asked for."""
        settings = self.settings
        return with_deployment_defaults(pool.shape(), settings.vm_defaults, default_zone=settings.default_zone)

    def startup_script(self, pool: Pool, unit: Unit) -> str:
        """The startup script of the unit's hosts: the pool-mode agent."""
        name = unit.queued_resource(pool.name)
        return render_unit_startup_script(pool.name, unit.index, name, self.shape(pool), self.settings)

    def idle_boot(self, pool: Pool, unit: Unit) -> HostBoot:
        """What a new unit's hosts boot with: the pool's account (or the deployment's), and the
        pool-mode agent waiting idle for an assignment."""
        account = pool.service_account or self.settings.tpu_service_account
        return HostBoot(account, unit_metadata(self.startup_script(pool, unit), idle_assignment_text(unit.seq)))

    def tell(self, name: str, index: int, job: Job | None = None) -> None:
        """Write the unit's node metadata as the pool document says (its job's assignment, or
        idle), then mark it told. Level-based: it writes what the document says now. A write not
        confirmed (an update still running or refused as concurrent, a node not READY) leaves
        the unit untold: the reconciler tells it again (repair.py), and that tell confirms a
        write that has landed meanwhile without writing again."""
        pool = self.store.get(name)
        unit = pool.unit(index) if pool is not None else None
        if pool is None or unit is None or unit.written or unit.state not in pools.HELD:
            return
        qr = unit.queued_resource(name)
        if unit.state is UnitState.BUSY:
            assert unit.job_id is not None
            job = job if job is not None and job.job_id == unit.job_id else self.jobs.get(unit.job_id)
            if job is None or job.warm_pool_unit != qr or job.attempt != unit.attempt:
                return  # not committed on it yet (or gone): `fill` or the reconciler settles it first
            assignment = assignment_text(job, self.settings, unit.seq, qr)
        else:
            assignment = idle_assignment_text(unit.seq)
        script = self.startup_script(pool, unit)
        try:
            self.capacity.tell_hosts(unit.zone, qr, pool.slices, unit_metadata(script, assignment))
        except (PermanentError, TransientError) as error:  # not confirmed: the reconciler tries again
            log.warning("pool %s: unit %d not told yet: %s", name, index, error)
            return
        self.store.update(name, lambda p: pools.marked_written(p, index, unit.seq))

"""The jobs of a warm pool: who may use it, a unit for a queued job, and where its jobs go
when the pool is deleted (cancelled, or to capacity of their own, `pool_fallback: provision`)."""

from __future__ import annotations

from tpujobs.domain import pools
from tpujobs.domain.access import AccessPolicies
from tpujobs.domain.job import Job
from tpujobs.domain.pools import PoolState
from tpujobs.domain.spec import JobSpec
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Decision, Observation
from tpujobs.engine import process_log
from tpujobs.engine.jobs.admission import SubmitOutcome
from tpujobs.engine.jobs.journal import JobJournal, Observe, cancellation
from tpujobs.engine.ports import JobRecords, WarmPoolStore
from tpujobs.engine.warm_pools.changes import tally
from tpujobs.engine.warm_pools.units import PoolUnits


class PoolJobs:
    """Jobs asking for a pool: vetted, given units in the pool's order, or sent elsewhere."""

    def __init__(
        self,
        store: WarmPoolStore,
        jobs: JobRecords,
        admins: tuple[str, ...],
        journal: JobJournal,
        units: PoolUnits,
        observe: Observe,
    ) -> None:
        self.store = store
        self.jobs = jobs
        self.admins = admins
        self.journal = journal
        self.units = units
        self.observe = observe

    def refusal(self, spec: JobSpec, *, owner_verified: bool, policies: AccessPolicies | None) -> str | None:
        """Why a job may not ask for its `pool`: none by that name, being deleted, its shape or
        account differs, or its owner is not the pool's (nor a user it names, nor an admin).
        A topic's owner is a claim, so only a verified owner counts (unless `policies` trust it)."""
        if spec.pool is None:
            return None
        pool = self.store.get(spec.pool)
        if pool is None:
            return f"no pool named {spec.pool}: `tpujobs pool list` shows them"
        if pool.state is not PoolState.ACTIVE:
            return f"pool {spec.pool} is being deleted"
        misfit = pools.misfit(spec, pool)
        if misfit is not None:
            return misfit
        if not owner_verified and not (policies is not None and policies.trust_topic_owners):
            return (
                f"a job on pool {spec.pool} needs a verified owner: its jobs share the pool's VMs, so submit "
                "through the jobs API (tpujobs submit with TPUJOBS_API_URL)"
            )
        members = policies.members(spec.owner) if policies is not None else frozenset({spec.owner})
        if not pools.may_use(pool, spec.owner, self.admins, members):
            return f"{spec.owner} may not run jobs on pool {spec.pool}: its owner {pool.owner} names who may"
        return None

    def admit(self, job: Job) -> SubmitOutcome:
        """A QUEUED job of a pool: a free unit now, in the pool's order, or it waits saying why
        (or leaves for capacity of its own, `pool_fallback: provision`)."""
        placed = self.units.fill(job.warm_pool)
        if job.job_id in placed:
            return SubmitOutcome("provisioning", job.job_id, f"assigned a unit of pool {job.warm_pool}")
        current = self.jobs.get(job.job_id)
        if current is None or current.state is not JobState.QUEUED or current.warm_pool != job.warm_pool:
            return SubmitOutcome("duplicate", job.job_id, "the job moved on meanwhile")
        pool = self.store.get(job.warm_pool)
        if pool is None or pool.state is not PoolState.ACTIVE:
            if current.warm_pool:
                self.settle_jobs_of_deleted(job.warm_pool, f"Pool {job.warm_pool} no longer exists")
            return SubmitOutcome("queued", job.job_id, f"pool {job.warm_pool} is gone")
        if pool.unit_of(current.job_id, current.attempt) is not None:  # a racing fill took it
            return SubmitOutcome("provisioning", job.job_id, f"assigned a unit of pool {job.warm_pool}")
        if current.spec.pool_fallback == "provision":
            why = f"No unit of pool {pool.name} is free ({tally(pool)})"
            outcome = self.observe(current.job_id, Observation(EventKind.LEFT_POOL, current.attempt, "submit", why))
            state = outcome.job.state.value.lower() if isinstance(outcome, Decision) else "queued"
            return SubmitOutcome("provisioning" if state == "provisioning" else "queued", job.job_id, why)
        why = f"Waiting for a free unit of pool {pool.name} ({tally(pool)}), in the pool's order (priority, then age)."
        self.journal.commit(current.job_id, Observation(EventKind.WAITING_FOR_POOL, current.attempt, "submit", why))
        return SubmitOutcome("queued", job.job_id, why)

    def settle_jobs_of_deleted(self, name: str, why: str) -> None:
        """Every job of a deleted pool goes: cancelled, or to capacity of its own."""
        for job in self.store.jobs_on(name):
            process_log.bind_job(job.job_id)
            if job.spec.pool_fallback == "provision":
                outcome = self.observe(job.job_id, Observation(EventKind.LEFT_POOL, None, "user", why))
                if isinstance(outcome, Decision) and job.warm_pool_unit:
                    self.units.leave_unit(job.job_id, job.attempt, job.warm_pool_unit, lost=False)
            else:
                cancelled = f"{why}; the job was cancelled (set pool_fallback: provision to move)."
                self.observe(job.job_id, cancellation(cancelled))

    def leave_attempt(self, job: Job) -> None:
        """An ended or recovering job's current attempt leaves its unit (`PoolUnits.leave_attempt`)."""
        self.units.leave_attempt(job)

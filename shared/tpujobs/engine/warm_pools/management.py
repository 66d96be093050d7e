"""Managing warm pools (the jobs API, tpujobs-control, the CLI): create, resize, delete.

`verified`: the jobs API proved the caller; otherwise the caller is tpujobs-control's claim,
which config/policies must trust before it creates a pool or touches one the API made.

Built with a `handoff` (the jobs API's engine), a change is committed on the pool's document and
the pool's name handed to the `converge` function (tpujobs-converge), whose `converge` here does
the capacity work."""

from __future__ import annotations

import logging
from dataclasses import replace

from tpujobs.domain import pools
from tpujobs.domain.access import AccessPolicies, topic_control_refusal
from tpujobs.domain.admission import limit_words, pool_of
from tpujobs.domain.pools import Pool, PoolError, PoolState
from tpujobs.domain.spec import JobSpec, SpecError, with_deployment_defaults
from tpujobs.engine.jobs.vetting import Vetting
from tpujobs.engine.pool_requests import PoolOutcome
from tpujobs.engine.ports import AccessPolicyReader, CapacityHandoff, Clock, WarmPoolStore
from tpujobs.engine.settings import Settings
from tpujobs.engine.warm_pools.jobs import PoolJobs
from tpujobs.engine.warm_pools.quota import UnitQuota
from tpujobs.engine.warm_pools.units import PoolUnits

log = logging.getLogger(__name__)


class PoolManagement:
    """Pools created, resized and deleted for their owners or admins, within the quota."""

    def __init__(
        self,
        store: WarmPoolStore,
        settings: Settings,
        clock: Clock,
        access: AccessPolicyReader | None,
        vetting: Vetting,
        quota: UnitQuota,
        units: PoolUnits,
        pool_jobs: PoolJobs,
        handoff: CapacityHandoff | None = None,
    ) -> None:
        """`handoff`: where the capacity work goes after each change (None: done here)."""
        self.store = store
        self.settings = settings
        self.clock = clock
        self.access = access
        self.vetting = vetting
        self.quota = quota
        self.units = units
        self.pool_jobs = pool_jobs
        self.handoff = handoff

    def create(self, data: dict[str, object], caller: str, *, verified: bool) -> PoolOutcome:
        """`pool create`: admins, or owners `config/policies.pools` allows; the quota must be able
        to hold every unit. The units are asked for at once."""
        try:
            request, shape = pools.parse_pool_request({**data, "owner": caller}, self.settings.default_zone)
            shape = with_deployment_defaults(
                shape,
                self.settings.vm_defaults,
                default_zone=self.settings.default_zone,
                compute_by_default=frozenset(self.settings.compute_by_default),
            )
            request = replace(request, platform=shape.platform or request.platform)
        except (PoolError, SpecError) as error:
            return PoolOutcome("invalid", None, f"Invalid pool: {error}")
        refused = self._creation_refusal(caller, verified, shape)
        if refused is not None:
            return PoolOutcome("forbidden", None, refused)
        too_big = self._never_fits(request.count, shape, request.zones)
        if too_big is not None:
            return PoolOutcome("invalid", None, too_big)
        pool = pools.new_pool(request, self.clock(), owner_verified=verified)
        if not self.store.create(pool):
            existing = self.store.get(request.name)
            return PoolOutcome("exists", existing, f"a pool named {request.name} already exists")
        log.info("pool %s created by %s: %d unit(s)", pool.name, caller, pool.count)
        self._converge_or_hand_off(pool.name)
        return PoolOutcome("done", self.store.get(pool.name), pool.reason)

    def _creation_refusal(self, caller: str, verified: bool, shape: JobSpec) -> str | None:
        policies = self.access.policies() if self.access is not None else None
        if not caller:
            return "a pool needs an owner"
        trusted = verified or (policies is not None and policies.trust_topic_owners)
        if not trusted:
            return "creating a pool needs a verified caller: use the jobs API (tpujobs pool with TPUJOBS_API_URL)"
        return self._rights_refusal(caller, "create pools", shape, policies)

    def _rights_refusal(self, caller: str, what: str, shape: JobSpec, policies: AccessPolicies | None) -> str | None:
        """Why `caller`'s rights as they are now do not allow more of this pool's capacity."""
        if caller not in self.settings.admins and (
            policies is None or not policies.members(caller) & set(policies.pools)
        ):
            return f"{caller} may not {what}: an admin allows it in config/policies.pools"
        # Reserved capacity and a service account need what a job of the caller would need.
        return self.vetting.refusal(shape, owner_verified=True, policies=policies)

    def _never_fits(self, count: int, shape: JobSpec, zones: tuple[str, ...]) -> str | None:
        book = self.quota.quotas()
        chips = count * shape.chips
        limits_passed: list[str] = []
        for zone in zones:  # a limit of 0 is a pause, not a size (`Limits.never_fits`)
            key = pool_of(shape, zone)
            limits = book.limits(key)
            scope = limits.never_fits(zone, chips)
            if scope is None:
                return None
            limits_passed.append(f"{limit_words(key, scope, zone)} ({limits.of(scope, zone)})")
        return (
            f"{count} unit(s) of {shape.chips} chips need {chips} chips, more than "
            f"{'; '.join(dict.fromkeys(limits_passed))}: ask an admin to raise it, or ask for fewer units"
        )

    def _management_refusal(self, pool: Pool, action: str, caller: str, verified: bool) -> str | None:
        """Why `caller` may not resize or delete the pool: its owner or an admin may; a claim on
        the topic only a pool a claim made for it, unless config/policies trusts claims."""
        if not pools.may_manage(pool, caller, self.settings.admins):
            return f"{caller} may not {action} pool {pool.name}: only its owner or an admin"
        if verified:
            return None
        policies = self.access.policies() if self.access is not None else AccessPolicies()
        return topic_control_refusal(
            action, f"pool {pool.name}", owner=pool.owner, owner_verified=pool.owner_verified, claimed=caller,
            admins=self.settings.admins, policies=policies,
        )  # fmt: skip

    def resize(self, name: str, count: int, caller: str, *, verified: bool) -> PoolOutcome:
        """`pool resize`: new units are asked for at once; surplus units go once no job is on them."""
        pool = self.store.get(name)
        if pool is None:
            return PoolOutcome("missing", None, f"no pool named {name}")
        refused = self._management_refusal(pool, "resize", caller, verified)
        if refused is not None:
            return PoolOutcome("forbidden", pool, refused)
        if pool.state is not PoolState.ACTIVE:
            return PoolOutcome("invalid", pool, f"pool {name} is being deleted")
        if count > pool.count:  # more capacity: the caller's rights now, not when it was made
            policies = self.access.policies() if self.access is not None else None
            refused = self._rights_refusal(caller, f"grow pool {name}", pool.shape(), policies)
            if refused is not None:
                return PoolOutcome("forbidden", pool, refused)
            too_big = self._never_fits(count, pool.shape(), pool.zones)
            if too_big is not None:
                return PoolOutcome("invalid", pool, too_big)
        try:
            self.store.update(name, lambda p: pools.resized(p, count, self.clock()))
        except PoolError as error:
            return PoolOutcome("invalid", pool, f"Invalid resize: {error}")
        self._converge_or_hand_off(name)
        return PoolOutcome("done", self.store.get(name), f"Pool {name} resized to {count} unit(s).")

    def delete(self, name: str, caller: str, *, verified: bool) -> PoolOutcome:
        """`pool delete`: jobs on it are cancelled, or moved to capacity of their own
        (`pool_fallback: provision`); units are released; the document goes with the last."""
        pool = self.store.get(name)
        if pool is None:
            return PoolOutcome("missing", None, f"no pool named {name}")
        refused = self._management_refusal(pool, "delete", caller, verified)
        if refused is not None:
            return PoolOutcome("forbidden", pool, refused)
        self.store.update(
            name, lambda p: pools.deleting(p, self.clock(), caller) if p.state is PoolState.ACTIVE else None
        )
        self._converge_or_hand_off(name)
        return PoolOutcome("done", self.store.get(name), f"Pool {name} is being deleted.")

    def _converge_or_hand_off(self, name: str) -> None:
        if self.handoff is not None:
            self.handoff.hand_off_pool(name)
        else:
            self.converge(name)

    def converge(self, name: str) -> None:
        """Do what the pool's document says, whoever asks and however often (level-based, like the
        reconciler's repair): an ACTIVE pool's units that should be asked for are, its surplus
        ones go once free; a DELETING pool's jobs are cancelled or moved and its units released."""
        pool = self.store.get(name)
        if pool is None:
            return
        if pool.state is PoolState.DELETING:
            self.pool_jobs.settle_jobs_of_deleted(name, _deletion(pool))
        else:
            self.units.request_units(name)
        self.units.settle_units(name)


def _deletion(pool: Pool) -> str:
    """Why a deleted pool's jobs go: who deleted it, while its reason is still `pools.deleting`'s."""
    by = pool.reason.removeprefix("Deleted by ").removesuffix(".") if pool.reason.startswith("Deleted by ") else ""
    return f"Pool {pool.name} was deleted" + (f" by {by}" if by else "")

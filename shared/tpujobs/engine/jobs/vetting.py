"""One vetting of a submitted spec, for every path a job comes in by (the topic, the jobs API,
a resume or rerun with overrides): may this owner run it, and could it ever fit its quota?"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tpujobs.domain.access import AccessPolicies, submission_refusal
from tpujobs.domain.admission import refusal_when_oversized
from tpujobs.domain.naming import code_location_refusal
from tpujobs.domain.quotas import QuotaBook
from tpujobs.domain.spec import JobSpec, with_deployment_defaults
from tpujobs.engine.ports import AccessPolicyReader, Pools
from tpujobs.engine.settings import Settings


class PoolAccess(Protocol):
    """Whether a job may ask for its warm pool (`warm_pools.PoolAccess`)."""

    def refusal(self, spec: JobSpec, *, owner_verified: bool, policies: AccessPolicies | None) -> str | None: ...


@dataclass(frozen=True)
class Verdict:
    """A vetted spec: why it is refused (None: accepted), whether for its size (the quota, not
    the owner's rights), and the quotas as read for it, for its admission."""

    refusal: str | None
    oversized: bool = False
    quotas: QuotaBook | None = None


class Vetting:
    """The owner's rights (priority, reserved capacity, service account, warm pool) and the size."""

    def __init__(
        self,
        settings: Settings,
        access: AccessPolicyReader | None = None,
        pools: Pools | None = None,
        warm: PoolAccess | None = None,
    ) -> None:
        self.settings = settings
        self.access = access  # None: no access policies (a service built by hand for a test)
        self.pools = pools  # None: no quotas
        self.warm = warm  # None: no warm pools in this deployment

    def completed(self, spec: JobSpec) -> JobSpec:
        """The spec with the deployment's VM defaults (network, tags, ...) where its author gave
        none, so the stored spec says what was requested; SpecError if they do not fit it."""
        return with_deployment_defaults(
            spec,
            self.settings.vm_defaults,
            default_zone=self.settings.default_zone,
            compute_by_default=frozenset(self.settings.compute_by_default),
        )

    def vet(self, spec: JobSpec, *, owner_verified: bool) -> Verdict:
        """The owner's rights first, then the size; the quotas are read once, for the size
        check and the job's admission alike (a round trip a job)."""
        refusal = self.refusal(spec, owner_verified=owner_verified)
        if refusal is not None:
            return Verdict(refusal)
        quotas = self.pools.quotas() if self.pools is not None and spec.pool is None else None
        too_big = self.oversize(spec, quotas)
        return Verdict(too_big, oversized=True) if too_big is not None else Verdict(None, quotas=quotas)

    def refusal(self, spec: JobSpec, *, owner_verified: bool, policies: AccessPolicies | None = None) -> str | None:
        """Why this owner may not submit this spec (privileged priority, reserved capacity, a
        service account; code in another account's prefix of the code bucket;
        `domain.access.submission_refusal`; a warm pool it may not use), or
        None. `policies`: the access policies when the caller has read them already."""
        account = spec.service_account
        if account and account == self.settings.tpu_service_account:
            return f"{account} is the deployment's default account: leave service_account out to use it"
        known = self.settings.job_service_accounts
        if account and known and account not in known:
            return f"{account} is not one of this deployment's job accounts ({', '.join(known)}): infra/ creates them"
        code_refused = code_location_refusal(spec.code_uri, self.settings.logs_bucket, account)
        if code_refused is not None:
            return code_refused
        if policies is None and self.access is not None:  # read once, for the pool and the rest
            policies = self.access.policies()
        if spec.pool is not None:
            if self.warm is None:
                return f"this deployment has no warm pools, so pool {spec.pool!r} cannot be used"
            refused = self.warm.refusal(spec, owner_verified=owner_verified, policies=policies)
            if refused is not None:
                return refused
        if policies is None:  # no policy store (a service built by hand): everything allowed
            return None
        return submission_refusal(spec, owner_verified=owner_verified, admins=self.settings.admins, policies=policies)

    def oversize(self, spec: JobSpec, quotas: QuotaBook | None = None) -> str | None:
        """Why a job bigger than the quota of every zone it may run in could never run (waiting
        at the head of a queue it would stop the jobs behind it), or None. A job of a warm pool
        asks for no chips of its own: the pool's units hold them. `quotas`: as already read."""
        if self.pools is None or spec.pool is not None:
            return None
        zones = spec.preferred_zones or (self.settings.default_zone,)
        return refusal_when_oversized(spec, zones, self.pools.quotas() if quotas is None else quotas)

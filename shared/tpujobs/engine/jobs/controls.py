"""tpujobs-control and the jobs API's controls: cancel, resume and rerun a job, which only its
owner or an admin may ask; and a warm pool's create, resize or delete sent on the topic.

On the topic the `owner` is a claim: unless config/policies trusts it, a message acts only on
what a claim owns (`domain.access.topic_control_refusal`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from tpujobs.domain.access import AccessPolicies, may_cancel, topic_control_refusal
from tpujobs.domain.job import Job
from tpujobs.domain.restart_overrides import RestartAction, describe_overrides, overridden_spec
from tpujobs.domain.spec import SpecError
from tpujobs.domain.states import EventKind, allowed_targets
from tpujobs.domain.transitions import Decision, Ignored, Observation
from tpujobs.engine import process_log
from tpujobs.engine.control_requests import ControlRequest, decode_control
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.jobs.lifecycle import JobLifecycle
from tpujobs.engine.jobs.rejections import Rejections
from tpujobs.engine.jobs.vetting import Vetting
from tpujobs.engine.messages import ReportError
from tpujobs.engine.pool_requests import PoolControlRequest, PoolCreateRequest, PoolOutcome, PoolResizeRequest
from tpujobs.engine.ports import AccessPolicyReader, JobRecords
from tpujobs.engine.settings import Settings


@dataclass(frozen=True)
class RestartOutcome:
    """What became of one resume or rerun request: started, a duplicate of one that did, or
    refused (missing job, forbidden caller or override, invalid override, job not ended)."""

    kind: Literal["started", "duplicate", "missing", "forbidden", "invalid", "refused"]
    job_id: str
    job: Job | None  # as it is after the request (as it was, when refused)
    reason: str


_RESTART_EVENTS: dict[RestartAction, EventKind] = {
    "resume": EventKind.RESUME_REQUESTED,
    "rerun": EventKind.RERUN_REQUESTED,
}


def restart_refusal(job: Job | None, action: RestartAction) -> str | None:
    """Why `action` cannot start a new attempt of this job now, as a sentence; None if it can."""
    if job is None:
        return "the job no longer exists"
    if allowed_targets(job.state, _RESTART_EVENTS[action]):  # the transition table decides
        return None
    if not job.state.is_terminal:
        return (
            f"{job.job_id} is {job.state.value} (attempt {job.attempt}): it has not ended, so there is "
            f"nothing to {action}; cancel it first, or wait for it to end."
        )
    return f"{job.job_id} SUCCEEDED: only a FAILED or CANCELLED job can be resumed; rerun it to start again."


class PoolControls(Protocol):
    """The warm pools' management, as a control on the topic asks it (`warm_pools.PoolManagement`)."""

    def create(self, data: dict[str, object], caller: str, *, verified: bool) -> PoolOutcome: ...
    def resize(self, name: str, count: int, caller: str, *, verified: bool) -> PoolOutcome: ...
    def delete(self, name: str, caller: str, *, verified: bool) -> PoolOutcome: ...


class Controls:
    """A user's requests about a job (cancel, resume, rerun) or a warm pool, checked and acted on."""

    def __init__(
        self,
        store: JobRecords,
        settings: Settings,
        vetting: Vetting,
        rejections: Rejections,
        lifecycle: JobLifecycle,
        pools: PoolControls | None = None,
        access: AccessPolicyReader | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.vetting = vetting
        self.rejections = rejections
        self.lifecycle = lifecycle
        self.pools = pools  # None: no warm pools in this deployment
        self.access = access  # None: no policy store, so the topic's claims are not trusted

    def on_control(self, message: InboundMessage) -> Decision | Ignored | None:
        """tpujobs-control: a cancel, resume or rerun request, which only the owner or an admin may
        ask, and the claim only of a job a claim submitted unless config/policies trusts it; or a
        warm pool's create, resize or delete (`_on_pool_control`)."""
        try:
            request = decode_control(message.data)
        except ReportError as error:
            self.rejections.reject(message, message.undecodable or str(error))
            return None
        if not isinstance(request, ControlRequest):
            return self._on_pool_control(message, request)
        job = self.store.get(request.job_id)
        if job is None:
            self.rejections.reject(message, f"job_id {request.job_id!r}: no such job")
            return None
        refusal = topic_control_refusal(
            request.action, f"job {job.job_id}", owner=job.owner, owner_verified=job.owner_verified,
            claimed=request.owner, admins=self.settings.admins, policies=self._policies(),
        )  # fmt: skip
        if refusal is not None:
            self.rejections.reject(message, refusal)
            return None
        if request.action != "cancel":  # resume, rerun: a retry of the message starts nothing
            request_id = request.request_id or f"message-{message.message_id}"
            restart = self.restart(request.job_id, request.action, request.owner, request_id, request.overrides)
            if restart.kind not in ("started", "duplicate"):
                self.rejections.reject(message, restart.reason)
            return None
        return self.cancel(request.job_id, f"Cancelled by {request.owner}.")

    def _policies(self) -> AccessPolicies:
        """config/policies as it is now; without a policy store, the defaults (claims not trusted)."""
        return self.access.policies() if self.access is not None else AccessPolicies()

    def _on_pool_control(self, message: InboundMessage, request: PoolControlRequest) -> Ignored | None:
        """A pool's request on the topic, where `owner` is a claim: unless config/policies trusts
        topic owners, the pools' management refuses to create, and resizes or deletes only a pool a
        claim made for that same claimed owner (never one made through the jobs API, and a
        claimed admin is a claim too). A refusal is a rejection with the reason.
        A redelivered message changes nothing: a create finds its own pool (same owner), a delete
        finds none."""
        if self.pools is None:
            self.rejections.reject(message, "this deployment has no warm pools")
            return None
        if isinstance(request, PoolCreateRequest):
            outcome = self.pools.create(dict(request.pool), request.owner, verified=False)
        elif isinstance(request, PoolResizeRequest):
            outcome = self.pools.resize(request.name, request.count, request.owner, verified=False)
        else:
            outcome = self.pools.delete(request.name, request.owner, verified=False)
        again = (outcome.kind == "exists" and outcome.pool is not None and outcome.pool.owner == request.owner) or (
            outcome.kind == "missing" and request.action == "pool-delete"
        )
        if again:
            return Ignored(f"{request.action}: {outcome.reason}; nothing to do")
        if outcome.kind != "done":
            self.rejections.reject(message, outcome.reason)
        return None

    def cancel(self, job_id: str, reason: str) -> Decision | Ignored:
        """Cancel a job (its caller has checked the right to) and release its capacity."""
        return self.lifecycle.cancel(job_id, reason)

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
        """Resume or rerun an ended job: a new attempt, same job_id, through admission.

        The owner or an admin only (the rule of cancel; `verified`: the jobs API proved the
        caller). The spec, overridden or not, is vetted as at submit: the owner's current
        privileges and the quota. `request_id` is remembered on the job in the same commit as the
        move, so a retried request (or a redelivered message) starts no second attempt.
        """
        process_log.bind_job(job_id)
        job = self.store.get(job_id)
        if job is None:
            return RestartOutcome("missing", job_id, None, f"job_id {job_id!r}: no such job")
        if not may_cancel(job.owner, caller, self.settings.admins):
            return RestartOutcome(
                "forbidden", job_id, job, f"{caller} may not {action} {job_id}: only its owner or an admin may."
            )
        already = f"request {request_id} already started an attempt of {job_id}"
        if request_id in job.restart_requests:
            self.lifecycle.converge(job_id)  # the first call may have died after its commit: finish it
            return RestartOutcome("duplicate", job_id, job, already)
        refusal = restart_refusal(job, action)
        if refusal is not None:
            return RestartOutcome("refused", job_id, job, refusal)
        try:
            spec = overridden_spec(job.spec, overrides)
        except SpecError as error:
            return RestartOutcome("invalid", job_id, job, f"Invalid override: {error}")
        # The owner's rights as they are now, overrides or not: rights an admin has taken away
        # since the job ran (priority, reserved capacity, a service account, a pool) are gone.
        owner_verified = job.owner_verified or (verified and caller == job.owner)
        verdict = self.vetting.vet(spec, owner_verified=owner_verified)
        if verdict.refusal is not None:
            return RestartOutcome("invalid" if verdict.oversized else "forbidden", job_id, job, verdict.refusal)
        changed = describe_overrides(job.spec, spec)
        how = "from its checkpoint" if action == "resume" else "from scratch"
        reason = f"{action.capitalize()} asked by {caller}{'' if verified else ' (via the topic)'}, {how}" + (
            f"; overrides: {changed}." if changed else "."
        )
        kind = _RESTART_EVENTS[action]
        seen = Observation(kind, None, "user", reason, request_id=request_id, spec=spec)
        outcome = self.lifecycle.observe(job_id, seen)
        after = self.store.get(job_id)
        if isinstance(outcome, Decision):
            return RestartOutcome("started", job_id, after or outcome.job, reason)
        if after is not None and request_id in after.restart_requests:  # a concurrent retry won
            return RestartOutcome("duplicate", job_id, after, already)
        return RestartOutcome("refused", job_id, after, restart_refusal(after, action) or outcome.reason)

"""The job service: decode, decide, commit, act. Every function handler calls into it.

The order is always the same: commit the decision in one transaction, then perform
the actions the job's new state implies (`converge`). A crash in between leaves a job
whose record says what should happen next; the redelivered message or the reconciler
calls `converge` again and finishes it, because every action is idempotent:
queued-resource names are deterministic and deleting what is gone is fine.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

from tpujobs.domain import signing
from tpujobs.domain.access import AccessPolicies, may_cancel, submission_refusal
from tpujobs.domain.admission import (
    Holder,
    chips_held,
    fits,
    never_fits,
    never_fits_reason,
    pool_id,
    quota_of,
    refusal_when_oversized,
    victims_for,
    waiting_reason,
)
from tpujobs.domain.job import Job, JobEvent, Source, SubmittedVia, new_job, worker_key
from tpujobs.domain.naming import (
    job_prefix,
    parse_queued_resource_name,
    parse_unit_queued_resource_name,
    queued_resource_name,
)
from tpujobs.domain.restart_overrides import RestartAction, describe_overrides, overridden_spec
from tpujobs.domain.restart_rules import BACKOFF_CAP_SECONDS
from tpujobs.domain.spec import JobSpec, SpecError, decode_spec, with_deployment_defaults
from tpujobs.domain.states import ATTEMPT_LIVE, QUOTA_EXHAUSTED, EventKind, JobState, allowed_targets
from tpujobs.domain.transitions import Decision, Ignored, Observation
from tpujobs.engine import process_log
from tpujobs.engine.errors import PermanentError, QuotaExhausted, TransientError
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.pool_service import WarmPoolService
from tpujobs.engine.ports import (
    AccessPolicyReader,
    CapacityStatus,
    Clock,
    JobStore,
    LogExportRequests,
    Pools,
    PoolView,
    Rejection,
    StatusChange,
    StatusPublisher,
    Tpu,
    WarmPoolStore,
    WorkerRecord,
)
from tpujobs.engine.reports import (
    ControlRequest,
    PoolControlRequest,
    PoolCreateRequest,
    PoolResizeRequest,
    PreemptionNotice,
    QrStateReport,
    Report,
    ReportError,
    SignedReport,
    WorkerReport,
    audit_log_target,
    decode_control,
    decode_report,
)
from tpujobs.engine.settings import Settings
from tpujobs.engine.startup_script import host_boot

log = logging.getLogger(__name__)

# Queued-resource states, as the TPU API names them, grouped by what they mean for a job.
CAPACITY_PENDING = frozenset({"CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"})
CAPACITY_GONE = frozenset({"SUSPENDING", "SUSPENDED", "FAILED"})

# An attempt whose job moves from ATTEMPT_LIVE to one of these has ended: export its output.
_ATTEMPT_OVER = frozenset(
    {JobState.RECOVERING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.QUEUED}
)
Quotas = Mapping[str, Mapping[str, int]]  # config/quotas: zone -> family -> chips
ADMISSION_ROUNDS = 50  # admissions (or lost races) one call may make before leaving the rest
QUEUE_PEEK = 5  # queued jobs read per round: the head, and claims still being finished


def _sent_back_to_queue(decision: Decision) -> bool:
    """Sent back to QUEUED from a live attempt: evicted, or moved to the next zone."""
    event = decision.event
    return event.to_state is JobState.QUEUED and event.from_state in ATTEMPT_LIVE | {JobState.RECOVERING}


def ended_attempt(decision: Decision) -> int | None:
    """The attempt a committed change ended, or None.

    From PROVISIONING or RUNNING to RECOVERING, SUCCEEDED, FAILED or CANCELLED; a cancel only
    once the job has started (before, there is no output). A move out of RECOVERING or QUEUED
    ends nothing: the attempt it names ended earlier, or never ran.
    """
    event = decision.event
    if event.from_state not in ATTEMPT_LIVE or event.to_state not in _ATTEMPT_OVER:
        return None
    if event.to_state is JobState.CANCELLED and decision.job.started_at is None:
        return None
    return event.attempt


@dataclass(frozen=True)
class _PoolQueue:
    """One read of a limited pool: its document as read (for the compare-and-set), the holds
    that stay and those that go with the next write, and the jobs still waiting, in order."""

    view: PoolView
    staying: list[Holder]
    going: frozenset[str]
    waiting: list[Job]


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


@dataclass(frozen=True)
class SubmitOutcome:
    """What became of one submission message."""

    kind: Literal["provisioning", "queued", "duplicate", "rejected", "failed"]
    job_id: str | None
    reason: str


class JobService:
    """The use cases of tpujobs, on explicit ports: no global clients, no clock of its own."""

    def __init__(
        self,
        store: JobStore,
        tpu: Tpu,
        settings: Settings,
        clock: Clock,
        sleep: Callable[[float], None] = time.sleep,
        status: StatusPublisher | None = None,
        exports: LogExportRequests | None = None,
        pools: Pools | None = None,
        access: AccessPolicyReader | None = None,
        warm_pools: WarmPoolStore | None = None,
    ) -> None:
        self.store = store
        self.tpu = tpu
        self.settings = settings
        self.clock = clock
        self.sleep = sleep
        self.status = status
        self.exports = exports
        self.pools = pools  # None: no quotas, every job is admitted at once
        self.access = access  # None: no access policies (a service built by hand for a test)
        # Warm pools (`tpujobs pool`): None when the service was built without their store.
        self.warm = WarmPoolService(warm_pools, self) if warm_pools is not None else None

    # -- rejections ------------------------------------------------------------------

    def reject(self, message: InboundMessage, reason: str) -> None:
        """Record why a message could not be used; the caller then acknowledges it. A reason
        may quote the message, so it is scrubbed of attempt keys like the payload."""
        reason = signing.scrub(reason)
        log.warning("rejected message %s on %s: %s", message.message_id, message.topic, reason)
        self.store.reject(
            Rejection(message.message_id, self.clock(), reason, signing.scrub(message.payload_text()), message.topic)
        )

    # -- submission ------------------------------------------------------------------

    def completed(self, spec: JobSpec) -> JobSpec:
        """The spec with the deployment's VM defaults (network, tags, ...) where its author gave
        none, so the stored spec says what was requested; SpecError if they do not fit it."""
        return with_deployment_defaults(spec, self.settings.vm_defaults, default_zone=self.settings.default_zone)

    def submit(self, message: InboundMessage) -> SubmitOutcome:
        """A job spec on tpujobs-submit becomes one job and one queued-resource request, at most
        once. Its `owner` is a claim nobody checked: the job records `owner_verified: false`."""
        if message.data is None:
            self.reject(message, message.undecodable)
            return SubmitOutcome("rejected", None, message.undecodable)
        try:
            spec = self.completed(decode_spec(message.data, message_id=message.message_id))
        except SpecError as error:
            self.reject(message, str(error))
            return SubmitOutcome("rejected", None, str(error))
        refusal = self.submission_refusal(spec, owner_verified=False)
        if refusal is not None:
            self.reject(message, refusal)
            return SubmitOutcome("rejected", spec.job_id, refusal)
        # The quotas are read once, for the size check and admission alike (a round trip a job).
        quotas = self.pools.quotas() if self.pools is not None and spec.pool is None else None
        refused = self._refused_as_oversized(message, spec, quotas)
        if refused is not None:
            return refused
        return self._accept(spec, "topic", lambda reason: self.reject(message, reason), quotas)

    def submit_verified(self, spec: JobSpec) -> SubmitOutcome:
        """A job spec from the jobs API, whose `owner` is the caller its ID token proved.

        The caller has checked `submission_refusal` and the quota (and answers with them),
        so a refusal here never becomes a rejection document.
        """
        return self._accept(spec, "api", lambda reason: None)

    def submission_refusal(
        self, spec: JobSpec, *, owner_verified: bool, policies: AccessPolicies | None = None
    ) -> str | None:
        """Why this owner may not submit this spec (privileged priority, reserved capacity, a
        service account; `domain.access.submission_refusal`; a warm pool it may not use), or
        None. `policies`: the access policies when the caller has read them already."""
        account = spec.service_account
        if account and account == self.settings.tpu_service_account:
            return f"{account} is the deployment's default account: leave service_account out to use it"
        known = self.settings.job_service_accounts
        if account and known and account not in known:
            return f"{account} is not one of this deployment's job accounts ({', '.join(known)}): infra/ creates them"
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

    def oversize_refusal(self, spec: JobSpec, quotas: Quotas | None = None) -> str | None:
        """Why a job bigger than the quota of every zone it may run in could never run, or None.
        A job of a warm pool asks for no chips of its own: the pool's units hold them.
        `quotas`: the quotas when the caller has read them already."""
        if self.pools is None or spec.pool is not None:
            return None
        zones = spec.preferred_zones or (self.settings.default_zone,)
        return refusal_when_oversized(spec, zones, self.pools.quotas() if quotas is None else quotas)

    def _accept(
        self, spec: JobSpec, via: SubmittedVia, refuse: Callable[[str], None], quotas: Quotas | None = None
    ) -> SubmitOutcome:
        """Create the job (once per job_id) and admit it; a job_id taken by another spec is refused.
        `quotas`: as read by the caller for this submission, else admission reads them."""
        assert spec.job_id is not None
        process_log.bind_job(spec.job_id)
        log_uri = f"gs://{self.settings.logs_bucket}/{job_prefix(spec.job_id, spec.service_account)}"
        job, first_event = new_job(
            spec,
            self.settings.default_zone,
            self.clock(),
            log_uri,
            via,
            owner_verified=via == "api",
            record_retention_days=self.settings.record_retention_days,
        )
        if self.store.create(job, first_event):
            self.announce(job, first_event)
        else:
            existing = self.store.get(job.job_id)
            if existing is None:  # deleted between the two reads: treat as new next time
                return SubmitOutcome("duplicate", job.job_id, "job vanished during submission")
            if existing.spec != spec:
                refuse(
                    f"job_id {job.job_id!r} already exists with a different spec; "
                    "a job_id names one job, so this submission was ignored"
                )
            if existing.state is not JobState.QUEUED:
                return SubmitOutcome("duplicate", job.job_id, f"job is already {existing.state.value}")
            job = existing  # an earlier delivery stopped half-way: finish its work
        return self.admit(job, quotas)

    # -- admission -------------------------------------------------------------------

    def _refused_as_oversized(
        self, message: InboundMessage, spec: JobSpec, quotas: Quotas | None = None
    ) -> SubmitOutcome | None:
        """Refuse, as a rejection, a job bigger than the quota of every zone it may run in:
        it could never run, and waiting at the head of a queue it would stop the jobs behind it."""
        refusal = self.oversize_refusal(spec, quotas)
        if refusal is None:
            return None
        self.reject(message, refusal)
        return SubmitOutcome("rejected", spec.job_id, refusal)

    def admit(self, job: Job, quotas: Quotas | None = None) -> SubmitOutcome:
        """A QUEUED job: request its capacity now if its pool has no quota, else in queue order;
        a job of a warm pool takes a free unit in that pool's order instead. `quotas`: as the
        caller read them for this job (a submission reads them once), else read here."""
        if job.warm_pool and self.warm is not None:
            return self.warm.admit(job)
        pool = pool_id(job.spec, job.zone)
        limit = self._quota(pool) if quotas is None else quota_of(quotas, pool)
        if limit is None:
            return self._admit(job)
        if never_fits(limit, job.spec.chips):
            return self._quota_exceeded(job, pool, limit)
        admitted = self.admit_waiting(pool, limit)
        if job.job_id in admitted:
            return SubmitOutcome("provisioning", job.job_id, f"admitted in {pool}")
        return SubmitOutcome("queued", job.job_id, f"waiting for quota in {pool}")

    def _quota(self, pool: str) -> int | None:
        return None if self.pools is None else quota_of(self.pools.quotas(), pool)

    def admit_waiting(self, pool: str, limit: int | None = None, leaving: frozenset[str] = frozenset()) -> list[str]:
        """Admit the pool's queue in order while its chips fit; a high-priority head may evict.

        Driven by the events that free chips (a job ends, is evicted, moves zone) and by
        submissions; the reconciler calls it too. `leaving` are jobs whose hold goes in the
        same write as the next claim. Each change is a compare-and-set on the pool's
        document, so concurrent calls never hand out a chip twice: the loser reads again.
        A head bigger than the whole quota (lowered after it was submitted) never stops the
        queue: it moves on to its next zone or fails, and the jobs behind it are looked at.
        """
        if self.pools is None:
            return []
        if limit is None:
            limit = self._quota(pool)
        admitted: list[str] = []
        for round_number in range(ADMISSION_ROUNDS):
            if round_number:  # the last round lost a race or moved its head on
                self.sleep(random.uniform(0, 0.005 * min(round_number, 10)))  # spread the retries of a burst
            queue = self._read_queue(pool, leaving)
            if not queue.waiting:
                if self._drop_holds(queue):
                    return admitted
                continue
            head = queue.waiting[0]
            if limit is not None and never_fits(limit, head.spec.chips):  # a quota lowered under it:
                self._quota_exceeded(head, pool, limit)  # it moves on or fails, and the queue goes on
                continue
            claim = self._claim(head)
            victims = self._victims(head, queue.staying, limit)
            if limit is not None and victims is None:  # no room, and none it may make
                if not self._drop_holds(queue):
                    continue
                self._say_waiting(head, pool, limit)
                return admitted
            for victim in victims or ():
                self._evict(victim.job_id, head)
            evicted = frozenset(v.job_id for v in victims or ())
            leaving = leaving | evicted  # until a write takes their holds away
            if not self.pools.change(queue.view, add=claim, remove=queue.going | evicted):
                continue
            leaving = frozenset()
            self._admit(head)
            admitted.append(head.job_id)
            staying = [h for h in queue.staying if h.job_id not in evicted]
            if limit is not None and chips_held(staying) + claim.chips >= limit:
                return admitted  # the pool is full: no need to look at the next job
        return admitted

    def _read_queue(self, pool: str, leaving: frozenset[str]) -> _PoolQueue:
        """Read the pool's holds and the head of its queue; finish the claims a call made and
        left half-way (idempotent), and mark the holds that go with the next write: `leaving`,
        and those of a queued job's earlier attempt."""
        assert self.pools is not None
        view = self.pools.view(pool)
        held = {h.job_id: h for h in view.holders}
        peeked = self.pools.queue(pool, QUEUE_PEEK)
        claimed = [j for j in peeked if j.job_id in held and held[j.job_id].attempt == j.attempt]
        for job in claimed:
            self._admit(job)
        waiting = [j for j in peeked if j not in claimed]
        stale = frozenset(j.job_id for j in waiting if j.job_id in held)
        going = (leaving | stale) & held.keys()
        staying = [h for h in view.holders if h.job_id not in going]
        return _PoolQueue(view, staying, going, waiting)

    def _drop_holds(self, queue: _PoolQueue) -> bool:
        """Take the holds that go off the pool; False when the pool changed since it was read."""
        assert self.pools is not None
        return not queue.going or self.pools.change(queue.view, remove=queue.going)

    def _claim(self, head: Job) -> Holder:
        """The hold the head of the queue takes: its chips, for its current attempt."""
        spec = head.spec
        return Holder(
            head.job_id, spec.chips, head.attempt, spec.priority, self.clock(), evictable=spec.on_preemption != "fail"
        )

    @staticmethod
    def _victims(head: Job, staying: list[Holder], limit: int | None) -> list[Holder] | None:
        """The holders the head must evict to fit: none when it fits; None when it may not
        make room (its priority evicts nobody, or evicting every lower one would not do)."""
        chips = head.spec.chips
        if limit is None or fits(limit, staying, chips):
            return []
        return victims_for(limit, staying, chips, head.spec.priority) or None

    def _say_waiting(self, head: Job, pool: str, limit: int) -> None:
        """The head waits for chips: its reason says so, once (the same words write nothing)."""
        why = waiting_reason(pool, limit, head.spec.chips)
        if head.state_reason != why:
            self._commit(head.job_id, Observation(EventKind.WAITING_FOR_QUOTA, head.attempt, "submit", reason=why))

    def _quota_exceeded(self, job: Job, pool: str, limit: int) -> SubmitOutcome:
        """A QUEUED job bigger than its pool's whole quota moves on to its next zone (and is
        admitted there, in that pool's order), or fails when it has none.

        Its current attempt never asked for capacity (a claimed job is finished before the
        head is looked at), so there is nothing to release; in the instant between a claim and
        its request, a leftover is the reconciler's to drop (a terminal job's claim and
        queued resource are stale).
        """
        why = f"The job {never_fits_reason(pool, limit, job.spec.chips)}"
        seen = Observation(EventKind.QUOTA_EXCEEDED, job.attempt, "submit", reason=why)
        outcome = self._commit(job.job_id, seen)
        if isinstance(outcome, Ignored):
            return SubmitOutcome("duplicate", job.job_id, outcome.reason)
        if outcome.job.state is JobState.QUEUED:
            return self.admit(outcome.job)
        return SubmitOutcome("failed", job.job_id, outcome.event.reason)

    def _evict(self, job_id: str, by: Job) -> None:
        """Send a lower-priority job back to QUEUED so `by` fits; its capacity is released."""
        spec = by.spec
        why = f"Evicted by {by.job_id} (priority {spec.priority}), which needs {spec.chips} chips"
        outcome = self._commit(job_id, Observation(EventKind.EVICTED, None, "submit", reason=why))
        if isinstance(outcome, Decision):
            self._left_attempt(outcome.job)

    def _left_attempt(self, job: Job) -> None:
        """A job sent back to QUEUED (evicted, or moving zone): free what its last attempt held.
        An attempt on a warm pool's unit had no queued resource of its own (the pool's service
        takes it off the unit)."""
        previous = job.usage_of(job.attempt - 1)
        zone = (previous.zone if previous else "") or job.zone
        if previous is None or not previous.pool:
            self.tpu.release(zone, queued_resource_name(job.job_id, job.attempt - 1))
        old_pool = pool_id(job.spec, zone)
        if old_pool != pool_id(job.spec, job.zone):
            self._drop_hold(job.job_id, old_pool)

    def _free_chips(self, job: Job) -> None:
        """An ended job gives its chips back, and the next waiting jobs get them at once."""
        self._drop_hold(job.job_id, pool_id(job.spec, job.zone))

    def drop_hold(self, job_id: str, pool: str) -> None:
        """Take a holder (a job, or a warm pool's unit) off an admission pool, and admit what fits."""
        self._drop_hold(job_id, pool)

    def _drop_hold(self, job_id: str, pool: str) -> None:
        """Take a job's hold off a pool, in the same write as the next admission if any."""
        if self.pools is None:
            return
        view = self.pools.view(pool)
        if any(h.job_id == job_id for h in view.holders):
            self.admit_waiting(pool, leaving=frozenset({job_id}))

    def _admit(self, job: Job) -> SubmitOutcome:
        """Request the attempt's capacity, then record PROVISIONING (or FAILED for good).

        A request refused because the TPU quota is exhausted is PROVISIONING too, saying so
        (`QUOTA_EXHAUSTED`): tpujobs admitted the job, Google has no room yet, and the message
        is done with (redelivering it would only end in the dead-letter topic); the reconciler
        asks again every tick, within the zone wait like any wait for capacity.
        """
        try:
            status, reason = self._request_capacity(job)
        except PermanentError as error:
            self._commit(
                job.job_id,
                Observation(EventKind.CAPACITY_REQUEST_FAILED, job.attempt, "tpu", reason=str(error)),
            )
            return SubmitOutcome("failed", job.job_id, str(error))
        seen = Observation(EventKind.ADMITTED, job.attempt, "submit", reason, status.state, operation=status.operation)
        outcome = self._commit(job.job_id, seen)
        if isinstance(outcome, Decision):
            self._failed_at_once(job.job_id, job.attempt, status)
            return SubmitOutcome("provisioning", job.job_id, outcome.event.reason)
        self._release_if_orphaned(job)
        return SubmitOutcome("duplicate", job.job_id, outcome.reason)

    def _request_capacity(self, job: Job) -> tuple[CapacityStatus, str]:
        """Request the attempt's queued resource: its status, and the reason to record ("" for
        the usual words). A full TPU quota is a wait, not an error: `QUOTA_EXHAUSTED`, quoting
        Google. PermanentError when the TPU API refused for good."""
        try:
            return self.tpu.request(job, host_boot(job, self.settings)), ""
        except QuotaExhausted as error:
            return CapacityStatus(job.queued_resource, job.zone, QUOTA_EXHAUSTED), quota_reason(job, error)

    # -- what happens to a running job ----------------------------------------------

    def on_worker_report(self, message: InboundMessage) -> Decision | Ignored | None:
        """tpujobs-worker-events: started, heartbeat, exited, checkpoint, aborted or rebooted,
        from one worker host, believed only when signed with its attempt's key (`_believed`)."""
        report = self._decode(WorkerReport, message)
        job = None if report is None else self._believed(report, message)
        if report is None or job is None:
            return None
        if report.kind == "peer_silent":
            return self._peer_silent(report, job, message)
        now = self.clock()
        at = report.at or now
        worker = worker_key(report.slice_id, report.worker_id)
        record = replace(_worker_record(report, worker, now, at), silent_after=silent_after(report, now, self.settings))
        seen = _worker_observation(report, worker)
        counted = _counted_on_workers(seen)
        if counted:  # the job counts these hosts from their records: the record comes first
            self.store.record_worker(report.job_id, record)
        outcome = None if seen is None else self._observe_host(job, seen)
        if report.peers_silent and job.state is JobState.RUNNING and job.attempt == report.attempt:
            outcome = self._peer_silent_again(report, job, message)
        if report.kind == "checkpoint":
            self.store.record_checkpoint(report.job_id, report.attempt, at, report.step)
        if report.kind == "started" and report.image_digest is not None:
            # The first host's digest is the attempt's; another host's different one (its tag
            # moved between two pulls) is kept beside it, so `describe` shows both.
            self.store.record_image_digest(report.job_id, report.attempt, report.image_digest)
        # Any other record comes after the job's commit: had it come first, a crash in between
        # would leave a worker marked (exited, rebooted) whose word the job never took. A counted
        # one comes first, since the count reads it; a redelivery counts again.
        if not counted:
            self.store.record_worker(report.job_id, record)
        return outcome

    # -- hosts counted on their records (a job of 1,000 hosts) ---------------------------

    def _observe_host(self, job: Job, seen: Observation) -> Decision | Ignored:
        """One host's word about `job` (as read when the report was believed): a `started` or an
        exit 0 is counted on the worker records, so the job document changes once per attempt
        for them, not once per host; the rest at once."""
        if seen.kind is EventKind.WORKERS_STARTED:
            return self._host_started(job, seen)
        if seen.kind is EventKind.WORKER_SUCCEEDED:
            return self._host_succeeded(job, seen)
        return self.observe(job.job_id, seen)

    def _host_started(self, job: Job, seen: Observation) -> Decision | Ignored:
        """The first `started` moves the job to RUNNING; the others write only their worker's
        record, and the one that completes the count notes `all_started_at` on the job."""
        running: Job | None = job
        if job.state is JobState.RUNNING and job.attempt == seen.attempt:
            outcome: Decision | Ignored = Ignored(f"attempt {job.attempt} is RUNNING already")
        else:  # PROVISIONING (or stale, ended: observed as before, which finishes earlier work)
            outcome = self.observe(job.job_id, seen)
            running = outcome.job if isinstance(outcome, Decision) else None
        if running is not None and running.state is JobState.RUNNING and running.attempt == seen.attempt:
            self._note_all_started(running)
        return outcome

    def _note_all_started(self, job: Job) -> None:
        """Note on the attempt's usage that every host has reported, when its records say so
        (one count query; `record_all_started` writes only the first time)."""
        usage = job.usage_of()
        if usage is None or usage.all_started_at is not None:
            return
        if self.store.attempt_workers_heard(job.job_id, job.attempt) >= job.total_workers:
            self.store.record_all_started(job.job_id, job.attempt, self.clock())

    def _host_succeeded(self, job: Job, seen: Observation) -> Decision | Ignored:
        """An exit 0, counted from the records of the attempt's hosts (this one's is written):
        the job is written when the count is complete (SUCCEEDED) or to leave PROVISIONING;
        redelivered or reordered exits count once each, since a record is one per host. The
        count decides, so `job` may be as read before this host's record was written."""
        assert seen.attempt is not None
        done = self.store.attempt_workers_succeeded(job.job_id, seen.attempt)
        live = job.state is JobState.RUNNING and job.attempt == seen.attempt
        if live and done < job.total_workers:
            return Ignored(f"worker {seen.worker} exited 0; {done} of {job.total_workers} workers are done")
        return self.observe(job.job_id, replace(seen, workers_done_count=done))

    def _peer_silent(self, report: WorkerReport, job: Job, message: InboundMessage) -> Decision | Ignored | None:
        """Worker 0 of a slice heard nothing from one of its peers for its peer timeout: that
        host is lost, as a silent worker is (found here in seconds, not at a reconcile tick).
        Only worker 0 speaks for a slice, and only of a peer the job has."""
        peer = report.peer_worker_id
        if report.worker_id != 0 or peer is None or peer >= job.spec.hosts_per_slice:  # >= 1: the schema
            who = "only worker 0 of a slice reports its peers" if report.worker_id != 0 else f"no peer {peer}"
            self.reject(message, f"Report for {report.job_id} attempt {report.attempt} refused: peer_worker_id: {who}.")
            return None
        worker = worker_key(report.slice_id, peer)
        said = report.detail or f"worker {worker_key(report.slice_id, 0)} stopped hearing it"
        why = f"Worker {worker} of attempt {report.attempt} went silent ({said}); the host is lost"
        seen = Observation(EventKind.CAPACITY_LOST, report.attempt, "agent", why, worker=worker)
        return self.observe(report.job_id, seen)

    def _peer_silent_again(self, report: WorkerReport, job: Job, message: InboundMessage) -> Decision | Ignored | None:
        """Worker 0's heartbeat names a peer it reported silent while the attempt still runs:
        that `peer_silent` never took effect (lost, or dead-lettered), so it is taken now."""
        peer = report.peers_silent[0] if report.peers_silent else None
        said = f"worker {worker_key(report.slice_id, 0)} reported it silent and has not heard it since"
        again = report.model_copy(update={"kind": "peer_silent", "peer_worker_id": peer, "detail": said})
        return self._peer_silent(again, job, message)

    def on_preemption(self, message: InboundMessage) -> Decision | Ignored | None:
        """tpujobs-preemption: a worker's notice that its capacity is going away, at once."""
        notice = self._decode(PreemptionNotice, message)
        if notice is None or self._believed(notice, message) is None:
            return None
        worker = worker_key(notice.slice_id, notice.worker_id)
        reason = f"Preempted: worker {worker} of attempt {notice.attempt} got notice ({notice.reason})"
        seen = Observation(EventKind.CAPACITY_LOST, notice.attempt, "agent", reason=reason, worker=worker)
        return self.observe(notice.job_id, seen)

    def on_qr_state(self, message: InboundMessage) -> Decision | Ignored | None:
        """tpujobs-qr-state: a queued resource was seen in some state (reconciler, audit log)."""
        audited = audit_log_target(message.data)
        if audited is not None:  # the log sink: something was done to it; see what it is now
            zone, name = audited
            status = self.tpu.status(zone, name)
            if status is None:
                return self.observe_capacity(name, "SUSPENDED", "the queued resource no longer exists")
            return self.observe_capacity(name, status.state, status.detail, status.unhealthy_hosts)
        report = self._decode(QrStateReport, message)
        if report is None:
            return None
        return self.observe_capacity(report.queued_resource, report.state, report.detail, report.unhealthy_hosts)

    def observe_capacity(
        self,
        queued_resource: str,
        state: str,
        detail: str = "",
        unhealthy_hosts: int = 0,
        source: Source = "tpu",
    ) -> Decision | Ignored | None:
        """Turn a queued resource's TPU state into the observation it means for its job."""
        owner = parse_queued_resource_name(queued_resource)
        if owner is None and self.warm is not None and parse_unit_queued_resource_name(queued_resource):
            self.warm.observe_unit(queued_resource, state, detail, unhealthy_hosts)
            return Ignored(f"{queued_resource} is a warm pool's unit: its pool was told")
        if owner is None:
            return Ignored(f"{queued_resource} is not a tpujobs queued resource")
        job_id, attempt = owner
        if state in CAPACITY_GONE or unhealthy_hosts:
            if state in ("SUSPENDING", "SUSPENDED"):
                what = f"Preempted: queued resource {queued_resource} is {state}"
            elif state == "FAILED":
                what = f"Queued resource {queued_resource} FAILED" + (f": {detail}" if detail else "")
            else:
                what = f"{unhealthy_hosts} host(s) of queued resource {queued_resource} were lost"
            seen = Observation(EventKind.CAPACITY_LOST, attempt, source, reason=what, capacity_state=state)
        elif state in CAPACITY_PENDING:
            seen = Observation(EventKind.CAPACITY_CHANGED, attempt, source, capacity_state=state)
        else:
            return Ignored(f"{queued_resource} is {state}: nothing to do")
        return self.observe(job_id, seen)

    def on_control(self, message: InboundMessage) -> Decision | Ignored | None:
        """tpujobs-control: a cancel, resume or rerun request, which only the owner or an admin may
        ask; or a warm pool's create, resize or delete (`_on_pool_control`)."""
        try:
            request = decode_control(message.data)
        except ReportError as error:
            self.reject(message, message.undecodable or str(error))
            return None
        if not isinstance(request, ControlRequest):
            return self._on_pool_control(message, request)
        if request.action != "cancel":  # resume, rerun: a retry of the message starts nothing
            request_id = request.request_id or f"message-{message.message_id}"
            restart = self.restart(request.job_id, request.action, request.owner, request_id, request.overrides)
            if restart.kind not in ("started", "duplicate"):
                self.reject(message, restart.reason)
            return None
        job = self.store.get(request.job_id)
        if job is None:
            self.reject(message, f"job_id {request.job_id!r}: no such job")
            return None
        if not may_cancel(job.owner, request.owner, self.settings.admins):
            self.reject(message, f"owner {request.owner!r} may not cancel a job of {job.owner!r}")
            return None
        return self.cancel(request.job_id, f"Cancelled by {request.owner}.")

    def _on_pool_control(self, message: InboundMessage, request: PoolControlRequest) -> Ignored | None:
        """A pool's request on the topic, where `owner` is a claim: `WarmPoolService` refuses to
        create for an unverified owner unless config/policies trusts topic owners, and resizes or
        deletes only for the pool's owner or an admin. A refusal is a rejection with the reason.
        A redelivered message changes nothing: a create finds its own pool (same owner), a delete
        finds none."""
        if self.warm is None:
            self.reject(message, "this deployment has no warm pools")
            return None
        if isinstance(request, PoolCreateRequest):
            outcome = self.warm.create(dict(request.pool), request.owner, verified=False)
        elif isinstance(request, PoolResizeRequest):
            outcome = self.warm.resize(request.name, request.count, request.owner)
        else:
            outcome = self.warm.delete(request.name, request.owner)
        again = (outcome.kind == "exists" and outcome.pool is not None and outcome.pool.owner == request.owner) or (
            outcome.kind == "missing" and request.action == "pool-delete"
        )
        if again:
            return Ignored(f"{request.action}: {outcome.reason}; nothing to do")
        if outcome.kind != "done":
            self.reject(message, outcome.reason)
        return None

    def cancel(self, job_id: str, reason: str) -> Decision | Ignored:
        """Cancel a job (its caller has checked the right to) and release its capacity."""
        return self.observe(job_id, Observation(EventKind.CANCEL_REQUESTED, None, "user", reason=reason))

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
        caller). Overrides are checked as the spec is at submit, the owner's privileges and
        the quota included. `request_id` is remembered on the job in the same commit as the
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
            self.converge(job_id)  # the first call may have died after its commit: finish it
            return RestartOutcome("duplicate", job_id, job, already)
        refusal = restart_refusal(job, action)
        if refusal is not None:
            return RestartOutcome("refused", job_id, job, refusal)
        try:
            spec = overridden_spec(job.spec, overrides)
        except SpecError as error:
            return RestartOutcome("invalid", job_id, job, f"Invalid override: {error}")
        if spec != job.spec:
            owner_verified = job.owner_verified or (verified and caller == job.owner)
            refused = self.submission_refusal(spec, owner_verified=owner_verified)
            if refused is not None:
                return RestartOutcome("forbidden", job_id, job, refused)
            too_big = self.oversize_refusal(spec)
            if too_big is not None:
                return RestartOutcome("invalid", job_id, job, too_big)
        changed = describe_overrides(job.spec, spec)
        how = "from its checkpoint" if action == "resume" else "from scratch"
        reason = f"{action.capitalize()} asked by {caller}{'' if verified else ' (via the topic)'}, {how}" + (
            f"; overrides: {changed}." if changed else "."
        )
        kind = _RESTART_EVENTS[action]
        seen = Observation(kind, None, "user", reason, request_id=request_id, spec=spec)
        outcome = self.observe(job_id, seen)
        after = self.store.get(job_id)
        if isinstance(outcome, Decision):
            return RestartOutcome("started", job_id, after or outcome.job, reason)
        if after is not None and request_id in after.restart_requests:  # a concurrent retry won
            return RestartOutcome("duplicate", job_id, after, already)
        return RestartOutcome("refused", job_id, after, restart_refusal(after, action) or outcome.reason)

    def observe(self, job_id: str, seen: Observation) -> Decision | Ignored:
        """Commit what an observation means for the job, then perform what its state implies."""
        process_log.bind_job(job_id)
        outcome = self._commit(job_id, seen)
        if isinstance(outcome, Decision):
            if _sent_back_to_queue(outcome):
                self._left_attempt(outcome.job)
            self._act(outcome.job)  # the job as just committed: no need to read it again
        else:
            self.converge(job_id)  # nothing changed, but earlier work may be unfinished
        return outcome

    def record(self, job_id: str, seen: Observation) -> Decision | Ignored:
        """Commit an observation (and announce it) without acting on the job's new state: for a
        caller that does what the state asks itself (the warm pools' service)."""
        return self._commit(job_id, seen)

    def _commit(self, job_id: str, seen: Observation) -> Decision | Ignored:
        """Commit an observation; announce the change it made, if any."""
        outcome = self.store.apply(job_id, seen, self.clock)
        if isinstance(outcome, Decision):
            event = outcome.event
            log.info("job %s: %s -> %s: %s", job_id, event.from_state, event.to_state.value, event.reason)
            self.announce(outcome.job, event)
            ended = ended_attempt(outcome)
            if ended is not None:
                self.request_export(job_id, ended)
        return outcome

    def announce(self, job: Job, event: JobEvent) -> None:
        """Publish a committed change to tpujobs-status, then mark its event as announced.

        A failure is left for the reconciler, which announces every event still unmarked:
        the change itself is committed, and redelivering the message would not repeat it.
        """
        if self.status is None:
            return
        change = StatusChange(
            job.job_id,
            job.owner,
            event.from_state.value if event.from_state else None,
            event.to_state.value,
            event.reason,
            event.attempt,
            event.at,
            event.seq,
        )
        try:
            self.status.announce(change)
            self.store.mark_announced(job.job_id, event)
        except TransientError as error:
            log.warning("status of %s not announced yet (the reconciler will): %s", job.job_id, error)

    def request_export(self, job_id: str, attempt: int) -> None:
        """Ask for an ended attempt's output to be exported (`tpujobs.engine.output_export`).

        Best effort: the change is committed, and failing the handler would not repeat the
        request (a redelivered message finds nothing left to change), so a failure is only
        logged; the reconciler asks again for attempts still unexported a minute later.
        """
        if self.exports is None:
            return
        try:
            self.exports.request_export(job_id, attempt)
        except Exception:  # whatever went wrong, the job's own handling is done
            log.exception("could not request the export of %s attempt %d's logs", job_id, attempt)

    # -- acting on a job's state -------------------------------------------------------

    def converge(self, job_id: str) -> None:
        """Do what the job's state asks for; safe to repeat, whoever calls it and however often.

        QUEUED: request capacity. RECOVERING: release the lost attempt's capacity and
        request the next. Ended: release the capacity. Anything else waits for events.
        """
        job = self.store.get(job_id)
        if job is not None:
            self._act(job)

    def _act(self, job: Job) -> None:
        if job.state is JobState.QUEUED:
            self.admit(job)
        elif job.state is JobState.RECOVERING:
            self._start_next_attempt(job)
        elif job.state.is_terminal:
            if job.warm_pool and self.warm is not None:
                self.warm.leave_attempt(job)  # its unit goes back to the pool; it had no resource of its own
            elif job.queued_resource:
                self.tpu.release(job.zone, job.queued_resource)
            self._free_chips(job)

    def _start_next_attempt(self, job: Job) -> None:
        warm = self.warm if job.warm_pool else None
        if warm is not None:  # the unit goes back (or, lost, is asked for again) now, not after the backoff
            warm.leave_attempt(job)
        if job.next_attempt_at is not None:
            wait = (job.next_attempt_at - self.clock()).total_seconds()
            if wait > 0:
                self.sleep(min(wait, BACKOFF_CAP_SECONDS))
        if warm is not None:
            warm.requeue(job)  # the next attempt waits in the pool's queue
            return
        self.tpu.release(job.zone, job.queued_resource)
        following = job.as_next_attempt()
        try:
            status, reason = self._request_capacity(following)  # a full quota: it waits, as at `_admit`
        except PermanentError as error:
            self._commit(
                job.job_id,
                Observation(EventKind.CAPACITY_REQUEST_FAILED, job.attempt, "tpu", reason=str(error)),
            )
            return
        seen = Observation(
            EventKind.NEXT_ATTEMPT_REQUESTED, job.attempt, "tpu", reason, status.state, operation=status.operation
        )
        outcome = self._commit(job.job_id, seen)
        if isinstance(outcome, Ignored):
            self._release_if_orphaned(following)
        else:
            self._failed_at_once(job.job_id, following.attempt, status)

    def _failed_at_once(self, job_id: str, attempt: int, status: CapacityStatus) -> None:
        """A create whose operation had already failed when it answered: a failed provisioning,
        under the job's rules (its next zone, a restart, or the end), at once."""
        if status.state == "FAILED":
            what = f"Queued resource {status.name} was never created: {status.detail}"
            self.observe(job_id, Observation(EventKind.CAPACITY_LOST, attempt, "tpu", what, "FAILED"))

    # -- what the reconciler asks of the service ----------------------------------------

    def request_again(self, job_id: str) -> Decision | Ignored | None:
        """Ask again for a PROVISIONING job's queued resource, missing or refused for quota.

        Read first: the reconciler's listing is an outline, without the command and env the
        hosts boot with. Within the zone wait only (the reconciler checks): `requested_at`
        stays the first request's, so this never loops for ever. Refused for quota: it waits
        on, saying so once; refused for good: FAILED, as at admission.
        """
        job = self.store.get(job_id)
        if job is None or job.state is not JobState.PROVISIONING:
            return None
        try:
            status = self.tpu.request(job, host_boot(job, self.settings))
        except QuotaExhausted as error:
            seen = Observation(EventKind.REQUESTED_AGAIN, job.attempt, "reconciler",
                               quota_reason(job, error), QUOTA_EXHAUSTED)  # fmt: skip
            return self._commit(job_id, seen)
        except PermanentError as error:
            seen = Observation(EventKind.CAPACITY_REQUEST_FAILED, job.attempt, "tpu", reason=str(error))
            return self.observe(job_id, seen)
        reason = ""
        if job.capacity_state == QUOTA_EXHAUSTED:
            reason = f"The TPU quota in {job.zone} has room now: queued resource {job.queued_resource} requested."
        seen = Observation(EventKind.REQUESTED_AGAIN, job.attempt, "reconciler", reason, status.state,
                           operation=status.operation)  # fmt: skip
        outcome = self._commit(job_id, seen)
        if isinstance(outcome, Ignored):
            self._release_if_orphaned(job)
        else:
            self._failed_at_once(job_id, job.attempt, status)
        return outcome

    def note_suspect_hosts(
        self, job_id: str, attempt: int, hosts: tuple[tuple[str, str], ...], reason: str
    ) -> Decision | Ignored:
        """Remember which hosts of the attempt are in a grace-gated condition, and since when
        (`Job.suspect_hosts`); the same hosts in the same conditions again write nothing."""
        return self._commit(job_id, Observation(EventKind.HOSTS_SUSPECT, attempt, "reconciler", reason, hosts=hosts))

    def note_repair_failure(self, job_id: str, doing: str, error: Exception) -> Decision | Ignored:
        """Record on the job that the reconciler's repair met a permanent error: its reason and
        timeline say so (once per distinct error), its state stays, and the tick goes on."""
        reason = signing.scrub(f"The reconciler could not {doing}: {error}. It tries again at every tick.")
        return self._commit(job_id, Observation(EventKind.REPAIR_FAILED, None, "reconciler", reason=reason))

    def _release_if_orphaned(self, requested: Job) -> None:
        """After a request lost its race (a cancel, another handler), free what nobody owns."""
        current = self.store.get(requested.job_id)
        if current is None or current.state.is_terminal or current.queued_resource != requested.queued_resource:
            self.tpu.release(requested.zone, requested.queued_resource)

    def _believed(self, report: SignedReport, message: InboundMessage) -> Job | None:
        """The job, as read to check it, when a report or notice is what the hosts of the
        attempt it names said; else None.

        Signed with that attempt's key, from a host the job has, timed within the attempt,
        and not a replay (the same signed bytes under another message id; a redelivery
        keeps its id). Otherwise it changes nothing and is recorded as a rejection.
        """
        job = self.store.get(report.job_id)
        if job is None:
            self.reject(message, f"job_id {report.job_id!r}: no such job")
            return None
        signature = message.attributes.get(signing.SIGNATURE_ATTRIBUTE)
        now = self.clock()
        problem = signing.report_problem(
            job,
            attempt=report.attempt,
            slice_id=report.slice_id,
            worker_id=report.worker_id,
            at=report.at,
            data=message.data or b"",
            signature=signature,
            master=self.settings.report_key,
            now=now,
        )
        if problem is None:
            assert signature is not None
            first = self.store.remember_report(
                signing.report_digest(signature), message.message_id, report.job_id, report.attempt, now
            )
            if first != message.message_id:
                problem = f"it is a replay: the same signed report arrived before as message {first}"
        if problem is not None:
            self.reject(message, f"Report for {report.job_id} attempt {report.attempt} refused: {problem}.")
            return None
        return job

    def _decode(self, model: type[Report], message: InboundMessage) -> Report | None:
        """The message as `model`; None after recording a rejection when it is not one."""
        try:
            return decode_report(model, message.data)
        except ReportError as error:
            self.reject(message, message.undecodable or str(error))
            return None


def quota_reason(job: Job, error: QuotaExhausted) -> str:
    """What a job waiting for TPU quota says, quoting Google."""
    said = str(error).rstrip(". ")
    return f"TPU quota exhausted in {job.zone}: {said}; waiting, asked again at every reconciler tick."


def _worker_record(report: WorkerReport, worker: str, now: datetime, at: datetime) -> WorkerRecord:
    """What a report changes in its worker's record (`jobs/{id}/workers`); None leaves a field as it was."""
    record = WorkerRecord(report.attempt, worker, report.slice_id, report.worker_id, now)
    if report.kind == "started":
        return replace(record, started_at=at, live=True)
    if report.kind in ("exited", "aborted"):
        speaking = speaks_after_exit(report)  # live on, watched, for the peers only it hears
        return replace(
            record, exited_at=at, exit_code=report.exit_code, live=speaking, speaks_for_peers=speaking or None
        )
    if report.kind == "checkpoint":
        return replace(record, checkpoint_step=report.step, checkpoint_at=at, live=True)
    if report.kind == "heartbeat":  # worker 0's adds its slice's latest checkpoint
        return replace(
            record, live=True, last_output_at=report.last_output_at, checkpoint_step=report.step,
            checkpoint_at=report.checkpoint_at if report.step is not None else None,
        )  # fmt: skip
    return replace(record, live=False)  # rebooted: the command it ran is gone with the host


# A host's record says it is silent SILENT_PERIODS of its own periods after its last word, and
# never sooner than the deployment's heartbeat_timeout_seconds; a host worker 0 of its slice
# speaks for is never silent by its record (SPOKEN_FOR): worker 0 reports it (`peer_silent`).
SILENT_PERIODS = 2
SPOKEN_FOR = datetime(2200, 1, 1, tzinfo=timezone.utc)


def silent_after(report: WorkerReport, now: datetime, settings: Settings) -> datetime | None:
    """The `silent_after` a report sets on its worker's record (None: leaves it as it was),
    counted from `now`, when the service heard it. A report without `next_report_seconds`
    or `watch` comes from an agent from before them: its heartbeats are every
    `heartbeat_seconds`, so its record keeps today's timeout."""
    if report.kind not in ("started", "heartbeat") and not speaks_after_exit(report):
        return None
    if report.watch == "slice":
        return SPOKEN_FOR
    period = report.next_report_seconds or settings.heartbeat_seconds
    return now + timedelta(seconds=max(settings.heartbeat_timeout_seconds, SILENT_PERIODS * period))


def speaks_after_exit(report: WorkerReport) -> bool:
    """Worker 0 whose command exited 0 while it still heard peers of its slice (`peers_heard`):
    it goes on heartbeating for them until they end, so its record stays live and is found
    silent like any host's; otherwise a worker 0 that died then would leave its peers,
    spoken for and never silent by their own records, watched by no one."""
    return (
        report.kind == "exited"
        and report.exit_code == 0
        and report.limit is None
        and report.worker_id == 0
        and bool(report.peers_heard)
    )


def _counted_on_workers(seen: Observation | None) -> bool:
    """A `started` or an exit 0: the job counts these from the worker records (`_observe_host`)."""
    return seen is not None and seen.kind in (EventKind.WORKERS_STARTED, EventKind.WORKER_SUCCEEDED)


def _worker_observation(report: WorkerReport, worker: str) -> Observation | None:
    """What a report means for its job; None for those that only touch the worker's record
    (heartbeat, checkpoint)."""
    if report.kind == "started":
        digest = report.image_digest
        why = f"Workers of attempt {report.attempt} started the command in image {digest}." if digest else ""
        return Observation(EventKind.WORKERS_STARTED, report.attempt, "agent", why, worker=worker)
    if report.kind == "exited":
        code = report.exit_code if report.exit_code is not None else -1
        if report.limit is not None:  # the agent stopped it at its deadline: the limit, even if it exited 0
            return Observation(
                EventKind.TIME_LIMIT_REACHED, report.attempt, "agent", exit_code=code, worker=worker, limit=report.limit
            )
        if code == 0:
            return Observation(
                EventKind.WORKER_SUCCEEDED,
                report.attempt,
                "agent",
                exit_code=0,
                worker=worker,
                held_since=report.command_started_at,
            )
        # The agent's own words when it ended the attempt itself (an image it could not pull).
        why = f"Worker {worker} exited with {code}: {report.detail}" if report.detail else ""
        # The agent's claim that a retry_on.output pattern matched is believed for this job only
        # (`tpujobs.domain.error_classes`): patterns never run here, where they could stall every team.
        pattern, line = report.retry_pattern, report.retry_line or ""
        return Observation(
            EventKind.COMMAND_FAILED,
            report.attempt,
            "agent",
            why,
            exit_code=code,
            worker=worker,
            retry_pattern=pattern,
            retry_line=line,
            held_since=report.command_started_at,
        )
    if report.kind == "aborted":
        why = report.detail or "the agent could not start the command"
        return Observation(
            EventKind.ATTEMPT_ABORTED, report.attempt, "agent", reason=why, exit_code=report.exit_code, worker=worker
        )
    if report.kind == "rebooted":  # the host's agent started over: that host is lost
        found = report.detail or "its startup script ran again"
        why = f"Rebooted: worker {worker} of attempt {report.attempt} started over ({found})"
        return Observation(EventKind.CAPACITY_LOST, report.attempt, "agent", reason=why, worker=worker)
    return None

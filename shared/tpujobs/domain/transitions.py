"""decide(job, observation, now): the only function that moves a job.

Pure: it reads the transition table and the restart rules and returns what should be
written; the service commits it in one transaction and then acts. Stale, duplicate and
out-of-order observations come back as `Ignored` with the reason, never as a move.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from tpujobs.domain import accounting, limits
from tpujobs.domain.error_classes import classify_error
from tpujobs.domain.job import HeldOver, Job, JobEvent, ScheduledMaintenance, Source, SuspectHost
from tpujobs.domain.naming import queued_resource_name
from tpujobs.domain.platforms import TPU_API
from tpujobs.domain.quotas import region_of
from tpujobs.domain.restart_overrides import REQUEST_MEMORY
from tpujobs.domain.restart_rules import backoff_seconds, rule_on_loss
from tpujobs.domain.spec import JobSpec
from tpujobs.domain.states import EventKind, JobState, allowed_targets


@dataclass(frozen=True)
class Observation:
    """Something that happened to one attempt of a job, from any source."""

    kind: EventKind
    attempt: int | None  # None: concerns the job, whatever its attempt (a cancel)
    source: Source
    reason: str = ""
    capacity_state: str | None = None
    exit_code: int | None = None
    worker: str | None = None  # "slice-worker", for reports of one worker host
    operation: str = ""  # the create's long-running operation, when capacity was requested
    hosts: tuple[tuple[str, str], ...] = ()  # HOSTS_SUSPECT: (node, condition) of each suspect host
    maintenance: tuple[ScheduledMaintenance, ...] = ()  # MAINTENANCE_SCHEDULED: the windows announced
    run_ends_at: datetime | None = None  # RUN_END_SCHEDULED: Compute Engine's terminationTimestamp
    limit: str = ""  # TIME_LIMIT_REACHED: which limit (`tpujobs.domain.limits.LIMITS`)
    request_id: str = ""  # RESUME_REQUESTED, RERUN_REQUESTED: the user's request, remembered on the job
    spec: JobSpec | None = None  # RESUME_REQUESTED, RERUN_REQUESTED: the spec with its overrides
    retry_pattern: int | None = None  # COMMAND_FAILED: the retry_on.output pattern the agent says matched
    retry_line: str = ""  # COMMAND_FAILED: the last-output line it matched
    # A worker's exit: when its host started the job, so capacity counts as held from then
    # when the exit is handled before the start (never before the attempt began to wait).
    held_since: datetime | None = None
    # ADMITTED onto a warm pool: the unit's queued resource and its zone (capacity already ACTIVE),
    # and when that queued resource was asked for (its VMs are no older).
    unit: str = ""
    zone: str = ""
    unit_requested_at: datetime | None = None
    # WORKER_SUCCEEDED: how many hosts of the attempt have exited 0 by their worker documents,
    # this one included (`engine.jobs.worker_events` counts them, so the job is not written once per host);
    # None: the job counts the worker itself, in `workers_done`.
    workers_done_count: int | None = None
    # QUOTA_EXCEEDED, ZONE_FAILOVER, CAPACITY_LOST (a create FAILED before it ran): the region whose
    # quota holds the job back; failover skips its zones.
    quota_region: str = ""
    # NEXT_ATTEMPT_REQUESTED: the lost attempt's holding, kept until its hosts' grace is over
    # (`domain.grace.hold_over`); HELD_OVER_RELEASED: the name of the holding released.
    held_over: HeldOver | None = None
    holding: str = ""


@dataclass(frozen=True)
class Decision:
    """The job after an observation, and the timeline entry that explains it."""

    job: Job
    event: JobEvent


@dataclass(frozen=True)
class Ignored:
    """An observation that changes nothing, and why (stale attempt, duplicate, illegal)."""

    reason: str


class IllegalTransition(RuntimeError):
    """A move the table does not allow was asked for: a bug, not an input problem."""


def decide(job: Job, seen: Observation, now: datetime) -> Decision | Ignored:
    """Apply one observation to a job: the new job and event, or why nothing changes.

    Three steps: an observation of another attempt, or one the table does not allow from the
    job's state, changes nothing; the event's rule (`_RULES`) says where the job goes and why;
    the move is checked against the table and written with its timeline entry.
    """
    if seen.attempt is not None and seen.attempt != job.attempt:
        return Ignored(f"{seen.kind.value} concerns attempt {seen.attempt}; the job is at attempt {job.attempt}")
    targets = allowed_targets(job.state, seen.kind)
    if not targets:
        return Ignored(f"{seen.kind.value} does not apply to a {job.state.value} job")
    rule = _RULES.get(seen.kind)
    if rule is None:  # pragma: no cover - every EventKind has a rule below
        raise IllegalTransition(f"no rule for {seen.kind}")
    move = rule(job, seen, now)
    if isinstance(move, Ignored):
        return move
    if move.to_state not in targets:
        raise IllegalTransition(f"{job.state.value} -> {move.to_state.value} on {seen.kind.value}")
    return _made(job, seen, move, now)


@dataclass(frozen=True)
class _Move:
    """What an event's rule decides: the state the job goes to, why, and the fields that change."""

    to_state: JobState
    reason: str
    changes: Mapping[str, object] = field(default_factory=dict)


def _made(job: Job, seen: Observation, move: _Move, now: datetime) -> Decision:
    """The job after a legal move, with its accounting brought up to date, and the event saying so."""
    changes = dict(move.changes)
    if move.to_state.is_terminal:
        changes["ended_at"] = now
        changes["expire_at"] = record_expiry(job, now)
    elif job.state.is_terminal:  # leaving a terminal state (resume, rerun): the record is kept again
        changes["expire_at"] = None
    changes["usage"] = _usage_after(job, seen, move.to_state, changes, now)
    seq = job.event_seq + 1
    event = JobEvent(seq, now, job.state, move.to_state, move.reason, seen.source, job.attempt)
    new = job.evolve(state=move.to_state, state_reason=move.reason, updated_at=now, event_seq=seq, **changes)
    return Decision(new, event)


def record_expiry(job: Job, ended_at: datetime) -> datetime:
    """When an ended job's record goes (Firestore TTL on `expire_at`): its retention after it ended."""
    return ended_at + timedelta(days=job.record_retention_days)


# -- one rule per event -------------------------------------------------------------------
# Each returns the move its event means for the job, or Ignored when it would change nothing
# (said already, counted already). `seen.reason`, when given, is the timeline's sentence.


def _admitted(job: Job, seen: Observation, now: datetime) -> _Move:
    """Admission requested the attempt's queued resource: PROVISIONING, its zone wait starts now."""
    reason = seen.reason or f"Queued resource {job.queued_resource} requested in {job.zone}."
    changes = {
        "capacity_state": seen.capacity_state,
        "requested_at": now,
        "create_operation": seen.operation,
        "suspect_hosts": (),
        "maintenance": (),
        "run_ends_at": None,
    }
    if seen.unit:  # a warm pool's unit: held already, its agents start the attempt
        reason = seen.reason or f"Assigned to unit {seen.unit} of pool {job.warm_pool} in {seen.zone or job.zone}."
        changes.update(warm_pool_unit=seen.unit, zone=seen.zone or job.zone, unit_requested_at=seen.unit_requested_at)
    return _Move(JobState.PROVISIONING, reason, changes)


def _requested_again(job: Job, seen: Observation, now: datetime) -> _Move | Ignored:
    """The reconciler asked again for the same queued resource; `requested_at` keeps the first
    request's time, so the zone wait still ends. Nothing new (state, operation, words): Ignored."""
    operation = seen.operation or job.create_operation
    said = not seen.reason or seen.reason == job.state_reason
    if seen.capacity_state == job.capacity_state and operation == job.create_operation and said:
        return Ignored(f"queued resource {job.queued_resource} was asked for again with nothing new")
    reason = seen.reason or f"Queued resource {job.queued_resource} was missing; requested again in {job.zone}."
    return _Move(JobState.PROVISIONING, reason, {"capacity_state": seen.capacity_state, "create_operation": operation})


def _hosts_suspect(job: Job, seen: Observation, now: datetime) -> _Move | Ignored:
    """The hosts now in a grace-gated condition; a host keeps the time it was first seen so."""
    earlier = {h.node: h.first_seen_at for h in job.suspect_hosts}
    hosts = tuple(SuspectHost(node, condition, earlier.get(node, now)) for node, condition in sorted(set(seen.hosts)))
    if hosts == job.suspect_hosts:
        return Ignored("the job already knows its hosts' conditions")
    names = ", ".join(f"{h.node} ({h.condition})" for h in hosts)
    reason = seen.reason or (
        f"Watching {names}: lost if it lasts past the grace."
        if hosts
        else f"Every host of attempt {job.attempt} is healthy again."
    )
    return _Move(job.state, reason, {"suspect_hosts": hosts})


def _maintenance_scheduled(job: Job, seen: Observation, now: datetime) -> _Move | Ignored:
    """Maintenance announced for hosts of the attempt: each (host, window) is said once."""
    known = {(m.host, m.window_start) for m in job.maintenance}
    new = tuple(m for m in dict.fromkeys(seen.maintenance) if (m.host, m.window_start) not in known)
    if not new:
        return Ignored("the job already knows of that maintenance")
    windows = "; ".join(
        f"{m.host}: {(m.kind or 'maintenance').lower()} from {m.window_start}"
        + (f" to {m.window_end}" if m.window_end else "")
        for m in new
    )
    reason = seen.reason or (
        f"Host maintenance is scheduled ({windows}). A TPU VM stops when its window starts: "
        f"checkpoint before then; tpujobs then recovers the job by on_preemption ({job.spec.on_preemption})."
    )
    return _Move(job.state, reason, {"maintenance": (*job.maintenance, *new)})


def _maintenance_move(job: Job, seen: Observation, now: datetime) -> _Move:
    """Leave the hosts before their maintenance: resume at once elsewhere, no restart counted."""
    reason = seen.reason or (
        f"Moving attempt {job.attempt} off its hosts ahead of their maintenance; "
        f"attempt {job.attempt + 1} resumes from its checkpoint on other capacity."
    )
    return _Move(JobState.RECOVERING, reason, {"resume_next": True, "next_attempt_at": now})


def _repair_failed(job: Job, seen: Observation, now: datetime) -> _Move | Ignored:
    """The reconciler could not repair the job: its state stays, its reason says so, once."""
    reason = seen.reason or "The reconciler could not repair the job."
    if reason == job.state_reason:
        return Ignored("the job already says why it could not be repaired")
    return _Move(job.state, reason)


def _capacity_changed(job: Job, seen: Observation, now: datetime) -> _Move | Ignored:
    """The queued resource moved to another state on its way up: mirror it."""
    if seen.capacity_state == job.capacity_state:
        return Ignored(f"capacity is already {job.capacity_state}")
    reason = seen.reason or f"Queued resource {job.queued_resource} is {seen.capacity_state}."
    return _Move(JobState.PROVISIONING, reason, {"capacity_state": seen.capacity_state})


def _workers_started(job: Job, seen: Observation, now: datetime) -> _Move:
    """The command started: RUNNING on ACTIVE capacity; `started_at` is the job's first start."""
    reason = seen.reason or f"Workers of attempt {job.attempt} started the command."
    return _Move(JobState.RUNNING, reason, {"capacity_state": "ACTIVE", "started_at": job.started_at or now})


def _worker_succeeded(job: Job, seen: Observation, now: datetime) -> _Move | Ignored:
    """One worker exited 0, counted once; the job succeeds when every worker of the attempt has."""
    worker = seen.worker or "?"
    if seen.workers_done_count is not None:
        return _counted_success(job, seen, worker, seen.workers_done_count, now)
    if worker in job.workers_done:
        return Ignored(f"worker {worker} of attempt {job.attempt} was already counted")
    done = (*job.workers_done, worker)
    changes: dict[str, object] = {"workers_done": done, "started_at": job.started_at or now}
    if len(done) < job.total_workers:
        reason = seen.reason or f"Worker {worker} exited 0; {len(done)} of {job.total_workers} workers are done."
        return _Move(JobState.RUNNING, reason, changes)
    reason = seen.reason or f"Every worker of attempt {job.attempt} exited 0."
    return _Move(JobState.SUCCEEDED, reason, {**changes, "exit_code": 0})


def _counted_success(job: Job, seen: Observation, worker: str, done: int, now: datetime) -> _Move | Ignored:
    """An exit 0 counted on the worker documents: the job changes only when the count is
    complete (SUCCEEDED), or to leave PROVISIONING; any other exit changes nothing, so a job of
    1,000 hosts is written once for their exits, not 1,000 times."""
    changes: dict[str, object] = {"started_at": job.started_at or now}
    if done >= job.total_workers:
        reason = seen.reason or f"Every worker of attempt {job.attempt} exited 0 ({job.total_workers} of them)."
        return _Move(JobState.SUCCEEDED, reason, {**changes, "exit_code": 0})
    if job.state is JobState.RUNNING:
        return Ignored(f"worker {worker} exited 0; {done} of {job.total_workers} workers are done")
    reason = seen.reason or f"Worker {worker} exited 0; {done} of {job.total_workers} workers are done."
    return _Move(JobState.RUNNING, reason, changes)


def _every_worker_done(job: Job, seen: Observation) -> bool:
    """This exit completes the attempt's count: every host exited 0, so every host started."""
    count = seen.workers_done_count
    return seen.kind is EventKind.WORKER_SUCCEEDED and count is not None and count >= job.total_workers


def _command_failed(job: Job, seen: Observation, now: datetime) -> _Move:
    """A worker's command exited non-zero: its error class (`retry_on`) picks the rule,
    `on_retryable_error` or `on_error`, and that rule and the restart budget decide."""
    what = seen.reason or f"The command exited with code {seen.exit_code}{_on_worker(seen)}"
    rule = job.spec.on_error
    found = classify_error(job.spec.retry_on, seen.exit_code, seen.retry_pattern, seen.retry_line)
    if found is not None:
        who = f"Worker {seen.worker}" if seen.worker else "The command"
        what = seen.reason or f"{who} exited with {seen.exit_code}"
        what += f": {'retryable' if found.retryable else 'not retryable'} ({found.why})"
        rule = job.spec.on_retryable_error if found.retryable else rule
    move = _ruled_on_loss(job, rule, what, now)
    return replace(move, changes={**move.changes, "exit_code": seen.exit_code})


def _capacity_lost(job: Job, seen: Observation, now: datetime) -> _Move:
    """The attempt's capacity is gone. Once the attempt's time is up (`limits.time_is_up`: a time
    limit, or a flex-start VM's maxRunDuration) that is the time limit: FAILED, never a restart. A
    queued resource that failed before it ever ran here moves to the next zone; otherwise
    `on_preemption` and the restart budget decide, and a spot job preempted too often within
    its window continues on on-demand capacity."""
    up = limits.time_is_up(job, now)
    if up is not None:  # its time ended it (a flex-start VM's run duration too): the time limit's rule
        return _Move(
            JobState.FAILED, f"{seen.reason or 'The capacity was lost'} after the attempt's time was up: {up}."
        )
    if _never_ran_here(job, seen):
        return _fails_over_unstarted(job, seen)
    move = _ruled_on_loss(job, job.spec.on_preemption, seen.reason or "The capacity was lost", now)
    if move.to_state is not JobState.RECOVERING or not _falls_back_to_on_demand(job, now):
        return move
    spec = job.spec
    reason = move.reason + (
        f" After {spec.on_demand_after_preemptions} preemption(s) within "
        f"{spec.preemption_window_minutes} minutes, the job continues on on-demand capacity."
    )
    return _Move(move.to_state, reason, {**move.changes, "on_demand": True})


def _fails_over_unstarted(job: Job, seen: Observation) -> _Move:
    """A queued resource that FAILED before it ever ran: the next attempt waits in the next zone
    (outside `seen.quota_region`, whose quota is full)."""
    zone = next_zone(job, seen.quota_region)
    assert zone is not None  # _never_ran_here checked it
    what = seen.reason or f"Queued resource {job.queued_resource} failed"
    reason = f"{what}; it never ran, so attempt {job.attempt + 1} moves to {zone}."
    return _Move(JobState.QUEUED, reason, _requeued(job, zone))


def _next_attempt_requested(job: Job, seen: Observation, now: datetime) -> _Move:
    """A RECOVERING job's next queued resource was requested: the next attempt, PROVISIONING."""
    following = job.as_next_attempt()
    how = "resuming from its checkpoint" if job.resume_next else "from scratch"
    reason = seen.reason or (
        f"Attempt {following.attempt} requested queued resource {following.queued_resource} in {following.zone}, {how}."
    )
    changes = {
        "attempt": following.attempt,
        "queued_resource": following.queued_resource,
        "workers_done": (),
        "capacity_state": seen.capacity_state,
        "next_attempt_at": None,
        "exit_code": None,
        "requested_at": now,
        "create_operation": seen.operation,
        "suspect_hosts": (),
        "maintenance": (),
        "run_ends_at": None,
    }
    if seen.held_over is not None:  # kept through its grace: the reconciler releases it after
        kept = tuple(h for h in job.held_over if h.holding != seen.held_over.holding)
        changes["held_over"] = (*kept, seen.held_over)
        until = seen.held_over.release_after.isoformat(timespec="seconds")
        reason += (
            f" Attempt {job.attempt}'s {seen.held_over.holding} is released once its hosts are gone, "
            f"at the latest when Google's shutdown grace ends ({until}): a save on SIGTERM is not cut short."
        )
    return _Move(JobState.PROVISIONING, reason, changes)


def _run_end_scheduled(job: Job, seen: Observation, now: datetime) -> _Move | Ignored:
    """Compute Engine said when it ends the attempt's VMs by their run duration: kept, said once."""
    if seen.run_ends_at is None or seen.run_ends_at == job.run_ends_at:
        return Ignored("the job already knows when its VMs' run duration ends")
    when = seen.run_ends_at.isoformat(timespec="seconds")
    reason = seen.reason or (
        f"Compute Engine ends attempt {job.attempt}'s VMs at {when}, their maxRunDuration: "
        "a loss from then on ends the job by its time, never as a preemption."
    )
    return _Move(job.state, reason, {"run_ends_at": seen.run_ends_at})


def _held_over_released(job: Job, seen: Observation, now: datetime) -> _Move | Ignored:
    """An earlier attempt's held-over holding was released: it leaves `held_over`, once."""
    kept = tuple(h for h in job.held_over if h.holding != seen.holding)
    if kept == job.held_over:
        return Ignored(f"{seen.holding} is not held over by the job")
    reason = seen.reason or f"Released {seen.holding}, an earlier attempt's holding."
    return _Move(job.state, reason, {"held_over": kept})


def _waiting_for_quota(job: Job, seen: Observation, now: datetime) -> _Move | Ignored:
    """No room in the pool yet: the job stays QUEUED, saying for what, once."""
    if seen.reason == job.state_reason:
        return Ignored("the job already says it waits for that")
    return _Move(JobState.QUEUED, seen.reason)


def _quota_exceeded(job: Job, seen: Observation, now: datetime) -> _Move:
    """Bigger than a whole limit of its pool: the attempt waits in the next zone (outside the
    region when the region's quota is the limit), or the job fails."""
    what = seen.reason or f"The job asks for more chips than the whole quota of {job.zone}"
    zone = next_zone(job, seen.quota_region)
    if zone is None:
        beyond = f"; its other zones are in region {seen.quota_region}, which shares that quota" if (
            seen.quota_region and next_zone(job) is not None
        ) else ""  # fmt: skip
        return _Move(JobState.FAILED, f"{what}{beyond}; ask an admin to raise the quota, or ask for fewer chips.")
    return _Move(JobState.QUEUED, f"{what}; attempt {job.attempt} waits in {zone} instead.", {"zone": zone})


TAKEN_BACK = frozenset({EventKind.EVICTED, EventKind.RECLAIMED})


def _evicted(job: Job, seen: Observation, now: datetime) -> _Move:
    """A higher-priority job, or a team under its nominal share, took the chips: the next attempt
    waits QUEUED, resuming by its rules."""
    resume = job.spec.on_preemption == "resume"
    how = "resume from its checkpoint" if resume else "start from scratch"
    reason = f"{seen.reason or 'Evicted'}; attempt {job.attempt + 1} waits for quota and will {how}."
    changes = {**_requeued(job, job.zone), "resume_next": resume}
    if seen.held_over is not None:  # its hosts stop the command first: the save is not cut short
        changes["held_over"] = (*(h for h in job.held_over if h.holding != seen.held_over.holding), seen.held_over)
        until = seen.held_over.release_after.isoformat(timespec="seconds")
        reason += (
            f" Attempt {job.attempt}'s hosts were asked to stop its command (SIGTERM, then its grace); "
            f"{seen.held_over.holding} is released once they have, at the latest at {until}."
        )
    return _Move(JobState.QUEUED, reason, changes)


def _zone_failover(job: Job, seen: Observation, now: datetime) -> _Move | Ignored:
    """Waited too long for capacity: the next attempt waits in the next zone, if there is one.
    When a region's quota is what is full (`seen.quota_region`), its other zones have no room
    either: the next zone outside it, or none (the job waits where it is)."""
    region = seen.quota_region
    zone = next_zone(job, region)
    if zone is None and region and next_zone(job) is not None:
        reason = (
            f"The TPU quota of region {region} is full, and every later zone of the job is in {region} "
            f"too: attempt {job.attempt} waits in {job.zone}."
        )
        return Ignored("the job already says why it waits") if job.state_reason == reason else _Move(job.state, reason)
    if zone is None:
        return Ignored(f"no zone after {job.zone} to fail over to")
    skipped = f" (region {region}'s quota is full, so its zones are skipped)" if region else ""
    reason = f"{seen.reason or 'No capacity'} in {job.zone}{skipped}; attempt {job.attempt + 1} moves to {zone}."
    return _Move(JobState.QUEUED, reason, _requeued(job, zone))


def _attempt_aborted(job: Job, seen: Observation, now: datetime) -> _Move:
    """The agent could not start the command for a reason no restart fixes: FAILED, whatever the rules."""
    reason = f"Attempt {job.attempt} could not run{_on_worker(seen)}: {seen.reason or 'the agent gave up'}"
    return _Move(JobState.FAILED, reason, {"exit_code": seen.exit_code})


def _capacity_request_failed(job: Job, seen: Observation, now: datetime) -> _Move:
    """The TPU API refused the request for good: FAILED."""
    return _Move(JobState.FAILED, seen.reason or "The TPU API refused the capacity request.")


def _cancel_requested(job: Job, seen: Observation, now: datetime) -> _Move:
    """The owner or an admin cancelled: CANCELLED."""
    return _Move(JobState.CANCELLED, seen.reason or "Cancelled.")


def _waiting_for_pool(job: Job, seen: Observation, now: datetime) -> _Move | Ignored:
    """No unit of the pool is free: the job stays QUEUED, saying for what, once."""
    reason = seen.reason or f"Waiting for a free unit of pool {job.warm_pool}."
    if reason == job.state_reason:
        return Ignored("the job already says it waits for that")
    return _Move(JobState.QUEUED, reason)


def _pool_requeued(job: Job, seen: Observation, now: datetime) -> _Move:
    """A recovering job on a warm pool: its next attempt waits in the pool's queue for a unit."""
    how = "resume from its checkpoint" if job.resume_next else "start from scratch"
    reason = seen.reason or f"Attempt {job.attempt + 1} waits for a unit of pool {job.warm_pool} and will {how}."
    return _Move(JobState.QUEUED, reason, {**_requeued(job, job.zone), "warm_pool_unit": ""})


def _left_pool(job: Job, seen: Observation, now: datetime) -> _Move | Ignored:
    """The job leaves its warm pool for capacity of its own; a live attempt ends here, and the next
    resumes as a preemption's would (`on_preemption`). A job on no pool has nothing to leave."""
    if not job.warm_pool:
        return Ignored("the job is on no warm pool")
    zone = (job.spec.preferred_zones or (job.zone,))[0]
    what = seen.reason or f"Pool {job.warm_pool} has no free unit"
    changes: dict[str, object] = {"warm_pool": "", "warm_pool_unit": "", "zone": zone}
    if job.state is JobState.QUEUED:
        return _Move(JobState.QUEUED, f"{what}; the job asks for capacity of its own in {zone}.", changes)
    resume = job.resume_next if job.state is JobState.RECOVERING else job.spec.on_preemption == "resume"
    how = "resume from its checkpoint" if resume else "start from scratch"
    reason = f"{what}; attempt {job.attempt + 1} asks for capacity of its own in {zone} and will {how}."
    return _Move(JobState.QUEUED, reason, {**_requeued(job, zone), **changes, "resume_next": resume})


def _time_limit_reached(job: Job, seen: Observation, now: datetime) -> _Move | Ignored:
    """A time limit ran out: FAILED, whatever the rules, naming the limit and the time used.
    The reconciler words its own reason; the agent's report names only the limit."""
    if seen.reason:
        return _Move(JobState.FAILED, seen.reason, {"exit_code": seen.exit_code})
    reached = limits.limit_as_reported(job, seen.limit, now)
    if reached is None:
        return Ignored(f"the job has no {seen.limit or 'time limit'} to have reached")
    by = f" (worker {seen.worker} stopped its command)" if seen.worker else ""
    return _Move(JobState.FAILED, f"{reached.reason}{by}.", {"exit_code": seen.exit_code})


def _hung(job: Job, seen: Observation, now: datetime) -> _Move:
    """The RUNNING attempt went quiet: `on_hang` and the restart budget decide."""
    return _ruled_on_loss(job, job.spec.on_hang, seen.reason or f"Attempt {job.attempt} is hung", now)


def _restart_requested(job: Job, seen: Observation, now: datetime) -> _Move | Ignored:
    """A user started an ended job again: the next attempt (a new queued-resource name) waits
    QUEUED in its first zone, with a fresh restart budget, resuming or not, with the overrides'
    spec; a request id already remembered starts nothing."""
    if seen.request_id and seen.request_id in job.restart_requests:
        return Ignored(f"request {seen.request_id} already started attempt {job.attempt}")
    resume = seen.kind is EventKind.RESUME_REQUESTED
    spec = seen.spec or job.spec
    zone = (spec.preferred_zones or (job.zone,))[0]
    attempt = job.attempt + 1
    how = "resumes from its checkpoint" if resume else "starts from scratch"
    reason = seen.reason or f"{'Resumed' if resume else 'Rerun'}: attempt {attempt} waits in {zone} and {how}."
    remembered = (*job.restart_requests, seen.request_id)[-REQUEST_MEMORY:] if seen.request_id else job.restart_requests
    changes = {
        **_requeued(job, zone),
        "spec": spec,
        "restarts": 0,
        "resume_next": resume,
        "ended_at": None,
        "on_demand": job.on_demand and spec.capacity == job.spec.capacity,
        "restart_requests": remembered,
        "run_first_attempt": attempt,
        "warm_pool": spec.pool or "",  # back to its pool's queue, if it asks for one
        "warm_pool_unit": "",
    }
    return _Move(JobState.QUEUED, reason, changes)


_Rule = Callable[[Job, Observation, datetime], "_Move | Ignored"]
_RULES: Mapping[EventKind, _Rule] = {
    EventKind.ADMITTED: _admitted,
    EventKind.REQUESTED_AGAIN: _requested_again,
    EventKind.HOSTS_SUSPECT: _hosts_suspect,
    EventKind.REPAIR_FAILED: _repair_failed,
    EventKind.MAINTENANCE_SCHEDULED: _maintenance_scheduled,
    EventKind.MAINTENANCE_MOVE: _maintenance_move,
    EventKind.CAPACITY_CHANGED: _capacity_changed,
    EventKind.WORKERS_STARTED: _workers_started,
    EventKind.WORKER_SUCCEEDED: _worker_succeeded,
    EventKind.COMMAND_FAILED: _command_failed,
    EventKind.CAPACITY_LOST: _capacity_lost,
    EventKind.NEXT_ATTEMPT_REQUESTED: _next_attempt_requested,
    EventKind.WAITING_FOR_QUOTA: _waiting_for_quota,
    EventKind.QUOTA_EXCEEDED: _quota_exceeded,
    EventKind.EVICTED: _evicted,
    EventKind.RECLAIMED: _evicted,
    EventKind.ZONE_FAILOVER: _zone_failover,
    EventKind.ATTEMPT_ABORTED: _attempt_aborted,
    EventKind.CAPACITY_REQUEST_FAILED: _capacity_request_failed,
    EventKind.CANCEL_REQUESTED: _cancel_requested,
    EventKind.TIME_LIMIT_REACHED: _time_limit_reached,
    EventKind.HUNG: _hung,
    EventKind.WAITING_FOR_POOL: _waiting_for_pool,
    EventKind.POOL_REQUEUED: _pool_requeued,
    EventKind.LEFT_POOL: _left_pool,
    EventKind.RESUME_REQUESTED: _restart_requested,
    EventKind.RERUN_REQUESTED: _restart_requested,
    EventKind.HELD_OVER_RELEASED: _held_over_released,
    EventKind.RUN_END_SCHEDULED: _run_end_scheduled,
}


def _ruled_on_loss(job: Job, rule: str, what: str, now: datetime) -> _Move:
    """A lost attempt under `rule` (`on_error` or `on_preemption`) and the restart budget:
    RECOVERING with the next restart counted and its backoff set, or FAILED."""
    ruling = rule_on_loss(rule, job.restarts, job.spec.max_restarts, what)
    if ruling.to_state is not JobState.RECOVERING:
        return _Move(ruling.to_state, ruling.reason)
    restarts = job.restarts + 1
    changes = {
        "restarts": restarts,
        "resume_next": ruling.resume,
        "next_attempt_at": now + timedelta(seconds=backoff_seconds(restarts)),
    }
    return _Move(ruling.to_state, ruling.reason, changes)


def _on_worker(seen: Observation) -> str:
    return f" on worker {seen.worker}" if seen.worker else ""


_HOLDS_CAPACITY = frozenset({EventKind.WORKERS_STARTED, EventKind.WORKER_SUCCEEDED})
_RESTARTS = frozenset({EventKind.RESUME_REQUESTED, EventKind.RERUN_REQUESTED})


def _usage_after(
    job: Job, seen: Observation, to_state: JobState, changes: dict[str, object], now: datetime
) -> tuple[accounting.AttemptUsage, ...]:
    """The attempts' timestamps after this move: capacity held from, attempt ended at."""
    chips = job.spec.chips
    usage = job.usage or accounting.next_attempt((), job.attempt, chips, job.created_at or now, job.zone)
    active = seen.capacity_state == "ACTIVE" and seen.kind is not EventKind.NEXT_ATTEMPT_REQUESTED
    if seen.kind is EventKind.ADMITTED and seen.unit:  # on a warm pool's unit, in its zone
        usage = accounting.on_pool(usage, job.attempt, job.warm_pool, str(changes.get("zone") or job.zone))
    if seen.kind in _HOLDS_CAPACITY or active or seen.held_since is not None:
        usage = accounting.capacity_held(usage, job.attempt, _held_since(usage, job.attempt, seen, now))
    if seen.kind in _HOLDS_CAPACITY:  # the boot clock of the attempt's other hosts starts
        every = job.total_workers == 1 or _every_worker_done(job, seen)
        usage = accounting.workers_started(usage, job.attempt, now, every=every)
    if to_state is JobState.RECOVERING or to_state.is_terminal:
        lost = seen.kind is EventKind.CAPACITY_LOST
        kept = bool(changes.get("resume_next", True))  # rerun from scratch throws the work away
        usage = accounting.attempt_ended(usage, job.attempt, now, capacity_lost=lost, work_kept=kept)
    if seen.kind in _RESTARTS:  # an ended job starts again: its new attempt waits from now
        attempt, zone = int(changes["attempt"]), str(changes["zone"])  # type: ignore[call-overload]
        return (*usage, accounting.AttemptUsage(attempt, chips, now, zone=zone))
    if to_state is JobState.QUEUED and "attempt" in changes:  # requeued: evicted, or another zone
        usage = accounting.attempt_ended(usage, job.attempt, now, capacity_lost=seen.kind in TAKEN_BACK)
        attempt, zone = int(changes["attempt"]), str(changes["zone"])  # type: ignore[call-overload]
        usage = accounting.next_attempt(usage, attempt, chips, now, zone)
    if seen.kind is EventKind.QUOTA_EXCEEDED and "zone" in changes:  # waits in its next zone
        usage = accounting.attempt_moved(usage, job.attempt, str(changes["zone"]))
    if seen.kind is EventKind.NEXT_ATTEMPT_REQUESTED:
        following = int(changes["attempt"])  # type: ignore[call-overload]
        usage = accounting.next_attempt(usage, following, chips, now, job.zone)
        if seen.capacity_state == "ACTIVE":  # an adopted queued resource that was already up
            usage = accounting.capacity_held(usage, following, now)
    return usage


def _held_since(usage: tuple[accounting.AttemptUsage, ...], attempt: int, seen: Observation, now: datetime) -> datetime:
    """When the attempt's capacity was first held, as far as this observation tells: the host's
    own start of the job for an exit that overtook its `started` report, kept between the
    attempt's start of waiting and now (a host's clock, or its word, cannot move chip time
    outside the attempt); else now."""
    if seen.held_since is None:
        return now
    waiting = next((u.waiting_since for u in usage if u.attempt == attempt), None)
    floor = max(waiting, seen.held_since) if waiting is not None else seen.held_since
    return min(floor, now)


def _falls_back_to_on_demand(job: Job, now: datetime) -> bool:
    """A spot job's policy: this preemption makes N within the window, so go on-demand."""
    spec = job.spec
    if job.on_demand or spec.capacity != "spot" or spec.on_demand_after_preemptions is None:
        return False
    since = now - timedelta(minutes=spec.preemption_window_minutes)
    earlier = sum(1 for u in job.usage if u.capacity_lost and u.ended_at is not None and u.ended_at >= since)
    return earlier + 1 >= spec.on_demand_after_preemptions


def next_zone(job: Job, outside_region: str = "") -> str | None:
    """The zone after the job's current one in its `zones`, outside `outside_region` when that
    region's quota is what holds the job back; None at the last (or with one zone)."""
    zones = job.spec.preferred_zones
    later = zones[zones.index(job.zone) + 1 :] if job.zone in zones else ()
    return next((z for z in later if not outside_region or region_of(z) != outside_region), None)


def _never_ran_here(job: Job, seen: Observation) -> bool:
    """A queued resource that FAILED while provisioning, before any capacity was held here,
    of a job with another zone to go to: that is a failover, not a loss."""
    current = job.usage_of()
    return (
        job.state is JobState.PROVISIONING
        and seen.capacity_state == "FAILED"
        and (current is None or current.held_from is None)
        and next_zone(job, seen.quota_region) is not None
    )


def _requeued(job: Job, zone: str) -> dict[str, object]:
    """The fields of a job sent back to QUEUED for its next attempt, in `zone`."""
    attempt = job.attempt + 1
    return {
        "attempt": attempt,
        "queued_resource": queued_resource_name(job.job_id, attempt, job.spec.platform or TPU_API),
        "workers_done": (),
        "capacity_state": None,
        "next_attempt_at": None,
        "exit_code": None,
        "zone": zone,
        "requested_at": None,
        "create_operation": "",
        "suspect_hosts": (),
        "maintenance": (),
        "run_ends_at": None,
    }

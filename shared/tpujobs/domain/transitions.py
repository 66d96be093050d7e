"""decide(job, observation, now): the only function that moves a job.

Pure: it reads the transition table and the restart rules and returns what should be
written; the service commits it in one transaction and then acts. Stale, duplicate and
out-of-order observations come back as `Ignored` with the reason, never as a move.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from tpujobs.domain import accounting
from tpujobs.domain.job import Job, JobEvent, Source, SuspectHost
from tpujobs.domain.naming import queued_resource_name
from tpujobs.domain.retry import backoff_seconds, rule_on_loss
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
    """Apply one observation to a job: the new job and event, or why nothing changes."""
    if seen.attempt is not None and seen.attempt != job.attempt:
        return Ignored(f"{seen.kind.value} concerns attempt {seen.attempt}; the job is at attempt {job.attempt}")
    targets = allowed_targets(job.state, seen.kind)
    if not targets:
        return Ignored(f"{seen.kind.value} does not apply to a {job.state.value} job")

    changes: dict[str, object] = {}
    reason = seen.reason
    if seen.kind is EventKind.ADMITTED:
        to_state = JobState.PROVISIONING
        changes["capacity_state"] = seen.capacity_state
        changes["requested_at"] = now
        changes["create_operation"] = seen.operation
        changes["suspect_hosts"] = ()
        reason = reason or f"Queued resource {job.queued_resource} requested in {job.zone}."
    elif seen.kind is EventKind.REQUESTED_AGAIN:
        operation = seen.operation or job.create_operation
        said = not seen.reason or seen.reason == job.state_reason
        if seen.capacity_state == job.capacity_state and operation == job.create_operation and said:
            return Ignored(f"queued resource {job.queued_resource} was asked for again with nothing new")
        to_state = JobState.PROVISIONING
        changes["capacity_state"] = seen.capacity_state
        changes["create_operation"] = operation
        reason = reason or f"Queued resource {job.queued_resource} was missing; requested again in {job.zone}."
    elif seen.kind is EventKind.HOSTS_SUSPECT:
        earlier = {h.node: h.first_seen_at for h in job.suspect_hosts}
        hosts = tuple(
            SuspectHost(node, condition, earlier.get(node, now)) for node, condition in sorted(set(seen.hosts))
        )
        if hosts == job.suspect_hosts:
            return Ignored("the job already knows its hosts' conditions")
        to_state = job.state
        changes["suspect_hosts"] = hosts
        names = ", ".join(f"{h.node} ({h.condition})" for h in hosts)
        reason = reason or (
            f"Watching {names}: lost if it lasts past the grace."
            if hosts
            else f"Every host of attempt {job.attempt} is healthy again."
        )
    elif seen.kind is EventKind.REPAIR_FAILED:
        reason = reason or "The reconciler could not repair the job."
        if reason == job.state_reason:
            return Ignored("the job already says why it could not be repaired")
        to_state = job.state
    elif seen.kind is EventKind.CAPACITY_CHANGED:
        if seen.capacity_state == job.capacity_state:
            return Ignored(f"capacity is already {job.capacity_state}")
        to_state = JobState.PROVISIONING
        changes["capacity_state"] = seen.capacity_state
        reason = reason or f"Queued resource {job.queued_resource} is {seen.capacity_state}."
    elif seen.kind is EventKind.WORKERS_STARTED:
        to_state = JobState.RUNNING
        changes["capacity_state"] = "ACTIVE"
        changes["started_at"] = job.started_at or now
        reason = reason or f"Workers of attempt {job.attempt} started the command."
    elif seen.kind is EventKind.WORKER_SUCCEEDED:
        worker = seen.worker or "?"
        if worker in job.workers_done:
            return Ignored(f"worker {worker} of attempt {job.attempt} was already counted")
        done = (*job.workers_done, worker)
        changes["workers_done"] = done
        changes["started_at"] = job.started_at or now
        if len(done) >= job.total_workers:
            to_state = JobState.SUCCEEDED
            changes["exit_code"] = 0
            reason = reason or f"Every worker of attempt {job.attempt} exited 0."
        else:
            to_state = JobState.RUNNING
            reason = reason or (f"Worker {worker} exited 0; {len(done)} of {job.total_workers} workers are done.")
    elif seen.kind is EventKind.CAPACITY_LOST and _never_ran_here(job, seen):
        zone = next_zone(job)
        assert zone is not None
        to_state = JobState.QUEUED
        changes.update(_requeued(job, zone))
        what = seen.reason or f"Queued resource {job.queued_resource} failed"
        reason = f"{what}; it never ran, so attempt {job.attempt + 1} moves to {zone}."
    elif seen.kind in (EventKind.COMMAND_FAILED, EventKind.CAPACITY_LOST):
        is_error = seen.kind is EventKind.COMMAND_FAILED
        on_worker = f" on worker {seen.worker}" if seen.worker else ""
        what = seen.reason or (
            f"The command exited with code {seen.exit_code}{on_worker}" if is_error else "The capacity was lost"
        )
        ruling = rule_on_loss(
            job.spec.on_error if is_error else job.spec.on_preemption,
            job.restarts,
            job.spec.max_restarts,
            what,
        )
        to_state, reason = ruling.to_state, ruling.reason
        if is_error:
            changes["exit_code"] = seen.exit_code
        if to_state is JobState.RECOVERING:
            changes["restarts"] = job.restarts + 1
            changes["resume_next"] = ruling.resume
            changes["next_attempt_at"] = now + timedelta(seconds=backoff_seconds(job.restarts + 1))
            if not is_error and _falls_back_to_on_demand(job, now):
                changes["on_demand"] = True
                spec = job.spec
                reason += (
                    f" After {spec.on_demand_after_preemptions} preemption(s) within "
                    f"{spec.preemption_window_minutes} minutes, the job continues on on-demand capacity."
                )
    elif seen.kind is EventKind.NEXT_ATTEMPT_REQUESTED:
        to_state = JobState.PROVISIONING
        following = job.as_next_attempt()
        changes.update(
            attempt=following.attempt,
            queued_resource=following.queued_resource,
            workers_done=(),
            capacity_state=seen.capacity_state,
            next_attempt_at=None,
            exit_code=None,
            requested_at=now,
            create_operation=seen.operation,
            suspect_hosts=(),
        )
        how = "resuming from its checkpoint" if job.resume_next else "from scratch"
        reason = reason or (
            f"Attempt {following.attempt} requested queued resource {following.queued_resource} "
            f"in {following.zone}, {how}."
        )
    elif seen.kind is EventKind.WAITING_FOR_QUOTA:
        if seen.reason == job.state_reason:
            return Ignored("the job already says it waits for that")
        to_state = JobState.QUEUED
    elif seen.kind is EventKind.QUOTA_EXCEEDED:
        what = seen.reason or f"The job asks for more chips than the whole quota of {job.zone}"
        zone = next_zone(job)
        if zone is None:
            to_state = JobState.FAILED
            reason = f"{what}; ask an admin to raise the quota, or ask for fewer chips."
        else:
            to_state = JobState.QUEUED
            changes["zone"] = zone
            reason = f"{what}; attempt {job.attempt} waits in {zone} instead."
    elif seen.kind is EventKind.EVICTED:
        to_state = JobState.QUEUED
        resume = job.spec.on_preemption == "resume"
        changes.update(_requeued(job, job.zone), resume_next=resume)
        how = "resume from its checkpoint" if resume else "start from scratch"
        reason = f"{seen.reason or 'Evicted'}; attempt {job.attempt + 1} waits for quota and will {how}."
    elif seen.kind is EventKind.ZONE_FAILOVER:
        zone = next_zone(job)
        if zone is None:
            return Ignored(f"no zone after {job.zone} to fail over to")
        to_state = JobState.QUEUED
        changes.update(_requeued(job, zone))
        reason = f"{seen.reason or 'No capacity'} in {job.zone}; attempt {job.attempt + 1} moves to {zone}."
    elif seen.kind is EventKind.ATTEMPT_ABORTED:
        to_state = JobState.FAILED
        changes["exit_code"] = seen.exit_code
        on_worker = f" on worker {seen.worker}" if seen.worker else ""
        reason = f"Attempt {job.attempt} could not run{on_worker}: {seen.reason or 'the agent gave up'}"
    elif seen.kind is EventKind.CAPACITY_REQUEST_FAILED:
        to_state = JobState.FAILED
        reason = reason or "The TPU API refused the capacity request."
    elif seen.kind is EventKind.CANCEL_REQUESTED:
        to_state = JobState.CANCELLED
        reason = reason or "Cancelled."
    else:  # pragma: no cover - every EventKind is handled above
        raise IllegalTransition(f"no rule for {seen.kind}")

    if to_state not in targets:
        raise IllegalTransition(f"{job.state.value} -> {to_state.value} on {seen.kind.value}")
    if to_state.is_terminal:
        changes["ended_at"] = now
    changes["usage"] = _usage_after(job, seen, to_state, changes, now)
    seq = job.event_seq + 1
    event = JobEvent(seq, now, job.state, to_state, reason, seen.source, job.attempt)
    new = job.evolve(state=to_state, state_reason=reason, updated_at=now, event_seq=seq, **changes)
    return Decision(new, event)


_HOLDS_CAPACITY = frozenset({EventKind.WORKERS_STARTED, EventKind.WORKER_SUCCEEDED})


def _usage_after(
    job: Job, seen: Observation, to_state: JobState, changes: dict[str, object], now: datetime
) -> tuple[accounting.AttemptUsage, ...]:
    """The attempts' timestamps after this move: capacity held from, attempt ended at."""
    chips = job.spec.chips
    usage = job.usage or accounting.next_attempt((), job.attempt, chips, job.created_at or now, job.zone)
    active = seen.capacity_state == "ACTIVE" and seen.kind is not EventKind.NEXT_ATTEMPT_REQUESTED
    if seen.kind in _HOLDS_CAPACITY or active:
        usage = accounting.capacity_held(usage, job.attempt, now)
    if seen.kind in _HOLDS_CAPACITY:  # the boot clock of the attempt's other hosts starts
        usage = accounting.workers_started(usage, job.attempt, now, every=job.total_workers == 1)
    if to_state is JobState.RECOVERING or to_state.is_terminal:
        lost = seen.kind is EventKind.CAPACITY_LOST
        kept = bool(changes.get("resume_next", True))  # rerun from scratch throws the work away
        usage = accounting.attempt_ended(usage, job.attempt, now, capacity_lost=lost, work_kept=kept)
    if to_state is JobState.QUEUED and "attempt" in changes:  # requeued: evicted, or another zone
        usage = accounting.attempt_ended(usage, job.attempt, now, capacity_lost=seen.kind is EventKind.EVICTED)
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


def _falls_back_to_on_demand(job: Job, now: datetime) -> bool:
    """A spot job's policy: this preemption makes N within the window, so go on-demand."""
    spec = job.spec
    if job.on_demand or spec.capacity != "spot" or spec.on_demand_after_preemptions is None:
        return False
    since = now - timedelta(minutes=spec.preemption_window_minutes)
    earlier = sum(1 for u in job.usage if u.capacity_lost and u.ended_at is not None and u.ended_at >= since)
    return earlier + 1 >= spec.on_demand_after_preemptions


def next_zone(job: Job) -> str | None:
    """The zone after the job's current one in its `zones`; None at the last (or with one zone)."""
    zones = job.spec.preferred_zones
    later = zones[zones.index(job.zone) + 1 :] if job.zone in zones else ()
    return later[0] if later else None


def _never_ran_here(job: Job, seen: Observation) -> bool:
    """A queued resource that FAILED while provisioning, before any capacity was held here,
    of a job with another zone to go to: that is a failover, not a loss."""
    current = next((u for u in job.usage if u.attempt == job.attempt), None)
    return (
        job.state is JobState.PROVISIONING
        and seen.capacity_state == "FAILED"
        and (current is None or current.held_from is None)
        and next_zone(job) is not None
    )


def _requeued(job: Job, zone: str) -> dict[str, object]:
    """The fields of a job sent back to QUEUED for its next attempt, in `zone`."""
    attempt = job.attempt + 1
    return {
        "attempt": attempt,
        "queued_resource": queued_resource_name(job.job_id, attempt),
        "workers_done": (),
        "capacity_state": None,
        "next_attempt_at": None,
        "exit_code": None,
        "zone": zone,
        "requested_at": None,
        "create_operation": "",
        "suspect_hosts": (),
    }

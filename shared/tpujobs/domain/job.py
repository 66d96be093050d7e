"""The job record and its timeline entries, as immutable values.

A `Job` mirrors its Firestore document (`jobs/{job_id}`) field by field, so the
adapter maps it flatly and the console shows what the code sees.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from tpujobs.domain.accounting import Accounting, AttemptUsage, account, first_attempt
from tpujobs.domain.naming import queued_resource_name
from tpujobs.domain.platforms import TPU_API
from tpujobs.domain.spec import JobSpec
from tpujobs.domain.states import ATTEMPT_LIVE, JobState

Source = Literal["submit", "tpu", "agent", "reconciler", "user"]
SubmittedVia = Literal["topic", "api"]  # tpujobs-submit, or the jobs API's submit action


@dataclass(frozen=True)
class JobEvent:
    """One entry of a job's timeline: a transition, or an observation that kept the state."""

    seq: int  # position in the timeline, 1-based; the event document's id is derived from it
    at: datetime
    from_state: JobState | None  # None for the submission that created the job
    to_state: JobState
    reason: str
    source: Source
    attempt: int

    @property
    def document_id(self) -> str:
        """Sorts in timeline order in the console: 0001-queued, 0002-provisioning, ..."""
        return f"{self.seq:04d}-{self.to_state.value.lower()}"


@dataclass(frozen=True)
class SuspectHost:
    """A node of the current attempt in a condition that is often transient (health TIMEOUT,
    RESTARTING, ...), and since when the reconciler has seen it so: lost only past the grace."""

    node: str  # the node id, as the TPU API names it
    condition: str  # what the API said: "health TIMEOUT", "state RESTARTING", ...
    first_seen_at: datetime


@dataclass(frozen=True)
class ScheduledMaintenance:
    """Host maintenance Google announced for a host of the current attempt, as it said it (the
    instance's `upcomingMaintenance`, or the host's `instance/upcoming-maintenance`). A TPU VM
    is not migrated: its processes stop when the window starts."""

    host: str  # the instance or node, as its platform names it; or "slice-worker" from its agent
    window_start: str  # RFC 3339, as Google gave it
    window_end: str = ""
    kind: str = ""  # Google's `type`: SCHEDULED, UNSCHEDULED, ...


@dataclass(frozen=True)
class HeldOver:
    """An earlier attempt's holding kept after the next attempt's request: it was lost to Google
    (a preemption, a lost host), whose hosts may still be saving on SIGTERM within Google's
    shutdown grace, so tpujobs releases it only once its hosts are gone or `release_after` has
    passed (`domain.grace`). Its chips count in its admission pool until then."""

    holding: str  # the attempt's queued resource (TPU API) or slice name (Compute Engine)
    zone: str
    attempt: int
    chips: int
    pool: str  # the admission pool its chips count in (`domain.admission.pool_id`)
    release_after: datetime  # when Google's grace is over for certain: the loss seen, plus the grace


@dataclass(frozen=True)
class Job:
    """A job as stored: its spec, where it is, and what it holds."""

    job_id: str
    name: str
    owner: str
    spec: JobSpec
    state: JobState
    state_reason: str
    zone: str
    attempt: int = 1
    restarts: int = 0
    queued_resource: str = ""
    capacity_state: str | None = None
    resume_next: bool = False  # whether the current (or, when RECOVERING, the next) attempt resumes
    workers_done: tuple[str, ...] = ()  # workers ("slice-worker") of this attempt that exited 0
    next_attempt_at: datetime | None = None  # RECOVERING: not before this (restart backoff)
    created_at: datetime | None = None
    updated_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    exit_code: int | None = None
    log_uri: str | None = None
    event_seq: int = 0  # events written so far; the next event gets event_seq + 1
    usage: tuple[AttemptUsage, ...] = ()  # every attempt's timestamps, for its chip-hours
    requested_at: datetime | None = None  # when the current queued resource was requested
    on_demand: bool = False  # a spot job continued on on-demand after too many preemptions
    submitted_via: SubmittedVia = "topic"
    # True when the jobs API verified that the owner is who called; a topic's `owner` is a claim.
    owner_verified: bool = False
    # The long-running operation of the current attempt's create: what it said if it failed.
    create_operation: str = ""
    suspect_hosts: tuple[SuspectHost, ...] = ()  # of the current attempt, first seen when
    maintenance: tuple[ScheduledMaintenance, ...] = ()  # announced for the current attempt's hosts
    # When Compute Engine ends the current attempt's VMs by their run duration (flex-start's
    # maxRunDuration: the earliest `terminationTimestamp` seen); a loss from then on is its time.
    run_ends_at: datetime | None = None
    # How long the record is kept once the job ends (the deployment's TPUJOBS_RECORD_RETENTION_DAYS
    # at submit), and when Firestore's TTL deletes it: set on entering a terminal state, cleared
    # on leaving one (`transitions._made`).
    record_retention_days: int = 180
    expire_at: datetime | None = None
    # Request ids of the resumes and reruns that started an attempt, newest last (at most
    # `domain.restart.REQUEST_MEMORY`): a retried request finds its id here and starts nothing.
    restart_requests: tuple[str, ...] = ()
    # The first attempt since the job was submitted, resumed or rerun: `time_limit` counts from
    # its capacity (`domain.limits.first_held`), so a job resumed days later is not out of time.
    run_first_attempt: int = 1
    # The warm pool (`tpujobs pool`) the current attempt runs on or waits for ("" for fresh
    # capacity), and the unit's queued resource it was given; the pool document says which job
    # each unit runs, these say it from the job's side (and `tpujobs list` shows the pool).
    warm_pool: str = ""
    warm_pool_unit: str = ""
    # When that unit's queued resource (the generation `warm_pool_unit` names) was asked for: its
    # VMs are no older, so a VM made before it cannot be the attempt's host (`attempt-key`).
    unit_requested_at: datetime | None = None
    # Earlier attempts' holdings still to release once their hosts' shutdown grace is over (the
    # reconciler finishes it); empty when every earlier holding has been released.
    held_over: tuple[HeldOver, ...] = ()
    # The team whose shares of the quota limits the job draws on (`domain.teams`), set at submit
    # from its verified owner (a topic's claimed owner only where config/policies trusts it); "": none.
    team: str = ""

    @property
    def capacity(self) -> str:
        """The capacity the next request asks for: the spec's, unless the fallback switched it."""
        return "on-demand" if self.on_demand else self.spec.capacity

    def accounting(self, now: datetime | None = None) -> Accounting:
        """Chip-hours, queue wait, lost time and goodput, as of `now` (default: the last change)."""
        until = now or self.updated_at or self.created_at
        assert until is not None, "a stored job has timestamps"
        return account(self.usage, until)

    def evolve(self, **changes: Any) -> Job:
        return replace(self, **changes)

    def usage_of(self, attempt: int | None = None) -> AttemptUsage | None:
        """The timestamps of `attempt` (default: the current one); None if it has none yet."""
        wanted = self.attempt if attempt is None else attempt
        return next((u for u in self.usage if u.attempt == wanted), None)

    @property
    def total_workers(self) -> int:
        """Worker hosts of one attempt: hosts per slice times slices."""
        return self.spec.hosts_per_slice * self.spec.slices

    @property
    def worker_keys(self) -> tuple[str, ...]:
        """Every worker host of one attempt, as `worker_key` names it."""
        return tuple(worker_key(s, w) for s in range(self.spec.slices) for w in range(self.spec.hosts_per_slice))

    def booting_since(self) -> datetime | None:
        """Since when the current attempt's hosts have been expected to report, while some may not
        have yet: the first host's `started` if one said it, else the capacity becoming ACTIVE.

        None when there is nothing to wait for: the job is not PROVISIONING or RUNNING, its
        capacity is not held yet, or every host is known to have reported (`all_started_at`).
        The boot timeout counts from this moment (`tpujobs.engine.reconciler`).
        """
        if self.state not in ATTEMPT_LIVE:
            return None
        usage = self.usage_of()
        if usage is None or usage.all_started_at is not None or usage.ended_at is not None:
            return None
        return usage.started_at or usage.held_from

    def hosts_lost_after(self, grace_seconds: float, now: datetime) -> tuple[SuspectHost, ...]:
        """The suspect hosts whose condition has lasted longer than the grace: lost hosts."""
        return tuple(h for h in self.suspect_hosts if (now - h.first_seen_at).total_seconds() > grace_seconds)

    def holding_of(self, attempt: int) -> str:
        """What holds (or held) that attempt's capacity, as `domain.naming` names it on the job's platform."""
        return queued_resource_name(self.job_id, attempt, self.spec.platform or TPU_API)

    def as_next_attempt(self) -> Job:
        """The job as its next attempt will see it: what the startup script of that attempt needs."""
        attempt = self.attempt + 1
        return self.evolve(
            attempt=attempt,
            queued_resource=self.holding_of(attempt),
            workers_done=(),
        )


def worker_key(slice_id: int, worker_id: int) -> str:
    """How a worker host is named in `workers_done` and in worker documents."""
    return f"{slice_id}-{worker_id}"


def new_job(
    spec: JobSpec,
    default_zone: str,
    now: datetime,
    log_uri: str | None = None,
    submitted_via: SubmittedVia = "topic",
    owner_verified: bool = False,
    record_retention_days: int = 180,
) -> tuple[Job, JobEvent]:
    """The QUEUED job a valid spec becomes, and the first entry of its timeline."""
    assert spec.job_id is not None, "parse_spec derives job_id before a job is made"
    zone = (spec.preferred_zones or (default_zone,))[0]
    by = spec.owner if owner_verified else f"{spec.owner} (unverified, via the topic)"
    where = f"on pool {spec.pool}" if spec.pool else f"({spec.capacity}) in {zone}"
    reason = f"Submitted by {by}: {spec.slices} x {spec.accelerator_type} {where}."
    job = Job(
        job_id=spec.job_id,
        name=spec.name,
        owner=spec.owner,
        spec=spec,
        state=JobState.QUEUED,
        state_reason=reason,
        zone=zone,
        attempt=1,
        queued_resource=queued_resource_name(spec.job_id, 1, spec.platform or TPU_API),
        created_at=now,
        updated_at=now,
        log_uri=log_uri,
        event_seq=1,
        usage=first_attempt(spec.chips, now, zone),
        submitted_via=submitted_via,
        owner_verified=owner_verified,
        record_retention_days=record_retention_days,
        warm_pool=spec.pool or "",
    )
    event = JobEvent(1, now, None, JobState.QUEUED, reason, "submit", 1)
    return job, event

"""Job states and the events that move them, as data.

`TRANSITIONS` is the one place that says which event may move a job from which
state to which. Anything not in it is refused: an event that arrives late, twice or
out of order is recorded but changes nothing. `tests/unit/domain/test_states.py` walks
every state against every event.
"""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    """Where a job is in its life. The value is what Firestore stores in the job's `state`."""

    QUEUED = "QUEUED"
    """Accepted and recorded; waiting for admission (quota, priority) before capacity is asked for."""
    PROVISIONING = "PROVISIONING"
    """Capacity was requested for the current attempt; `capacity_state` mirrors its holding's state."""
    RUNNING = "RUNNING"
    """Capacity is active and the workers have started the command."""
    RECOVERING = "RECOVERING"
    """The attempt was lost (preemption, hardware, infrastructure, or an error the rules retry);
    the next attempt is being set up."""
    SUCCEEDED = "SUCCEEDED"
    """Terminal: every worker of the last attempt exited 0."""
    FAILED = "FAILED"
    """Terminal: the rules gave up (error with on_error=fail, restarts used up, a permanent API error)."""
    CANCELLED = "CANCELLED"
    """Terminal: a user cancelled the job; its capacity was released."""

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL


TERMINAL: frozenset[JobState] = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ACTIVE: frozenset[JobState] = frozenset(set(JobState) - TERMINAL)
RESUMABLE: frozenset[JobState] = frozenset({JobState.FAILED, JobState.CANCELLED})
"""End states a user may resume from the checkpoint (`tpujobs resume`); any end state may be rerun."""
ATTEMPT_LIVE: frozenset[JobState] = frozenset({JobState.PROVISIONING, JobState.RUNNING})
"""States whose current attempt has asked for or holds capacity: its hosts are expected to report."""


class EventKind(str, Enum):
    """What can happen to a job. Each event names the attempt it concerns."""

    ADMITTED = "admitted"
    """Admission let the job in and its queued resource was requested."""
    CAPACITY_REQUEST_FAILED = "capacity_request_failed"
    """The TPU API refused the request for good (a permanent error, not a retryable one)."""
    CAPACITY_CHANGED = "capacity_changed"
    """The holding moved to another state on its way up (WAITING, PROVISIONING: `domain.holdings`)."""
    WORKERS_STARTED = "workers_started"
    """The worker agents report the command started."""
    WORKER_SUCCEEDED = "worker_succeeded"
    """One worker's command exited 0; the job succeeds when every worker of the attempt has."""
    COMMAND_FAILED = "command_failed"
    """A worker's command (or setup) exited non-zero; `on_error` decides what follows."""
    ATTEMPT_ABORTED = "attempt_aborted"
    """A worker could not start the command for a reason no restart fixes (a secret missing or
    unreadable by the job's account, code whose digest differs): the job fails, whatever its rules."""
    CAPACITY_LOST = "capacity_lost"
    """Preemption, hardware failure or a lost host; `on_preemption` decides what follows."""
    NEXT_ATTEMPT_REQUESTED = "next_attempt_requested"
    """The next attempt's queued resource was requested after a recovery."""
    CANCEL_REQUESTED = "cancel_requested"
    """A user (the owner or an admin) asked to cancel."""
    WAITING_FOR_QUOTA = "waiting_for_quota"
    """Admission found no room in the job's quota; the job waits QUEUED and says for what."""
    QUOTA_EXCEEDED = "quota_exceeded"
    """The job asks for more chips than its pool's whole quota (lowered after it was submitted):
    it could never be admitted there, so it moves QUEUED to the next of its `zones`, or fails,
    and the queue behind it goes on."""
    EVICTED = "evicted"
    """A higher-priority job took the chips; the job waits QUEUED again and resumes by its rules."""
    RECLAIMED = "reclaimed"
    """A team under its nominal share took back the chips the job's team had borrowed
    (`domain.fair_share`); the job waits QUEUED again and resumes by its rules, no restart counted."""
    ZONE_FAILOVER = "zone_failover"
    """The queued resource waited too long for capacity; the job waits QUEUED in the next of its `zones`,
    outside the region whose quota Google said is full; with no such zone it stays PROVISIONING, saying why."""
    REQUESTED_AGAIN = "requested_again"
    """The reconciler asked again for the current attempt's queued resource: it was missing, or
    the TPU quota had been exhausted. The job stays PROVISIONING; the zone wait keeps counting
    from the first request (`requested_at`), so asking again never waits forever."""
    HOSTS_SUSPECT = "hosts_suspect"
    """The hosts whose node is in a grace-gated condition (`adapters.tpu.NODE_STATES`, health
    TIMEOUT, RESTARTING, UNKNOWN...) changed: the job remembers since when each has been, so a
    stateless tick can tell a passing condition from one that lasts past the grace."""
    MAINTENANCE_SCHEDULED = "maintenance_scheduled"
    """Google scheduled maintenance for a host of the current attempt (the API's
    `upcomingMaintenance`, or the host's `instance/upcoming-maintenance` metadata): its processes
    stop when the window starts. Recorded once per host and window, and announced, so the owner
    can checkpoint or move; the state stays, and the loss itself is handled by `on_preemption`."""
    RUN_END_SCHEDULED = "run_end_scheduled"
    """Compute Engine set when it ends the current attempt's VMs by their run duration (the
    earliest `terminationTimestamp`: flex-start's `maxRunDuration`, counted from RUNNING). The
    job keeps it (`Job.run_ends_at`), so a loss from then on is the attempt's time, not a preemption."""
    MAINTENANCE_MOVE = "maintenance_move"
    """A job with `on_maintenance: checkpoint-and-move` reached its lead before a host's
    maintenance window: the attempt ends (its hosts get SIGTERM and save a checkpoint) and the
    next one resumes on other capacity at once. tpujobs chose it, so no restart is counted."""
    REPAIR_FAILED = "repair_failed"
    """The reconciler's repair of the job met a permanent error (an API refusing a call): the job
    keeps its state and says why in its reason and timeline, once per distinct reason."""
    TIME_LIMIT_REACHED = "time_limit_reached"
    """The job's `time_limit` or the attempt's `attempt_time_limit` ran out (the reconciler's
    tick, or the agent at its deadline): FAILED, whatever its rules; the reason names the limit
    and the time used (`tpujobs.domain.limits`)."""
    HUNG = "hung"
    """No worker of the RUNNING attempt printed a line or reported a checkpoint within its
    `hang_timeout`: `on_hang` and the restart budget decide what follows."""
    RESUME_REQUESTED = "resume_requested"
    """The owner or an admin asked a FAILED or CANCELLED job to go on (`tpujobs resume`): a new
    attempt under the same job_id waits QUEUED for admission and resumes from the checkpoint
    prefix, with a fresh restart budget and the overrides asked for (`domain.restart`)."""
    WAITING_FOR_POOL = "waiting_for_pool"
    """No unit of the job's warm pool is free: the job stays QUEUED in the pool's own queue
    (priority, then age), saying what it waits for."""
    POOL_REQUEUED = "pool_requeued"
    """A RECOVERING job on a warm pool: its next attempt waits QUEUED in the pool's queue for a
    free unit (the next one free, or its own once it is back), resuming by its rules."""
    LEFT_POOL = "left_pool"
    """The job leaves its warm pool for capacity of its own (`pool_fallback: provision`): no unit
    was free, or the pool was deleted. QUEUED for admission as any job; a live attempt ends
    first and the next one resumes by `on_preemption`."""
    HELD_OVER_RELEASED = "held_over_released"
    """An earlier attempt's holding, kept past the next attempt's request while its hosts might
    be saving within Google's shutdown grace (`Job.held_over`, `domain.grace`), was released: its
    hosts are gone or its grace is over. The state stays; its chips leave the job's pool."""
    RERUN_REQUESTED = "rerun_requested"
    """The owner or an admin asked an ended job (SUCCEEDED too) to run again from scratch
    (`tpujobs rerun`): as RESUME_REQUESTED, but the new attempt does not resume."""


QUOTA_EXHAUSTED = "QUOTA_EXHAUSTED"
"""`capacity_state` of a PROVISIONING job whose request the TPU API refused because a TPU quota
is exhausted: no queued resource exists, the reason quotes Google, and the reconciler asks again
every tick until the quota frees up (or the zone wait moves the job to its next zone)."""
REGION_QUOTA_EXHAUSTED = "REGION_QUOTA_EXHAUSTED"
"""As `QUOTA_EXHAUSTED`, when Google says the quota that ran out is the REGION's (of the job's
zone): no other zone of that region has room either, so the zone wait moves the job to its
next zone outside the region, or, with none, it waits where it is."""
GOOGLE_QUOTA_WAITS = frozenset({QUOTA_EXHAUSTED, REGION_QUOTA_EXHAUSTED})
"""The `capacity_state`s of a job whose request Google refused for quota: asked again every tick."""


TRANSITIONS: dict[tuple[JobState, EventKind], frozenset[JobState]] = {
    (JobState.QUEUED, EventKind.ADMITTED): frozenset({JobState.PROVISIONING}),
    (JobState.QUEUED, EventKind.CAPACITY_REQUEST_FAILED): frozenset({JobState.FAILED}),
    (JobState.RECOVERING, EventKind.CAPACITY_REQUEST_FAILED): frozenset({JobState.FAILED}),
    # The reconciler asking again for a missing queued resource is refused for good.
    (JobState.PROVISIONING, EventKind.CAPACITY_REQUEST_FAILED): frozenset({JobState.FAILED}),
    (JobState.PROVISIONING, EventKind.REQUESTED_AGAIN): frozenset({JobState.PROVISIONING}),
    (JobState.PROVISIONING, EventKind.HOSTS_SUSPECT): frozenset({JobState.PROVISIONING}),
    (JobState.RUNNING, EventKind.HOSTS_SUSPECT): frozenset({JobState.RUNNING}),
    (JobState.PROVISIONING, EventKind.MAINTENANCE_SCHEDULED): frozenset({JobState.PROVISIONING}),
    (JobState.RUNNING, EventKind.MAINTENANCE_SCHEDULED): frozenset({JobState.RUNNING}),
    (JobState.PROVISIONING, EventKind.RUN_END_SCHEDULED): frozenset({JobState.PROVISIONING}),
    (JobState.RUNNING, EventKind.RUN_END_SCHEDULED): frozenset({JobState.RUNNING}),
    (JobState.PROVISIONING, EventKind.MAINTENANCE_MOVE): frozenset({JobState.RECOVERING}),
    (JobState.RUNNING, EventKind.MAINTENANCE_MOVE): frozenset({JobState.RECOVERING}),
    **{(state, EventKind.REPAIR_FAILED): frozenset({state}) for state in ACTIVE},
    **{(state, EventKind.HELD_OVER_RELEASED): frozenset({state}) for state in ACTIVE},
    (JobState.PROVISIONING, EventKind.CAPACITY_CHANGED): frozenset({JobState.PROVISIONING}),
    (JobState.PROVISIONING, EventKind.WORKERS_STARTED): frozenset({JobState.RUNNING}),
    # A worker may finish before its `started` report arrives: exits count from PROVISIONING too.
    (JobState.PROVISIONING, EventKind.WORKER_SUCCEEDED): frozenset({JobState.RUNNING, JobState.SUCCEEDED}),
    (JobState.RUNNING, EventKind.WORKER_SUCCEEDED): frozenset({JobState.RUNNING, JobState.SUCCEEDED}),
    (JobState.PROVISIONING, EventKind.COMMAND_FAILED): frozenset({JobState.RECOVERING, JobState.FAILED}),
    (JobState.RUNNING, EventKind.COMMAND_FAILED): frozenset({JobState.RECOVERING, JobState.FAILED}),
    (JobState.PROVISIONING, EventKind.ATTEMPT_ABORTED): frozenset({JobState.FAILED}),
    (JobState.RUNNING, EventKind.ATTEMPT_ABORTED): frozenset({JobState.FAILED}),
    # A queued resource that FAILED before it ever ran moves a job with more `zones` to the next.
    (JobState.PROVISIONING, EventKind.CAPACITY_LOST): frozenset(
        {JobState.RECOVERING, JobState.FAILED, JobState.QUEUED}
    ),
    (JobState.RUNNING, EventKind.CAPACITY_LOST): frozenset({JobState.RECOVERING, JobState.FAILED}),
    (JobState.RECOVERING, EventKind.NEXT_ATTEMPT_REQUESTED): frozenset({JobState.PROVISIONING}),
    **{(state, EventKind.CANCEL_REQUESTED): frozenset({JobState.CANCELLED}) for state in ACTIVE},
    (JobState.QUEUED, EventKind.WAITING_FOR_QUOTA): frozenset({JobState.QUEUED}),
    (JobState.QUEUED, EventKind.QUOTA_EXCEEDED): frozenset({JobState.QUEUED, JobState.FAILED}),
    **{
        (state, kind): frozenset({JobState.QUEUED})
        for state in (JobState.PROVISIONING, JobState.RUNNING, JobState.RECOVERING)
        for kind in (EventKind.EVICTED, EventKind.RECLAIMED)
    },
    (JobState.PROVISIONING, EventKind.ZONE_FAILOVER): frozenset({JobState.QUEUED, JobState.PROVISIONING}),
    **{(state, EventKind.TIME_LIMIT_REACHED): frozenset({JobState.FAILED}) for state in ACTIVE},
    (JobState.RUNNING, EventKind.HUNG): frozenset({JobState.RECOVERING, JobState.FAILED}),
    (JobState.QUEUED, EventKind.WAITING_FOR_POOL): frozenset({JobState.QUEUED}),
    (JobState.RECOVERING, EventKind.POOL_REQUEUED): frozenset({JobState.QUEUED}),
    **{(state, EventKind.LEFT_POOL): frozenset({JobState.QUEUED}) for state in ACTIVE},
    # The only ways out of an end state: a user's resume (of a failed or cancelled job) or rerun.
    **{(state, EventKind.RESUME_REQUESTED): frozenset({JobState.QUEUED}) for state in RESUMABLE},
    **{(state, EventKind.RERUN_REQUESTED): frozenset({JobState.QUEUED}) for state in TERMINAL},
}
"""(state, event) -> the states that event may lead to. Absent pairs change nothing."""


def allowed_targets(state: JobState, event: EventKind) -> frozenset[JobState]:
    """The states `event` may move a job in `state` to; empty when it must be ignored."""
    return TRANSITIONS.get((state, event), frozenset())

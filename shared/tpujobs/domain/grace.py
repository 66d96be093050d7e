"""The preemption grace is the job's: a lost attempt's holding is released only after it.

When Google takes capacity back it gives the VMs' guest OS a shutdown grace: "there will be 120
seconds between GCE ACPI G2 Soft Off and ACPI G3 Mechanical Off for Standard VMs and 30 seconds
for Spot VMs" (compute_v1 `Scheduling.skip_guest_os_shutdown`). A job saves its checkpoint on
SIGTERM within it. Google documents nothing about what deleting a holding that is LOSING (a
queued resource SUSPENDING), or a VM that is STOPPING, does to that grace, so tpujobs never
deletes before it is over: the next attempt is requested at once, and the lost attempt's
holding is kept (`HeldOver` on the job, its chips counted in its pool) until its hosts are gone
(the holding LOST, FAILED or no longer there: `holdings.HOSTS_GONE`) or the grace has passed
since the loss was seen. The reconciler finishes what is left. See docs/recovery.md.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from tpujobs.domain.admission import pool_id
from tpujobs.domain.holdings import HOSTS_GONE, HoldingState
from tpujobs.domain.job import HeldOver, Job
from tpujobs.domain.states import JobState

SPOT_SHUTDOWN_GRACE_SECONDS = 30.0  # Spot VMs: ACPI G2 Soft Off, then G3 Mechanical Off 30 s later
STANDARD_SHUTDOWN_GRACE_SECONDS = 120.0  # every other VM (and the safe path where Google says nothing)
HELD_PREFIX = "held:"  # an admission pool's holder id for a held-over holding: `held:{holding}`
# A running attempt tpujobs stops itself (a reclaim, an eviction) is asked to through its hosts'
# metadata (`tpujobs-stop`): the agent stops the command as for a preemption notice, with its own
# grace (30 s from SIGTERM to SIGKILL), ships the output and says `stopped`. Its holding is kept
# until every host has, or this long at most.
STOP_HOLD_SECONDS = 60.0


def shutdown_grace_seconds(job: Job) -> float:
    """The grace of the hosts of the job's attempt just lost: a Spot VM's, when the attempt ran
    on spot capacity for certain; otherwise a standard VM's, the longer (a spot job that has just
    switched to on-demand lost a spot attempt, and waits the longer grace: the safe path)."""
    if job.spec.capacity == "spot" and not job.on_demand:
        return SPOT_SHUTDOWN_GRACE_SECONDS
    return STANDARD_SHUTDOWN_GRACE_SECONDS


def hold_over(job: Job, state: str | None, unhealthy_hosts: int = 0) -> HeldOver | None:
    """The current attempt's holding, to be kept past the next attempt's request, as its
    capacity now reads (`state`, None when it is gone; `unhealthy_hosts`): when Google is taking
    the whole slice back, its hosts saving within their grace. That is a holding LOSING (a
    preemption the platform says as such), or one every host of which is lost (Compute Engine's
    preempted Spot VMs, STOPPING). None otherwise, and it goes at once: its hosts are gone
    already (LOST, FAILED, absent), or some still run the command
    (one lost host, a failed or hung command, a move ahead of maintenance), which only the
    release stops."""
    usage = job.usage_of()
    if usage is None or not usage.capacity_lost or usage.ended_at is None or not job.queued_resource:
        return None
    reclaimed = state == HoldingState.LOSING or (state not in HOSTS_GONE and 0 < job.total_workers <= unhealthy_hosts)
    if state is None or not reclaimed:
        return None
    until = usage.ended_at + timedelta(seconds=shutdown_grace_seconds(job))
    chips, pool = job.spec.chips, pool_id(job.spec, job.zone, job.capacity)
    return HeldOver(job.queued_resource, job.zone, job.attempt, chips, pool, until)


def hold_while_stopping(job: Job, now: datetime) -> HeldOver | None:
    """The current attempt's holding, kept while tpujobs asks its hosts to stop (a reclaim, an
    eviction) so the command's save on SIGTERM is not cut short; None when no host can be running
    the command yet (the attempt is not RUNNING): it is released at once."""
    if job.state is not JobState.RUNNING or not job.queued_resource:
        return None
    chips, pool = job.spec.chips, pool_id(job.spec, job.zone, job.capacity)
    return HeldOver(job.queued_resource, job.zone, job.attempt, chips, pool, now + timedelta(seconds=STOP_HOLD_SECONDS))


def saving_until(job: Job, state: str | None, unhealthy_hosts: int, now: datetime) -> datetime | None:
    """An ended job's last holding (its capacity reading `state`, `unhealthy_hosts`): when its
    hosts' grace ends, while Google is taking it back and they may still be saving (`hold_over`'s
    rule); None once they are gone or the grace is over, or when it was not taken back."""
    held = hold_over(job, state, unhealthy_hosts)
    return held.release_after if held is not None and now < held.release_after else None


def release_due(held: HeldOver, now: datetime, state: str | None) -> bool:
    """Whether a held-over holding may go now: its grace is over, or its hosts are gone (its
    state is one of `HOSTS_GONE`, or it no longer exists: `state` None)."""
    return now >= held.release_after or state is None or state in HOSTS_GONE


def held_holder(holding: str) -> str:
    """A held-over holding's holder id in its admission pool (`quota_pools/{pool}`)."""
    return f"{HELD_PREFIX}{holding}"


def parse_held_holder(holder: str) -> str | None:
    """The holding a `held:` holder id names; None for a job's or a unit's holder."""
    return holder[len(HELD_PREFIX) :] if holder.startswith(HELD_PREFIX) else None

"""A flex-start VM's run duration as pure rules: its maxRunDuration leaves room for tpujobs' own
limit (the boot and a save on SIGTERM inside), and a capacity lost once the attempt's time is up
ends the job by the time limit, never restarted as a preemption."""

from __future__ import annotations

from test_limits import at, moved, running

from tpujobs.domain import limits
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Observation
from tpujobs.engine.startup_script import AgentTimings

FLEX = {"accelerator_type": "v7x-16", "platform": "compute", "capacity": "flex-start"}


def lost(job, when: float):
    """The job after its hosts are seen lost at `when` s (a preemption notice's words)."""
    seen = Observation(EventKind.CAPACITY_LOST, job.attempt, "agent", "Preempted: worker 0-0 got notice (SIGTERM)")
    return moved(job, seen, at(when))


def test_the_run_duration_holds_the_limit_the_boot_and_the_save() -> None:
    """maxRunDuration is the smaller limit plus the boot allowance, a SIGTERM grace no shorter
    than the agent's, and a margin; within Compute Engine's 10 minutes to 7 days."""
    job = running(attempt_time_limit="1h", time_limit="3h", max_restarts=5, on_preemption="resume", **FLEX)
    seconds = limits.flex_run_seconds(job.spec)
    assert (
        seconds
        == 3600 + limits.RUN_BOOT_ALLOWANCE_SECONDS + limits.RUN_SIGTERM_GRACE_SECONDS + limits.RUN_MARGIN_SECONDS
    )
    assert AgentTimings().grace_seconds <= limits.RUN_SIGTERM_GRACE_SECONDS
    week = running(time_limit="300h", **FLEX)
    assert limits.flex_run_seconds(week.spec) == 7 * 24 * 3600


def test_a_flex_start_attempt_lost_at_its_run_duration_fails_by_the_time_limit() -> None:
    """Held from 60 s, a 7-day limit (the run duration capped at 7 days, before tpujobs' own
    limit): hosts lost once the VMs' maxRunDuration is over end the job FAILED, naming it, with
    restarts left; lost earlier, the job is restarted as before."""
    job = running(time_limit="200h", max_restarts=5, on_preemption="resume", **FLEX)
    end = 60 + 7 * 24 * 3600
    done = lost(job, end)
    assert done.state is JobState.FAILED and done.restarts == 0
    assert "maxRunDuration of 168h" in done.state_reason and "Preempted" in done.state_reason
    early = lost(job, end - limits.RUN_BOOT_ALLOWANCE_SECONDS - 60)
    assert early.state is JobState.RECOVERING and early.restarts == 1


def test_hosts_lost_after_the_attempts_limit_end_the_job_by_that_limit_on_any_platform() -> None:
    """A loss seen after the attempt_time_limit ran out (before the reconciler's tick) is the limit,
    not a preemption to restart from: FAILED, naming the limit."""
    job = running(attempt_time_limit="10m", max_restarts=5, on_preemption="resume")
    done = lost(job, 60 + 600 + 1)
    assert done.state is JobState.FAILED and "attempt_time_limit of 10m" in done.state_reason
    assert lost(job, 60 + 599).state is JobState.RECOVERING

"""A flex-start v7x job whose VMs reach their maxRunDuration, end to end through google-cloud-compute:
the reconciler reads Compute Engine's terminationTimestamp, and when the VMs end then, the job ends
FAILED by its time in its first attempt, never restarted as a preemption."""

from __future__ import annotations

import pytest

from tpujobs.domain.states import JobState
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

# A 10-minute limit makes a maxRunDuration of 23 min (domain.limits.flex_run_seconds); the simulator
# counts this share of it, about 28 s, and shows the terminationTimestamp it counts to.
SCALE = 0.02


def test_a_flex_start_job_ended_by_its_run_duration_fails_by_its_time_without_a_restart(env, submit_job):
    default = env["control"].config()["run_duration_scale"]
    env["control"].configure(run_duration_scale=SCALE)
    try:
        job_id = submit_job(
            prefix="v7x-flex",
            accelerator_type="v7x-8",
            capacity="flex-start",
            time_limit="10m",
            max_restarts=3,
            on_preemption="resume",
            command="sleep 600",
        )
        known = wait_for(lambda: (j := env["store"].get(job_id)) and j.run_ends_at and j, timeout=120)
        assert known.state in (JobState.PROVISIONING, JobState.RUNNING) and known.attempt == 1
        done = wait_for(lambda: (j := env["store"].get(job_id)) and j.state.is_terminal and j, timeout=120)
        assert (done.state, done.attempt, done.restarts) == (JobState.FAILED, 1, 0), done.state_reason
        assert "maxRunDuration" in done.state_reason, done.state_reason
    finally:
        env["control"].configure(run_duration_scale=default)

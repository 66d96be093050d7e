"""Time limits and hang detection end to end on the local stack, driven through the CLI: the
reconciler's tick (every few seconds locally) ends or restarts the jobs, and the simulator
stops their hosts when their queued resources are deleted."""

from __future__ import annotations

import pytest
from owner_cli import ended, events, submitted

from tpujobs.domain.states import JobState
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e


def no_capacity_left(env, job_id: str) -> None:
    """No queued resource of the job is left in the simulator (deleted, or on its way out)."""

    def probe():
        left = [
            s
            for s in env["tpu"].list_queued_resources(parent=f"projects/{env['project']}/locations/{env['zone']}")
            if s.name.rsplit("/", 1)[-1].startswith(f"{job_id}-a")
        ]
        return not left or None

    probe.__doc__ = f"the queued resources of {job_id} are gone"
    wait_for(probe, timeout=60)


def test_a_sleeping_job_past_its_time_limit_ends_failed_for_its_limit_with_no_capacity_left(env, tmp_path):
    """`sleep 600` under time_limit 5s: FAILED for its limit, the reason and the time used in the timeline."""
    job_id = submitted(tmp_path, "limit", command="sleep 600", time_limit="5s", on_error="resume", max_restarts=3)
    job = ended(env, job_id)
    assert job.state is JobState.FAILED and job.attempt == 1
    assert "time_limit of 5s was reached" in job.state_reason
    last = events(job_id)[-1]
    assert last["to_state"] == "FAILED" and "time_limit of 5s was reached: it used" in last["reason"]
    no_capacity_left(env, job_id)


def test_a_silent_job_is_hung_resumed_once_then_failed_at_its_restart_limit(env, tmp_path):
    """`sleep 600`, printing nothing, hang_timeout 5s, on_hang resume, max_restarts 1."""
    job_id = submitted(
        tmp_path, "hung", command="sleep 600", hang_timeout="5s", on_hang="resume", max_restarts=1, on_error="fail"
    )
    job = ended(env, job_id, timeout=180)
    assert (job.state, job.attempt, job.restarts) == (JobState.FAILED, 2, 1)
    timeline = events(job_id)
    hung = [e for e in timeline if "is hung" in e["reason"]]
    assert [(e["attempt"], e["to_state"]) for e in hung] == [(1, "RECOVERING"), (2, "FAILED")]
    assert "restart 1 of 1 will resume" in hung[0]["reason"] and "silent: 0-0 for" in hung[0]["reason"]
    assert "all 1 restarts are used up" in hung[1]["reason"]
    no_capacity_left(env, job_id)

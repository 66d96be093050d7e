"""Error classes end to end on the local stack, driven through the CLI: the agent on the
simulated host matches retry_on.output against the command's last lines, and the control
plane rules the failure with on_retryable_error or on_error."""

from __future__ import annotations

import pytest
from owner_cli import ended, events, submitted

from tpujobs.domain.states import JobState

pytestmark = pytest.mark.e2e

LINE = "rpc error: code = DEADLINE_EXCEEDED desc = deadline exceeded"
# Attempt 1 prints the gRPC error and exits 7; attempt 2 succeeds.
FLAKY = f'if [ "$TPUJOBS_ATTEMPT" = 1 ]; then echo "step 10"; echo "{LINE}" >&2; exit 7; fi; echo done'


def test_a_deadline_exceeded_error_is_retried_and_the_job_succeeds_at_attempt_2(env, tmp_path):
    """Exit 7 after DEADLINE_EXCEEDED under retry_on.output and on_error fail: resumed, SUCCEEDED at 2."""
    job_id = submitted(
        tmp_path, "retry", command=FLAKY, retry_on={"output": ["DEADLINE_EXCEEDED"]}, on_error="fail", max_restarts=2
    )
    job = ended(env, job_id)
    assert (job.state, job.attempt, job.restarts) == (JobState.SUCCEEDED, 2, 1), job.state_reason
    retried = [e for e in events(job_id) if e["to_state"] == "RECOVERING"]
    assert len(retried) == 1 and retried[0]["attempt"] == 1
    assert retried[0]["reason"] == (
        f'Worker 0-0 exited with 7: retryable (output matched "DEADLINE_EXCEEDED": "{LINE}"); '
        "restart 1 of 2 will resume from its checkpoint"
    )


def test_an_error_that_matches_no_pattern_fails_under_on_error(env, tmp_path):
    """Exit 7 after a Python error no pattern matches, on_error fail: FAILED at attempt 1, saying why."""
    command = 'echo "ValueError: bad input" >&2; exit 7'
    job_id = submitted(
        tmp_path, "noretry", command=command, retry_on={"output": ["DEADLINE_EXCEEDED"]}, on_error="fail"
    )
    job = ended(env, job_id)
    assert (job.state, job.attempt, job.exit_code) == (JobState.FAILED, 1, 7)
    assert job.state_reason.startswith("Worker 0-0 exited with 7: not retryable (exit code 7 is not listed")
    assert events(job_id)[-1]["reason"].endswith("; the job's rule is 'fail'")

"""Error classes end to end on the local stack, driven through the CLI: the agent on the
simulated host matches retry_on.output against the command's last lines, and the control
plane rules the failure with on_retryable_error or on_error."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tpujobs.cli import app
from tpujobs.domain.states import JobState
from tpujobs.testing import wait_for

pytestmark = pytest.mark.e2e

OWNER = "ada@example.com"
LINE = "rpc error: code = DEADLINE_EXCEEDED desc = deadline exceeded"
# Attempt 1 prints the gRPC error and exits 7; attempt 2 succeeds.
FLAKY = f'if [ "$TPUJOBS_ATTEMPT" = 1 ]; then echo "step 10"; echo "{LINE}" >&2; exit 7; fi; echo done'


def tpujobs(*args: str) -> str:
    """`tpujobs ARGS` as the jobs' owner; its output, the command checked to have succeeded."""
    result = CliRunner().invoke(app, list(args), env={"TPUJOBS_OWNER": OWNER}, terminal_width=200)
    assert result.exit_code == 0, f"tpujobs {' '.join(args)}: {result.output}"
    return result.output


def submitted(tmp_path: Path, prefix: str, **spec: Any) -> str:
    """`tpujobs submit` of a one-host spot job with `spec`'s fields; the job's id."""
    job_id = f"{prefix}-{uuid.uuid4().hex[:6]}"
    path = tmp_path / f"{job_id}.json"
    base = {"job_id": job_id, "name": prefix, "owner": OWNER, "capacity": "spot", "accelerator_type": "v4-8"}
    path.write_text(json.dumps({**base, **spec}))
    assert job_id in tpujobs("submit", str(path))
    return job_id


def events(job_id: str) -> list[dict[str, Any]]:
    """The job's timeline, as `tpujobs describe JOB -o json` shows it."""
    return list(json.loads(tpujobs("describe", job_id, "-o", "json"))["events"])


def ended(env, job_id: str, timeout: float = 120.0):
    def probe():
        job = env["store"].get(job_id)
        return job if job is not None and job.state.is_terminal else None

    probe.__doc__ = f"{job_id} ended"
    return wait_for(probe, timeout=timeout)


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

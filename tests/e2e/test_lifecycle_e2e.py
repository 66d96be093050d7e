"""Jobs that really run: the simulator starts the startup script on every worker host, the
agent runs the command and reports through the Pub/Sub emulator to the functions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from stack_reads import checkpoint_state, worker_output

from tpujobs.domain.states import JobState
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train"


def control(env, path: str) -> dict:
    return env["control"].call("POST", path, {})


def workers_of(env, queued_resource: str) -> list[dict]:
    return env["control"].workers(env["zone"], queued_resource)


def checkpoint_step(env, job_id: str) -> int:
    return int(checkpoint_state(env, job_id).get("step", 0))


def running_attempt(env, job_id: str, attempt: int):
    def probe():
        job = env["store"].get(job_id)
        return job if job and job.state is JobState.RUNNING and job.attempt == attempt else None

    probe.__doc__ = f"{job_id} RUNNING at attempt {attempt}"
    return wait_for(probe)


def test_a_job_preempted_twice_finishes_at_attempt_3_from_its_checkpoints(env, submit_job):
    """Two preemptions: attempts 2 and 3 resume from the last checkpoint and the job SUCCEEDS."""
    from tpujobs.cli.code_upload import upload_code_dir

    code_uri, digest = upload_code_dir(env["storage"], env["bucket"], EXAMPLE)
    job_id = submit_job(
        prefix="twice",
        code_uri=code_uri,
        code_sha256=digest,
        command="python3 train.py --steps 40 --step-seconds 0.1 --checkpoint-every 5",
        on_preemption="resume",
        max_restarts=5,
    )
    checkpoints_before = []
    for attempt in (1, 2):
        job = running_attempt(env, job_id, attempt)
        floor = checkpoint_step(env, job_id)
        wait_for(lambda floor=floor: checkpoint_step(env, job_id) > floor)  # a checkpoint in this attempt
        checkpoints_before.append(checkpoint_step(env, job_id))
        control(env, f"queuedResources/{env['zone']}/{job.queued_resource}:preempt")

    def finished():
        job = env["store"].get(job_id)
        return job if job and job.state.is_terminal else None

    job = wait_for(finished, timeout=90)
    assert job.state is JobState.SUCCEEDED, job.state_reason
    assert (job.attempt, job.restarts, job.exit_code) == (3, 2, 0)
    for attempt, floor in ((2, checkpoints_before[0]), (3, checkpoints_before[1])):
        text = worker_output(env, job_id, attempt)
        resumed = int(text.split("resumes from step ")[1].split()[0])
        assert resumed >= floor > 0, text[:300]
    assert "finished 40 steps in attempt 3" in worker_output(env, job_id, 3)
    assert "starts from step 0" in worker_output(env, job_id, 1)
    recoveries = [e for e in env["store"].events(job_id) if e.to_state is JobState.RECOVERING]
    assert len(recoveries) == 2 and all("Preempted" in e.reason for e in recoveries)


def test_a_command_exiting_3_with_on_error_fail_ends_failed_and_keeps_its_output(env, submit_job):
    """Exit code 3 and on_error=fail: FAILED with exit_code 3; both output streams are kept in Storage."""
    job_id = submit_job(
        prefix="exit3",
        accelerator_type="v4-8",
        command="echo to-stdout; echo to-stderr >&2; exit 3",
        on_error="fail",
    )

    def ended():
        job = env["store"].get(job_id)
        return job if job and job.state.is_terminal else None

    job = wait_for(ended)
    assert job.state is JobState.FAILED and job.exit_code == 3
    assert "exited with code 3" in job.state_reason
    text = wait_for(lambda: worker_output(env, job_id, 1))
    assert "to-stdout" in text and "to-stderr" in text


def test_a_cancelled_job_leaves_no_queued_resource_and_no_worker_process(env, submit_job):
    """`tpujobs cancel`: CANCELLED, the queued resource deleted, every worker process gone."""
    from google.api_core import exceptions
    from typer.testing import CliRunner

    from tpujobs.cli import app

    job_id = submit_job(prefix="cancel", command="sleep 600")
    job = running_attempt(env, job_id, 1)
    pids = wait_for(lambda: [w["pid"] for w in workers_of(env, job.queued_resource) if w["alive"]])
    assert len(pids) == 2
    result = CliRunner().invoke(app, ["cancel", job_id, "--owner", "ada@example.com"])
    assert result.exit_code == 0, result.output
    assert env["store"].get(job_id).state is JobState.CANCELLED
    name = f"projects/{env['project']}/locations/{env['zone']}/queuedResources/{job.queued_resource}"

    def resource_gone():
        try:
            env["tpu"].get_queued_resource(name=name)
        except exceptions.NotFound:
            return True
        return False

    wait_for(resource_gone, timeout=30)

    def processes_gone():
        for pid in pids:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            return False
        return True

    wait_for(processes_gone, timeout=30)

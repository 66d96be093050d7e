"""Exported logs on the whole local stack: the agent uploads chunks, the service asks for an
export when an attempt ends, export_logs writes worker-K.log and attempt.log, and
`tpujobs logs` prints them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from stack_reads import worker_output

from tpujobs.domain.states import JobState
from tpujobs.engine.output_export import cut_off_line
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

TPUJOBS = Path(sys.executable).with_name("tpujobs")


def read(env, name: str) -> str:
    return env["storage"].bucket(env["bucket"]).blob(name).download_as_text()


def exported(env, job_id: str, attempt: int):
    def probe():
        return env["store"].attempt_logs(job_id, attempt)

    probe.__doc__ = f"the export of {job_id} attempt {attempt}"
    return wait_for(probe, timeout=90)


def ended(env, job_id: str):
    def probe():
        job = env["store"].get(job_id)
        return job if job and job.state.is_terminal else None

    probe.__doc__ = f"{job_id} to end"
    return wait_for(probe, timeout=90)


def cli(*args: str):
    from typer.testing import CliRunner

    from tpujobs.cli import app

    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_a_two_worker_jobs_output_is_exported_per_worker_and_shown_by_tpujobs_logs(env, submit_job, tmp_path):
    """v4-16, exit 0: worker-0.log, worker-1.log and attempt.log exported; `tpujobs logs` prints
    them, and `--follow` started before the job printed anything printed the same lines, then exited 0.

    The hosts are processes on this machine: the command waits for a file the test makes once the
    follower says it follows, so the follower never starts after the job is over, however slow."""
    go = tmp_path / "go"
    job_id = submit_job(
        prefix="two",
        command=f"while [ ! -e {go} ]; do sleep 0.2; done; "
        'for i in 1 2 3 4; do echo "worker $TPUJOBS_WORKER_ID line $i"; sleep 1; done',
    )
    wait_for(lambda: env["store"].get(job_id))
    said = tmp_path / "follower.err"
    with said.open("wb") as stderr:
        follower = subprocess.Popen(
            [str(TPUJOBS), "logs", job_id, "--follow"], stdout=subprocess.PIPE, stderr=stderr, env=dict(os.environ)
        )
    try:
        wait_for(lambda: "Following attempt 1" in said.read_text(), timeout=90, what="the follower to follow")
        go.touch()
        job = ended(env, job_id)
        assert job.state is JobState.SUCCEEDED, job.state_reason
        logs = exported(env, job_id, 1)
        followed, _ = follower.communicate(timeout=60)
        errors = said.read_bytes()
    finally:
        follower.kill()
    base = f"gs://{env['bucket']}/logs/jobs/{job_id}/attempt-1/"
    assert logs.log_uri == base + "attempt.log" and logs.cut_off_workers == ()
    assert dict(logs.worker_logs) == {0: base + "worker-0.log", 1: base + "worker-1.log"}
    assert wait_for(lambda: env["store"].get(job_id).log_uri == logs.log_uri)
    for worker in (0, 1):
        text = read(env, f"logs/jobs/{job_id}/attempt-1/worker-{worker}.log")
        assert text == "".join(f"worker {worker} line {i}\n" for i in (1, 2, 3, 4))
    combined = read(env, f"logs/jobs/{job_id}/attempt-1/attempt.log")
    assert combined == "".join(f"[worker {w}] worker {w} line {i}\n" for w in (0, 1) for i in (1, 2, 3, 4))

    assert cli("logs", job_id) == combined
    assert cli("logs", job_id, "--worker", "1") == "".join(f"worker 1 line {i}\n" for i in (1, 2, 3, 4))
    assert follower.returncode == 0, errors.decode()
    assert "Following attempt 1" in errors.decode()  # it followed: the job was not over yet
    lines = followed.decode().splitlines()
    assert sorted(lines) == sorted(combined.splitlines()), followed.decode()


def test_a_preempted_job_keeps_attempt_1s_logs_beside_attempt_2s(env, submit_job):
    """Preempted once: attempt 1's log is exported with the cut-off line, attempt 2's without;
    the job's log_uri names attempt 2's, and `tpujobs logs --attempt 1` still prints attempt 1's."""
    job_id = submit_job(
        prefix="again",
        accelerator_type="v4-8",
        command='echo "attempt $TPUJOBS_ATTEMPT says hi"; if [ "$TPUJOBS_ATTEMPT" = 1 ]; then sleep 600; fi',
        on_preemption="rerun",
    )

    def running_first():
        job = env["store"].get(job_id)
        return job if job and job.state is JobState.RUNNING and job.attempt == 1 else None

    job = wait_for(running_first)
    wait_for(lambda: "attempt 1 says hi" in worker_output(env, job_id, 1))
    env["control"].preempt(env["zone"], job.queued_resource)
    job = ended(env, job_id)
    assert (job.state, job.attempt) == (JobState.SUCCEEDED, 2), job.state_reason

    first, second = exported(env, job_id, 1), exported(env, job_id, 2)
    assert first.cut_off_workers == (0,) and second.cut_off_workers == ()
    before = read(env, f"logs/jobs/{job_id}/attempt-1/worker-0.log")
    assert before.startswith("attempt 1 says hi\n") and before.endswith(cut_off_line(0).decode())
    assert read(env, f"logs/jobs/{job_id}/attempt-2/worker-0.log") == "attempt 2 says hi\n"
    assert wait_for(lambda: env["store"].get(job_id).log_uri == second.log_uri)
    assert cli("logs", job_id, "--attempt", "1") == read(env, f"logs/jobs/{job_id}/attempt-1/attempt.log")
    assert cli("logs", job_id) == "[worker 0] attempt 2 says hi\n"

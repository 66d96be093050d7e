"""A FAILED job resumed with `tpujobs resume` on the local stack: it continues from its
checkpoint under the same job_id and succeeds, and a retried request starts nothing more."""

from __future__ import annotations

from pathlib import Path

import pytest
from stack_reads import checkpoint_state, worker_output

from tpujobs.domain.naming import queued_resource_name
from tpujobs.domain.states import JobState
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train"
OWNER = "ada@example.com"
# Attempt 1 trains 6 steps (checkpoints at 3 and 6) and then fails; a resumed attempt trains on to 12.
COMMAND = (
    'echo "attempt $TPUJOBS_ATTEMPT resume=$TPUJOBS_RESUME uri=$TPUJOBS_CHECKPOINT_URI"; '
    'if [ "$TPUJOBS_RESUME" = 1 ]; then python3 train.py --steps 12 --step-seconds 0.05 --checkpoint-every 3; '
    "else python3 train.py --steps 6 --step-seconds 0.05 --checkpoint-every 3 && exit 4; fi"
)


def ended(env, job_id: str, attempt: int):
    def probe():
        job = env["store"].get(job_id)
        return job if job and job.attempt == attempt and job.state.is_terminal else None

    probe.__doc__ = f"{job_id} ended at attempt {attempt}"
    return wait_for(probe, timeout=90)


def cli(*args: str):
    from typer.testing import CliRunner

    from tpujobs.cli import app

    return CliRunner().invoke(app, list(args), terminal_width=200)


def test_a_failed_job_resumed_continues_from_its_checkpoint_and_succeeds_once(env, submit_job):
    """FAILED at attempt 1 after checkpointing step 6; `tpujobs resume` (sent twice with one
    request id) starts attempt 2 only, with TPUJOBS_RESUME=1 and the same checkpoint URI; it
    resumes from step 6 and SUCCEEDS under the same job_id."""
    from tpujobs.cli.code_upload import upload_code_dir

    code_uri, digest = upload_code_dir(env["storage"], env["bucket"], EXAMPLE)
    job_id = submit_job(
        prefix="resume",
        accelerator_type="v4-8",
        capacity="on-demand",
        code_uri=code_uri,
        code_sha256=digest,
        command=COMMAND,
        on_error="fail",
        max_restarts=1,
    )
    failed = ended(env, job_id, 1)
    assert failed.state is JobState.FAILED and failed.exit_code == 4, failed.state_reason
    assert checkpoint_state(env, job_id)["step"] == 6

    first = cli("resume", job_id, "--owner", OWNER, "--request-id", "resume-once", "--max-restarts", "2")
    assert first.exit_code == 0, first.output
    again = cli("resume", job_id, "--owner", OWNER, "--request-id", "resume-once", "--max-restarts", "2")
    assert again.exit_code == 0 and "already started" in again.output, again.output

    job = ended(env, job_id, 2)
    assert job.state is JobState.SUCCEEDED, job.state_reason
    assert (job.job_id, job.exit_code, job.ended_at is not None) == (job_id, 0, True)
    assert job.spec.max_restarts == 2 and job.restart_requests == ("resume-once",)
    resumes = [e for e in env["store"].events(job_id) if e.from_state is JobState.FAILED]
    assert len(resumes) == 1 and resumes[0].source == "user" and OWNER in resumes[0].reason
    first_output = wait_for(lambda: worker_output(env, job_id, 1))
    second_output = wait_for(lambda: next((t for t in [worker_output(env, job_id, 2)] if "finished 12" in t), None))
    uri = f"uri=gs://{env['bucket']}/checkpoints/jobs/{job_id}/"
    assert "resume=0" in first_output and uri in first_output
    assert "resume=1" in second_output and uri in second_output
    assert "resumes from step 6" in second_output and "finished 12 steps in attempt 2" in second_output
    parent = f"projects/{env['project']}/locations/{env['zone']}"
    names = {r.name.rsplit("/", 1)[-1] for r in env["tpu"].list_queued_resources(parent=parent)}
    assert queued_resource_name(job_id, 3) not in names  # the duplicate asked for nothing

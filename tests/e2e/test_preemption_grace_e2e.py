"""The preemption grace is the job's, on each platform: a job whose save on SIGTERM takes 6 s is
preempted with `tpujobs dev preempt`, and its next attempt resumes from that save. tpujobs asks
for the next attempt at once and deletes the preempted holding only after its hosts' grace
(a delete would end it: the simulator's delete grace is 2 s, as unkind as Google may be)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import Result
from stack_reads import checkpoint_state, worker_output
from typer.testing import CliRunner

from tpujobs.cli import app
from tpujobs.domain.states import JobState
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

CHECKPOINTS = Path(__file__).resolve().parents[2] / "examples" / "train" / "checkpoints.py"
SAVE_SECONDS = 6
# Attempt 1 traps SIGTERM, takes 6 s to save, writes its marker (worker 0-0) and exits; a later
# attempt looks for the marker once, at its start (its command starts only after the old hosts
# said they stopped: `attempt_key` waits for it), and exits 0 only if it is there.
SLOW_SAVE = f"""
import json, os, signal, sys, time
import checkpoints

uri = os.environ["TPUJOBS_CHECKPOINT_URI"]
attempt = int(os.environ["TPUJOBS_ATTEMPT"])
writer = (os.environ["TPUJOBS_SLICE_ID"], os.environ["TPUJOBS_WORKER_ID"]) == ("0", "0")
if attempt > 1:
    saved = checkpoints.load(uri)
    print("attempt", attempt, "sees", json.dumps(saved or {{}}), flush=True)
    sys.exit(0 if saved and saved.get("saved_on_sigterm") else 4)


def stop(signum, frame):
    print("saving on SIGTERM", flush=True)
    time.sleep({SAVE_SECONDS})
    if writer:
        checkpoints.save(uri, {{"saved_on_sigterm": True, "attempt": attempt}})
    print("saved", flush=True)
    sys.exit(143)


signal.signal(signal.SIGTERM, stop)
print("ready to save on SIGTERM", flush=True)
while True:
    time.sleep(0.2)
"""


def tpujobs(*args: str) -> Result:
    """`tpujobs ARGS` against the local stack (TPUJOBS_STATE_DIR); its result, checked."""
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, f"tpujobs {' '.join(args)}: {result.output}"
    return result


@pytest.fixture
def slow_save_code(env, tmp_path: Path) -> tuple[str, str]:
    """The job's code (its script and the example's checkpoint helper), uploaded: (uri, digest)."""
    from tpujobs.cli.code_upload import upload_code_dir

    (tmp_path / "slow_save.py").write_text(SLOW_SAVE)
    shutil.copy(CHECKPOINTS, tmp_path / "checkpoints.py")
    return upload_code_dir(env["storage"], env["bucket"], tmp_path)


def saved_after_preemption(env, submit_job, code: tuple[str, str], prefix: str, accelerator_type: str) -> None:
    code_uri, digest = code
    job_id = submit_job(prefix=prefix, accelerator_type=accelerator_type, code_uri=code_uri, code_sha256=digest,
                        command="python3 slow_save.py", on_preemption="resume", max_restarts=2)  # fmt: skip

    def trapping():
        """attempt 1 RUNNING with its SIGTERM trap set"""
        job = env["store"].get(job_id)
        running = job is not None and job.state is JobState.RUNNING and job.attempt == 1
        return running and "ready to save on SIGTERM" in worker_output(env, job_id, 1)

    wait_for(trapping, timeout=120)
    tpujobs("dev", "preempt", job_id)

    done = wait_for(lambda: (j := env["store"].get(job_id)) and j.state.is_terminal and j, timeout=180)
    assert done.state is JobState.SUCCEEDED, (done.state_reason, worker_output(env, job_id, 2))
    assert (done.attempt, done.restarts) == (2, 1)
    assert checkpoint_state(env, job_id) == {"saved_on_sigterm": True, "attempt": 1}
    assert "sees " + json.dumps({"saved_on_sigterm": True, "attempt": 1}) in worker_output(env, job_id, 2)
    kept = [e for e in env["store"].events(job_id) if "is released once its hosts are gone" in e.reason]
    assert len(kept) == 1, [e.reason for e in env["store"].events(job_id)]


def test_a_save_on_sigterm_of_6_s_survives_a_preemption_on_the_tpu_api(env, submit_job, slow_save_code):
    """TPU API (v4-16, two hosts): attempt 2 resumes from the save attempt 1 made on SIGTERM."""
    saved_after_preemption(env, submit_job, slow_save_code, "grace-tpu", "v4-16")


def test_a_save_on_sigterm_of_6_s_survives_a_preemption_on_compute_engine(env, submit_job, slow_save_code):
    """Compute Engine (v7x-16, a MIG of two Spot VMs): attempt 2 resumes from attempt 1's save on SIGTERM."""
    saved_after_preemption(env, submit_job, slow_save_code, "grace-ce", "v7x-16")

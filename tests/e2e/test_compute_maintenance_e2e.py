"""Host maintenance of a TPU7x job on Compute Engine, end to end through google-cloud-compute: its
VMs (onHostMaintenance TERMINATE, automaticRestart false) are terminated and stay TERMINATED, a
DO_NOTHING MIG makes none again, and the job goes on in a new attempt from its checkpoint; the
hosts never see instance/maintenance-event change, as on Google."""

from __future__ import annotations

from pathlib import Path

import pytest
from stack_reads import checkpoint_state, worker_output
from test_compute_platform_e2e import in_state, nothing_of

from tpujobs.domain.states import JobState
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train"


def statuses(env, holding: str) -> list[str]:
    """The statuses of the holding's VMs that exist, by name."""
    found = env["control"].state()["compute"]["instances"]
    return [vm["status"] for vm in sorted(found, key=lambda vm: vm["name"]) if vm["name"].startswith(holding)]


def test_host_maintenance_terminates_a_v7x_jobs_vms_for_good_and_the_job_resumes_elsewhere(env, submit_job):
    """Maintenance now on a running two-host v7x job: both VMs TERMINATED (never RUNNING again),
    attempt 2 resumes from the checkpoint and SUCCEEDS, and nothing is left."""
    from tpujobs.cli.code_upload import upload_code_dir

    code_uri, digest = upload_code_dir(env["storage"], env["bucket"], EXAMPLE)
    job_id = submit_job(
        prefix="v7x-maint",
        accelerator_type="v7x-16",
        code_uri=code_uri,
        code_sha256=digest,
        command="python3 train.py --steps 150 --step-seconds 0.1 --checkpoint-every 5",
    )
    job = wait_for(in_state(env, job_id, JobState.RUNNING, 1), timeout=90)
    wait_for(lambda: int(checkpoint_state(env, job_id).get("step", 0)) > 0)
    floor = int(checkpoint_state(env, job_id)["step"])
    env["control"].group_maintenance(env["zone"], job.queued_resource, 0)

    wait_for(lambda: statuses(env, job.queued_resource) in (["TERMINATED"] * 2, []), timeout=60)
    done = wait_for(lambda: (j := env["store"].get(job_id)) and j.state.is_terminal and j, timeout=120)
    assert done.state is JobState.SUCCEEDED, done.state_reason
    assert (done.attempt, done.restarts) == (2, 1)
    resumed = int(worker_output(env, job_id, 2).split("resumes from step ")[1].split()[0])
    assert resumed >= floor > 0
    reasons = " ".join(e.reason for e in env["store"].events(job_id))
    assert "TERMINATE_ON_HOST_MAINTENANCE" not in reasons
    for holding in (f"{job_id}-c1", f"{job_id}-c2"):
        wait_for(lambda holding=holding: nothing_of(env, holding), timeout=60)

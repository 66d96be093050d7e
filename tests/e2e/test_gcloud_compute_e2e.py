"""A user tests a running Compute Engine job with the real gcloud, as Google's docs tell them to:
`gcloud compute instances simulate-maintenance-event` and `gcloud compute instances stop` on one of
its TPU VMs end that host, and the job goes on in a new attempt from its checkpoint."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from stack_reads import checkpoint_state, worker_output
from test_compute_platform_e2e import EXAMPLE, in_state

from tpujobs.domain.states import JobState
from tpujobs.local.gcloud_cli import Gcloud
from tpujobs.local.simulator.compute_records import predicted_member_names
from tpujobs.local.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]  # alone, it starts the stack (about a minute) too


def a_running_v7x_job(env, submit_job) -> tuple[str, str]:
    """A v7x-16 job (two hosts) that has checkpointed; its id and its first VM's name."""
    from tpujobs.cli.code_upload import upload_code_dir

    code_uri, digest = upload_code_dir(env["storage"], env["bucket"], EXAMPLE)
    job_id = submit_job(
        prefix="v7x-gcloud",
        accelerator_type="v7x-16",
        code_uri=code_uri,
        code_sha256=digest,
        command="python3 train.py --steps 150 --step-seconds 0.1 --checkpoint-every 5",
    )
    job = wait_for(in_state(env, job_id, JobState.RUNNING, 1), timeout=90)
    wait_for(lambda: int(checkpoint_state(env, job_id).get("step", 0)) > 0)
    group = job.queued_resource
    return job_id, predicted_member_names(group, group, 2)[0]


def goes_on_in_a_new_attempt(env, job_id: str) -> None:
    done = wait_for(lambda: (j := env["store"].get(job_id)) and j.state.is_terminal and j, timeout=150)
    assert done.state is JobState.SUCCEEDED, done.state_reason
    assert done.attempt >= 2
    assert "resumes from step " in worker_output(env, job_id, done.attempt)
    assert any(e.to_state is JobState.RECOVERING for e in env["store"].events(job_id))


def ran_its_course(done: subprocess.CompletedProcess[str], vm: str) -> None:
    """gcloud's operation finished ("done."). Its last step reads the VM back, which may already
    be gone: tpujobs releases a slice that lost a host at once, so that read may be a 404."""
    assert "done." in done.stderr, done.stderr
    assert done.returncode == 0 or f"instances/{vm}' was not found" in done.stderr, done.stderr


@pytest.fixture
def gcloud(env, local_stack, tmp_path: Path) -> Gcloud:
    compute = local_stack["TPUJOBS_COMPUTE_ENDPOINT"]
    cli = Gcloud.against({"COMPUTE": f"{compute}/compute/v1/"}, tmp_path / "gcloud", env["project"])
    if cli is None:
        pytest.skip("gcloud is not installed on this machine")
    return cli


def test_gcloud_simulate_maintenance_event_on_a_jobs_vm_makes_it_go_on_in_a_new_attempt(
    env, submit_job, gcloud: Gcloud
) -> None:
    """The TPU VM is terminated for host maintenance (TERMINATE, no automatic restart): the job
    loses that host and resumes from its checkpoint in a new attempt, to success."""
    job_id, vm = a_running_v7x_job(env, submit_job)
    ran_its_course(gcloud.run("compute", "instances", "simulate-maintenance-event", vm, f"--zone={env['zone']}"), vm)
    goes_on_in_a_new_attempt(env, job_id)


def test_gcloud_stop_on_a_jobs_vm_makes_it_go_on_in_a_new_attempt(env, submit_job, gcloud: Gcloud) -> None:
    """A user stops one of the job's VMs: STOPPING, then TERMINATED (its DO_NOTHING MIG does not
    repair it); the job loses that host and resumes in a new attempt, to success."""
    job_id, vm = a_running_v7x_job(env, submit_job)
    ran_its_course(gcloud.run("compute", "instances", "stop", vm, f"--zone={env['zone']}"), vm)
    goes_on_in_a_new_attempt(env, job_id)

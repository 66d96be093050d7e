"""TPU7x on Compute Engine, end to end: the functions make a v7x slice of two hosts through the real
google-cloud-compute client (a MIG naming the shared workload policy and template of its shape),
the hosts run the job, a spot preemption is recovered from the checkpoint, and nothing of the job
is left behind when it ends or is cancelled."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from stack_reads import checkpoint_state, worker_output

from tpujobs.domain.states import JobState
from tpujobs.engine.topology import CONTROL
from tpujobs.local.simulator.compute_records import predicted_member_names
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train"


def compute_held(env) -> dict[str, list[str]]:
    """Every Compute Engine resource the simulator holds, by kind: names only."""
    compute = env["control"].state()["compute"]
    return {kind: sorted(item["name"] for item in items) for kind, items in compute.items()}


def nothing_of(env, holding: str) -> bool:
    return not any(name.startswith(holding) for names in compute_held(env).values() for name in names)


def in_state(env, job_id: str, state: JobState, attempt: int | None = None):
    def probe():
        job = env["store"].get(job_id)
        return job if job and job.state is state and (attempt is None or job.attempt == attempt) else None

    probe.__doc__ = f"{job_id} {state.value}" + (f" at attempt {attempt}" if attempt else "")
    return probe


def test_a_v7x_job_on_two_hosts_recovers_from_a_spot_preemption_and_leaves_nothing(env, submit_job):
    from tpujobs.cli.code_upload import upload_code_dir

    code_uri, digest = upload_code_dir(env["storage"], env["bucket"], EXAMPLE)
    job_id = submit_job(
        prefix="v7x",
        accelerator_type="v7x-16",
        code_uri=code_uri,
        code_sha256=digest,
        command="python3 train.py --steps 150 --step-seconds 0.1 --checkpoint-every 5",
    )
    job = wait_for(in_state(env, job_id, JobState.RUNNING, 1), timeout=90)
    assert job.spec.platform == "compute" and job.queued_resource == f"{job_id}-c1"
    held = compute_held(env)
    assert job.queued_resource in held["instanceGroupManagers"]
    (mig,) = [m for m in env["control"].state()["compute"]["instanceGroupManagers"] if m["name"] == job.queued_resource]
    # the shared template and policy of its shape; the job's own boot in the MIG's all-instances configuration
    assert mig["instanceTemplate"].rsplit("/", 1)[-1] in held["instanceTemplates"]
    assert mig["resourcePolicies"]["workloadPolicy"].rsplit("/", 1)[-1] in held["resourcePolicies"]
    assert mig["allInstancesConfig"]["properties"]["labels"]["tpujobs-job"] == job_id
    assert len([n for n in held["instances"] if n.startswith(job.queued_resource)]) == 2
    wait_for(lambda: int(checkpoint_state(env, job_id).get("step", 0)) > 0)
    floor = int(checkpoint_state(env, job_id)["step"])
    env["control"].preempt_group(env["zone"], job.queued_resource)

    done = wait_for(lambda: (j := env["store"].get(job_id)) and j.state.is_terminal and j, timeout=120)
    assert done.state is JobState.SUCCEEDED, done.state_reason
    assert (done.attempt, done.restarts) == (2, 1)
    resumed = int(worker_output(env, job_id, 2).split("resumes from step ")[1].split()[0])
    assert resumed >= floor > 0
    for worker in ("0-0", "0-1"):
        assert "finished 150 steps in attempt 2" in worker_output(env, job_id, 2, worker)
    recoveries = [e for e in env["store"].events(job_id) if e.to_state is JobState.RECOVERING]
    # The agent's notice (instance/preempted) and the reconciler (the VMs STOPPING) race to say it first.
    assert len(recoveries) == 1 and ("Preempted" in recoveries[0].reason or "were lost" in recoveries[0].reason)
    for holding in (f"{job_id}-c1", f"{job_id}-c2"):
        wait_for(lambda holding=holding: nothing_of(env, holding), timeout=60)


def test_a_cancelled_v7x_job_leaves_no_mig_template_policy_or_instance(env, submit_job):
    job_id = submit_job(prefix="v7x-cancel", accelerator_type="v7x-16", command="sleep 600")
    job = wait_for(in_state(env, job_id, JobState.RUNNING), timeout=90)
    env["publisher"].publish_json(CONTROL, {"action": "cancel", "job_id": job_id, "owner": "ada@example.com"})
    wait_for(in_state(env, job_id, JobState.CANCELLED), timeout=60)
    wait_for(lambda: nothing_of(env, job.queued_resource), timeout=60)


def test_a_two_slice_v7x_job_is_told_its_coordinator_by_the_control_plane(env, submit_job, tmp_path):
    """Compute Engine fills in no MEGASCALE_* values: every host's command sees the ones tpujobs
    sets, the coordinator being worker 0 of slice 0's own address."""
    flag = tmp_path / "go"
    job_id = submit_job(
        prefix="v7x-ms",
        accelerator_type="v7x-8",
        slices=2,
        command=f"env | grep '^MEGASCALE_' | sort; echo printed; while [ ! -e {flag} ]; do sleep 0.2; done",
    )
    try:
        job = wait_for(in_state(env, job_id, JobState.RUNNING), timeout=90)
        printed = {
            worker: wait_for(lambda w=worker: "printed" in (t := worker_output(env, job_id, 1, w)) and t, timeout=90)
            for worker in ("0-0", "1-0")
        }
    finally:
        flag.touch()
    first = predicted_member_names(f"{job.queued_resource}-0", f"{job.queued_resource}-0", 1)[0]
    (vm,) = [i for i in env["control"].state()["compute"]["instances"] if i["name"] == first]
    coordinator = f"{vm['networkInterfaces'][0]['networkIP']}:8080"
    for worker, text in printed.items():
        values = dict(line.split("=", 1) for line in text.splitlines() if line.startswith("MEGASCALE_"))
        assert values == {
            "MEGASCALE_COORDINATOR_ADDRESS": coordinator,
            "MEGASCALE_NUM_SLICES": "2",
            "MEGASCALE_PORT": "8080",
            "MEGASCALE_SLICE_ID": worker[0],
        }, worker
    ended = wait_for(lambda: (j := env["store"].get(job_id)) and j.state.is_terminal and j, timeout=90)
    assert ended.state is JobState.SUCCEEDED, ended.state_reason
    wait_for(lambda: nothing_of(env, job.queued_resource), timeout=60)


def test_a_warm_pool_on_compute_engine_runs_a_job_and_leaves_nothing_when_deleted(env, local_stack):
    """A v7x-8 pool's unit is a Compute Engine slice (`{pool}-c0-g1`); its assignment reaches the
    pool-mode agent through `instances.setMetadata`; deleting the pool releases the slice."""
    from tpujobs.cli.demo_pool import LocalPools
    from tpujobs.engine.settings import Settings

    pools = LocalPools(Settings.from_env(), local_stack, owner="ada@example.com")
    pools.allow()
    name = f"v7x-{uuid.uuid4().hex[:6]}"
    pools.create(name, count=1, accelerator_type="v7x-8")
    try:
        described = pools.wait_idle(name, 1, 120)
        assert described["platform"] == "compute"
        (unit,) = [u["queued_resource"] for u in described["units"]]
        assert re.fullmatch(rf"{name}-c0-g[0-9]+", unit), unit  # a Compute Engine unit, whatever its generation
        job_id, _ = pools.submit(
            {"name": "on-pool", "accelerator_type": "v7x-8", "pool": name, "command": "echo ran on the pool"}
        )
        ended = wait_for(lambda: (j := env["store"].get(job_id)) and j.state.is_terminal and j, timeout=120)
        assert ended.state is JobState.SUCCEEDED, ended.state_reason
        assert ended.warm_pool_unit.startswith(f"{name}-c0-g")
        assert "ran on the pool" in worker_output(env, job_id)
    finally:
        pools.delete(name)
    wait_for(lambda: pools.describe(name) is None and nothing_of(env, f"{name}-c0"), timeout=120)

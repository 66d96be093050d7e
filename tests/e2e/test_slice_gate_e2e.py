"""The command starts only on a ready slice (issue 38 items 2 and 3), on the local stack through the
real google-cloud-compute client: while a v7x slice's VMs run but its interconnect is still
ACTIVATING, its hosts' agents are told to wait by the attempt_key function, so no host reports
`started` and the job stays PROVISIONING; once the interconnect is ACTIVE the command starts."""

from __future__ import annotations

import time

import pytest

from tpujobs.adapters.compute import ComputeEngine, build_clients
from tpujobs.domain.states import JobState
from tpujobs.engine.topology import CONTROL
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

ACTIVATION = 20.0  # seconds the simulator's interconnect is ACTIVATING once the VMs run


def test_no_command_starts_while_the_interconnect_is_activating(env, submit_job):
    """Every look while the MIG says ACTIVATING finds the job PROVISIONING with no worker heard;
    after ACTIVE it runs."""
    default = env["control"].config()["topology_activation_seconds"]
    env["control"].configure(topology_activation_seconds=ACTIVATION)
    job_id = submit_job(prefix="v7x-gate", accelerator_type="v7x-16", command="sleep 600")
    try:
        holding = wait_for(lambda: (j := env["store"].get(job_id)) and j.queued_resource, timeout=60)
        compute = ComputeEngine(build_clients(env["simulator"]), env["project"])

        def read():
            return compute.status(env["zone"], holding)

        wait_for(lambda: (s := read()) and "ACTIVATING" in s.detail, timeout=90)
        looks = 0
        while (status := read()) is not None and status.state != "ACTIVE":
            job = env["store"].get(job_id)
            assert job is not None and job.state is JobState.PROVISIONING, (status, job and job.state)
            assert env["store"].attempt_workers(job_id, job.attempt) == [], status
            looks += 1
            time.sleep(0.5)
        assert looks >= 1, "no look found the interconnect ACTIVATING"
        running = wait_for(lambda: (j := env["store"].get(job_id)) and j.state is JobState.RUNNING and j, timeout=90)
        assert running.queued_resource == holding
    finally:
        env["control"].configure(topology_activation_seconds=default)
        env["publisher"].publish_json(CONTROL, {"action": "cancel", "job_id": job_id, "owner": "ada@example.com"})

"""A v7x slice's interconnect on the local stack, through the real google-cloud-compute client:
tpujobs reads the holding as PROVISIONING while the MIG says its accelerator topology is ACTIVATING
and ACTIVE only once it is, and a FAILED interconnect ends the attempt with Google's reason."""

from __future__ import annotations

import pytest

from tpujobs.adapters.compute import ComputeEngine, build_clients
from tpujobs.domain.states import JobState
from tpujobs.engine.topology import CONTROL
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

ACTIVATION = 8.0  # seconds the simulator's interconnect is ACTIVATING once the VMs run
REASON = "ICI link down between hosts 0 and 1 (e2e)"


def test_a_v7x_holding_waits_while_its_interconnect_activates_and_a_failed_one_ends_the_attempt(env, submit_job):
    default = env["control"].config()["topology_activation_seconds"]
    env["control"].configure(topology_activation_seconds=ACTIVATION)
    job_id = submit_job(prefix="v7x-ici", accelerator_type="v7x-16", command="sleep 600")
    try:
        holding = wait_for(lambda: (j := env["store"].get(job_id)) and j.queued_resource, timeout=60)
        compute = ComputeEngine(build_clients(env["simulator"]), env["project"])

        def read():
            return compute.status(env["zone"], holding)

        activating = wait_for(lambda: (s := read()) and "ACTIVATING" in s.detail and s, timeout=90)
        assert activating.state == "PROVISIONING" and activating.unhealthy_hosts == 0
        wait_for(lambda: (s := read()) and s.state == "ACTIVE", timeout=60)
        wait_for(lambda: (j := env["store"].get(job_id)) and j.state is JobState.RUNNING, timeout=90)

        env["control"].fail_topology(env["zone"], holding, "FAILED", REASON)

        def ended():
            return next((e for e in env["store"].events(job_id) if REASON in (e.reason or "")), None)

        event = wait_for(ended, timeout=90)
        assert "FAILED" in event.reason and event.to_state is not JobState.RUNNING
        assert read().state == "FAILED" or env["store"].get(job_id).attempt > 1
    finally:
        env["control"].configure(topology_activation_seconds=default)
        env["publisher"].publish_json(CONTROL, {"action": "cancel", "job_id": job_id, "owner": "ada@example.com"})


def test_a_partial_v7x_slice_waits_saying_how_many_hosts_came(env, submit_job):
    """No v7x chips free: the individual-mode MIG waits; Compute Engine then makes one of its two
    VMs (`tpujobs dev fault partial`): tpujobs reads the holding, through the real client, as
    WAITING saying 1 of 2 hosts came, and the job stays PROVISIONING, no host started."""
    before = dict(env["control"].config().get("capacity") or {})
    env["control"].configure(capacity={**before, f"v7x@{env['zone']}": 0})
    job_id = submit_job(prefix="v7x-part", accelerator_type="v7x-16", command="sleep 600")
    try:
        holding = wait_for(lambda: (j := env["store"].get(job_id)) and j.queued_resource, timeout=60)
        compute = ComputeEngine(build_clients(env["simulator"]), env["project"])
        wait_for(lambda: (s := compute.status(env["zone"], holding)) and s.state == "WAITING", timeout=60)
        env["control"].grant_partially(env["zone"], holding, 1)
        partial = wait_for(
            lambda: (s := compute.status(env["zone"], holding)) and "1 of 2" in s.detail and s, timeout=60
        )
        assert partial.state == "WAITING" and partial.unhealthy_hosts == 0, partial
        job = env["store"].get(job_id)
        assert job.state is JobState.PROVISIONING and not env["store"].attempt_workers(job_id, 1)
    finally:
        env["control"].configure(capacity=before)
        env["publisher"].publish_json(CONTROL, {"action": "cancel", "job_id": job_id, "owner": "ada@example.com"})

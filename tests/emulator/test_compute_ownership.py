"""Compute Engine resources named like a tpujobs holding but made by someone else (no marker in
their description, none of tpujobs' labels on their VMs), through the real google-cloud-compute
client against the simulator: never adopted, written into or deleted (issue 37, item 7)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tpujobs.adapters import compute_requests as bodies
from tpujobs.adapters.compute import ComputeClients, ComputeEngine, build_clients
from tpujobs.adapters.compute_operations import OperationFollower, is_done
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.errors import NotOurs
from tpujobs.engine.ports import HostBoot, UnitRequest
from tpujobs.local.simulator import SimulatorConfig, SimulatorServer
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.emulator

PROJECT = "compute-ownership"
ZONE = "us-central1-c"
REGION = "us-central1"
BOOT = HostBoot("vm@compute-ownership.iam.gserviceaccount.com", {"startup-script": "#!/bin/sh"})


@pytest.fixture
def simulator() -> Iterator[str]:
    config = SimulatorConfig(waiting_seconds=0.05, provisioning_seconds=0.1, capacity={})
    with SimulatorServer(config, run_workers=False) as server:
        yield server.url


@pytest.fixture
def clients(simulator: str) -> ComputeClients:
    return build_clients(simulator)


@pytest.fixture
def compute(clients: ComputeClients) -> ComputeEngine:
    return ComputeEngine(clients, PROJECT, operation_wait_s=10)


def spec(**changes: Any) -> Any:
    fields = {"job_id": "train-1", "name": "train", "owner": "ada", "accelerator_type": "v7x-8"}
    return parse_spec({**fields, "platform": "compute", "capacity": "spot", "command": "x", **changes})


def a_job(**changes: Any) -> Job:
    job, _ = new_job(spec(**changes), ZONE, datetime.now(timezone.utc))
    return job


def plant_foreign(clients: ComputeClients, holding: bodies.Holding, template_name: str = "") -> None:
    """Someone else's policy, template and MIG of the holding's slice names (the template named
    `template_name` if given): what tpujobs would make, less its marker (description) and labels,
    made by hand with the same client."""
    follower = OperationFollower(clients.zone_operations, clients.region_operations, PROJECT, dict)

    def done(operation: Any) -> None:
        assert is_done(follower.follow(operation, 30))

    slice_name = holding.slice_names()[0]
    policy_name = ""
    if holding.shape.multi_host:
        policy = bodies.workload_policy(holding)
        policy.name = policy_name = slice_name
        policy.description = "made by hand"
        done(clients.policies.insert_unary(project=PROJECT, region=REGION, resource_policy_resource=policy))
    template = bodies.instance_template(holding, BOOT, PROJECT, bodies.Images())
    template.description = ""
    template.properties.labels = {"team": "other"}
    template.name = template_name or slice_name
    done(clients.templates.insert_unary(project=PROJECT, region=REGION, instance_template_resource=template))
    mig = bodies.instance_group_manager(holding, 0, PROJECT, template.name, BOOT, policy_name)
    mig.description = "someone else's MIG"
    mig.all_instances_config.properties.labels = {"team": "other"}
    done(clients.groups.insert_unary(project=PROJECT, zone=ZONE, instance_group_manager_resource=mig))


def names(simulator: str) -> dict[str, list[str]]:
    state = SimulatorControl(simulator).state()["compute"]
    return {kind: sorted(item["name"] for item in items) for kind, items in state.items() if items}


def running_vms(simulator: str) -> list[dict[str, Any]]:
    def probe() -> list[dict[str, Any]] | None:
        """the foreign MIG's VMs made"""
        vms = list(SimulatorControl(simulator).state()["compute"]["instances"])
        return vms or None

    return wait_for(probe, timeout=30)


def test_a_request_never_adopts_someone_elses_mig_of_the_holdings_name(compute, clients, simulator):
    """A foreign MIG `train-1-c1`: the request refuses (NotOurs); the MIG is never reported as the
    holding's, and a release deletes nothing (the shared template the request made stays, for reuse)."""
    job = a_job()
    holding = bodies.job_holding(job)
    plant_foreign(clients, holding, template_name="hand-made")
    with pytest.raises(NotOurs, match="MIG train-1-c1"):
        compute.request(job, BOOT)
    assert compute.status(ZONE, job.queued_resource) is None
    compute.release(ZONE, job.queued_resource)
    left = names(simulator)
    shared = bodies.instance_template(holding, BOOT, PROJECT, bodies.Images()).name
    assert (left["instanceGroupManagers"], left["instanceTemplates"]) == (["train-1-c1"], sorted(["hand-made", shared]))


def test_a_pool_unit_request_over_someone_elses_template_of_the_shared_name_refuses(compute, clients, simulator):
    """Someone else's template named like the shared one (no marker): NotOurs at the template, no
    MIG made from it, and the zone's sweep never deletes it however old."""
    unit = UnitRequest("demo-c0-g1", ZONE, spec(job_id="demo-unit"), {"tpujobs-pool": "demo", "tpujobs-unit": "0"})
    holding = bodies.unit_holding(unit)
    shared = bodies.instance_template(holding, BOOT, PROJECT, bodies.Images()).name
    plant_foreign(clients, holding, template_name=shared)
    clients.groups.delete_unary(project=PROJECT, zone=ZONE, instance_group_manager="demo-c0-g1")
    wait_for(lambda: "instanceGroupManagers" not in names(simulator), timeout=30)
    with pytest.raises(NotOurs, match=f"instance template {shared}"):
        compute.request_unit(unit, BOOT)
    assert "instanceGroupManagers" not in names(simulator)
    later = ComputeEngine(clients, PROJECT, clock=lambda: datetime.now(timezone.utc) + timedelta(days=1))
    assert later.list_capacity(ZONE) == []
    assert names(simulator)["instanceTemplates"] == [shared]


def test_metadata_is_never_written_into_someone_elses_mig_named_like_a_unit(compute, clients, simulator):
    """A foreign MIG `demo-c0-g1` with RUNNING VMs: tell_hosts raises NotOurs, its VMs untouched."""
    unit = UnitRequest("demo-c0-g1", ZONE, spec(job_id="demo-unit"), {"tpujobs-pool": "demo", "tpujobs-unit": "0"})
    plant_foreign(clients, bodies.unit_holding(unit))
    before = running_vms(simulator)
    with pytest.raises(NotOurs, match="MIG demo-c0-g1"):
        compute.tell_hosts(ZONE, "demo-c0-g1", 1, {"tpujobs-assignment": "job-9"})
    after = list(SimulatorControl(simulator).state()["compute"]["instances"])
    assert [vm["metadata"] for vm in after] == [vm["metadata"] for vm in before]


def test_a_release_never_deletes_someone_elses_mig_template_or_policy(compute, clients, simulator):
    """release of a multi-host holding's name whose MIG, template and policy are foreign deletes none."""
    job = a_job(accelerator_type="v7x-16")
    plant_foreign(clients, bodies.job_holding(job))
    planted = names(simulator)
    compute.release(ZONE, job.queued_resource)
    assert {k: v for k, v in names(simulator).items() if k != "instances"} == {
        k: v for k, v in planted.items() if k != "instances"
    }
    assert planted["instanceGroupManagers"] == ["train-1-c1"] and planted["resourcePolicies"] == ["train-1-c1"]

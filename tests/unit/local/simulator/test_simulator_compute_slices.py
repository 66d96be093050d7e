"""The simulated Compute Engine's slices beyond their VMs, on a fake clock: the interconnect a MIG
reports (appliedAcceleratorTopologies) and its faults, a partial grant in individual mode, why a
bulk MIG waits (lastProgressCheck), and a member deleted outside its MIG; each JSON answer is read
back through google-cloud-compute's own types."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from google.cloud import compute_v1

from tpujobs.local.simulator import Simulator, SimulatorConfig
from tpujobs.local.simulator.compute_errors import ComputeError
from tpujobs.local.simulator.compute_groups import GroupView
from tpujobs.local.simulator.compute_json import group_json, managed_instance_json
from tpujobs.local.testing import SecondsClock

P, R, Z = "proj", "us-central1", "us-central1-a"
POLICY = f"projects/{P}/regions/{R}/resourcePolicies/pol"
QUICK = SimulatorConfig(
    waiting_seconds=1.0,
    provisioning_seconds=2.0,  # the VMs all run 3 s after the insert
    topology_activation_seconds=4.0,
    compute_operation_seconds=1.0,
    deleting_seconds=1.0,
)


@pytest.fixture
def clock() -> SecondsClock:
    return SecondsClock()


def simulator(clock: SecondsClock, config: SimulatorConfig = QUICK) -> Simulator:
    return Simulator(config, clock=clock, wall_clock=lambda: 1_700_000_000.0 + clock.now)


def slice_group(sim: Simulator, model: str = "SPOT", size: int = 2, policy: bool = True, **extra: Any) -> None:
    if policy:
        body = {"name": "pol", "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}}
        sim.compute.operations.insert_policy(P, R, body)
    scheduling: dict[str, Any] = {"provisioningModel": model, "instanceTerminationAction": "DELETE"}
    if model == "FLEX_START":
        scheduling["maxRunDuration"] = {"seconds": "3600"}
    properties = {
        "machineType": "tpu7x-standard-4t",
        "disks": [{"boot": True}],
        "networkInterfaces": [{"network": "global/networks/default"}],
        "scheduling": scheduling,
    }
    sim.compute.operations.insert_template(P, R, {"name": "tpl", "properties": properties})
    group = {
        "name": "mig",
        "baseInstanceName": "mig",
        "instanceTemplate": f"projects/{P}/regions/{R}/instanceTemplates/tpl",
        "targetSize": size,
        "instanceLifecyclePolicy": {"defaultActionOnFailure": "DO_NOTHING"},
        **extra,
    }
    if policy:
        group["resourcePolicies"] = {"workloadPolicy": POLICY}
    sim.compute.groups.insert_group(P, Z, group)


def as_google(view: GroupView) -> compute_v1.InstanceGroupManager:
    """The MIG's JSON read by google-cloud-compute, as a caller of the simulator reads it."""
    return compute_v1.InstanceGroupManager.from_json(json.dumps(group_json(view)))


def interconnect(sim: Simulator) -> tuple[str, ...]:
    applied = as_google(sim.compute.groups.get_group(P, Z, "mig")).status.applied_accelerator_topologies
    return tuple(f"{t.accelerator_topology} {t.state}" for t in applied)


def statuses(sim: Simulator) -> list[tuple[str | None, str]]:
    return [(m.status, m.current_action) for m in sim.compute.groups.get_group(P, Z, "mig").members]


def test_the_interconnect_is_incomplete_then_activating_once_the_vms_run_then_active(clock: SecondsClock) -> None:
    """INCOMPLETE while the VMs are made; ACTIVATING for topology_activation_seconds from the moment
    they all run (however late the clock is read); then ACTIVE. A MIG without a policy shows none."""
    sim = simulator(clock)
    slice_group(sim)
    assert interconnect(sim) == ("2x2x2 INCOMPLETE",)
    clock.tick(5)  # the VMs ran at 3 s
    assert statuses(sim) == [("RUNNING", "NONE")] * 2
    assert interconnect(sim) == ("2x2x2 ACTIVATING",)
    clock.tick(2.5)  # 7.5 s: 4.5 s since they ran
    assert interconnect(sim) == ("2x2x2 ACTIVE",)
    sim.compute.groups.delete_group(P, Z, "mig")
    assert interconnect(sim) == ("2x2x2 DEACTIVATING",)
    lone = simulator(SecondsClock())
    slice_group(lone, size=1, policy=False)
    assert interconnect(lone) == ()


def test_a_fault_makes_the_interconnect_failed_or_incomplete_with_its_reason(clock: SecondsClock) -> None:
    """topology FAILED: stateDetails' error and timestamp as Google's types read them; the VMs run on.
    A MIG whose policy names no topology has no interconnect to fail; a state other than the two is refused."""
    sim = simulator(clock)
    slice_group(sim)
    clock.tick(10)
    sim.compute.slices.force_topology(P, Z, "mig", "FAILED", "ICI link down between hosts 0 and 1")
    (applied,) = as_google(sim.compute.groups.get_group(P, Z, "mig")).status.applied_accelerator_topologies
    assert applied.state == "FAILED" and applied.state_details.timestamp
    assert applied.state_details.error.errors[0].message == "ICI link down between hosts 0 and 1"
    assert statuses(sim) == [("RUNNING", "NONE")] * 2
    sim.compute.slices.force_topology(P, Z, "mig", "INCOMPLETE")
    assert interconnect(sim) == ("2x2x2 INCOMPLETE",)
    with pytest.raises(ComputeError):
        sim.compute.slices.force_topology(P, Z, "mig", "ACTIVE")
    lone = simulator(SecondsClock())
    slice_group(lone, size=1, policy=False)
    with pytest.raises(ComputeError, match="no slice with an accelerator topology"):
        lone.compute.slices.force_topology(P, Z, "mig", "FAILED")


def test_a_waiting_slice_granted_in_part_shows_some_vms_running_and_the_rest_waiting(clock: SecondsClock) -> None:
    """Individual mode, no chips: `partial` brings worker 0 of 2 RUNNING, worker 1 CREATING with the
    stockout; the interconnect INCOMPLETE. Chips arriving make the whole slice. Bulk is refused."""
    sim = simulator(clock, dataclasses.replace(QUICK, capacity={f"v7x@{Z}": 0}))
    slice_group(sim)
    clock.tick(5)
    with pytest.raises(ComputeError):
        sim.compute.slices.grant_partially(P, Z, "mig", 2)  # all of it is no part
    view = sim.compute.slices.grant_partially(P, Z, "mig")
    assert [(m.status, m.current_action) for m in view.members] == [("RUNNING", "NONE"), (None, "CREATING")]
    listed = [compute_v1.ManagedInstance.from_json(json.dumps(managed_instance_json(m))) for m in view.members]
    assert listed[1].last_attempt.errors.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert not listed[0].last_attempt.errors.errors
    assert [v.record.name for v in sim.compute.vms.list_instances(P, Z).items] == [view.members[0].record.name]
    assert interconnect(sim) == ("2x2x2 INCOMPLETE",)
    sim.fault_plan.reconfigure(dataclasses.replace(sim.config, capacity={}))
    clock.tick(10)
    assert statuses(sim) == [("RUNNING", "NONE")] * 2
    assert interconnect(sim) == ("2x2x2 ACTIVE",)
    with pytest.raises(ComputeError, match="not waiting for capacity"):
        sim.compute.slices.grant_partially(P, Z, "mig")
    reserved = simulator(SecondsClock(), dataclasses.replace(QUICK, capacity={f"v7x@{Z}": 0}))
    slice_group(reserved, "FLEX_START", targetSizePolicy={"mode": "BULK"})
    with pytest.raises(ComputeError, match="bulk mode"):
        reserved.compute.slices.grant_partially(P, Z, "mig")


def test_a_bulk_mig_says_why_it_waits_in_its_last_progress_check_not_per_instance(clock: SecondsClock) -> None:
    """FLEX_START in bulk mode, the quota too small: bulkInstanceOperation.lastProgressCheck has
    QUOTA_EXCEEDED naming the metric and where; no member has lastAttempt errors; a stockout likewise."""
    sim = simulator(clock, dataclasses.replace(QUICK, quota={R: {"v7x": {"spot": 4}}}))
    slice_group(sim, "FLEX_START", targetSizePolicy={"mode": "BULK"})
    clock.tick(5)
    view = sim.compute.groups.get_group(P, Z, "mig")
    bulk = as_google(view).status.bulk_instance_operation
    assert bulk.in_progress and bulk.last_progress_check.timestamp
    (error,) = bulk.last_progress_check.error.errors
    assert error.code == "QUOTA_EXCEEDED" and f"in region {R}" in error.message
    assert all(not m.errors and m.current_action == "CREATING" for m in view.members)
    sim.fault_plan.reconfigure(dataclasses.replace(sim.config, quota={}, capacity={f"v7x@{Z}": 0}))
    clock.tick(1)
    stocked = as_google(sim.compute.groups.get_group(P, Z, "mig")).status.bulk_instance_operation.last_progress_check
    assert stocked.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"


def test_a_member_deleted_outside_its_mig_stops_then_leaves_its_list_and_the_target_stays(
    clock: SecondsClock,
) -> None:
    """instances.delete of a DO_NOTHING MIG's VM: STOPPING (its host told), then gone from
    listManagedInstances and the instance list, never made again; targetSize stays 2, the MIG stable."""
    sim = simulator(clock)
    slice_group(sim)
    clock.tick(10)
    gone = sim.compute.groups.get_group(P, Z, "mig").members[1].record.name
    sim.compute.slices.delete_instance(P, Z, gone)
    assert statuses(sim) == [("RUNNING", "NONE"), ("STOPPING", "NONE")]
    clock.tick(5)
    listed = sim.compute.groups.list_managed_instances(P, Z, "mig").items
    assert [m.record.name for m in listed] == [sim.compute.groups.get_group(P, Z, "mig").members[0].record.name]
    assert gone not in [v.record.name for v in sim.compute.vms.list_instances(P, Z).items]
    view = sim.compute.groups.get_group(P, Z, "mig")
    assert (view.record.target_size, view.stable) == (2, True)
    assert interconnect(sim) == ("2x2x2 INCOMPLETE",)

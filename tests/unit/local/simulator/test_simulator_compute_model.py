"""The simulated Compute Engine's rules on a fake clock, without sockets: operations, VM statuses,
Spot preemption, slices and workload policies, bulk mode, capacity and quota, what a host's
metadata server answers, and that the TPU API neither serves v7x nor sees Compute's slices."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from tpujobs.local.simulator import (
    JsonStateFile,
    QueuedResourceRequest,
    Simulator,
    SimulatorConfig,
    SimulatorError,
    SliceRequest,
)
from tpujobs.local.simulator.compute_errors import ComputeError
from tpujobs.local.simulator.compute_hosts import host_overlay
from tpujobs.local.simulator.compute_lists import name_filter
from tpujobs.local.simulator.compute_records import predicted_member_names
from tpujobs.local.simulator.metadata import lookup
from tpujobs.local.testing import SecondsClock

P, R, Z = "proj", "us-central1", "us-central1-a"
POLICY = f"projects/{P}/regions/{R}/resourcePolicies/pol"
TEMPLATE = f"projects/{P}/regions/{R}/instanceTemplates/tpl"
QUICK = SimulatorConfig(
    waiting_seconds=1.0,
    provisioning_seconds=2.0,
    compute_operation_seconds=1.0,
    preemption_grace_seconds=30.0,
    deleting_seconds=1.0,
)


@pytest.fixture
def clock() -> SecondsClock:
    return SecondsClock()


def simulator(clock: SecondsClock, config: SimulatorConfig = QUICK, **kwargs: Any) -> Simulator:
    return Simulator(config, clock=clock, wall_clock=lambda: 1_700_000_000.0 + clock.now, **kwargs)


def properties(model: str = "SPOT", action: str = "DELETE", machine_type: str = "tpu7x-standard-4t") -> dict[str, Any]:
    return {
        "machineType": machine_type,
        "disks": [{"boot": True}],
        "networkInterfaces": [{"network": "global/networks/default"}],
        "scheduling": {"provisioningModel": model, "instanceTerminationAction": action},
        "metadata": {"items": [{"key": "startup-script", "value": "echo hi"}]},
    }


def group_body(size: int = 2, policy: str = POLICY, **extra: Any) -> dict[str, Any]:
    body = {
        "name": "mig",
        "baseInstanceName": "mig",
        "instanceTemplate": TEMPLATE,
        "targetSize": size,
        "instanceLifecyclePolicy": {"defaultActionOnFailure": "DO_NOTHING"},
        **extra,
    }
    if policy:
        body["resourcePolicies"] = {"workloadPolicy": policy}
    return body


def slice_parts(sim: Simulator, topology: str = "2x2x2", **template: Any) -> None:
    sim.compute.operations.insert_policy(
        P, R, {"name": "pol", "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": topology}}
    )
    sim.compute.operations.insert_template(P, R, {"name": "tpl", "properties": properties(**template)})


def members(sim: Simulator) -> list[tuple[str | None, str]]:
    return [(m.status, m.current_action) for m in sim.compute.groups.get_group(P, Z, "mig").members]


def running_slice(clock: SecondsClock, sim: Simulator, size: int = 2) -> tuple[str, ...]:
    slice_parts(sim)
    sim.compute.groups.insert_group(P, Z, group_body(size))
    clock.tick(10)
    assert members(sim) == [("RUNNING", "NONE")] * size
    return predicted_member_names("mig", "mig", size)


def test_an_operation_is_pending_then_running_then_done(clock: SecondsClock) -> None:
    """compute_operation_seconds 1: PENDING at once, RUNNING from half way, DONE at the end."""
    sim = simulator(clock)
    op = sim.compute.operations.insert_policy(P, R, {"name": "pol", "workloadPolicy": {"type": "HIGH_AVAILABILITY"}})
    scope = f"regions/{R}"
    assert op.status == "PENDING"
    clock.tick(0.6)
    assert sim.compute.operations.get_compute_operation(P, scope, op.record.name).status == "RUNNING"
    clock.tick(0.5)
    done = sim.compute.operations.get_compute_operation(P, scope, op.record.name)
    assert done.status == "DONE" and done.record.end_time is not None and not done.record.errors


def test_a_slices_vms_are_provisioning_then_staging_then_running(clock: SecondsClock) -> None:
    """A MIG's VMs do not exist while the slice waits; then PROVISIONING, STAGING for the second
    half of provisioning_seconds, RUNNING; the MIG is stable only then."""
    sim = simulator(clock)
    slice_parts(sim)
    sim.compute.groups.insert_group(P, Z, group_body())
    assert members(sim) == [(None, "CREATING")] * 2
    clock.tick(1.0)  # waiting_seconds over: admitted
    assert members(sim) == [("PROVISIONING", "CREATING")] * 2
    clock.tick(1.0)
    assert members(sim) == [("STAGING", "CREATING")] * 2
    assert not sim.compute.groups.get_group(P, Z, "mig").stable
    clock.tick(1.0)
    view = sim.compute.groups.get_group(P, Z, "mig")
    assert members(sim) == [("RUNNING", "NONE")] * 2 and view.stable
    assert view.current_actions["none"] == 2 and view.current_actions["creating"] == 0


def test_member_names_are_the_base_and_four_letters_the_same_every_time(clock: SecondsClock) -> None:
    """Worker 0 first, names predicted by predicted_member_names, distinct."""
    sim = simulator(clock)
    names = running_slice(clock, sim)
    assert [m.record.name for m in sim.compute.groups.get_group(P, Z, "mig").members] == list(names)
    assert all(len(name) == len("mig-") + 4 and name[4:].isalpha() and name[4:].islower() for name in names)
    assert names == predicted_member_names("mig", "mig", 2) and len(set(names)) == 2


def test_a_preempted_spot_vm_stops_terminates_then_goes_and_its_mig_still_lists_it(clock: SecondsClock) -> None:
    """preempted TRUE at once, STOPPING for the 30 s grace, TERMINATED, deleted after
    (instanceTerminationAction DELETE); a DO_NOTHING MIG lists it with no status; the other runs on."""
    sim = simulator(clock)
    first, second = running_slice(clock, sim)
    preempted = sim.compute.vms.preempt_instance(P, Z, first)
    assert (preempted.status, preempted.record.preempted) == ("STOPPING", True)
    clock.tick(29.9)
    assert sim.compute.vms.get_instance(P, Z, first).status == "STOPPING"
    clock.tick(0.2)
    assert sim.compute.vms.get_instance(P, Z, first).status == "TERMINATED"
    clock.tick(1.0)
    with pytest.raises(ComputeError) as gone:
        sim.compute.vms.get_instance(P, Z, first)
    assert gone.value.http_status == 404
    assert members(sim) == [(None, "NONE"), ("RUNNING", "NONE")]
    assert [view.record.name for view in sim.compute.vms.list_instances(P, Z).items] == [second]
    ops = sim.compute.operations.list_compute_operations(P, f"zones/{Z}").items
    assert "compute.instances.preempted" in {view.record.operation_type for view in ops}


def test_a_spot_vm_that_stops_on_termination_stays_terminated(clock: SecondsClock) -> None:
    """instanceTerminationAction STOP: TERMINATED after the grace, and it stays."""
    sim = simulator(clock)
    slice_parts(sim, action="STOP")
    sim.compute.groups.insert_group(P, Z, group_body())
    clock.tick(10)
    name = predicted_member_names("mig", "mig", 2)[0]
    sim.compute.vms.preempt_instance(P, Z, name)
    clock.tick(100)
    assert sim.compute.vms.get_instance(P, Z, name).status == "TERMINATED"


def test_only_spot_vms_are_preempted(clock: SecondsClock) -> None:
    sim = simulator(clock)
    slice_parts(sim, model="STANDARD")
    sim.compute.groups.insert_group(P, Z, group_body())
    clock.tick(10)
    with pytest.raises(ComputeError):
        sim.compute.vms.preempt_instance(P, Z, predicted_member_names("mig", "mig", 2)[0])


def test_a_policy_or_template_in_use_is_refused_until_the_mig_is_gone(clock: SecondsClock) -> None:
    """resourceInUseByAnotherResource (400) while the MIG exists, also while it is being deleted."""
    sim = simulator(clock)
    running_slice(clock, sim)
    for delete in (
        lambda: sim.compute.operations.delete_policy(P, R, "pol"),
        lambda: sim.compute.operations.delete_template(P, R, "tpl"),
    ):
        with pytest.raises(ComputeError) as refused:
            delete()
        assert (refused.value.http_status, refused.value.reason) == (400, "resourceInUseByAnotherResource")
    sim.compute.groups.delete_group(P, Z, "mig")
    assert members(sim) == [("STOPPING", "DELETING")] * 2
    with pytest.raises(ComputeError):
        sim.compute.operations.delete_policy(P, R, "pol")
    clock.tick(1.0)
    assert not sim.compute.groups.list_groups(P, Z).items and not sim.compute.vms.list_instances(P, Z).items
    sim.compute.operations.delete_template(P, R, "tpl")
    sim.compute.operations.delete_policy(P, R, "pol")
    clock.tick(1.0)
    assert (
        not sim.compute.operations.list_policies(P, R).items and not sim.compute.operations.list_templates(P, R).items
    )


@pytest.mark.parametrize(
    ("topology", "size", "machine_type"),
    [
        ("2x2x2", 4, "tpu7x-standard-4t"),  # 2x2x4
        ("2x2x4", 2, "tpu7x-standard-4t"),  # 2x2x2
        ("2x2x2", 1, "tpu7x-standard-4t"),
        ("2x4", 2, "ct6e-standard-8t"),  # v6e-16 is 4 x ct6e-standard-4t
    ],
)
def test_a_mig_that_does_not_make_its_policys_topology_is_refused(
    clock: SecondsClock, topology: str, size: int, machine_type: str
) -> None:
    sim = simulator(clock)
    slice_parts(sim, topology=topology, machine_type=machine_type)
    with pytest.raises(ComputeError) as refused:
        sim.compute.groups.insert_group(P, Z, group_body(size))
    assert refused.value.http_status == 400
    assert not sim.compute.groups.list_groups(P, Z).items


def test_a_multi_host_mig_needs_a_workload_policy_but_one_vm_does_not(clock: SecondsClock) -> None:
    sim = simulator(clock)
    slice_parts(sim)
    with pytest.raises(ComputeError):
        sim.compute.groups.insert_group(P, Z, group_body(2, policy=""))
    sim.compute.groups.insert_group(P, Z, group_body(1, policy=""))
    clock.tick(10)
    assert members(sim) == [("RUNNING", "NONE")]


@pytest.mark.parametrize(
    "workload",
    [
        {"type": "HIGH_AVAILABILITY", "acceleratorTopology": "2x2x2"},
        {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2", "maxTopologyDistance": "BLOCK"},
        {"acceleratorTopology": "2x2x2"},
    ],
)
def test_a_workload_policy_is_checked_as_google_checks_it(clock: SecondsClock, workload: dict[str, str]) -> None:
    """acceleratorTopology only with HIGH_THROUGHPUT and never with maxTopologyDistance; a type is required."""
    with pytest.raises(ComputeError):
        simulator(clock).compute.operations.insert_policy(P, R, {"name": "pol", "workloadPolicy": workload})


def test_bulk_mode_needs_reservation_bound_or_flex_start_and_grows_only_from_zero(clock: SecondsClock) -> None:
    sim = simulator(clock)
    slice_parts(sim)  # SPOT
    with pytest.raises(ComputeError):
        sim.compute.groups.insert_group(P, Z, group_body(0, targetSizePolicy={"mode": "BULK"}))
    flex = {
        **properties("FLEX_START"),
        "scheduling": {**properties("FLEX_START")["scheduling"], "maxRunDuration": {"seconds": "3600"}},
    }
    sim.compute.operations.insert_template(P, R, {"name": "flex", "properties": flex})
    bulk = group_body(
        0, targetSizePolicy={"mode": "BULK"}, instanceTemplate=f"projects/{P}/regions/{R}/instanceTemplates/flex"
    )
    sim.compute.groups.insert_group(P, Z, bulk)
    with pytest.raises(ComputeError):
        sim.compute.groups.resize_group(P, Z, "mig", 4)  # 2x2x4 is not the policy's topology
    sim.compute.groups.resize_group(P, Z, "mig", 2)
    with pytest.raises(ComputeError):
        sim.compute.groups.resize_group(P, Z, "mig", 1)
    clock.tick(10)
    assert members(sim) == [("RUNNING", "NONE")] * 2
    sim.compute.groups.resize_group(P, Z, "mig", 0)
    assert members(sim) == []


def test_a_stockout_or_quota_shows_per_managed_instance_and_capacity_lets_it_through(clock: SecondsClock) -> None:
    """No chips: CREATING with ZONE_RESOURCE_POOL_EXHAUSTED; a quota below the slice:
    QUOTA_EXCEEDED; capacity and quota enough: RUNNING. Spot has a pool of its own when named."""
    sim = simulator(clock, dataclasses.replace(QUICK, capacity={f"v7x@{Z}:spot": 0, f"v7x@{Z}": 8}))
    slice_parts(sim)  # SPOT: from the Spot pool
    op = sim.compute.groups.insert_group(P, Z, group_body())
    clock.tick(5)
    view = sim.compute.groups.get_group(P, Z, "mig")
    assert [(m.status, m.current_action, m.errors[0][0]) for m in view.members] == [
        (None, "CREATING", "ZONE_RESOURCE_POOL_EXHAUSTED")
    ] * 2
    done = sim.compute.operations.get_compute_operation(P, f"zones/{Z}", op.record.name)
    assert done.status == "DONE" and not done.record.errors
    sim.fault_plan.reconfigure(dataclasses.replace(sim.config, capacity={}, quota={Z: {"v7x": {"spot": 4}}}))
    clock.tick(1)
    assert [m.errors[0][0] for m in sim.compute.groups.get_group(P, Z, "mig").members] == ["QUOTA_EXCEEDED"] * 2
    sim.fault_plan.reconfigure(dataclasses.replace(sim.config, quota={Z: {"v7x": {"spot": 8}}}))
    clock.tick(5)
    assert members(sim) == [("RUNNING", "NONE")] * 2


def test_a_lone_vm_without_capacity_fails_its_insert_and_a_flex_start_one_waits_pending(clock: SecondsClock) -> None:
    sim = simulator(clock, dataclasses.replace(QUICK, capacity={f"v7x@{Z}": 0}))
    vm = {**properties("STANDARD", "STOP"), "name": "vm", "machineType": f"zones/{Z}/machineTypes/tpu7x-standard-4t"}
    op = sim.compute.vms.insert_instance(P, Z, vm)
    clock.tick(5)
    failed = sim.compute.operations.get_compute_operation(P, f"zones/{Z}", op.record.name)
    assert failed.status == "DONE" and failed.record.errors[0][0] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert failed.record.http_status == 503
    assert not sim.compute.vms.list_instances(P, Z).items
    flex = {
        **vm,
        "scheduling": {
            "provisioningModel": "FLEX_START",
            "instanceTerminationAction": "DELETE",
            "maxRunDuration": {"seconds": "600"},
        },
    }
    sim.compute.vms.insert_instance(P, Z, flex)
    clock.tick(5)
    assert sim.compute.vms.get_instance(P, Z, "vm").status == "PENDING"
    sim.fault_plan.reconfigure(dataclasses.replace(sim.config, capacity={}))
    clock.tick(5)
    assert sim.compute.vms.get_instance(P, Z, "vm").status == "RUNNING"


def lone_vm(model: str, **extra: Any) -> dict[str, Any]:
    """A one-host v7x VM (4 chips) of provisioning *model*."""
    scheduling: dict[str, Any] = {"provisioningModel": model, "instanceTerminationAction": "DELETE"}
    if model == "FLEX_START":
        scheduling["maxRunDuration"] = {"seconds": "600"}
    return {
        **properties(model),
        "name": "vm",
        "machineType": f"zones/{Z}/machineTypes/tpu7x-standard-4t",
        "scheduling": scheduling,
        **extra,
    }


@pytest.mark.parametrize(
    ("model", "quota", "message"),
    [
        ("SPOT", {R: {"v7x": {"spot": 0}}}, "Quota 'PREEMPTIBLE_TPU_V7X' exceeded. Limit: 0.0 in region us-central1."),
        ("STANDARD", {Z: {"v7x": 2}}, f"Quota 'TPUS_PER_TPU_FAMILY' exceeded. Limit: 2.0 in zone {Z}."),
    ],
)
def test_a_vm_held_back_by_quota_fails_its_insert_naming_the_metric_and_where(
    clock: SecondsClock, model: str, quota: dict[str, Any], message: str
) -> None:
    """QUOTA_EXCEEDED (403) as Compute Engine words it: the preemptible or on-demand metric, the
    region's limit or the zone's."""
    sim = simulator(clock, dataclasses.replace(QUICK, quota=quota))
    op = sim.compute.vms.insert_instance(P, Z, lone_vm(model))
    clock.tick(5)
    failed = sim.compute.operations.get_compute_operation(P, f"zones/{Z}", op.record.name)
    assert failed.record.errors == (("QUOTA_EXCEEDED", message),) and failed.record.http_status == 403


def test_flex_start_waits_on_the_spot_quota_and_not_on_the_on_demand_one(clock: SecondsClock) -> None:
    """Flex-start VMs consume preemptible quota: PENDING, saying so, while the spot quota is
    full; the on-demand quota (0) is no limit on them."""
    quota = {R: {"v7x": {"spot": 0, "on-demand": 0}}}
    sim = simulator(clock, dataclasses.replace(QUICK, quota=quota))
    sim.compute.vms.insert_instance(P, Z, lone_vm("FLEX_START"))
    clock.tick(5)
    view = sim.compute.vms.get_instance(P, Z, "vm")
    assert view.status == "PENDING"
    assert view.errors == (
        ("QUOTA_EXCEEDED", "Quota 'PREEMPTIBLE_TPU_V7X' exceeded. Limit: 0.0 in region us-central1."),
    )
    sim.fault_plan.reconfigure(dataclasses.replace(sim.config, quota={R: {"v7x": {"spot": 4, "on-demand": 0}}}))
    clock.tick(5)
    assert sim.compute.vms.get_instance(P, Z, "vm").status == "RUNNING"


def test_a_reservation_bound_vm_counts_against_its_reservations_size(clock: SecondsClock) -> None:
    """A reservation-bound VM that names a full reservation fails as Compute Engine says it
    (CONDITION_NOT_MET, the reservation named); the quota does not count it."""
    affinity = {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["team"],
    }
    quota = {Z: {"v7x": 0}, "reservations": {"team": 2}}
    sim = simulator(clock, dataclasses.replace(QUICK, quota=quota))
    op = sim.compute.vms.insert_instance(P, Z, lone_vm("RESERVATION_BOUND", reservationAffinity=affinity))
    clock.tick(5)
    failed = sim.compute.operations.get_compute_operation(P, f"zones/{Z}", op.record.name)
    reason = "Specified reservation 'team' does not have available resources for the request."
    assert failed.record.errors == (("CONDITION_NOT_MET", reason),) and failed.record.http_status == 400
    sim.fault_plan.reconfigure(dataclasses.replace(sim.config, quota={**quota, "reservations": {"team": 4}}))
    sim.compute.vms.insert_instance(P, Z, lone_vm("RESERVATION_BOUND", reservationAffinity=affinity))
    clock.tick(5)
    assert sim.compute.vms.get_instance(P, Z, "vm").status == "RUNNING"


def test_set_metadata_needs_the_current_fingerprint(clock: SecondsClock) -> None:
    sim = simulator(clock)
    name = running_slice(clock, sim)[0]
    for stale in ({}, {"fingerprint": "stale"}):
        with pytest.raises(ComputeError) as refused:
            sim.compute.vms.set_metadata(P, Z, name, {**stale, "items": []})
        assert (refused.value.http_status, refused.value.reason) == (412, "conditionNotMet")
    current = sim.compute.vms.get_instance(P, Z, name).record.fingerprint
    sim.compute.vms.set_metadata(P, Z, name, {"fingerprint": current, "items": [{"key": "k", "value": "v"}]})
    changed = sim.compute.vms.get_instance(P, Z, name).record
    assert changed.metadata == (("k", "v"),) and changed.fingerprint != current


def test_a_hosts_metadata_server_answers_as_a_compute_tpu_vm(clock: SecondsClock) -> None:
    """accelerator-type v7x-16, tpu-env with TOPOLOGY, its worker number, every worker's endpoint,
    the VM's own items, preempted per VM, and upcoming-maintenance NONE then the announcement."""
    sim = simulator(clock)
    first, second = running_slice(clock, sim)
    backing = sim.compute.groups.get_group(P, Z, "mig").record.backing
    node = sim.node_updates.host_node(P, Z, backing)

    def answer(worker: int, key: str) -> str:
        host = sim.compute.vms.host_instance(sim.node_updates.host_node(P, Z, backing), worker)
        assert host is not None
        return lookup(node, worker, key, host_overlay(node, worker, host)).body

    assert answer(1, "instance/attributes/accelerator-type") == "v7x-16"
    assert "TOPOLOGY: '2x2x2'" in answer(1, "instance/attributes/tpu-env")
    assert answer(1, "instance/attributes/agent-worker-number") == "1"
    assert answer(0, "instance/attributes/worker-network-endpoints") == ",".join(
        f"unknown:unknown:{ip}" for ip in node.host_addresses
    )
    assert answer(0, "instance/attributes/startup-script") == "echo hi"
    assert answer(0, "instance/name") == first
    assert answer(0, "instance/upcoming-maintenance") == "NONE"
    sim.compute.vms.preempt_instance(P, Z, second)
    assert (answer(0, "instance/preempted"), answer(1, "instance/preempted")) == ("FALSE", "TRUE")
    sim.compute.vms.schedule_maintenance(P, Z, first, notice_seconds=60)
    announced = json.loads(answer(0, "instance/upcoming-maintenance"))
    assert announced["type"] == "SCHEDULED" and announced["maintenance_status"] == "PENDING"


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ('name eq "mig-.*"', ["mig-a", "mig-b"]),
        ("name eq mig-a", ["mig-a"]),
        ('name ne "mig-.*"', ["other"]),
        ('name = "other"', ["other"]),
        ('(name != "other")', ["mig-a", "mig-b"]),
        ("", ["mig-a", "mig-b", "other"]),
    ],
)
def test_a_list_filter_on_the_name(text: str, kept: list[str]) -> None:
    keep = name_filter(text)
    assert [name for name in ("mig-a", "mig-b", "other") if keep(name)] == kept


@pytest.mark.parametrize("text", ['status eq "RUNNING"', "name eq", 'name eq "("', "name ~ x"])
def test_a_filter_the_simulator_cannot_read_is_400(text: str) -> None:
    with pytest.raises(ComputeError):
        name_filter(text)


def test_the_tpu_api_refuses_v7x_and_does_not_see_computes_slices(clock: SecondsClock) -> None:
    sim = simulator(clock)
    running_slice(clock, sim)
    request = QueuedResourceRequest(slices=(SliceRequest("v7x-16", "v2-alpha-tpu7-ubuntu2404", node_id="n"),))
    with pytest.raises(SimulatorError) as refused:
        sim.queued_resources.create_queued_resource(P, Z, "qr", request)
    assert "Compute Engine" in refused.value.message
    assert not sim.queued_resources.list_queued_resources(P, Z).items and not sim.nodes.list_nodes(P, Z).items
    assert not sim.state().queued_resources


def test_compute_state_survives_a_restart(clock: SecondsClock, tmp_path: Path) -> None:
    """Policies, templates, MIGs and VMs come back from the state file, with their statuses."""
    store = JsonStateFile(tmp_path / "state.json")
    first = simulator(clock, store=store)
    names = running_slice(clock, first)
    again = simulator(clock, store=store)
    assert [m.record.name for m in again.compute.groups.get_group(P, Z, "mig").members] == list(names)
    assert again.compute.vms.get_instance(P, Z, names[0]).status == "RUNNING"
    assert again.compute.operations.get_policy(P, R, "pol").topology == "2x2x2"


def test_a_mig_made_again_under_its_name_gets_a_slice_of_its_own(clock: SecondsClock) -> None:
    """Deleted, then inserted again while the old slice's queued resource is still deleting:
    the new slice is another queued resource, and the old one still ends and frees its chips."""
    sim = simulator(clock, dataclasses.replace(QUICK, deleting_seconds=5.0, capacity={f"v7x@{Z}:spot": 16}))
    running_slice(clock, sim)
    old = sim.compute.groups.get_group(P, Z, "mig").record.backing
    sim.compute.groups.delete_group(P, Z, "mig")
    clock.tick(1.0)  # the MIG is gone; its slice is still deleting
    sim.compute.groups.insert_group(P, Z, group_body())
    new = sim.compute.groups.get_group(P, Z, "mig").record.backing
    assert new != old
    clock.tick(10)
    assert members(sim) == [("RUNNING", "NONE")] * 2
    with pytest.raises(SimulatorError):
        sim.node_updates.host_node(P, Z, old)


def test_a_compute_vms_identity_token_names_the_vm(clock: SecondsClock) -> None:
    """format=full carries the VM's own name, id and creation time, as the control plane checks them
    (domain.naming.host_name_refusal wants `{slice}-xxxx`)."""
    from google.auth import jwt

    from tpujobs.local.simulator.identity import IdentitySigner
    from tpujobs.local.simulator.metadata import identity

    sim = simulator(clock)
    first, _ = running_slice(clock, sim)
    node = sim.node_updates.host_node(P, Z, sim.compute.groups.get_group(P, Z, "mig").record.backing)
    host = sim.compute.vms.host_instance(node, 0)
    assert host is not None
    key = "instance/service-accounts/default/identity"
    reply = identity(
        node, 0, key, {"audience": ["aud"], "format": ["full"]}, IdentitySigner(), host_overlay(node, 0, host)
    )
    assert reply is not None and reply.status == 200
    engine = jwt.decode(reply.body, verify=False)["google"]["compute_engine"]
    assert engine["instance_name"] == first and engine["instance_id"] == str(host.record.number)
    assert engine["zone"] == Z and engine["project_id"] == P


@pytest.mark.parametrize(
    ("method", "path", "counted"),
    [
        ("POST", f"/compute/v1/projects/{P}/zones/{Z}/instanceGroupManagers", "create"),
        ("POST", f"/compute/v1/projects/{P}/regions/{R}/resourcePolicies", "create"),
        ("GET", f"/compute/v1/projects/{P}/zones/{Z}/instances/vm", "get"),
        ("GET", f"/compute/v1/projects/{P}/zones/{Z}/instances", "list"),
        ("GET", f"/compute/v1/projects/{P}/aggregated/instances", "list"),
        ("POST", f"/compute/v1/projects/{P}/zones/{Z}/instanceGroupManagers/mig/listManagedInstances", "list"),
        ("POST", f"/compute/v1/projects/{P}/zones/{Z}/instances/vm/setMetadata", "update"),
        ("POST", f"/compute/v1/projects/{P}/zones/{Z}/instanceGroupManagers/mig/resize", "update"),
        ("DELETE", f"/compute/v1/projects/{P}/global/instanceTemplates/t", "delete"),
        ("POST", f"/compute/v1/projects/{P}/zones/{Z}/operations/op/wait", None),
        ("GET", f"/compute/v1/projects/{P}/regions/{R}/operations/op", None),
    ],
)
def test_each_compute_call_counts_as_one_method_of_the_planned_faults(
    method: str, path: str, counted: str | None
) -> None:
    """`tpujobs dev fault error --method M` hits Compute calls too; operations never."""
    from tpujobs.local.simulator.compute_api import fault_method

    assert fault_method(method, path) == counted

"""A Compute Engine VM's own end in the simulator, on a fake clock: a flex-start VM's maxRunDuration
(counted from RUNNING, then its instanceTerminationAction), and host maintenance of a TERMINATE VM
without automatic restart (TERMINATED for good, its maintenance-event NONE throughout)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from test_simulator_compute_model import (
    QUICK,
    P,
    R,
    Z,
    group_body,
    members,
    properties,
    running_slice,
    simulator,
    slice_parts,
)

from tpujobs.local.simulator.compute_errors import ComputeError
from tpujobs.local.simulator.compute_hosts import host_overlay
from tpujobs.local.simulator.compute_json import instance_json, managed_instance_json
from tpujobs.local.simulator.compute_records import predicted_member_names
from tpujobs.local.simulator.metadata import lookup
from tpujobs.local.simulator.records import HostAction
from tpujobs.local.testing import SecondsClock

TPU_VM = {"onHostMaintenance": "TERMINATE", "automaticRestart": False}


@pytest.fixture
def clock() -> SecondsClock:
    return SecondsClock()


def flex_template(seconds: int) -> dict[str, Any]:
    scheduling = {
        **properties("FLEX_START")["scheduling"],
        **TPU_VM,
        "maxRunDuration": {"seconds": str(seconds)},
    }
    return {**properties("FLEX_START"), "scheduling": scheduling}


def flex_slice(clock: SecondsClock, sim: Any, seconds: int) -> tuple[str, ...]:
    """A BULK flex-start MIG of two VMs whose template says maxRunDuration *seconds*; RUNNING."""
    slice_parts(sim)
    sim.compute.operations.insert_template(P, R, {"name": "flex", "properties": flex_template(seconds)})
    template = f"projects/{P}/regions/{R}/instanceTemplates/flex"
    sim.compute.groups.insert_group(P, Z, group_body(2, targetSizePolicy={"mode": "BULK"}, instanceTemplate=template))
    clock.tick(10)
    assert members(sim) == [("RUNNING", "NONE")] * 2
    return predicted_member_names("mig", "mig", 2)


def told(sim: Any) -> list[tuple[tuple[int, ...], HostAction]]:
    """What the hosts will be told from now: (workers, action) of each host event, in order."""
    seen: list[tuple[tuple[int, ...], HostAction]] = []
    sim.on_hosts.append(lambda event: seen.append((event.workers, event.action)))
    return seen


def test_a_flex_start_vm_is_deleted_at_its_run_duration_counted_from_running(clock: SecondsClock) -> None:
    """RUNNING until maxRunDuration after it turned RUNNING (its terminationTimestamp says when),
    then STOPPING (its host told to go, not preempted), then deleted (DELETE): the DO_NOTHING MIG
    lists it with no status and makes nothing again."""
    sim = simulator(clock, dataclasses.replace(QUICK, delete_grace_seconds=30.0))
    first, _ = flex_slice(clock, sim, 600)
    hosts = told(sim)
    vm = sim.compute.vms.get_instance(P, Z, first)
    stamp = instance_json(vm)["resourceStatus"]["scheduling"]["terminationTimestamp"]
    assert managed_instance_json(vm)["scheduling"]["terminationTimestamp"] == stamp
    assert vm.record.terminates_at is not None and vm.record.terminates_at > vm.record.create_time + 600
    clock.tick(590)
    assert members(sim) == [("RUNNING", "NONE")] * 2
    clock.tick(10)
    assert members(sim) == [("STOPPING", "NONE")] * 2
    assert not sim.compute.vms.get_instance(P, Z, first).record.preempted
    assert hosts == [((0,), HostAction.DELETE), ((1,), HostAction.DELETE)]
    clock.tick(60)
    assert members(sim) == [(None, "NONE")] * 2
    assert sim.compute.groups.get_group(P, Z, "mig").record.target_size == 2


def test_a_vm_without_a_run_duration_runs_on(clock: SecondsClock) -> None:
    """No maxRunDuration (a Spot template here): no terminationTimestamp and no end of its own."""
    sim = simulator(clock)
    first, _ = running_slice(clock, sim)
    clock.tick(8 * 24 * 3600)
    assert members(sim) == [("RUNNING", "NONE")] * 2
    assert "resourceStatus" not in instance_json(sim.compute.vms.get_instance(P, Z, first))


def tpu_slice(clock: SecondsClock, sim: Any) -> tuple[str, ...]:
    """An on-demand MIG of two TPU VMs made as tpujobs makes them (TERMINATE, no automatic restart)."""
    scheduling = {"provisioningModel": "STANDARD", **TPU_VM}
    sim.compute.operations.insert_policy(
        P, R, {"name": "pol", "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}}
    )
    sim.compute.operations.insert_template(
        P, R, {"name": "tpl", "properties": {**properties(), "scheduling": scheduling}}
    )
    sim.compute.groups.insert_group(P, Z, group_body(2))
    clock.tick(10)
    assert members(sim) == [("RUNNING", "NONE")] * 2
    return predicted_member_names("mig", "mig", 2)


def test_simulated_maintenance_terminates_a_tpu_vm_for_good(clock: SecondsClock) -> None:
    """simulate_instance_maintenance: an operation comes back; the VM is STOPPING (its host shut
    down), then TERMINATED, and a DO_NOTHING MIG leaves it so; the other VM runs on, and a
    compute.instances.terminateOnHostMaintenance operation names the VM."""
    sim = simulator(clock)
    first, _ = tpu_slice(clock, sim)
    hosts = told(sim)
    op = sim.compute.faults.simulate_instance_maintenance(P, Z, first)
    assert op.record.operation_type == "simulateMaintenanceEvent" and op.record.target.endswith(first)
    assert members(sim) == [("STOPPING", "NONE"), ("RUNNING", "NONE")]
    assert hosts == [((0,), HostAction.SHUTDOWN)]
    clock.tick(3600)
    assert members(sim) == [("TERMINATED", "NONE"), ("RUNNING", "NONE")]
    kinds = [o.record for o in sim.compute.operations.list_compute_operations(P, f"zones/{Z}").items]
    assert any(
        o.operation_type == "compute.instances.terminateOnHostMaintenance" and o.target.endswith(first) for o in kinds
    )


def test_maintenance_of_a_mig_is_announced_then_terminates_its_vms_and_the_event_key_stays_none(
    clock: SecondsClock,
) -> None:
    """terminate_for_maintenance with a notice: upcomingMaintenance says when, every VM RUNNING
    meanwhile; then all TERMINATED, and none is ever told TERMINATE_ON_HOST_MAINTENANCE."""
    sim = simulator(clock)
    tpu_slice(clock, sim)
    backing = sim.compute.groups.get_group(P, Z, "mig").record.backing

    def event_key(worker: int) -> str:
        node = sim.node_updates.host_node(P, Z, backing)
        host = sim.compute.vms.host_instance(node, worker)
        assert host is not None
        return lookup(node, worker, "instance/maintenance-event", host_overlay(node, worker, host)).body

    sim.compute.faults.terminate_for_maintenance(P, Z, "mig", notice=30)
    view = sim.compute.groups.get_group(P, Z, "mig")
    assert [m.status for m in view.members] == ["RUNNING", "RUNNING"]
    assert all(m.record.upcoming_maintenance for m in view.members)
    assert (event_key(0), event_key(1)) == ("NONE", "NONE")
    clock.tick(31)
    assert members(sim) == [("STOPPING", "NONE")] * 2
    assert (event_key(0), event_key(1)) == ("NONE", "NONE")
    clock.tick(3600)
    assert members(sim) == [("TERMINATED", "NONE")] * 2


def test_maintenance_is_refused_with_the_real_reason(clock: SecondsClock) -> None:
    """A VM that restarts on its own (automaticRestart unset) or is not RUNNING is refused, saying why."""
    sim = simulator(clock)
    first, _ = running_slice(clock, sim)  # properties(): no onHostMaintenance, no automaticRestart
    with pytest.raises(ComputeError, match="automaticRestart"):
        sim.compute.faults.simulate_instance_maintenance(P, Z, first)
    sim.compute.vms.preempt_instance(P, Z, first)
    with pytest.raises(ComputeError, match="is STOPPING"):
        sim.compute.faults.simulate_instance_maintenance(P, Z, first)

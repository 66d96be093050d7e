"""Every refusal of the simulated TPU API names its real reason: a node in the right state but with
a maintenance window scheduled, a reboot or an announced event under way says so; the TPU API
refuses a TPU7x size for TPU7x, not for its size."""

from __future__ import annotations

import pytest

from tpujobs.local.simulator import (
    Code,
    NodeState,
    QueuedResourceRequest,
    Simulator,
    SimulatorConfig,
    SimulatorError,
    SliceRequest,
)
from tpujobs.local.testing import SecondsClock

PROJECT, ZONE = "proj", "us-central2-b"
QUICK = SimulatorConfig(
    waiting_seconds=1.0,
    provisioning_seconds=2.0,
    reboot_seconds=2.0,
    maintenance_notice_seconds=5.0,
    maintenance_seconds=10.0,
)


def active(clock: SecondsClock) -> Simulator:
    """A simulator holding ACTIVE QR 'qr' with its one-host node 'node' READY."""
    sim = Simulator(QUICK, clock=clock, wall_clock=lambda: 1_700_000_000.0)
    request = QueuedResourceRequest(slices=(SliceRequest("v5litepod-1", "rt", node_id="node"),))
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", request)
    clock.tick(3.0)
    assert sim.nodes.get_node(PROJECT, ZONE, "node").state is NodeState.READY
    return sim


def refusal(call: object) -> SimulatorError:
    assert callable(call)
    with pytest.raises(SimulatorError) as refused:
        call()
    return refused.value


def test_simulated_maintenance_on_a_ready_node_with_a_window_names_the_window() -> None:
    """The node is READY, so "only a READY node can be" would hide why: the scheduled window."""
    sim = active(SecondsClock())
    sim.nodes.schedule_maintenance_window("qr", notice_seconds=600)
    assert sim.nodes.get_node(PROJECT, ZONE, "node").state is NodeState.READY
    error = refusal(lambda: sim.node_power.simulate_maintenance_event(PROJECT, ZONE, "node"))
    assert error.code is Code.FAILED_PRECONDITION
    assert "a host maintenance window is scheduled for it, starting 2023-11-14T22:23:20" in error.message
    assert "only a READY node" not in error.message


def test_stopping_a_ready_node_whose_maintenance_is_announced_says_so() -> None:
    """An announced maintenance event (the hosts about to go down), not the node's READY state."""
    sim = active(SecondsClock())
    sim.node_power.simulate_maintenance_event(PROJECT, ZONE, "node")
    error = refusal(lambda: sim.node_power.stop_node(PROJECT, ZONE, "node"))
    assert "maintenance event is announced for it" in error.message and "only a READY" not in error.message


def test_a_second_fault_on_a_rebooting_node_names_the_reboot() -> None:
    """dev fault maintenance during a reboot: 'its hosts rebooting', not 'try again when it is READY'."""
    sim = active(SecondsClock())
    sim.nodes.reboot("qr")
    error = refusal(lambda: sim.nodes.maintenance("qr"))
    assert "its hosts rebooting" in error.message and "when it is READY" not in error.message


def test_the_tpu_api_refuses_a_tpu7x_size_because_it_serves_no_tpu7x() -> None:
    """v7x-6 is no size anywhere, but the TPU API's reason is the generation: Compute Engine only."""
    sim = Simulator(QUICK, clock=SecondsClock(), wall_clock=lambda: 1_700_000_000.0)
    request = QueuedResourceRequest(slices=(SliceRequest("v7x-6", "rt", node_id="node"),))
    error = refusal(lambda: sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", request))
    assert error.code is Code.INVALID_ARGUMENT
    assert "served only through Compute Engine" in error.message

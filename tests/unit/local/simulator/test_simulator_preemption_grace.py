"""The simulated TPU API on a preempted queued resource, as Google documents it: SUSPENDING while
its hosts are in their preemption grace ("being deleted"), SUSPENDED once they are gone ("have
been deleted"), and a plain (non-force) delete of a SUSPENDED one allowed (queuedResources.delete:
"the queued resource will only be deleted if its nodes have already been deleted or the queued
resource is in the ACCEPTED, FAILED, or SUSPENDED state")."""

from __future__ import annotations

import pytest

from tpujobs.local.simulator import (
    QrState,
    QueuedResourceRequest,
    Simulator,
    SimulatorConfig,
    SimulatorError,
    SliceRequest,
)
from tpujobs.local.testing import SecondsClock

PROJECT = "proj"
ZONE = "us-central2-b"
CONFIG = SimulatorConfig(
    accept_seconds=0.0,
    waiting_seconds=1.0,
    provisioning_seconds=2.0,
    suspending_seconds=1.0,
    deleting_seconds=1.0,
    preemption_grace_seconds=30.0,
)


def preempted(clock: SecondsClock) -> Simulator:
    sim = Simulator(CONFIG, clock=clock, wall_clock=lambda: 1_700_000_000.0)
    request = QueuedResourceRequest(
        slices=(SliceRequest(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base", node_id="n"),)
    )
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", request)
    clock.tick(3.0)
    sim.queued_resources.preempt("qr", zone=ZONE)
    return sim


def state(sim: Simulator) -> QrState:
    return sim.queued_resources.get_queued_resource(PROJECT, ZONE, "qr").state


def test_a_preempted_queued_resource_is_suspending_until_its_hosts_grace_is_over() -> None:
    """SUSPENDING for the whole preemption grace (its hosts are saving), SUSPENDED only after."""
    clock = SecondsClock()
    sim = preempted(clock)

    clock.tick(29.0)
    assert state(sim) is QrState.SUSPENDING
    clock.tick(1.5)
    assert state(sim) is QrState.SUSPENDED


def test_a_suspended_queued_resource_may_be_deleted_without_force() -> None:
    """A plain delete of a SUSPENDED queued resource is accepted, its preempted nodes with it."""
    clock = SecondsClock()
    sim = preempted(clock)
    clock.tick(31.0)

    sim.queued_resources.delete_queued_resource(PROJECT, ZONE, "qr")

    assert state(sim) is QrState.DELETING


def test_a_suspending_queued_resource_still_needs_force() -> None:
    """While SUSPENDING its nodes exist and it is none of ACCEPTED, FAILED, SUSPENDED: refused."""
    clock = SecondsClock()
    sim = preempted(clock)

    with pytest.raises(SimulatorError, match="set force to true"):
        sim.queued_resources.delete_queued_resource(PROJECT, ZONE, "qr")
    assert state(sim) is QrState.SUSPENDING

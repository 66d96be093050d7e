"""The simulated UpdateNode takes time, as Google's does, on a fake clock: its operation runs
update_node_seconds, a second update of the node meanwhile is 409 ABORTED, and the hosts'
metadata servers answer the new map metadata_propagation_seconds after it is done."""

from __future__ import annotations

import pytest
from test_simulator_update_node import ASSIGNMENT, BOOT_METADATA, PROJECT, QUICK, ZONE, refusal, unit

from tpujobs.local.simulator import Code, Simulator
from tpujobs.local.simulator.metadata import lookup
from tpujobs.local.testing import SecondsClock

NODE = "demo-u0-g1"
TIMED = QUICK.updated({"update_node_seconds": 2.0, "metadata_propagation_seconds": 1.0})


@pytest.fixture
def clock() -> SecondsClock:
    return SecondsClock()


def timed(clock: SecondsClock) -> Simulator:
    sim = Simulator(TIMED, clock=clock, wall_clock=lambda: 1_700_000_000.0)
    unit(sim, clock)
    return sim


def assigned(seq: int) -> dict[str, object]:
    return {"metadata": {**BOOT_METADATA, "tpujobs-assignment": f'{{"seq": {seq}}}'}}


def test_an_update_is_done_after_update_node_seconds_and_the_node_changes_then(clock: SecondsClock) -> None:
    """Running (not done, the node unchanged) until update_node_seconds pass; then done, changed."""
    sim = timed(clock)
    operation = sim.node_updates.update_node(PROJECT, ZONE, NODE, ["metadata"], assigned(2))
    assert not operation.done
    assert sim.nodes.get_node(PROJECT, ZONE, NODE).metadata["tpujobs-assignment"] == '{"seq": 1}'
    clock.tick(1.9)
    assert not sim.queued_resources.get_operation(PROJECT, ZONE, operation.operation_id).done
    clock.tick(0.2)
    done = sim.queued_resources.get_operation(PROJECT, ZONE, operation.operation_id)
    assert done.done and done.error_code == 0 and done.node is not None
    assert sim.nodes.get_node(PROJECT, ZONE, NODE).metadata["tpujobs-assignment"] == '{"seq": 2}'


def test_a_second_update_while_one_is_in_flight_is_409_aborted_and_then_accepted(clock: SecondsClock) -> None:
    """gcloud's "already an UpdateNode call in flight": ABORTED (HTTP 409) until the first is done."""
    sim = timed(clock)
    sim.node_updates.update_node(PROJECT, ZONE, NODE, ["metadata"], assigned(2))
    refused = refusal(lambda: sim.node_updates.update_node(PROJECT, ZONE, NODE, ["metadata"], assigned(3)))
    assert refused.code is Code.ABORTED and refused.code.http_status == 409
    assert "already an UpdateNode call in flight" in refused.message
    clock.tick(2.1)
    assert not sim.node_updates.update_node(PROJECT, ZONE, NODE, ["metadata"], assigned(3)).done


def test_the_hosts_read_the_new_metadata_only_after_it_propagates(clock: SecondsClock) -> None:
    """Done at 2 s, the hosts' metadata servers still answer the old value until 3 s."""
    sim = timed(clock)
    sim.node_updates.update_node(PROJECT, ZONE, NODE, ["metadata"], assigned(2))
    clock.tick(2.1)
    assert sim.nodes.get_node(PROJECT, ZONE, NODE).metadata["tpujobs-assignment"] == '{"seq": 2}'
    assert lookup(sim.node_updates.host_node(PROJECT, ZONE, NODE), 0, ASSIGNMENT).body == '{"seq": 1}'
    clock.tick(1.0)
    assert lookup(sim.node_updates.host_node(PROJECT, ZONE, NODE), 0, ASSIGNMENT).body == '{"seq": 2}'


def test_an_update_of_a_node_deleted_meanwhile_fails_not_found(clock: SecondsClock) -> None:
    """The queued resource deleted while its node's update runs: the operation ends NOT_FOUND."""
    sim = timed(clock)
    operation = sim.node_updates.update_node(PROJECT, ZONE, NODE, ["metadata"], assigned(2))
    sim.queued_resources.delete_queued_resource(PROJECT, ZONE, NODE, force=True)
    clock.tick(5.0)
    done = sim.queued_resources.get_operation(PROJECT, ZONE, operation.operation_id)
    assert done.done and done.error_code == Code.NOT_FOUND.grpc_code


def test_the_end_of_propagation_wakes_a_held_wait_for_change(clock: SecondsClock) -> None:
    """The new map reaching the hosts is a change: the simulator's generation moves once the
    propagation time is up, so a `wait_for_change` held on the old value answers then, not at its
    next periodic check."""
    sim = timed(clock)
    sim.node_updates.update_node(PROJECT, ZONE, NODE, ["metadata"], assigned(2))
    clock.tick(2.1)
    sim.advance()  # the update lands: the node changes, the hosts still read seq 1
    landed = sim.generation()
    clock.tick(0.5)
    sim.advance()
    assert sim.generation() == landed  # nothing new for the hosts yet
    clock.tick(0.5)
    sim.advance()
    assert sim.generation() > landed
    assert lookup(sim.node_updates.host_node(PROJECT, ZONE, NODE), 0, ASSIGNMENT).body == '{"seq": 2}'

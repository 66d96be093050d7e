"""StopNode, StartNode and SimulateMaintenanceEvent in the simulated TPU service, on a fake clock;
and the catalog gcloud lists (accelerator types, runtime versions, locations), through the API
object without sockets."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from tpujobs.local.simulator import (
    Code,
    NodeState,
    QrState,
    QueuedResourceRequest,
    Simulator,
    SimulatorApi,
    SimulatorConfig,
    SimulatorError,
    SliceRequest,
)
from tpujobs.local.simulator.catalog import offered_accelerator_types
from tpujobs.local.simulator.records import MAINTENANCE_NONE, MAINTENANCE_TERMINATE
from tpujobs.local.testing import SecondsClock

PROJECT = "proj"
ZONE = "us-central2-b"
QUICK = SimulatorConfig(
    waiting_seconds=1.0,
    provisioning_seconds=2.0,
    reboot_seconds=2.0,
    maintenance_notice_seconds=5.0,
    maintenance_seconds=10.0,
)


def active(clock: SecondsClock, accelerator_type: str = "v5litepod-1", *, spot: bool = False) -> Simulator:
    """A simulator holding ACTIVE QR 'qr' with node 'node', recording every host event."""
    sim = Simulator(QUICK, clock=clock, wall_clock=lambda: 1_700_000_000.0)
    request = QueuedResourceRequest(
        slices=(SliceRequest(accelerator_type=accelerator_type, runtime_version="rt", node_id="node"),), spot=spot
    )
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", request)
    clock.tick(3.0)
    assert sim.nodes.get_node(PROJECT, ZONE, "node").state is NodeState.READY
    return sim


def host_events(sim: Simulator) -> list[tuple[int, tuple[int, ...], str]]:
    events: list[tuple[int, tuple[int, ...], str]] = []
    sim.on_hosts.append(lambda e: events.append((e.slice_index, e.workers, e.action.value)))
    return events


def refusal(call: object) -> SimulatorError:
    assert callable(call)
    with pytest.raises(SimulatorError) as refused:
        call()
    return refused.value


def test_stop_shuts_the_host_down_and_start_boots_it_after_reboot_seconds() -> None:
    """stop: STOPPED now and SHUTDOWN of the host; start: STARTING, then READY and BOOT."""
    clock = SecondsClock()
    sim = active(clock)
    events = host_events(sim)
    stopped = sim.node_power.stop_node(PROJECT, ZONE, "node")
    assert stopped.done and stopped.verb == "stop" and stopped.node is not None
    assert sim.nodes.get_node(PROJECT, ZONE, "node").state is NodeState.STOPPED
    assert events == [(0, (0,), "shutdown")]
    clock.tick(60.0)  # a stopped node stays stopped
    assert sim.nodes.get_node(PROJECT, ZONE, "node").state is NodeState.STOPPED
    sim.node_power.start_node(PROJECT, ZONE, "node")
    assert sim.nodes.get_node(PROJECT, ZONE, "node").state is NodeState.STARTING
    clock.tick(1.9)
    assert events == [(0, (0,), "shutdown")]
    clock.tick(0.1)
    node = sim.nodes.get_node(PROJECT, ZONE, "node")
    assert (node.state, node.health) == (NodeState.READY, "HEALTHY")
    assert events[1:] == [(0, (0,), "boot")]
    assert sim.queued_resources.get_queued_resource(PROJECT, ZONE, "qr").state is QrState.ACTIVE


def test_stop_is_refused_for_multi_host_and_spot_nodes() -> None:
    """A v4-16 (two hosts) and a Spot node cannot stop: FAILED_PRECONDITION, nothing happens."""
    for accelerator_type, spot, reason in (("v4-16", False, "multi-host"), ("v5litepod-1", True, "Spot")):
        sim = active(SecondsClock(), accelerator_type, spot=spot)
        events = host_events(sim)
        error = refusal(lambda sim=sim: sim.node_power.stop_node(PROJECT, ZONE, "node"))
        assert error.code is Code.FAILED_PRECONDITION and reason in str(error)
        assert sim.nodes.get_node(PROJECT, ZONE, "node").state is NodeState.READY
        assert events == []


def test_stop_and_start_need_the_right_state_and_an_existing_node() -> None:
    """Start of a READY node, stop of a STOPPED one: FAILED_PRECONDITION; an unknown node: NOT_FOUND."""
    sim = active(SecondsClock())
    assert refusal(lambda: sim.node_power.start_node(PROJECT, ZONE, "node")).code is Code.FAILED_PRECONDITION
    sim.node_power.stop_node(PROJECT, ZONE, "node")
    assert refusal(lambda: sim.node_power.stop_node(PROJECT, ZONE, "node")).code is Code.FAILED_PRECONDITION
    assert refusal(lambda: sim.node_power.stop_node(PROJECT, ZONE, "other")).code is Code.NOT_FOUND


def test_a_start_pending_when_the_queued_resource_is_deleted_never_boots() -> None:
    """Deleting the QR settles the STARTING node: no BOOT comes later."""
    clock = SecondsClock()
    sim = active(clock)
    events = host_events(sim)
    sim.node_power.stop_node(PROJECT, ZONE, "node")
    sim.node_power.start_node(PROJECT, ZONE, "node")
    sim.queued_resources.delete_queued_resource(PROJECT, ZONE, "qr", force=True)
    clock.tick(10.0)
    assert events == [(0, (0,), "shutdown")]


def test_simulated_maintenance_event_runs_the_maintenance_of_dev_fault() -> None:
    """simulate_maintenance_event: the event now, SHUTDOWN after the notice, BOOT and NONE after
    maintenance_seconds, as `maintenance` does; a second one while it runs is refused."""
    clock = SecondsClock()
    sim = active(clock)
    events = host_events(sim)
    operation = sim.node_power.simulate_maintenance_event(PROJECT, ZONE, "node", [0])
    assert operation.done and operation.verb == "simulateMaintenanceEvent"
    assert sim.nodes.get_node(PROJECT, ZONE, "node").maintenance_event == MAINTENANCE_TERMINATE
    assert (
        refusal(lambda: sim.node_power.simulate_maintenance_event(PROJECT, ZONE, "node")).code
        is Code.FAILED_PRECONDITION
    )
    clock.tick(5.0)
    assert sim.nodes.get_node(PROJECT, ZONE, "node").state is NodeState.REPAIRING
    assert events == [(0, (0,), "shutdown")]
    clock.tick(10.0)
    node = sim.nodes.get_node(PROJECT, ZONE, "node")
    assert (node.state, node.maintenance_event) == (NodeState.READY, MAINTENANCE_NONE)
    assert events[1:] == [(0, (0,), "boot")]


def test_simulated_maintenance_refuses_workers_the_node_has_not_and_stopped_nodes() -> None:
    """Worker 1 of a one-host node: INVALID_ARGUMENT; a STOPPED node cannot be maintained, by
    gcloud or by dev fault, nor rebooted (no host of it is up): FAILED_PRECONDITION."""
    sim = active(SecondsClock())
    assert (
        refusal(lambda: sim.node_power.simulate_maintenance_event(PROJECT, ZONE, "node", [1])).code
        is Code.INVALID_ARGUMENT
    )
    sim.node_power.stop_node(PROJECT, ZONE, "node")
    assert (
        refusal(lambda: sim.node_power.simulate_maintenance_event(PROJECT, ZONE, "node")).code
        is Code.FAILED_PRECONDITION
    )
    assert refusal(lambda: sim.nodes.maintenance("qr")).code is Code.FAILED_PRECONDITION
    assert refusal(lambda: sim.nodes.reboot("qr")).code is Code.FAILED_PRECONDITION
    assert sim.nodes.get_node(PROJECT, ZONE, "node").state is NodeState.STOPPED


def api_get(api: SimulatorApi, path: str, query: dict[str, list[str]] | None = None) -> tuple[int, dict[str, Any]]:
    return api.handle("GET", path, query or {}, b"")


def test_accelerator_types_come_from_the_families_with_their_topologies() -> None:
    """Every listed type parses, has its family's config type and a topology of its chips; v7x is absent."""
    offered = {name: (config, topology) for name, config, topology in offered_accelerator_types()}
    assert offered["v4-32"] == ("V4", "2x2x4")
    assert offered["v5litepod-8"] == ("V5LITE_POD", "2x4")
    assert offered["v2-8"] == ("V2", "2x2")
    assert not [name for name in offered if name.startswith("v7x")]


def test_catalog_paths_of_v1_and_v2_answer_as_gcloud_reads_them() -> None:
    """v2 acceleratorTypes and runtimeVersions, v1 acceleratorTypes and tensorflowVersions, and
    locations list and get; an unknown type is NOT_FOUND, and pages follow pageSize."""
    api = SimulatorApi(Simulator(QUICK))
    base = f"projects/{PROJECT}/locations/{ZONE}"
    status, v2_type = api_get(api, f"/v2/{base}/acceleratorTypes/v4-8")
    assert status == 200 and v2_type["acceleratorConfigs"] == [{"type": "V4", "topology": "2x2x1"}]
    status, v1_type = api_get(api, f"/v1/{base}/acceleratorTypes/v4-8")
    assert v1_type == {"name": f"{base}/acceleratorTypes/v4-8", "type": "v4-8"}
    status, _ = api_get(api, f"/v2/{base}/acceleratorTypes/v9-8")
    assert status == 404
    status, runtimes = api_get(api, f"/v2/{base}/runtimeVersions")
    assert {"name": f"{base}/runtimeVersions/tpu-ubuntu2204-base", "version": "tpu-ubuntu2204-base"} in runtimes[
        "runtimeVersions"
    ]
    status, tensorflow = api_get(api, f"/v1/{base}/tensorflowVersions")
    assert status == 200 and tensorflow["tensorflowVersions"]
    status, first = api_get(api, f"/v1/projects/{PROJECT}/locations", {"pageSize": ["2"]})
    assert len(first["locations"]) == 2 and first["nextPageToken"]
    status, location = api_get(api, f"/v1/{base}")
    assert location["locationId"] == ZONE
    assert api_get(api, f"/v1/projects/{PROJECT}/locations/mars-north1-a")[0] == 404


def test_zones_named_in_the_config_are_listed_as_locations() -> None:
    """A capacity pool in a zone off Google's table makes that zone a location too."""
    api = SimulatorApi(Simulator(dataclasses.replace(QUICK, capacity={"v4@lab-zone1-a": 8})))
    _, listed = api_get(api, f"/v2/projects/{PROJECT}/locations")
    assert "lab-zone1-a" in json.dumps(listed)


def test_stop_and_simulated_maintenance_answer_operations_on_their_paths() -> None:
    """POST v2 nodes/N:stop and :start, and v2alpha1 nodes/N:simulateMaintenanceEvent with workerIds
    as strings, answer done operations; the v2alpha1 operation can be read back."""
    clock = SecondsClock()
    sim = active(clock)
    api = SimulatorApi(sim)
    node = f"projects/{PROJECT}/locations/{ZONE}/nodes/node"
    status, stopped = api.handle("POST", f"/v2/{node}:stop", {}, b"{}")
    assert status == 200 and stopped["done"] is True and stopped["response"]["state"] == "STOPPED"
    status, started = api.handle("POST", f"/v2/{node}:start", {}, b"{}")
    assert status == 200 and started["response"]["state"] == "STARTING"
    clock.tick(2.0)
    status, simulated = api.handle("POST", f"/v2alpha1/{node}:simulateMaintenanceEvent", {}, b'{"workerIds": ["0"]}')
    assert status == 200 and simulated["done"] is True
    status, again = api_get(api, f"/v2alpha1/{simulated['name']}")
    assert status == 200 and again["name"] == simulated["name"]
    status, _ = api.handle("POST", f"/v2alpha1/{node}:simulateMaintenanceEvent", {}, b'{"workerIds": ["x"]}')
    assert status == 400

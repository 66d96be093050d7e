"""Maintenance announced ahead on the TPU simulator's nodes (issue 28): each node's `upcomingMaintenance`
and its hosts' `instance/upcoming-maintenance` name the window; when it starts the hosts go down as in a
maintenance now, and the notice clears once it is over."""

from __future__ import annotations

import dataclasses
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.cloud import tpu_v2alpha1

from tpujobs.adapters.tpu import build_client
from tpujobs.local.simulator import (
    Code,
    JsonStateFile,
    NodeState,
    QrState,
    QueuedResourceRequest,
    Simulator,
    SimulatorConfig,
    SimulatorError,
    SimulatorServer,
    SliceRequest,
)
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.simulator.metadata import MetadataService, lookup, metadata_url
from tpujobs.local.testing import SecondsClock, wait_for

PROJECT, ZONE = "proj", "us-central2-b"
WALL = 1_700_000_000.0  # 2023-11-14T22:13:20Z
QUICK = SimulatorConfig(
    accept_seconds=0.0, waiting_seconds=1.0, provisioning_seconds=2.0, maintenance_seconds=7.0, deleting_seconds=1.0
)


def two_slices() -> QueuedResourceRequest:
    return QueuedResourceRequest(
        slices=(SliceRequest("v4-16", "tpu-ubuntu2204-base", node_id_prefix="s", node_count=2),)
    )


@pytest.fixture
def clock() -> SecondsClock:
    return SecondsClock()


@pytest.fixture
def sim(clock: SecondsClock) -> Simulator:
    simulator = Simulator(QUICK, clock=clock, wall_clock=lambda: WALL)
    simulator.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", two_slices())
    clock.tick(3.0)
    assert simulator.queued_resources.get_queued_resource(PROJECT, ZONE, "qr").state is QrState.ACTIVE
    return simulator


def host_events(sim: Simulator) -> list[tuple[int, tuple[int, ...], str]]:
    events: list[tuple[int, tuple[int, ...], str]] = []
    sim.on_hosts.append(lambda e: events.append((e.slice_index, e.workers, e.action.value)))
    return events


def test_a_window_is_announced_on_one_slice_then_taken_down_then_cleared(sim: Simulator, clock: SecondsClock) -> None:
    """Slice 1, 100 s ahead, 600 s long: its node and both hosts say so, slice 0 says nothing and
    instance/maintenance-event stays NONE; at the window the hosts go down (ONGOING), after it READY and cleared."""
    events = host_events(sim)
    (node,) = sim.nodes.schedule_maintenance_window("qr", 1, notice_seconds=100.0, window_seconds=600.0)
    assert node.node_id == "s-1"
    assert node.upcoming_maintenance == {
        "type": "SCHEDULED",
        "canReschedule": True,
        "windowStartTime": "2023-11-14T22:15:00.000000Z",
        "windowEndTime": "2023-11-14T22:25:00.000000Z",
        "latestWindowStartTime": "2023-11-14T22:15:00.000000Z",
        "maintenanceStatus": "PENDING",
    }
    for worker in (0, 1):
        said = json.loads(lookup(node, worker, "instance/upcoming-maintenance").body)
        assert (said["window_start_time"], said["maintenance_status"]) == ("2023-11-14T22:15:00.000000Z", "PENDING")
        assert lookup(node, worker, "instance/maintenance-event").body == "NONE"
    quiet = sim.nodes.get_node(PROJECT, ZONE, "s-0")
    assert quiet.upcoming_maintenance is None and lookup(quiet, 0, "instance/upcoming-maintenance").body == "NONE"
    with pytest.raises(SimulatorError) as busy:
        sim.nodes.reboot("qr", 1)
    assert busy.value.code is Code.FAILED_PRECONDITION

    clock.tick(99.0)
    assert sim.nodes.get_node(PROJECT, ZONE, "s-1").state is NodeState.READY and events == []
    clock.tick(1.0)
    down = sim.nodes.get_node(PROJECT, ZONE, "s-1")
    assert (down.state, down.health) == (NodeState.REPAIRING, "UNHEALTHY_MAINTENANCE")
    assert down.upcoming_maintenance is not None and down.upcoming_maintenance["maintenanceStatus"] == "ONGOING"
    assert events == [(1, (0, 1), "shutdown")]
    clock.tick(7.0)
    back = sim.nodes.get_node(PROJECT, ZONE, "s-1")
    assert (back.state, back.upcoming_maintenance) == (NodeState.READY, None)
    assert lookup(back, 1, "instance/upcoming-maintenance").body == "NONE"
    assert events[1:] == [(1, (0, 1), "boot")]


def test_a_window_needs_a_running_slice_a_sane_length_and_no_other_step(sim: Simulator, clock: SecondsClock) -> None:
    """A negative notice or an empty window is INVALID_ARGUMENT; a node already announced, FAILED_PRECONDITION."""
    for notice, window in ((-1.0, 60.0), (60.0, 0.0)):
        with pytest.raises(SimulatorError) as wrong:
            sim.nodes.schedule_maintenance_window("qr", None, notice, window)
        assert wrong.value.code is Code.INVALID_ARGUMENT
    sim.nodes.schedule_maintenance_window("qr", 0, 60.0, 60.0)
    with pytest.raises(SimulatorError) as again:
        sim.nodes.schedule_maintenance_window("qr", None, 60.0, 60.0)
    assert again.value.code is Code.FAILED_PRECONDITION
    assert sim.nodes.get_node(PROJECT, ZONE, "s-1").upcoming_maintenance is None  # refused as a whole


def test_the_metadata_server_answers_the_window_as_json_too(sim: Simulator) -> None:
    """`?alt=json` (what the agent asks): `"NONE"` before, the window's object after."""
    service = MetadataService(sim.node_updates.host_node, changes=sim)
    path = metadata_url("", PROJECT, ZONE, "s-0", 0) + "/instance/upcoming-maintenance"
    flavor = {"Metadata-Flavor": "Google"}
    before = service.answer(path, {"alt": ["json"]}, flavor)
    assert (before.body, before.content_type) == ('"NONE"', "application/json")
    sim.nodes.schedule_maintenance_window("qr", 0, 60.0, 60.0)
    after = json.loads(service.answer(path, {"alt": ["json"]}, flavor).body)
    assert after["type"] == "SCHEDULED" and after["window_end_time"] == "2023-11-14T22:15:20.000000Z"


@pytest.fixture
def server() -> Iterator[SimulatorServer]:
    config = SimulatorConfig(waiting_seconds=0.01, provisioning_seconds=0.05, tick_seconds=0.01)
    with SimulatorServer(config, run_workers=False) as running:
        running.simulator.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", two_slices())
        wait_for(
            lambda: running.simulator.queued_resources.get_queued_resource(PROJECT, ZONE, "qr").state is QrState.ACTIVE
        )
        yield running


def get_json(url: str) -> str:
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Metadata-Flavor": "Google"}), timeout=5) as got:
        return str(got.read().decode())


def test_the_control_verb_shows_on_v2alpha1_nodes_and_the_hosts_metadata(server: SimulatorServer) -> None:
    """POST :upcoming-maintenance; v2alpha1's nodes.get and nodes.list (read as tpu_v2alpha1 messages, a
    field mask included) show it, v2's REST client still reads its nodes, and each host's key says it."""
    answer = SimulatorControl(server.url).upcoming_maintenance(ZONE, "qr", notice=3600, window=1200, project=PROJECT)
    assert [n["upcomingMaintenance"]["maintenanceStatus"] for n in answer["nodes"]] == ["PENDING", "PENDING"]
    base = f"{server.url}/v2alpha1/projects/{PROJECT}/locations/{ZONE}/nodes"
    node = tpu_v2alpha1.Node.from_json(get_json(f"{base}/s-1"), ignore_unknown_fields=True)
    upcoming = node.upcoming_maintenance
    assert (upcoming.type_, upcoming.maintenance_status, upcoming.can_reschedule) == (
        tpu_v2alpha1.UpcomingMaintenance.MaintenanceType.SCHEDULED,
        tpu_v2alpha1.UpcomingMaintenance.MaintenanceStatus.PENDING,
        True,
    )
    masked = get_json(f"{base}?fields=nodes.name,nodes.upcomingMaintenance.windowStartTime,nextPageToken")
    listed = tpu_v2alpha1.ListNodesResponse.from_json(masked)
    assert [n.upcoming_maintenance.window_start_time for n in listed.nodes] == [upcoming.window_start_time] * 2
    v2_nodes = build_client(server.url).list_nodes(parent=f"projects/{PROJECT}/locations/{ZONE}")
    assert sorted(n.name.rsplit("/", 1)[-1] for n in v2_nodes) == ["s-0", "s-1"]
    said = json.loads(get_json(metadata_url(server.url, PROJECT, ZONE, "s-0", 1) + "/instance/upcoming-maintenance"))
    assert said["window_start_time"] == upcoming.window_start_time


def test_a_window_that_starts_takes_the_hosts_down_on_the_server_clock(server: SimulatorServer) -> None:
    """notice 0.2 s on slice 0: its hosts shut down, then boot again with the notice gone; slice 1 is left be."""
    sim = server.simulator
    sim.fault_plan.reconfigure(dataclasses.replace(sim.config, maintenance_seconds=0.3))
    events = host_events(sim)
    SimulatorControl(server.url).upcoming_maintenance(ZONE, "qr", notice=0.2, window=60, slice_index=0)
    wait_for(lambda: len(events) == 2, what="the hosts down and up again")
    assert events == [(0, (0, 1), "shutdown"), (0, (0, 1), "boot")]
    assert sim.nodes.get_node(PROJECT, ZONE, "s-0").upcoming_maintenance is None


def test_an_announced_window_survives_a_restart_of_the_simulator(clock: SecondsClock, tmp_path: Path) -> None:
    """Saved with the node: after a restart the node still shows it, and its window still comes."""
    store = JsonStateFile(tmp_path / "state.json")
    first = Simulator(QUICK, clock=clock, wall_clock=lambda: WALL, store=store)
    first.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", two_slices())
    clock.tick(3.0)
    first.nodes.schedule_maintenance_window("qr", 0, 50.0, 60.0)
    again = Simulator(QUICK, clock=clock, wall_clock=lambda: WALL, store=store)
    shown = again.nodes.get_node(PROJECT, ZONE, "s-0").upcoming_maintenance
    assert shown is not None and shown["windowStartTime"] == "2023-11-14T22:14:10.000000Z"
    clock.tick(50.0)
    assert again.nodes.get_node(PROJECT, ZONE, "s-0").state is NodeState.REPAIRING

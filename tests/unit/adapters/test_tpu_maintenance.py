"""The TPU API adapter's zone listing carries the maintenance Google announced on the nodes of ACTIVE
queued resources (`upcomingMaintenance`, read through v2alpha1), and a failed read of it never fails
the listing (issue 28)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from google.cloud import tpu_v2alpha1

from tpujobs.adapters.tpu import CloudTpu, build_client
from tpujobs.adapters.tpu_maintenance import NodeMaintenance, windows_of
from tpujobs.local.simulator import (
    QrState,
    QueuedResourceRequest,
    SimulatorConfig,
    SimulatorServer,
    SliceRequest,
)
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.testing import wait_for

PROJECT, ZONE = "proj", "us-central2-b"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"


def alpha_node(node_id: str, owner: str, **upcoming: object) -> tpu_v2alpha1.Node:
    node = tpu_v2alpha1.Node(name=f"{PARENT}/nodes/{node_id}", queued_resource=f"{PARENT}/queuedResources/{owner}")
    if upcoming:
        node.upcoming_maintenance = tpu_v2alpha1.UpcomingMaintenance(**upcoming)
    return node


def test_nodes_with_upcoming_maintenance_become_node_and_window_start_per_queued_resource() -> None:
    """The window start, else the latest start; a node with none announced, or with no queued resource, is left out."""
    nodes = [
        alpha_node("a-1", "a", window_start_time="2026-12-01T04:00:00Z", type_="SCHEDULED"),
        alpha_node("a-0", "a", latest_window_start_time="2026-12-02T04:00:00Z", maintenance_status="PENDING"),
        alpha_node("b", "b"),
        tpu_v2alpha1.Node(name=f"{PARENT}/nodes/lone", upcoming_maintenance={"window_start_time": "x"}),
    ]
    assert windows_of(iter(nodes)) == {
        "a": (("a-0", "2026-12-02T04:00:00Z"), ("a-1", "2026-12-01T04:00:00Z")),
    }


@pytest.fixture
def server() -> Iterator[SimulatorServer]:
    """Two queued resources: `busy` (two slices, ACTIVE) and `late` (waiting for chips it will never get);
    one node per list page, so the v2alpha1 read must follow the pages."""
    config = SimulatorConfig(
        waiting_seconds=0.01,
        provisioning_seconds=0.05,
        tick_seconds=0.01,
        default_page_size=1,
        capacity={f"v4@{ZONE}": 8},
    )
    with SimulatorServer(config, run_workers=False) as running:
        sim = running.simulator
        busy = SliceRequest("v4-8", "tpu-ubuntu2204-base", node_id_prefix="busy", node_count=2)
        sim.queued_resources.create_queued_resource(PROJECT, ZONE, "busy", QueuedResourceRequest(slices=(busy,)))
        sim.queued_resources.create_queued_resource(
            PROJECT, ZONE, "late", QueuedResourceRequest(slices=(SliceRequest("v4-8", "rt", node_id="late"),))
        )
        wait_for(lambda: sim.queued_resources.get_queued_resource(PROJECT, ZONE, "busy").state is QrState.ACTIVE)
        yield running


def by_name(tpu: CloudTpu) -> dict[str, tuple[str, tuple[tuple[str, str], ...]]]:
    return {s.name: (s.state, s.maintenance) for s in tpu.list_capacity(ZONE)}


def test_the_listing_gives_an_active_slices_maintenance_from_its_nodes(server: SimulatorServer) -> None:
    """Announced on both slices of `busy` (one page each): the listing says (node, window start) of each;
    before, nothing."""
    tpu = CloudTpu(build_client(server.url), PROJECT)
    assert by_name(tpu)["busy"] == ("ACTIVE", ())
    answer = SimulatorControl(server.url).upcoming_maintenance(ZONE, "busy", notice=3600, window=600, project=PROJECT)
    start = answer["nodes"][0]["upcomingMaintenance"]["windowStartTime"]
    listed = by_name(tpu)
    assert listed["busy"] == ("ACTIVE", (("busy-0", start), ("busy-1", start)))
    assert listed["late"][1] == ()
    assert tpu.status(ZONE, "busy") is not None  # the one-resource read is v2's alone


class Counting:
    """A v2alpha1 node lister that counts its calls and fails, or yields nothing."""

    def __init__(self, fail: bool) -> None:
        self.calls = 0
        self.fail = fail

    def __call__(self, parent: str) -> Iterator[tpu_v2alpha1.Node]:
        self.calls += 1
        if self.fail:
            raise ConnectionError("v2alpha1 is down")
        return iter(())


def test_a_failed_v2alpha1_read_leaves_maintenance_empty_and_the_listing_whole(
    server: SimulatorServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The listing is what v2 says, maintenance (), and the failure is logged; one read per listing."""
    SimulatorControl(server.url).upcoming_maintenance(ZONE, "busy", project=PROJECT)
    failing = Counting(fail=True)
    tpu = CloudTpu(build_client(server.url), PROJECT, maintenance=NodeMaintenance(failing))
    listed = by_name(tpu)
    assert listed["busy"] == ("ACTIVE", ()) and "late" in listed
    assert failing.calls == 1
    assert "could not read upcomingMaintenance" in caplog.text


def test_a_zone_with_nothing_active_is_not_read_through_v2alpha1(server: SimulatorServer) -> None:
    """No ACTIVE queued resource (busy deleted, late waiting): no v2alpha1 call at all."""
    sim = server.simulator
    sim.queued_resources.delete_queued_resource(PROJECT, ZONE, "busy", force=True)
    wait_for(lambda: "busy" not in {qr.qr_id for qr in sim.state().queued_resources})
    counting = Counting(fail=False)
    tpu = CloudTpu(build_client(server.url), PROJECT, maintenance=NodeMaintenance(counting))
    assert [s.state for s in tpu.list_capacity(ZONE)] != ["ACTIVE"]
    assert counting.calls == 0


def test_importing_the_adapter_does_not_import_v2alpha1() -> None:
    """Cold start: tpu_v2alpha1 (~0.4 s) is imported by the first listing that reads it, not by the import."""
    probe = "import sys, tpujobs.adapters.tpu; print('google.cloud.tpu_v2alpha1' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "False"

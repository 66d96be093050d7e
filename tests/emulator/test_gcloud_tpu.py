"""The real gcloud CLI as a client of the TPU simulator (CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU): a client
that no one here wrote asks the paths and reads the answers as it does from Google. Each test skips,
saying why, where gcloud is not installed."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import google.auth.credentials
import pytest
from google.cloud import tpu_v2

from tpujobs.local.gcloud_cli import Gcloud as GcloudCli
from tpujobs.local.simulator import SimulatorConfig, SimulatorServer
from tpujobs.local.simulator.catalog import RUNTIME_VERSIONS, TENSORFLOW_VERSIONS
from tpujobs.local.simulator.records import MAINTENANCE_TERMINATE, NodeState
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.emulator

PROJECT = "tpujobs-test"
ZONE = "us-central2-b"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"
FAST = SimulatorConfig(
    waiting_seconds=0.02,
    provisioning_seconds=0.02,
    tick_seconds=0.01,
    reboot_seconds=0.2,
    delete_grace_seconds=0.5,
    # Long enough that gcloud (seconds to start) sees the notice before the hosts go down.
    maintenance_notice_seconds=60.0,
)
BOOT_COUNTING = """#!/bin/bash
cd "$TPUJOBS_WORKDIR"
echo booted >> boots
trap 'echo term >> ../term; exit 0' TERM
while :; do sleep 0.1; done
"""

Gcloud = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SimulatorServer]:
    with SimulatorServer(FAST, workers_root=tmp_path / "workers") as running:
        yield running


@pytest.fixture
def gcloud(server: SimulatorServer, tmp_path: Path) -> Gcloud:
    """Run gcloud against the simulator: a scratch config, a fake token, prompts off."""
    cli = GcloudCli.against({"TPU": f"{server.url}/"}, tmp_path / "gcloud", PROJECT)
    if cli is None:
        pytest.skip("gcloud is not installed on this machine")
    return cli.run


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def node_state(server: SimulatorServer) -> NodeState | None:
    """The node's state, or None while it does not exist yet."""
    found = [node for node in server.simulator.state().nodes if node.node_id == "node"]
    return found[0].state if found else None


def active_node(server: SimulatorServer, accelerator_type: str = "v5litepod-1", *, spot: bool = False) -> None:
    """An ACTIVE QR 'qr' with one node 'node', whose hosts run BOOT_COUNTING."""
    client = tpu_v2.TpuClient(
        transport="rest",
        client_options={"api_endpoint": server.url},
        credentials=google.auth.credentials.AnonymousCredentials(),
    )
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(
        parent=PARENT,
        node_id="node",
        node=tpu_v2.Node(
            accelerator_type=accelerator_type,
            runtime_version="tpu-ubuntu2204-base",
            metadata={"startup-script": BOOT_COUNTING},
        ),
    )
    resource = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]))
    if spot:
        resource.spot = tpu_v2.QueuedResource.Spot()
    client.create_queued_resource(parent=PARENT, queued_resource_id="qr", queued_resource=resource).result(timeout=10)
    wait_for(lambda: node_state(server) is NodeState.READY, timeout=10)
    hosts = len(server.simulator.nodes.get_node(PROJECT, ZONE, "node").host_addresses)
    wait_for(lambda: len(server.workers("qr")) == hosts and all(w.alive for w in server.workers("qr")), timeout=10)


def test_gcloud_stops_a_node_whose_host_gets_sigterm_and_starts_it_to_boot_again(
    server: SimulatorServer, gcloud: Gcloud
) -> None:
    """tpu-vm stop: the node is STOPPED and its host's script gets SIGTERM; tpu-vm start: READY
    again, and the startup script runs a second time on the same disk."""
    active_node(server)
    (first,) = server.workers("qr")
    ok(gcloud("compute", "tpus", "tpu-vm", "stop", "node", f"--zone={ZONE}"))
    described = json.loads(
        ok(gcloud("compute", "tpus", "tpu-vm", "describe", "node", f"--zone={ZONE}", "--format=json"))
    )
    assert described["state"] == "STOPPED"
    wait_for(lambda: (first.scratch / "term").exists(), what="SIGTERM of the stop")
    assert not server.workers("qr")[0].alive
    ok(gcloud("compute", "tpus", "tpu-vm", "start", "node", f"--zone={ZONE}"))
    wait_for(lambda: node_state(server) is NodeState.READY, timeout=10)
    wait_for(lambda: server.workers("qr")[0].boot == 2, timeout=10, what="the host's second boot")
    (second,) = server.workers("qr")
    assert second.alive and second.scratch == first.scratch
    wait_for(lambda: (second.workdir / "boots").read_text() == "booted\nbooted\n", what="the second boot")


def test_gcloud_stop_of_a_multi_host_slice_is_refused_and_nothing_stops(
    server: SimulatorServer, gcloud: Gcloud
) -> None:
    """tpu-vm stop of a v4-16 (two hosts) fails with Google's reason; the node stays READY."""
    active_node(server, "v4-16")
    refused = gcloud("compute", "tpus", "tpu-vm", "stop", "node", f"--zone={ZONE}")
    assert refused.returncode != 0
    assert "multi-host" in refused.stderr and "FAILED_PRECONDITION" in refused.stderr
    assert server.simulator.nodes.get_node(PROJECT, ZONE, "node").state is NodeState.READY
    assert all(w.alive for w in server.workers("qr"))


def test_gcloud_stop_of_a_spot_node_is_refused(server: SimulatorServer, gcloud: Gcloud) -> None:
    """tpu-vm stop of a Spot node fails: Spot TPUs are deleted, not stopped."""
    active_node(server, spot=True)
    refused = gcloud("compute", "tpus", "tpu-vm", "stop", "node", f"--zone={ZONE}")
    assert refused.returncode != 0 and "Spot" in refused.stderr
    assert server.simulator.nodes.get_node(PROJECT, ZONE, "node").state is NodeState.READY


def test_gcloud_lists_accelerator_types_on_v1_and_v2(gcloud: Gcloud) -> None:
    """accelerator-types list (v1) and tpu-vm accelerator-types list (v2) show the families the
    TPU API serves, and describe one with its topology."""
    for group in (("compute", "tpus"), ("compute", "tpus", "tpu-vm")):
        listed = ok(gcloud(*group, "accelerator-types", "list", f"--zone={ZONE}", "--format=value(type)")).split()
        assert {"v4-8", "v4-16", "v5litepod-1", "v5p-8", "v6e-8", "v2-8", "v3-8"} <= set(listed)
        assert not any(name.startswith("v7x") for name in listed)  # Compute Engine only
    described = json.loads(
        ok(
            gcloud(
                "compute", "tpus", "tpu-vm", "accelerator-types", "describe", "v4-32", f"--zone={ZONE}", "--format=json"
            )
        )
    )
    assert described["acceleratorConfigs"] == [{"type": "V4", "topology": "2x2x4"}]


def test_gcloud_lists_runtime_and_tensorflow_versions(gcloud: Gcloud) -> None:
    """versions list asks v1's tensorflowVersions; tpu-vm versions list asks v2's runtimeVersions."""
    v1 = ok(gcloud("compute", "tpus", "versions", "list", f"--zone={ZONE}", "--format=value(version)")).split()
    assert sorted(v1) == sorted(TENSORFLOW_VERSIONS)
    v2 = ok(
        gcloud("compute", "tpus", "tpu-vm", "versions", "list", f"--zone={ZONE}", "--format=value(version)")
    ).split()
    assert sorted(v2) == sorted(RUNTIME_VERSIONS)


def test_gcloud_lists_locations(gcloud: Gcloud) -> None:
    """locations list (v1) names the TPU zones, the test's zone among them."""
    listed = ok(gcloud("compute", "tpus", "locations", "list", "--format=value(locationId)")).split()
    assert ZONE in listed and "europe-west4-a" in listed


def test_gcloud_alpha_simulates_a_maintenance_event_as_dev_fault_does(server: SimulatorServer, gcloud: Gcloud) -> None:
    """alpha tpu-vm simulate-maintenance-event: the node's instance/maintenance-event announces
    TERMINATE_ON_HOST_MAINTENANCE, as `tpujobs dev fault maintenance` does; a worker the node has
    not is refused."""
    active_node(server)
    ok(gcloud("alpha", "compute", "tpus", "tpu-vm", "simulate-maintenance-event", "node", f"--zone={ZONE}"))
    node = server.simulator.nodes.get_node(PROJECT, ZONE, "node")
    assert node.maintenance_event == MAINTENANCE_TERMINATE
    assert node.state is NodeState.READY  # the notice runs: hosts still up
    refused = gcloud(
        "alpha", "compute", "tpus", "tpu-vm", "simulate-maintenance-event", "node", f"--zone={ZONE}", "--workers=3"
    )
    assert refused.returncode != 0 and "workers 0..0" in refused.stderr

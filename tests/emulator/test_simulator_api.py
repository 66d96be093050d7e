"""The simulator through the real google-cloud-tpu REST client, as the control plane will call it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import google.auth.credentials
import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2
from google.longrunning import operations_pb2
from google.protobuf import empty_pb2, json_format

from tpujobs.simulator import SimulatorConfig, SimulatorServer

pytestmark = pytest.mark.emulator

PROJECT = "tpujobs-test"
ZONE = "us-central2-b"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"
RUNTIME = "tpu-ubuntu2204-base"
FAST = SimulatorConfig(
    waiting_seconds=0.02,
    provisioning_seconds=0.02,
    suspending_seconds=0.02,
    tick_seconds=0.01,
)


@pytest.fixture
def server() -> Iterator[SimulatorServer]:
    with SimulatorServer(FAST, run_workers=False) as running:
        yield running


@pytest.fixture
def client(server: SimulatorServer) -> tpu_v2.TpuClient:
    return tpu_v2.TpuClient(
        transport="rest",
        client_options={"api_endpoint": server.url},
        credentials=google.auth.credentials.AnonymousCredentials(),
    )


def control(server: SimulatorServer, path: str, body: dict[str, Any] | None = None) -> Any:
    """Call a /simulator/v1 endpoint; POST when there is a body."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        server.url + "/simulator/v1/" + path, data=data, method="POST" if data else "GET"
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def queued_resource(
    node_id: str = "node",
    accelerator_type: str = "v4-8",
    *,
    spot: bool = False,
    multislice: tuple[str, int] | None = None,
) -> tpu_v2.QueuedResource:
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(
        parent=PARENT,
        node=tpu_v2.Node(
            accelerator_type=accelerator_type,
            runtime_version=RUNTIME,
            labels={"tpujobs-job": "job-1"},
            metadata={"startup-script": "#!/bin/bash\necho hello"},
            scheduling_config=tpu_v2.SchedulingConfig(spot=spot),
        ),
    )
    if multislice:
        spec.multislice_params = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(
            node_id_prefix=multislice[0], node_count=multislice[1]
        )
    else:
        spec.node_id = node_id
    resource = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]))
    if spot:
        resource.spot = tpu_v2.QueuedResource.Spot()
    return resource


def wait_for(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def qr_state(client: tpu_v2.TpuClient, qr_id: str) -> tpu_v2.QueuedResourceState.State:
    return client.get_queued_resource(name=f"{PARENT}/queuedResources/{qr_id}").state.state


def make_active(client: tpu_v2.TpuClient, qr_id: str, resource: tpu_v2.QueuedResource) -> None:
    client.create_queued_resource(
        parent=PARENT, queued_resource_id=qr_id, queued_resource=resource
    ).result(timeout=5)
    wait_for(lambda: qr_state(client, qr_id) == tpu_v2.QueuedResourceState.State.ACTIVE)


def status_of(error: pytest.ExceptionInfo[exceptions.GoogleAPICallError]) -> str:
    """The google.rpc status name in the error body; REST clients pick exceptions by HTTP code only."""
    assert error.value.response is not None
    return str(error.value.response.json()["error"]["status"])


def test_created_queued_resource_can_be_read_back_and_becomes_active(
    client: tpu_v2.TpuClient,
) -> None:
    """create_queued_resource with an id, then get: the request echoed and the state ACTIVE."""
    operation = client.create_queued_resource(
        parent=PARENT,
        queued_resource_id="qr-1",
        queued_resource=queued_resource("node-1", spot=True),
    )
    created = operation.result(timeout=5)
    assert created.name == f"{PARENT}/queuedResources/qr-1"
    assert created.state.state == tpu_v2.QueuedResourceState.State.ACCEPTED
    assert operation.metadata.verb == "create"
    wait_for(lambda: qr_state(client, "qr-1") == tpu_v2.QueuedResourceState.State.ACTIVE)
    fetched = client.get_queued_resource(name=f"{PARENT}/queuedResources/qr-1")
    assert fetched.state.state_initiator == tpu_v2.QueuedResourceState.StateInitiator.USER
    assert "spot" in fetched
    spec = fetched.tpu.node_spec[0]
    assert (spec.parent, spec.node_id, spec.node.accelerator_type) == (PARENT, "node-1", "v4-8")
    assert spec.node.metadata["startup-script"].endswith("echo hello")


def test_list_queued_resources_pages_through_everything(client: tpu_v2.TpuClient) -> None:
    """page_size 2 over five QRs gives three pages and every QR once."""
    for i in range(5):
        client.create_queued_resource(
            parent=PARENT,
            queued_resource_id=f"qr-{i}",
            queued_resource=queued_resource(f"node-{i}"),
        )
    pager = client.list_queued_resources(
        request=tpu_v2.ListQueuedResourcesRequest(parent=PARENT, page_size=2)
    )
    pages = list(pager.pages)
    assert [len(page.queued_resources) for page in pages] == [2, 2, 1]
    assert [qr.name.rsplit("/", 1)[1] for page in pages for qr in page.queued_resources] == [
        f"qr-{i}" for i in range(5)
    ]


def test_creating_a_queued_resource_twice_is_a_conflict_with_status_already_exists(
    client: tpu_v2.TpuClient,
) -> None:
    """A second create with the same id is HTTP 409 ALREADY_EXISTS (the client raises Conflict)."""
    client.create_queued_resource(
        parent=PARENT, queued_resource_id="qr", queued_resource=queued_resource("a")
    )
    with pytest.raises(exceptions.Conflict) as duplicate:
        client.create_queued_resource(
            parent=PARENT, queued_resource_id="qr", queued_resource=queued_resource("b")
        )
    assert status_of(duplicate) == "ALREADY_EXISTS"


def test_reading_what_does_not_exist_is_not_found(client: tpu_v2.TpuClient) -> None:
    """get_queued_resource and get_node of unknown names raise NotFound."""
    with pytest.raises(exceptions.NotFound):
        client.get_queued_resource(name=f"{PARENT}/queuedResources/missing")
    with pytest.raises(exceptions.NotFound):
        client.get_node(name=f"{PARENT}/nodes/missing")


def test_force_delete_completes_its_operation_and_the_queued_resource_is_gone(
    client: tpu_v2.TpuClient,
) -> None:
    """delete with force: operation.result() returns Empty; then get is NotFound, nodes too."""
    make_active(client, "qr", queued_resource("node"))
    operation = client.delete_queued_resource(
        request=tpu_v2.DeleteQueuedResourceRequest(name=f"{PARENT}/queuedResources/qr", force=True)
    )
    assert operation.result(timeout=5) == empty_pb2.Empty()
    with pytest.raises(exceptions.NotFound):
        client.get_queued_resource(name=f"{PARENT}/queuedResources/qr")
    with pytest.raises(exceptions.NotFound):
        client.get_node(name=f"{PARENT}/nodes/node")


def test_delete_without_force_of_an_active_queued_resource_is_failed_precondition(
    client: tpu_v2.TpuClient,
) -> None:
    """An ACTIVE QR has nodes, so deleting it without force is HTTP 400 FAILED_PRECONDITION."""
    make_active(client, "qr", queued_resource("node"))
    with pytest.raises(exceptions.BadRequest) as refused:
        client.delete_queued_resource(name=f"{PARENT}/queuedResources/qr")
    assert status_of(refused) == "FAILED_PRECONDITION"


def test_nodes_of_a_multislice_request_can_be_read_and_listed(client: tpu_v2.TpuClient) -> None:
    """Two v5litepod-16 slices: nodes s-0 and s-1, READY, four endpoints each, listed a page at a time."""
    make_active(client, "qr", queued_resource(accelerator_type="v5litepod-16", multislice=("s", 2)))
    node = client.get_node(name=f"{PARENT}/nodes/s-1")
    assert node.state == tpu_v2.Node.State.READY
    assert node.health == tpu_v2.Node.Health.HEALTHY
    assert node.queued_resource == f"{PARENT}/queuedResources/qr"
    assert node.multislice_node
    assert node.labels["tpujobs-job"] == "job-1"
    assert [e.port for e in node.network_endpoints] == [8470] * 4
    pages = list(
        client.list_nodes(request=tpu_v2.ListNodesRequest(parent=PARENT, page_size=1)).pages
    )
    assert [n.name for page in pages for n in page.nodes] == [
        f"{PARENT}/nodes/s-0",
        f"{PARENT}/nodes/s-1",
    ]


@pytest.mark.parametrize("qr_id", ["Bad_Id", "ends-with-", "x" * 64])
def test_a_bad_queued_resource_id_is_invalid_argument(client: tpu_v2.TpuClient, qr_id: str) -> None:
    """Ids the TPU API refuses are HTTP 400 INVALID_ARGUMENT."""
    with pytest.raises(exceptions.BadRequest) as refused:
        client.create_queued_resource(
            parent=PARENT, queued_resource_id=qr_id, queued_resource=queued_resource()
        )
    assert status_of(refused) == "INVALID_ARGUMENT"


def test_an_unknown_accelerator_type_is_invalid_argument(client: tpu_v2.TpuClient) -> None:
    """An accelerator type the API does not offer is HTTP 400 INVALID_ARGUMENT."""
    with pytest.raises(exceptions.BadRequest) as refused:
        client.create_queued_resource(
            parent=PARENT,
            queued_resource_id="qr",
            queued_resource=queued_resource(accelerator_type="v4-12"),
        )
    assert status_of(refused) == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("status", "exception"),
    [(503, exceptions.ServiceUnavailable), (429, exceptions.TooManyRequests)],
)
def test_injected_api_errors_raise_the_client_exceptions(
    server: SimulatorServer,
    client: tpu_v2.TpuClient,
    status: int,
    exception: type[exceptions.GoogleAPICallError],
) -> None:
    """At api_error_rate 1 every TPU call fails with the configured status; control calls never do."""
    control(server, "config", {"api_error_rate": 1.0, "api_error_codes": [status]})
    with pytest.raises(exception):
        client.get_queued_resource(name=f"{PARENT}/queuedResources/anything")
    with pytest.raises(exception):
        client.create_queued_resource(
            parent=PARENT, queued_resource_id="qr", queued_resource=queued_resource()
        )
    assert control(server, "health") == {"ok": True}
    assert control(server, "state")["queuedResources"] == []


def test_preempt_control_endpoint_suspends_the_queued_resource(
    server: SimulatorServer, client: tpu_v2.TpuClient
) -> None:
    """POST :preempt makes the QR SUSPENDING then SUSPENDED by the SERVICE, its node PREEMPTED."""
    make_active(client, "qr", queued_resource("node", spot=True))
    answer = control(server, f"queuedResources/{ZONE}/qr:preempt", {})
    assert answer["state"]["state"] == "SUSPENDING"
    assert client.get_node(name=f"{PARENT}/nodes/node").state == tpu_v2.Node.State.PREEMPTED
    wait_for(lambda: qr_state(client, "qr") == tpu_v2.QueuedResourceState.State.SUSPENDED)
    suspended = client.get_queued_resource(name=f"{PARENT}/queuedResources/qr")
    assert suspended.state.state_initiator == tpu_v2.QueuedResourceState.StateInitiator.SERVICE


def test_fail_control_endpoint_fails_the_queued_resource_with_the_message(
    server: SimulatorServer, client: tpu_v2.TpuClient
) -> None:
    """POST :fail makes the QR FAILED with failed_data.error carrying the message."""
    make_active(client, "qr", queued_resource("node"))
    control(server, f"queuedResources/{ZONE}/qr:fail", {"message": "stockout", "code": 8})
    failed = client.get_queued_resource(name=f"{PARENT}/queuedResources/qr").state
    assert failed.state == tpu_v2.QueuedResourceState.State.FAILED
    assert (failed.failed_data.error.code, failed.failed_data.error.message) == (8, "stockout")


def test_kill_host_control_endpoint_puts_the_node_in_repair_and_leaves_the_qr_active(
    server: SimulatorServer, client: tpu_v2.TpuClient
) -> None:
    """POST :kill-host?slice=0&worker=1: node REPAIRING, UNHEALTHY_MAINTENANCE, QR still ACTIVE."""
    make_active(client, "qr", queued_resource("node", "v4-16"))
    answer = control(server, f"queuedResources/{ZONE}/qr:kill-host?slice=0&worker=1", {})
    assert answer["name"] == f"{PARENT}/nodes/node"
    node = client.get_node(name=f"{PARENT}/nodes/node")
    assert node.state == tpu_v2.Node.State.REPAIRING
    assert node.health == tpu_v2.Node.Health.UNHEALTHY_MAINTENANCE
    assert "Worker 1" in node.health_description
    assert qr_state(client, "qr") == tpu_v2.QueuedResourceState.State.ACTIVE


@pytest.mark.parametrize(
    ("query", "status"),
    [("slice=1&worker=0", "INVALID_ARGUMENT"), ("slice=0&worker=2", "INVALID_ARGUMENT")],
)
def test_kill_host_of_a_host_that_does_not_exist_is_invalid_argument(
    server: SimulatorServer, client: tpu_v2.TpuClient, query: str, status: str
) -> None:
    """A slice or worker index beyond the QR's nodes and hosts is HTTP 400 INVALID_ARGUMENT."""
    make_active(client, "qr", queued_resource("node", "v4-16"))
    with pytest.raises(urllib.error.HTTPError) as refused:
        control(server, f"queuedResources/{ZONE}/qr:kill-host?{query}", {})
    assert refused.value.code == 400
    assert json.load(refused.value)["error"]["status"] == status


def test_kill_host_of_a_suspended_queued_resource_is_failed_precondition(
    server: SimulatorServer, client: tpu_v2.TpuClient
) -> None:
    """Only an ACTIVE QR has hosts to kill: after preemption it is HTTP 400 FAILED_PRECONDITION."""
    make_active(client, "qr", queued_resource("node", spot=True))
    control(server, f"queuedResources/{ZONE}/qr:preempt", {})
    with pytest.raises(urllib.error.HTTPError) as refused:
        control(server, f"queuedResources/{ZONE}/qr:kill-host", {})
    assert json.load(refused.value)["error"]["status"] == "FAILED_PRECONDITION"


def test_without_workers_the_state_and_workers_endpoints_list_no_processes(
    server: SimulatorServer, client: tpu_v2.TpuClient
) -> None:
    """run_workers=False: an ACTIVE QR has no processes; state["workers"] and :workers are empty."""
    make_active(client, "qr", queued_resource("node"))
    assert control(server, "state")["workers"] == {}
    assert control(server, f"queuedResources/{ZONE}/qr:workers") == {"workers": []}
    assert server.workers("qr") == ()


def test_grace_periods_are_configurable_and_refuse_negative_values(server: SimulatorServer) -> None:
    """POST config sets preemption_grace_seconds and delete_grace_seconds; a negative one is 400."""
    answer = control(server, "config", {"preemption_grace_seconds": 1, "delete_grace_seconds": 0.5})
    assert (answer["preemption_grace_seconds"], answer["delete_grace_seconds"]) == (1.0, 0.5)
    with pytest.raises(urllib.error.HTTPError) as refused:
        control(server, "config", {"preemption_grace_seconds": -1})
    assert refused.value.code == 400


def test_everything_the_simulator_renders_is_valid_tpu_api_json(
    server: SimulatorServer, client: tpu_v2.TpuClient
) -> None:
    """Every QR, node and operation in every reachable state parses strictly into the API's types."""
    control(
        server,
        "config",
        {"capacity": {f"v6e@{ZONE}": 0}, "deleting_seconds": 60, "suspending_seconds": 60},
    )
    make_active(client, "active", queued_resource("a"))
    make_active(client, "preempted", queued_resource("b", spot=True))
    make_active(client, "failed", queued_resource("c"))
    make_active(client, "deleting", queued_resource("d"))
    make_active(client, "repairing", queued_resource("r", "v4-16"))
    control(server, f"queuedResources/{ZONE}/repairing:kill-host?worker=1", {})
    client.create_queued_resource(
        parent=PARENT, queued_resource_id="waiting", queued_resource=queued_resource("e", "v6e-8")
    )
    control(server, f"queuedResources/{ZONE}/preempted:preempt", {})
    control(server, f"queuedResources/{ZONE}/failed:fail", {"message": "no"})
    client.delete_queued_resource(
        request=tpu_v2.DeleteQueuedResourceRequest(
            name=f"{PARENT}/queuedResources/deleting", force=True
        )
    )
    state = control(server, "state")
    states = {qr["state"]["state"] for qr in state["queuedResources"]}
    assert {"ACTIVE", "SUSPENDING", "FAILED", "DELETING", "WAITING_FOR_RESOURCES"} <= states
    assert {"READY", "PREEMPTED", "DELETING", "REPAIRING"} <= {n["state"] for n in state["nodes"]}
    for qr in state["queuedResources"]:
        tpu_v2.QueuedResource.from_json(json.dumps(qr), ignore_unknown_fields=False)
    for node in state["nodes"]:
        tpu_v2.Node.from_json(json.dumps(node), ignore_unknown_fields=False)
    for operation in state["operations"]:  # strict, as the client parses polled operations
        json_format.Parse(
            json.dumps(operation), operations_pb2.Operation(), ignore_unknown_fields=False
        )


def test_command_line_prints_its_url_serves_and_stops_on_sigterm() -> None:
    """python -m tpujobs.simulator prints one listening line, answers health and exits 0 on SIGTERM."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tpujobs.simulator", "--port", "0", "--capacity", f"v4@{ZONE}=32"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        prefix = "tpujobs-simulator listening on "
        assert line.startswith(prefix + "http://127.0.0.1:")
        url = line.removeprefix(prefix)
        with urllib.request.urlopen(url + "/simulator/v1/config", timeout=5) as response:
            assert json.load(response)["capacity"] == {f"v4@{ZONE}": 32}
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=5) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

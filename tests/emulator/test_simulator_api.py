"""The simulator through the real google-cloud-tpu REST client, as the control plane will call it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import google.auth.credentials
import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2
from google.longrunning import operations_pb2
from google.protobuf import empty_pb2, json_format

from tpujobs.local.simulator import Code, SimulatorConfig, SimulatorServer
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.testing import wait_for

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
    return SimulatorControl(server.url).call("GET" if body is None else "POST", path, body)


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


def qr_state(client: tpu_v2.TpuClient, qr_id: str) -> tpu_v2.QueuedResourceState.State:
    return client.get_queued_resource(name=f"{PARENT}/queuedResources/{qr_id}").state.state


def make_active(client: tpu_v2.TpuClient, qr_id: str, resource: tpu_v2.QueuedResource) -> None:
    client.create_queued_resource(parent=PARENT, queued_resource_id=qr_id, queued_resource=resource).result(timeout=5)
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
    pager = client.list_queued_resources(request=tpu_v2.ListQueuedResourcesRequest(parent=PARENT, page_size=2))
    pages = list(pager.pages)
    assert [len(page.queued_resources) for page in pages] == [2, 2, 1]
    assert [qr.name.rsplit("/", 1)[1] for page in pages for qr in page.queued_resources] == [
        f"qr-{i}" for i in range(5)
    ]


def test_creating_a_queued_resource_twice_is_a_conflict_with_status_already_exists(
    client: tpu_v2.TpuClient,
) -> None:
    """A second create with the same id is HTTP 409 ALREADY_EXISTS (the client raises Conflict)."""
    client.create_queued_resource(parent=PARENT, queued_resource_id="qr", queued_resource=queued_resource("a"))
    with pytest.raises(exceptions.Conflict) as duplicate:
        client.create_queued_resource(parent=PARENT, queued_resource_id="qr", queued_resource=queued_resource("b"))
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
    pages = list(client.list_nodes(request=tpu_v2.ListNodesRequest(parent=PARENT, page_size=1)).pages)
    assert [n.name for page in pages for n in page.nodes] == [
        f"{PARENT}/nodes/s-0",
        f"{PARENT}/nodes/s-1",
    ]


@pytest.mark.parametrize("qr_id", ["Bad_Id", "ends-with-", "x" * 64])
def test_a_bad_queued_resource_id_is_invalid_argument(client: tpu_v2.TpuClient, qr_id: str) -> None:
    """Ids the TPU API refuses are HTTP 400 INVALID_ARGUMENT."""
    with pytest.raises(exceptions.BadRequest) as refused:
        client.create_queued_resource(parent=PARENT, queued_resource_id=qr_id, queued_resource=queued_resource())
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
    [
        (503, exceptions.ServiceUnavailable),
        (429, exceptions.TooManyRequests),
        ("DEADLINE_EXCEEDED", exceptions.GatewayTimeout),  # a gRPC code name: its HTTP rendering, 504
    ],
)
def test_injected_api_errors_raise_the_client_exceptions(
    server: SimulatorServer,
    client: tpu_v2.TpuClient,
    status: int | str,
    exception: type[exceptions.GoogleAPICallError],
) -> None:
    """At api_error_rate 1 every TPU call fails with the configured status or code; control calls never do."""
    control(server, "config", {"api_error_rate": 1.0, "api_error_codes": [status]})
    with pytest.raises(exception):
        client.get_queued_resource(name=f"{PARENT}/queuedResources/anything")
    with pytest.raises(exception):
        client.create_queued_resource(parent=PARENT, queued_resource_id="qr", queued_resource=queued_resource())
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
    control(server, "config", {"reboot_seconds": 60, "maintenance_notice_seconds": 60})
    make_active(client, "restarting", queued_resource("s", "v4-16"))
    control(server, f"queuedResources/{ZONE}/restarting:reboot?worker=0", {})
    make_active(client, "maintained", queued_resource("m"))
    control(server, f"queuedResources/{ZONE}/maintained:maintenance", {})
    control(
        server,
        f"queuedResources/{ZONE}/maintained:node-health",
        {"health": "TIMEOUT", "description": "d"},
    )
    client.create_queued_resource(
        parent=PARENT, queued_resource_id="waiting", queued_resource=queued_resource("e", "v6e-8")
    )
    control(server, f"queuedResources/{ZONE}/preempted:preempt", {})
    control(server, f"queuedResources/{ZONE}/failed:fail", {"message": "no"})
    client.delete_queued_resource(
        request=tpu_v2.DeleteQueuedResourceRequest(name=f"{PARENT}/queuedResources/deleting", force=True)
    )
    state = control(server, "state")
    states = {qr["state"]["state"] for qr in state["queuedResources"]}
    assert {"ACTIVE", "SUSPENDING", "FAILED", "DELETING", "WAITING_FOR_RESOURCES"} <= states
    assert {"READY", "PREEMPTED", "DELETING", "REPAIRING", "RESTARTING"} <= {n["state"] for n in state["nodes"]}
    for qr in state["queuedResources"]:
        tpu_v2.QueuedResource.from_json(json.dumps(qr), ignore_unknown_fields=False)
    for node in state["nodes"]:
        tpu_v2.Node.from_json(json.dumps(node), ignore_unknown_fields=False)
    for operation in state["operations"]:  # strict, as the client parses polled operations
        json_format.Parse(json.dumps(operation), operations_pb2.Operation(), ignore_unknown_fields=False)


def test_command_line_prints_its_url_serves_and_stops_on_sigterm() -> None:
    """python -m tpujobs.local.simulator prints one listening line, answers health and exits 0 on SIGTERM."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tpujobs.local.simulator", "--port", "0", "--capacity", f"v4@{ZONE}=32"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        prefix = "tpujobs-simulator listening on "
        assert line.startswith(prefix + "http://127.0.0.1:")
        url = line.removeprefix(prefix)
        assert SimulatorControl(url).config()["capacity"] == {f"v4@{ZONE}": 32}
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0  # it stops: how fast is the machine's
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# -- tpujobs dev fault error: what each injected error becomes in the real REST client ----------


def plan_errors(server: SimulatorServer, **fault: Any) -> Any:
    return control(server, "faults/errors", fault)


@pytest.mark.parametrize(
    ("code", "http_status", "status", "exception"),
    [
        ("UNKNOWN", 500, "UNKNOWN", exceptions.InternalServerError),
        ("CANCELLED", 499, "CANCELLED", exceptions.Cancelled),
        ("DEADLINE_EXCEEDED", 504, "DEADLINE_EXCEEDED", exceptions.GatewayTimeout),
        ("UNAVAILABLE", 503, "UNAVAILABLE", exceptions.ServiceUnavailable),
        ("DATA_LOSS", 500, "DATA_LOSS", exceptions.InternalServerError),
        ("INTERNAL", 500, "INTERNAL", exceptions.InternalServerError),
        ("ABORTED", 409, "ABORTED", exceptions.Conflict),
        ("PERMISSION_DENIED", 403, "PERMISSION_DENIED", exceptions.Forbidden),
        (502, 502, "UNAVAILABLE", exceptions.BadGateway),
        (429, 429, "RESOURCE_EXHAUSTED", exceptions.TooManyRequests),
    ],
)
def test_grpc_codes_and_http_statuses_reach_the_rest_client_as_google_renders_them(
    server: SimulatorServer,
    client: tpu_v2.TpuClient,
    code: int | str,
    http_status: int,
    status: str,
    exception: type[exceptions.GoogleAPICallError],
) -> None:
    """Each code answers with its code.proto HTTP status and `status` name; the REST client picks
    its exception by HTTP status alone (UNKNOWN and DATA_LOSS are InternalServerError, a 504 is
    GatewayTimeout, not DeadlineExceeded), and the call after the planned one succeeds."""
    make_active(client, "qr", queued_resource("node"))
    plan_errors(server, method="get", code=code)
    with pytest.raises(exception) as failed:
        client.get_queued_resource(name=f"{PARENT}/queuedResources/qr")
    assert type(failed.value) is exception
    assert failed.value.code == http_status
    assert failed.value.response.json()["error"]["status"] == status
    assert qr_state(client, "qr") == tpu_v2.QueuedResourceState.State.ACTIVE


def test_a_quota_429_carries_error_info_and_quota_failure_where_the_client_reads_them(
    server: SimulatorServer, client: tpu_v2.TpuClient
) -> None:
    """--quota: TooManyRequests whose reason is RESOURCE_QUOTA_EXCEEDED and whose details hold a
    QuotaFailure for the zone; a plain 429 is the rate limit, RATE_LIMIT_EXCEEDED."""
    plan_errors(server, method="create", code=429, quota=True)
    plan_errors(server, method="create", code=429)
    with pytest.raises(exceptions.TooManyRequests) as quota:
        client.create_queued_resource(parent=PARENT, queued_resource_id="qr", queued_resource=queued_resource())
    assert (quota.value.reason, quota.value.domain) == ("RESOURCE_QUOTA_EXCEEDED", "googleapis.com")
    assert quota.value.metadata["quota_location"] == ZONE
    failure = next(d for d in quota.value.details if d["@type"].endswith("QuotaFailure"))
    assert failure["violations"][0]["quotaDimensions"] == {"zone": ZONE}
    with pytest.raises(exceptions.TooManyRequests) as rate:
        client.create_queued_resource(parent=PARENT, queued_resource_id="qr", queued_resource=queued_resource())
    assert rate.value.reason == "RATE_LIMIT_EXCEEDED"
    assert control(server, "state")["queuedResources"] == []  # neither created anything


def test_planned_errors_hit_only_their_method_and_count(server: SimulatorServer, client: tpu_v2.TpuClient) -> None:
    """count=2 on list: two list calls fail, gets and creates do not, the third list succeeds."""
    plan_errors(server, method="list", code=503, count=2)
    make_active(client, "qr", queued_resource("node"))  # creates, gets, polls the operation
    for _ in range(2):
        with pytest.raises(exceptions.ServiceUnavailable):
            list(client.list_queued_resources(parent=PARENT))
    assert [qr.name for qr in client.list_queued_resources(parent=PARENT)] == [f"{PARENT}/queuedResources/qr"]
    assert control(server, "faults")["errors"]["list"] == []


def test_an_applied_error_loses_only_the_answer_the_create_happened(
    server: SimulatorServer, client: tpu_v2.TpuClient
) -> None:
    """applied: the create raises GatewayTimeout yet the QR exists; a retried create is a Conflict."""
    plan_errors(server, method="create", code="DEADLINE_EXCEEDED", applied=True)
    with pytest.raises(exceptions.GatewayTimeout):
        client.create_queued_resource(parent=PARENT, queued_resource_id="qr", queued_resource=queued_resource())
    assert client.get_queued_resource(name=f"{PARENT}/queuedResources/qr").name.endswith("/qr")
    with pytest.raises(exceptions.Conflict):
        client.create_queued_resource(parent=PARENT, queued_resource_id="qr", queued_resource=queued_resource())


@pytest.mark.parametrize(
    "fault",
    [
        {"method": "patch", "code": 503},
        {"method": "get", "code": 302},
        {"method": "get", "code": "NOPE"},
        {"method": "get", "code": 503, "quota": True},
        {"method": "get", "code": 503, "count": 0},
        {"method": "get", "code": 503, "extra": 1},
    ],
)
def test_a_fault_that_makes_no_sense_is_refused_with_400(server: SimulatorServer, fault: dict) -> None:
    """Unknown methods, non-error statuses, unknown codes, a quota that is no 429, count 0: 400."""
    with pytest.raises(urllib.error.HTTPError) as refused:
        plan_errors(server, **fault)
    assert refused.value.code == 400
    assert json.load(refused.value)["error"]["status"] == "INVALID_ARGUMENT"


# -- strict field masks, paged lists -------------------------------------------------------------


def test_a_misspelled_field_mask_path_is_invalid_argument_not_an_empty_field(
    client: tpu_v2.TpuClient,
) -> None:
    """x-goog-fieldmask queuedResources.stat is refused with 400 INVALID_ARGUMENT, as Google does."""
    make_active(client, "qr", queued_resource("node"))
    with pytest.raises(exceptions.BadRequest) as refused:
        list(
            client.list_queued_resources(
                parent=PARENT, metadata=[("x-goog-fieldmask", "queuedResources.stat,nextPageToken")]
            )
        )
    assert status_of(refused) == "INVALID_ARGUMENT"
    assert "queuedResources.stat" in refused.value.message
    with pytest.raises(exceptions.BadRequest):
        client.get_node(name=f"{PARENT}/nodes/node", metadata=[("x-goog-fieldmask", "health.x")])


def test_a_field_mask_keeps_only_its_fields_and_a_list_without_next_page_token_stops_at_one_page(
    server: SimulatorServer, client: tpu_v2.TpuClient
) -> None:
    """A mask naming name and state gives just those; leaving out nextPageToken loses the pages after
    the first, exactly as against Google."""
    control(server, "config", {"default_page_size": 2})
    for i in range(3):
        client.create_queued_resource(
            parent=PARENT, queued_resource_id=f"qr-{i}", queued_resource=queued_resource(f"n-{i}")
        )
    masked = list(client.list_queued_resources(parent=PARENT, metadata=[("x-goog-fieldmask", "queuedResources.name")]))
    assert [qr.name.rsplit("/", 1)[1] for qr in masked] == ["qr-0", "qr-1"]
    assert not any("tpu" in qr or "state" in qr for qr in masked)


def test_the_fields_parameter_takes_google_grouping_syntax(server: SimulatorServer, client: tpu_v2.TpuClient) -> None:
    """?fields=queuedResources(name,state/...) keeps just those; an unbalanced one is 400."""
    make_active(client, "qr", queued_resource("node"))
    url = f"{server.url}/v2/{PARENT}/queuedResources?fields=queuedResources(name,state.state)"
    with urllib.request.urlopen(url, timeout=5) as response:
        answer = json.load(response)
    assert answer == {"queuedResources": [{"name": f"{PARENT}/queuedResources/qr", "state": {"state": "ACTIVE"}}]}
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url.replace("state)", "state"), timeout=5)
    assert refused.value.code == 400


def test_the_adapters_list_sees_every_queued_resource_through_small_pages(
    server: SimulatorServer, client: tpu_v2.TpuClient
) -> None:
    """default_page_size 2 over five QRs: CloudTpu.list (its field masks keep nextPageToken) sees all
    five, with the health of their nodes; the pager really turned pages."""
    from tpujobs.adapters.tpu import CloudTpu

    control(server, "config", {"default_page_size": 2})
    for i in range(5):
        client.create_queued_resource(
            parent=PARENT, queued_resource_id=f"qr-{i}", queued_resource=queued_resource(f"n-{i}")
        )
    wait_for(lambda: qr_state(client, "qr-4") == tpu_v2.QueuedResourceState.State.ACTIVE)
    control(server, f"queuedResources/{ZONE}/qr-3:kill-host", {})
    seen = CloudTpu(client, PROJECT).list_capacity(ZONE)
    assert sorted(status.name for status in seen) == [f"qr-{i}" for i in range(5)]
    assert {status.name: status.unhealthy_hosts for status in seen}["qr-3"] == 1
    pages = list(client.list_queued_resources(parent=PARENT).pages)
    assert [len(page.queued_resources) for page in pages] == [2, 2, 1]


# -- deletion takes time, dead capacity holds chips ----------------------------------------------


def test_deleting_is_visible_and_the_operation_completes_only_when_gone(
    server: SimulatorServer, client: tpu_v2.TpuClient
) -> None:
    """deleting_seconds 0.3: the QR reads DELETING and the operation is not done; then it is gone."""
    control(server, "config", {"deleting_seconds": 0.3})
    make_active(client, "qr", queued_resource("node"))
    operation = client.delete_queued_resource(
        request=tpu_v2.DeleteQueuedResourceRequest(name=f"{PARENT}/queuedResources/qr", force=True)
    )
    assert qr_state(client, "qr") == tpu_v2.QueuedResourceState.State.DELETING
    assert not operation.done()
    assert operation.result(timeout=5) == empty_pb2.Empty()
    with pytest.raises(exceptions.NotFound):
        client.get_queued_resource(name=f"{PARENT}/queuedResources/qr")


def test_a_suspended_queued_resource_holds_its_chips_until_deleted(
    server: SimulatorServer, client: tpu_v2.TpuClient
) -> None:
    """4 v4 chips: a preempted v4-8 stays SUSPENDED holding them; the next waits until it is deleted."""
    control(server, "config", {"capacity": {f"v4@{ZONE}": 4}})
    make_active(client, "spot", queued_resource("a", spot=True))
    client.create_queued_resource(parent=PARENT, queued_resource_id="next", queued_resource=queued_resource("b"))
    control(server, f"queuedResources/{ZONE}/spot:preempt", {})
    wait_for(lambda: qr_state(client, "spot") == tpu_v2.QueuedResourceState.State.SUSPENDED)
    time.sleep(0.2)  # many ticks: the chips are still held
    assert qr_state(client, "next") == tpu_v2.QueuedResourceState.State.WAITING_FOR_RESOURCES
    client.delete_queued_resource(
        request=tpu_v2.DeleteQueuedResourceRequest(name=f"{PARENT}/queuedResources/spot", force=True)
    ).result(timeout=5)
    wait_for(lambda: qr_state(client, "next") == tpu_v2.QueuedResourceState.State.ACTIVE)


# -- what nodes show: reboot, maintenance, health and state --------------------------------------


def test_node_health_and_state_endpoints_show_in_the_client(server: SimulatorServer, client: tpu_v2.TpuClient) -> None:
    """:node-health TIMEOUT with a description and :node-state UNKNOWN read back through get_node."""
    make_active(client, "qr", queued_resource("node"))
    control(
        server,
        f"queuedResources/{ZONE}/qr:node-health",
        {"health": "TIMEOUT", "description": "late"},
    )
    answer = control(server, f"queuedResources/{ZONE}/qr:node-state", {"state": "UNKNOWN"})
    assert [n["state"] for n in answer["nodes"]] == ["UNKNOWN"]
    node = client.get_node(name=f"{PARENT}/nodes/node")
    assert (node.state, node.health, node.health_description) == (
        tpu_v2.Node.State.UNKNOWN,
        tpu_v2.Node.Health.TIMEOUT,
        "late",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        control(server, f"queuedResources/{ZONE}/qr:node-state", {"state": "ON_FIRE"})
    assert refused.value.code == 400


def test_reboot_and_maintenance_endpoints_show_restarting_and_repairing(
    server: SimulatorServer, client: tpu_v2.TpuClient
) -> None:
    """:reboot makes the node RESTARTING then READY; :maintenance?notice=0 makes it REPAIRING with
    UNHEALTHY_MAINTENANCE; a reboot while it is maintained is 400 FAILED_PRECONDITION."""
    control(server, "config", {"reboot_seconds": 0.2, "maintenance_seconds": 60})
    make_active(client, "qr", queued_resource("node", "v4-16"))
    answer = control(server, f"queuedResources/{ZONE}/qr:reboot?worker=1", {})
    assert [n["state"] for n in answer["nodes"]] == ["RESTARTING"]
    assert client.get_node(name=f"{PARENT}/nodes/node").state == tpu_v2.Node.State.RESTARTING
    wait_for(lambda: client.get_node(name=f"{PARENT}/nodes/node").state == tpu_v2.Node.State.READY)
    control(server, f"queuedResources/{ZONE}/qr:maintenance?notice=0", {})
    wait_for(lambda: client.get_node(name=f"{PARENT}/nodes/node").state == tpu_v2.Node.State.REPAIRING)
    assert client.get_node(name=f"{PARENT}/nodes/node").health == tpu_v2.Node.Health.UNHEALTHY_MAINTENANCE
    with pytest.raises(urllib.error.HTTPError) as refused:
        control(server, f"queuedResources/{ZONE}/qr:reboot", {})
    assert json.load(refused.value)["error"]["status"] == "FAILED_PRECONDITION"


def test_error_bodies_parse_strictly_as_google_rpc_status(server: SimulatorServer) -> None:
    """Every injected error body is a google.rpc.Status in JSON, details and all."""
    from google.rpc import error_details_pb2, status_pb2  # noqa: F401 - registers the detail types

    for fault in ({"code": 429, "quota": True}, {"code": 429}, {"code": "DATA_LOSS"}):
        plan_errors(server, method="get", **fault)
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(f"{server.url}/v2/{PARENT}/queuedResources/x", timeout=5)
        body = json.load(failed.value)["error"]
        status = {"code": Code[body["status"]].grpc_code, "message": body["message"]}
        status["details"] = body.get("details", [])
        json_format.ParseDict(status, status_pb2.Status(), ignore_unknown_fields=False)


def test_the_local_stacks_simulator_deletes_slowly_pages_small_and_warns_briefly() -> None:
    """The command line `tpujobs dev up` runs: deleting_seconds 3, default_page_size 2, a 5 s notice."""
    from tpujobs.local import processes

    argv = [*processes.simulator(0).argv, "--no-workers"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip().removeprefix("tpujobs-simulator listening on ")
        config = SimulatorControl(url).config()
        assert (
            config["deleting_seconds"],
            config["default_page_size"],
            config["maintenance_notice_seconds"],
        ) == (3.0, 2, 5.0)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0  # it stops: how fast is the machine's
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

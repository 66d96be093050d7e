"""The simulator's HTTP face: the Cloud TPU v2 REST API as google-cloud-tpu's REST client calls it,
Compute Engine v1 as google-cloud-compute's does (`compute_api`), plus control endpoints under
/simulator/v1/ (preempt, fail, faults, config; `client.SimulatorControl`),
each worker's metadata server, and the certificates of its VMs' identity tokens (/simulator/v1/certs).
Everything here is translation: the rules live in `model`.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from types import TracebackType
from typing import Any

from google.cloud import tpu_v2

from tpujobs.local.simulator import fields
from tpujobs.local.simulator.compute_api import ComputeApi, compute_state
from tpujobs.local.simulator.compute_hosts import overlay_of
from tpujobs.local.simulator.errors import FAULT_METHODS, Fault, bad_request
from tpujobs.local.simulator.http import ApiServer, JsonRequestHandler, Routes, google_answer
from tpujobs.local.simulator.identity import CERTS_CACHE_CONTROL, CERTS_PATH, IdentitySigner
from tpujobs.local.simulator.messages import camel, canonical, json_object, query_str, timestamp
from tpujobs.local.simulator.metadata import MetadataReply, MetadataService, metadata_url
from tpujobs.local.simulator.model import (
    WORKER_PORT,
    Code,
    JsonStateFile,
    NodeRecord,
    OperationRecord,
    Page,
    QrState,
    QueuedResourceRecord,
    QueuedResourceRequest,
    Simulator,
    SimulatorConfig,
    SimulatorError,
    SliceRequest,
    accelerator_type_of_config,
)
from tpujobs.local.simulator.workers import WorkerInfo, WorkerPool

_log = logging.getLogger(__name__)

Json = dict[str, Any]
Query = Mapping[str, list[str]]

TYPE_PREFIX = "type.googleapis.com/"
QUEUED_RESOURCE_TYPE = TYPE_PREFIX + "google.cloud.tpu.v2.QueuedResource"
NODE_TYPE = TYPE_PREFIX + "google.cloud.tpu.v2.Node"
OPERATION_METADATA_TYPE = TYPE_PREFIX + "google.cloud.tpu.v2.OperationMetadata"
EMPTY_TYPE = TYPE_PREFIX + "google.protobuf.Empty"

_STATE_DATA_FIELD = {
    QrState.CREATING: "creatingData",
    QrState.ACCEPTED: "acceptedData",
    QrState.WAITING_FOR_RESOURCES: None,  # QueuedResourceState has no data field for it
    QrState.PROVISIONING: "provisioningData",
    QrState.ACTIVE: "activeData",
    QrState.SUSPENDING: "suspendingData",
    QrState.SUSPENDED: "suspendedData",
    QrState.FAILED: "failedData",
    QrState.DELETING: "deletingData",
}

# Node fields the service sets; whatever a caller sends for them is dropped.
_NODE_OUTPUT_ONLY = frozenset(
    {
        "name",
        "state",
        "healthDescription",
        "createTime",
        "networkEndpoints",
        "health",
        "id",
        "apiVersion",
        "symptoms",
        "queuedResource",
        "multisliceNode",
    }
)
# What a node template (the caller's node fields, echoed on every node) leaves out.
_NOT_TEMPLATE = _NODE_OUTPUT_ONLY | {"acceleratorType", "runtimeVersion"}


# -- JSON out ---------------------------------------------------------------------------------


def queued_resource_json(qr: QueuedResourceRecord) -> Json:
    """A QueuedResource as the REST API returns it."""
    out: Json = {
        "name": qr.name,
        "createTime": timestamp(qr.create_time),
        "tpu": {"nodeSpec": [_node_spec_json(qr, spec) for spec in qr.request.slices]},
        "state": _qr_state_json(qr),
    }
    if qr.request.spot:
        out["spot"] = {}
    if qr.request.guaranteed is not None:
        out["guaranteed"] = dict(qr.request.guaranteed)
    if qr.request.queueing_policy is not None:
        out["queueingPolicy"] = dict(qr.request.queueing_policy)
    if qr.request.reservation_name:
        out["reservationName"] = qr.request.reservation_name
    return out


def _node_spec_json(qr: QueuedResourceRecord, spec: SliceRequest) -> Json:
    """One node spec as it was asked for: its accelerator_type, or its accelerator_config alone."""
    node: Json = {**spec.template, "runtimeVersion": spec.runtime_version}
    if "acceleratorConfig" not in spec.template:
        node["acceleratorType"] = spec.accelerator_type
    out: Json = {"parent": qr.parent, "node": node}
    if spec.multislice:
        out["multisliceParams"] = {
            "nodeCount": spec.node_count,
            "nodeIdPrefix": spec.node_id_prefix,
        }
    else:
        out["nodeId"] = spec.node_id
    return out


def _qr_state_json(qr: QueuedResourceRecord) -> Json:
    state: Json = {"state": qr.state.value, "stateInitiator": qr.initiator.value}
    data_field = _STATE_DATA_FIELD[qr.state]
    if qr.state is QrState.FAILED:
        state["failedData"] = {"error": {"code": qr.error_code, "message": qr.error_message}}
    elif data_field is not None:
        state[data_field] = {}
    return state


def node_json(node: NodeRecord) -> Json:
    """A Node as the REST API returns it: one network endpoint per worker host."""
    out: Json = {
        **node.template,
        "name": node.name,
        "acceleratorType": node.accelerator_type,
        "runtimeVersion": node.runtime_version,
        "state": node.state.value,
        "networkEndpoints": [{"ipAddress": address, "port": WORKER_PORT} for address in node.host_addresses],
        "createTime": timestamp(node.create_time),
        "id": str(node.number),  # int64 is a string in JSON
        "apiVersion": "V2",
        "queuedResource": node.queued_resource,
        "multisliceNode": node.multislice,
    }
    account = node.template.get("serviceAccount")
    out["serviceAccount"] = {  # what the VMs run as: the Compute default when none was named
        **(account if isinstance(account, dict) else {}),
        "email": node.service_account,
    }
    if node.spot:
        out["schedulingConfig"] = {**node.template.get("schedulingConfig", {}), "spot": True}
    if node.health:
        out["health"] = node.health
    if node.health_description:
        out["healthDescription"] = node.health_description
    return out


def worker_json(worker: WorkerInfo) -> Json:
    return worker.to_json()


def operation_json(op: OperationRecord) -> Json:
    """A google.longrunning.Operation carrying the TPU API's OperationMetadata."""
    metadata: Json = {
        "@type": OPERATION_METADATA_TYPE,
        "createTime": timestamp(op.create_time),
        "target": op.target,
        "verb": op.verb,
        "apiVersion": "v2",
    }
    if op.end_time is not None:
        metadata["endTime"] = timestamp(op.end_time)
    out: Json = {"name": op.name, "metadata": metadata, "done": op.done}
    if not op.done:
        return out
    if op.error_code:
        out["error"] = {"code": op.error_code, "message": op.error_message}
    elif op.result is not None:
        out["response"] = {"@type": QUEUED_RESOURCE_TYPE, **queued_resource_json(op.result)}
    elif op.node is not None:
        out["response"] = {"@type": NODE_TYPE, **node_json(op.node)}
    else:
        out["response"] = {"@type": EMPTY_TYPE}
    return out


def _page_json(key: str, page: Page[Any], render: Callable[[Any], Json]) -> Json:
    """One page of a list answer, as the API shapes it: the items, and a token if more follow."""
    out: Json = {key: [render(item) for item in page.items]}
    if page.next_page_token:
        out["nextPageToken"] = page.next_page_token
    return out


# -- JSON in ----------------------------------------------------------------------------------


def parse_queued_resource(resource: Mapping[str, Any], parent: str) -> QueuedResourceRequest:
    """A create request's QueuedResource, as canonical JSON (`messages.canonical`), as the
    model's request; what the message type allows but the simulator cannot serve is INVALID_ARGUMENT."""
    tpu = resource.get("tpu")
    if tpu is None:
        raise SimulatorError(Code.INVALID_ARGUMENT, "queued_resource.tpu is required: the simulator offers TPU nodes")
    specs = tpu.get("nodeSpec")
    if not specs:
        raise SimulatorError(Code.INVALID_ARGUMENT, "queued_resource.tpu.node_spec must name at least one node")
    return QueuedResourceRequest(  # spot and guaranteed are one oneof: json_format refuses both
        slices=tuple(_parse_node_spec(spec, parent) for spec in specs),
        spot="spot" in resource,
        guaranteed=resource.get("guaranteed"),
        reservation_name=resource.get("reservationName", ""),
        queueing_policy=resource.get("queueingPolicy"),
    )


def _parse_node_spec(spec: Mapping[str, Any], parent: str) -> SliceRequest:
    spec_parent = spec.get("parent")
    if spec_parent != parent:
        raise SimulatorError(Code.INVALID_ARGUMENT, f"node_spec.parent must be {parent!r}, got {spec_parent!r}")
    node = spec.get("node")
    if node is None:
        raise SimulatorError(Code.INVALID_ARGUMENT, "node_spec.node is required")
    accelerator_type = node.get("acceleratorType", "")
    config = node.get("acceleratorConfig")
    if accelerator_type and config is not None:
        raise bad_request(
            "queued_resource.tpu.node_spec.node.accelerator_config",
            "Only one of accelerator_type and accelerator_config may be given for a node.",
        )
    if config is not None:  # the node's type is what the config names: V4 2x2x4 is v4-32
        accelerator_type = accelerator_type_of_config(config, "queued_resource.tpu.node_spec.node.accelerator_config")
    if not accelerator_type:
        raise SimulatorError(Code.INVALID_ARGUMENT, "node.accelerator_type or node.accelerator_config is required")
    multislice = spec.get("multisliceParams")
    return SliceRequest(
        accelerator_type=accelerator_type,
        runtime_version=node.get("runtimeVersion", ""),
        node_id=spec.get("nodeId", ""),
        node_id_prefix="" if multislice is None else multislice.get("nodeIdPrefix", ""),
        node_count=0 if multislice is None else multislice.get("nodeCount", 0),
        template={key: value for key, value in node.items() if key not in _NOT_TEMPLATE},
    )


def _query_int(query: Query, name: str) -> int:
    raw = query.get(name, ["0"])[-1] or "0"
    try:
        return int(raw)
    except ValueError as exc:
        raise SimulatorError(Code.INVALID_ARGUMENT, f"{name} must be a number, got {raw!r}") from exc


def _query_optional_int(query: Query, name: str) -> int | None:
    """An integer parameter, or None when it is absent or empty."""
    return _query_int(query, name) if query_str(query, name) else None


def _where(params: Mapping[str, str], query: Query) -> dict[str, str | None]:
    """The zone of a control path and the optional ?project= that settle which QR is meant."""
    return {"zone": params["zone"], "project": query_str(query, "project") or None}


def _flag(request: Mapping[str, Any], name: str) -> bool:
    value = request.get(name, False)
    if not isinstance(value, bool):
        raise SimulatorError(Code.INVALID_ARGUMENT, f"{name} must be true or false, got {value!r}")
    return value


def _whole(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SimulatorError(Code.INVALID_ARGUMENT, f"{name} must be a whole number, got {value!r}")
    return value


def _query_bool(query: Query, name: str) -> bool:
    return query_str(query, name).lower() in ("true", "1")


# -- routing ----------------------------------------------------------------------------------

_LOCATION = "/v2/projects/<project>/locations/<zone>"
_ID = "<id:id>"
_CONTROL = "/simulator/v1"
Handler = Callable[[dict[str, str], Query, bytes], tuple[int, Json]]


@dataclass(frozen=True)
class _TpuMethod:
    """One TPU API method: what a fault aimed at it is called, and what message it answers."""

    handler: Handler
    fault_method: str | None  # one of FAULT_METHODS, or None for operations
    response: str  # a fields.RESPONSES name, to check field masks against


def _tpu_route(
    method: str, path: str, handler: Handler, fault_method: str | None, response: str
) -> tuple[str, str, _TpuMethod]:
    return method, _LOCATION + path, _TpuMethod(handler, fault_method, response)


def _control_route(method: str, path: str, handler: Handler) -> tuple[str, str, Handler]:
    return method, _CONTROL + path, handler


_QR = "/queuedResources/<zone>/" + _ID


class SimulatorApi:
    """Routes one request to the model and renders the answer; no sockets, so tests can call it."""

    def __init__(
        self,
        simulator: Simulator,
        worker_pool: WorkerPool | None = None,
        stopping: threading.Event | None = None,
    ) -> None:
        self.simulator = simulator
        self.worker_pool = worker_pool
        self.identity_signer = IdentitySigner()  # the key of this simulator's VM identity tokens
        self.metadata_service = MetadataService(
            simulator.host_node,
            stopping=stopping,
            changes=simulator,
            signer=self.identity_signer,
            overlay=overlay_of(simulator),
        )
        self.compute_api = ComputeApi(simulator, worker_pool, stopping)
        qrs, nodes, operations = "/queuedResources", "/nodes", "/operations"
        self._tpu_routes = Routes(
            [
                _tpu_route("POST", qrs, self._create_queued_resource, "create", "Operation"),
                _tpu_route("GET", qrs, self._list_queued_resources, "list", "ListQueuedResourcesResponse"),
                _tpu_route("GET", f"{qrs}/{_ID}", self._get_queued_resource, "get", "QueuedResource"),
                _tpu_route("DELETE", f"{qrs}/{_ID}", self._delete_queued_resource, "delete", "Operation"),
                _tpu_route("GET", nodes, self._list_nodes, "list", "ListNodesResponse"),
                _tpu_route("GET", f"{nodes}/{_ID}", self._get_node, "get", "Node"),
                _tpu_route("PATCH", f"{nodes}/{_ID}", self._update_node, "update", "Operation"),
                _tpu_route("GET", operations, self._list_operations, None, "ListOperationsResponse"),
                _tpu_route("GET", f"{operations}/{_ID}", self._get_operation, None, "Operation"),
            ]
        )
        self._control_routes = Routes(
            [
                _control_route("GET", "/health", self._health),
                _control_route("GET", "/state", self._state),
                _control_route("GET", "/config", self._get_config),
                _control_route("POST", "/config", self._set_config),
                _control_route("GET", "/faults", self._get_faults),
                _control_route("POST", "/faults:clear", self._clear_faults),
                _control_route("POST", "/faults/errors", self._inject_errors),
                _control_route("POST", "/faults/no-boot", self._no_boot_next),
                _control_route("POST", _QR + ":preempt", self._preempt),
                _control_route("POST", _QR + ":fail", self._fail),
                _control_route("POST", _QR + ":kill-host", self._kill_host),
                _control_route("POST", _QR + ":no-boot", self._no_boot),
                _control_route("POST", _QR + ":reboot", self._reboot),
                _control_route("POST", _QR + ":maintenance", self._maintenance),
                _control_route("POST", _QR + ":node-health", self._node_health),
                _control_route("POST", _QR + ":node-state", self._node_state),
                _control_route("GET", _QR + ":workers", self._workers),
            ]
        )

    def handle(self, method: str, path: str, query: Query, body: bytes, field_mask: str = "") -> tuple[int, Json]:
        """The HTTP status and JSON answer to one request; errors become Google's error JSON.

        A TPU API call first meets its faults (planned, then random), then has its field
        mask checked, then runs; control calls ignore both.
        """
        return google_answer(
            lambda: self._route(method, path, query, body, field_mask),
            "simulator",
            f"{method} {path}",
            tell_failures=True,
        )

    def _route(self, method: str, path: str, query: Query, body: bytes, field_mask: str) -> tuple[int, Json]:
        if self.compute_api.handles(path):
            return self.compute_api.route(method, path, query, body)
        tpu = self._tpu_routes.match(method, path)
        if tpu is not None:
            return self._call_tpu(*tpu, query, body, field_mask)
        control = self._control_routes.match(method, path)
        if control is not None:
            handler, params = control
            return handler(params, query, body)
        if path.startswith("/v2/"):
            raise SimulatorError(Code.UNIMPLEMENTED, f"the tpujobs simulator does not implement {method} {path}")
        raise SimulatorError(Code.NOT_FOUND, f"no such endpoint: {method} {path}")

    def _call_tpu(
        self, route: _TpuMethod, params: dict[str, str], query: Query, body: bytes, field_mask: str
    ) -> tuple[int, Json]:
        fault = self.simulator.next_fault(route.fault_method)
        if fault is not None and not fault.applied:
            raise fault.error(params["project"], params["zone"])
        paths = fields.check(field_mask, route.response) if field_mask else None
        status, payload = route.handler(params, query, body)
        if fault is not None:  # applied: the call took effect, and its answer is lost
            raise fault.error(params["project"], params["zone"])
        return status, payload if paths is None else fields.apply(payload, paths)

    def metadata(self, path: str, query: Query, headers: Mapping[str, str]) -> MetadataReply | None:
        """A worker's metadata server answer, or None when *path* is not a metadata path."""
        if not MetadataService.handles(path):
            return None
        return self.metadata_service.answer(path, query, headers)

    def certs(self, path: str) -> Json | None:
        """The certificates that verify the VMs' identity tokens, in Google's v1 format, or None
        when *path* is another."""
        return self.identity_signer.certs() if path == CERTS_PATH else None

    # -- the TPU API ----------------------------------------------------------------------

    def _create_queued_resource(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        parent = f"projects/{params['project']}/locations/{params['zone']}"
        request = parse_queued_resource(canonical(body, tpu_v2.QueuedResource.pb(), "QueuedResource"), parent)
        operation = self.simulator.create_queued_resource(
            params["project"], params["zone"], query_str(query, "queuedResourceId"), request
        )
        return 200, operation_json(operation)

    def _list_queued_resources(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        page = self.simulator.list_queued_resources(
            params["project"], params["zone"], _query_int(query, "pageSize"), query_str(query, "pageToken")
        )
        return 200, _page_json("queuedResources", page, queued_resource_json)

    def _get_queued_resource(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        return 200, queued_resource_json(
            self.simulator.get_queued_resource(params["project"], params["zone"], params["id"])
        )

    def _delete_queued_resource(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        operation = self.simulator.delete_queued_resource(
            params["project"], params["zone"], params["id"], force=_query_bool(query, "force")
        )
        return 200, operation_json(operation)

    def _list_nodes(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        page = self.simulator.list_nodes(
            params["project"], params["zone"], _query_int(query, "pageSize"), query_str(query, "pageToken")
        )
        return 200, _page_json("nodes", page, node_json)

    def _get_node(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        return 200, node_json(self.simulator.get_node(params["project"], params["zone"], params["id"]))

    def _update_node(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        """PATCH v2/{name=projects/*/locations/*/nodes/*}?updateMask=a,b with a Node body."""
        mask = [camel(path) for path in query_str(query, "updateMask").split(",") if path.strip()]
        node = canonical(body, tpu_v2.Node.pb(), "Node")
        operation = self.simulator.update_node(params["project"], params["zone"], params["id"], mask, node)
        return 200, operation_json(operation)

    def _list_operations(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        page = self.simulator.list_operations(
            params["project"], params["zone"], _query_int(query, "pageSize"), query_str(query, "pageToken")
        )
        return 200, _page_json("operations", page, operation_json)

    def _get_operation(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        return 200, operation_json(self.simulator.get_operation(params["project"], params["zone"], params["id"]))

    # -- control ----------------------------------------------------------------------------

    def _health(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        return 200, {"ok": True}

    def _state(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        state = self.simulator.state()
        return 200, {
            "queuedResources": [queued_resource_json(qr) for qr in state.queued_resources],
            "nodes": [node_json(node) for node in state.nodes],
            "operations": [operation_json(op) for op in state.operations],
            "compute": compute_state(self.simulator),
            "config": self.simulator.config.to_json(),
            "workers": {
                name: [worker_json(w) for w in workers]
                for name, workers in (self.worker_pool.all_workers() if self.worker_pool is not None else {}).items()
            },
        }

    def _get_config(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        return 200, self.simulator.config.to_json()

    def _set_config(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        changes = json_object(body, "the config")
        try:
            config = self.simulator.config.updated(changes)
        except (TypeError, ValueError) as exc:
            raise SimulatorError(Code.INVALID_ARGUMENT, str(exc)) from exc
        self.simulator.reconfigure(config)
        return 200, config.to_json()

    def _preempt(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        qr = self.simulator.preempt(params["id"], zone=params["zone"], project=query_str(query, "project") or None)
        return 200, queued_resource_json(qr)

    def _fail(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        details = json_object(body.strip(), "the failure")
        code = details.get("code") or Code.INTERNAL.grpc_code
        if not isinstance(code, int):
            raise SimulatorError(Code.INVALID_ARGUMENT, f"code must be a google.rpc.Code number, got {code!r}")
        qr = self.simulator.fail(
            params["id"],
            str(details.get("message") or "failed by the tpujobs simulator"),
            zone=params["zone"],
            project=query_str(query, "project") or None,
            code=code,
        )
        return 200, queued_resource_json(qr)

    def _kill_host(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        node = self.simulator.kill_host(
            params["id"],
            _query_int(query, "slice"),
            _query_int(query, "worker"),
            zone=params["zone"],
            project=query_str(query, "project") or None,
        )
        return 200, node_json(node)

    def _get_faults(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        return 200, self.simulator.faults()

    def _clear_faults(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        return 200, self.simulator.clear_faults()

    def _inject_errors(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        request = json_object(body, "the fault")
        unknown = sorted(set(request) - {"method", "code", "count", "quota", "applied", "message"})
        if unknown:
            raise SimulatorError(Code.INVALID_ARGUMENT, f"unknown fault fields: {', '.join(unknown)}")
        method = request.get("method")
        if method not in FAULT_METHODS:
            raise SimulatorError(
                Code.INVALID_ARGUMENT,
                f"method must be one of {', '.join(FAULT_METHODS)}, got {method!r}",
            )
        code = request.get("code")
        if not isinstance(code, (int, str)) or isinstance(code, bool):
            raise SimulatorError(
                Code.INVALID_ARGUMENT,
                "code must be an HTTP status (400..599) or a google.rpc.Code name such as UNAVAILABLE",
            )
        try:
            fault = Fault.parse(
                code,
                quota=_flag(request, "quota"),
                applied=_flag(request, "applied"),
                message=str(request.get("message") or ""),
            )
        except ValueError as exc:
            raise SimulatorError(Code.INVALID_ARGUMENT, str(exc)) from exc
        return 200, self.simulator.inject_errors(method, fault, _whole(request.get("count", 1), "count"))

    def _no_boot_next(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        request = json_object(body, "the fault")
        return 200, self.simulator.no_boot(_whole(request.get("count", 1), "count"))

    def _no_boot(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        qr = self.simulator.no_boot_queued_resource(params["id"], **_where(params, query))
        return 200, queued_resource_json(qr)

    def _reboot(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        nodes = self.simulator.reboot(
            params["id"],
            _query_optional_int(query, "slice"),
            _query_optional_int(query, "worker"),
            **_where(params, query),
        )
        return 200, {"nodes": [node_json(node) for node in nodes]}

    def _maintenance(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        notice = query_str(query, "notice")
        try:
            notice_seconds = float(notice) if notice else None
        except ValueError as exc:
            raise SimulatorError(Code.INVALID_ARGUMENT, f"notice must be a number of seconds, got {notice!r}") from exc
        nodes = self.simulator.maintenance(
            params["id"],
            _query_optional_int(query, "slice"),
            notice_seconds,
            **_where(params, query),
        )
        return 200, {"nodes": [node_json(node) for node in nodes]}

    def _node_health(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        request = json_object(body, "the node health")
        nodes = self.simulator.set_node_health(
            params["id"],
            str(request.get("health") or ""),
            str(request.get("description") or ""),
            _query_optional_int(query, "slice"),
            **_where(params, query),
        )
        return 200, {"nodes": [node_json(node) for node in nodes]}

    def _node_state(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        request = json_object(body, "the node state")
        nodes = self.simulator.set_node_state(
            params["id"],
            str(request.get("state") or ""),
            _query_optional_int(query, "slice"),
            **_where(params, query),
        )
        return 200, {"nodes": [node_json(node) for node in nodes]}

    def _workers(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        if self.worker_pool is None:
            return 200, {"workers": []}
        found = self.worker_pool.workers(params["id"], zone=params["zone"], project=query_str(query, "project") or None)
        return 200, {"workers": [worker_json(w) for w in found]}


# -- the server -------------------------------------------------------------------------------


class _RequestHandler(JsonRequestHandler):
    """The TPU API and the control API as JSON; a host's metadata server GETs as Google's."""

    server: ApiServer[SimulatorApi]

    def answer(self, method: str, path: str, query: Query, body: bytes) -> None:
        if method == "GET":
            reply = self.server.api.metadata(path, query, dict(self.headers.items()))
            if reply is not None:
                self.send(
                    reply.status,
                    reply.body.encode("utf-8"),
                    reply.content_type,
                    {"Metadata-Flavor": "Google", **({"ETag": reply.etag} if reply.etag else {})},
                )
                return
            certs = self.server.api.certs(path)
            if certs is not None:
                body = json.dumps(certs).encode("utf-8")
                self.send(200, body, "application/json; charset=UTF-8", {"Cache-Control": CERTS_CACHE_CONTROL})
                return
        mask = self.headers.get("X-Goog-FieldMask") or query_str(query, "fields") or query_str(query, "$fields")
        self.send_json(*self.server.api.handle(method, path, query, body, mask))


class SimulatorServer:
    """The simulator on a local port, served and ticked by daemon threads; a context manager.

    With *run_workers* (the default) it also runs every ACTIVE QR's startup scripts
    (``workers.WorkerPool``) under *workers_root*, a temporary directory made at start and
    removed at stop when none is given; *environ* is their base environment (default
    ``os.environ``). ``stop()`` leaves no worker process behind.
    """

    def __init__(
        self,
        config: SimulatorConfig | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        state_file: str | PathLike[str] | None = None,
        *,
        simulator: Simulator | None = None,
        run_workers: bool = True,
        workers_root: str | PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        store = JsonStateFile(state_file) if state_file is not None else None
        self.simulator = simulator or Simulator(config, store=store)
        self._address = (host, port)
        self._http: ApiServer[SimulatorApi] | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._run_workers = run_workers
        self._workers_root = None if workers_root is None else Path(workers_root)
        self._made_workers_root = False
        self._environ = environ
        self.worker_pool: WorkerPool | None = None  # set by start() when workers run

    @property
    def url(self) -> str:
        if self._http is None:
            raise RuntimeError("the simulator server is not started")
        host, port = self._http.socket.getsockname()[:2]  # the bound address, never bytes for TCP
        return f"http://{host}:{port}"

    def start(self) -> str:
        """Bind, serve and tick in the background; returns the base URL for api_endpoint."""
        if self._http is not None:
            raise RuntimeError("the simulator server is already started")
        if self._run_workers:
            if self._workers_root is None:
                self._workers_root = Path(tempfile.mkdtemp(prefix="tpujobs-workers-"))
                self._made_workers_root = True
            self._workers_root.mkdir(parents=True, exist_ok=True)
            self.worker_pool = WorkerPool(self.simulator, self._workers_root, self._metadata_url, environ=self._environ)
        self._http = ApiServer(
            self._address, SimulatorApi(self.simulator, self.worker_pool, self._stopping), _RequestHandler
        )
        if self.worker_pool is not None:
            self.worker_pool.attach()
        self._threads = [
            threading.Thread(
                target=self._http.serve_forever,
                kwargs={"poll_interval": 0.02},
                name="tpujobs-simulator-http",
                daemon=True,
            ),
            threading.Thread(target=self._tick, name="tpujobs-simulator-ticker", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self.url

    @property
    def workers_root(self) -> Path | None:
        """Where worker scratch directories go; None when workers do not run."""
        return self._workers_root if self._run_workers else None

    def workers(self, qr_id: str, *, zone: str | None = None, project: str | None = None) -> tuple[WorkerInfo, ...]:
        """The worker processes of a QR, by slice then worker; () when workers do not run."""
        if self.worker_pool is None:
            return ()
        return self.worker_pool.workers(qr_id, zone=zone, project=project)

    def stop(self) -> None:
        """Stop every worker group (SIGTERM, then SIGKILL after delete_grace_seconds), then
        serving and ticking; idempotent."""
        if self._http is None or self._stopping.is_set():
            return
        self._stopping.set()  # ends the ticker and metadata waits; HTTP serves on meanwhile
        self.simulator.wake_waiters()
        try:
            if self.worker_pool is not None:
                self.worker_pool.close()
        finally:
            self._http.shutdown()
            self._http.server_close()
            for thread in self._threads:
                thread.join(timeout=5)
            if self._made_workers_root and self._workers_root is not None:
                shutil.rmtree(self._workers_root, ignore_errors=True)

    def _metadata_url(self, node: NodeRecord, worker: int) -> str:
        return metadata_url(self.url, node.project, node.zone, node.node_id, worker)

    def _tick(self) -> None:
        """Advance time even when nobody asks, so hooks fire and waits end on time."""
        while not self._stopping.wait(self.simulator.config.tick_seconds):
            try:
                self.simulator.advance()
            except Exception:  # keep ticking: one bad hook or disk error must not freeze time
                _log.exception("simulator tick failed")

    def __enter__(self) -> SimulatorServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

"""The TPU API's messages as JSON, both ways: queued resources, nodes and operations as the REST API
returns them, a create request's QueuedResource as the model's request, and the query and body
values the handlers read. Shared by the TPU routes (`server`) and the control routes (`control_api`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tpujobs.local.simulator.checks import accelerator_type_of_config
from tpujobs.local.simulator.errors import Code, SimulatorError, bad_request
from tpujobs.local.simulator.messages import query_str, timestamp
from tpujobs.local.simulator.records import (
    WORKER_PORT,
    NodeRecord,
    OperationRecord,
    Page,
    QrState,
    QueuedResourceRecord,
    QueuedResourceRequest,
    SliceRequest,
)
from tpujobs.local.simulator.workers import WorkerInfo

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
        "upcomingMaintenance",
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
    if node.upcoming_maintenance is not None:
        # Google's REST Node has it; of google-cloud-tpu's types only v2alpha1's Node does.
        out["upcomingMaintenance"] = dict(node.upcoming_maintenance)
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


def page_json(key: str, page: Page[Any], render: Callable[[Any], Json]) -> Json:
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


# -- query and body values ---------------------------------------------------------------------


def query_int(query: Query, name: str) -> int:
    raw = query.get(name, ["0"])[-1] or "0"
    try:
        return int(raw)
    except ValueError as exc:
        raise SimulatorError(Code.INVALID_ARGUMENT, f"{name} must be a number, got {raw!r}") from exc


def query_optional_int(query: Query, name: str) -> int | None:
    """An integer parameter, or None when it is absent or empty."""
    return query_int(query, name) if query_str(query, name) else None


def where(params: Mapping[str, str], query: Query) -> dict[str, str | None]:
    """The zone of a control path and the optional ?project= that settle which QR is meant."""
    return {"zone": params["zone"], "project": query_str(query, "project") or None}


def flag(request: Mapping[str, Any], name: str) -> bool:
    value = request.get(name, False)
    if not isinstance(value, bool):
        raise SimulatorError(Code.INVALID_ARGUMENT, f"{name} must be true or false, got {value!r}")
    return value


def whole(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SimulatorError(Code.INVALID_ARGUMENT, f"{name} must be a whole number, got {value!r}")
    return value


def query_bool(query: Query, name: str) -> bool:
    return query_str(query, name).lower() in ("true", "1")

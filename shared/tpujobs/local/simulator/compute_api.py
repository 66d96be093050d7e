"""The simulator's Compute Engine v1 REST face, as google-cloud-compute's REST clients call it (paths,
methods and query parameters from its `services/*/transports/rest_base.py`), with the control
endpoints of compute_control.py beside it. Translation only: the rules are the model's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from google.cloud import compute_v1

from tpujobs.local.simulator.compute_checks import read_body
from tpujobs.local.simulator.compute_control import ComputeControl
from tpujobs.local.simulator.compute_errors import ComputeError, as_compute, invalid_field
from tpujobs.local.simulator.compute_instance_verbs import InstanceVerbs
from tpujobs.local.simulator.compute_json import (
    group_json,
    instance_group_json,
    instance_json,
    list_json,
    managed_instance_json,
    operation_json,
    policy_json,
    template_json,
)
from tpujobs.local.simulator.compute_lists import query_whole
from tpujobs.local.simulator.compute_model import OperationView
from tpujobs.local.simulator.compute_records import COMPUTE_ROOT
from tpujobs.local.simulator.errors import Code, SimulatorError
from tpujobs.local.simulator.http import Routes
from tpujobs.local.simulator.messages import BadBody, query_str
from tpujobs.local.simulator.model import Simulator
from tpujobs.local.simulator.workers import WorkerPool

Json = dict[str, Any]
Query = Mapping[str, list[str]]
Handler = Callable[[dict[str, str], Query, bytes], tuple[int, Json]]
WAIT_SECONDS = 120.0  # operations.wait answers within two minutes, DONE or not, as Google's does
_PROJECT = "/compute/v1/projects/<project>"
_ZONE = _PROJECT + "/zones/<zone>"
_REGION = _PROJECT + "/regions/<region>"
_GLOBAL = _PROJECT + "/global"
_ID = "<id:id>"


def _by(location: str) -> Callable[[Callable[[str, str, str], Any], Callable[[Any], Json]], Handler]:
    """Handlers of get and delete: the model call on (project, zone or region or "", name), rendered."""

    def route(call: Callable[[str, str, str], Any], render: Callable[[Any], Json]) -> Handler:
        def handler(params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
            return 200, render(call(params["project"], params[location] if location else "", params["id"]))

        return handler

    return route


_COLLECTIONS = ("instances", "instanceGroupManagers", "resourcePolicies", "instanceTemplates", "instanceGroups")


def fault_method(method: str, path: str) -> str | None:
    """Which of the planned faults' methods (errors.FAULT_METHODS) a Compute call counts as:
    inserts are create, setMetadata and resize update, lists list; operations and control calls
    are never faulted, so an operation can always be followed to its end. A VM's stop and
    simulated maintenance are updates."""
    if not path.startswith(COMPUTE_ROOT) or "/operations" in path or path.endswith("/autoscalers"):
        return None
    last = path.rstrip("/").rsplit("/", 1)[-1]
    if method == "DELETE":
        return "delete"
    if last in ("setMetadata", "resize", "stop", "simulateMaintenanceEvent"):
        return "update"
    if last == "listManagedInstances" or (method == "GET" and (last in _COLLECTIONS or "/aggregated/" in path)):
        return "list"
    return "get" if method == "GET" else "create"


def _listing_args(query: Query) -> tuple[str, int, str]:
    return query_str(query, "filter"), query_whole(query, "maxResults"), query_str(query, "pageToken")


class ComputeApi:
    """Routes one Compute Engine request (or control call) to the model; no sockets."""

    def __init__(
        self, simulator: Simulator, worker_pool: WorkerPool | None = None, stopping: threading.Event | None = None
    ) -> None:
        self.simulator = simulator
        self.worker_pool = worker_pool
        self._stopping = stopping or threading.Event()
        sim = simulator
        zonal, regional, global_ = _by("zone"), _by("region"), _by("")
        insert = self._insert
        vm, group, policy, template = (
            compute_v1.Instance,
            compute_v1.InstanceGroupManager,
            compute_v1.ResourcePolicy,
            compute_v1.InstanceTemplate,
        )
        ops, vms, groups, slices = sim.compute.operations, sim.compute.vms, sim.compute.groups, sim.compute.slices
        rules: list[tuple[str, str, Handler]] = [
            ("POST", _ZONE + "/instances", insert(vms.insert_instance, vm, "zone")),
            ("GET", _ZONE + "/instances", self._list_instances),
            ("GET", _ZONE + f"/instances/{_ID}", zonal(vms.get_instance, instance_json)),
            ("DELETE", _ZONE + f"/instances/{_ID}", zonal(slices.delete_instance, operation_json)),
            ("POST", _ZONE + f"/instances/{_ID}/setMetadata", self._set_metadata),
            ("POST", _ZONE + "/instanceGroupManagers", insert(groups.insert_group, group, "zone")),
            ("GET", _ZONE + "/instanceGroupManagers", self._list_groups),
            ("GET", _ZONE + f"/instanceGroupManagers/{_ID}", zonal(groups.get_group, group_json)),
            ("DELETE", _ZONE + f"/instanceGroupManagers/{_ID}", zonal(groups.delete_group, operation_json)),
            ("POST", _ZONE + f"/instanceGroupManagers/{_ID}/listManagedInstances", self._list_managed),
            ("POST", _ZONE + f"/instanceGroupManagers/{_ID}/resize", self._resize),
            ("POST", _REGION + "/resourcePolicies", insert(ops.insert_policy, policy, "region")),
            ("GET", _REGION + "/resourcePolicies", self._list_policies),
            ("GET", _REGION + f"/resourcePolicies/{_ID}", regional(ops.get_policy, policy_json)),
            ("DELETE", _REGION + f"/resourcePolicies/{_ID}", regional(ops.delete_policy, operation_json)),
            ("POST", _REGION + "/instanceTemplates", insert(ops.insert_template, template, "region")),
            ("GET", _REGION + "/instanceTemplates", self._list_templates),
            ("GET", _REGION + f"/instanceTemplates/{_ID}", regional(ops.get_template, template_json)),
            ("DELETE", _REGION + f"/instanceTemplates/{_ID}", regional(ops.delete_template, operation_json)),
            ("POST", _GLOBAL + "/instanceTemplates", insert(ops.insert_template, template, "")),
            ("GET", _GLOBAL + "/instanceTemplates", self._list_templates),
            ("GET", _GLOBAL + f"/instanceTemplates/{_ID}", global_(ops.get_template, template_json)),
            ("DELETE", _GLOBAL + f"/instanceTemplates/{_ID}", global_(ops.delete_template, operation_json)),
        ]  # fmt: skip
        rules += [
            ("GET", _PROJECT + "/aggregated/instances", self._aggregated("instances", instance_json)),
            (
                "GET",
                _PROJECT + "/aggregated/instanceGroupManagers",
                self._aggregated("instanceGroupManagers", group_json),
            ),
            ("GET", _PROJECT + "/aggregated/resourcePolicies", self._aggregated("resourcePolicies", policy_json)),
            ("GET", _ZONE + "/autoscalers", self._no_autoscalers),
            ("GET", _ZONE + "/instanceGroups", self._list_instance_groups),
        ]
        for base in (_ZONE, _REGION, _GLOBAL):
            rules += [
                ("GET", base + "/operations", self._list_operations),
                ("GET", base + f"/operations/{_ID}", self._get_operation),
                ("POST", base + f"/operations/{_ID}/wait", self._wait_operation),
            ]
        rules += InstanceVerbs(simulator, worker_pool).rules()
        rules += ComputeControl(simulator, worker_pool).rules()
        self._routes = Routes(rules)

    def handles(self, path: str) -> bool:
        return path.startswith(COMPUTE_ROOT) or path.startswith("/simulator/v1/compute/")

    def route(self, method: str, path: str, query: Query, body: bytes) -> tuple[int, Json]:
        """The answer to one request; every refusal in Compute Engine's error shape."""
        try:
            found = self._routes.match(method, path)
            if found is None:
                raise ComputeError(
                    404, "notFound", f"The tpujobs simulator does not serve {method} {path}", Code.NOT_FOUND
                )
            handler, params = found
            fault = self.simulator.fault_plan.next_fault(fault_method(method, path))
            where = params.get("zone") or params.get("region") or "global"
            if fault is not None and not fault.applied:
                raise fault.error(params.get("project", ""), where)
            answer = handler(params, query, body)
            if fault is not None:  # applied: the call took effect, and its answer is lost
                raise fault.error(params.get("project", ""), where)
            return answer
        except SimulatorError as error:
            raise as_compute(error) from None
        except BadBody as error:
            raise ComputeError(400, "invalid", str(error)) from None

    # -- the Compute Engine API -----------------------------------------------------------------

    @staticmethod
    def _insert(insert: Callable[[str, str, Json], OperationView], message: Any, location: str) -> Handler:
        """An insert: the body read as *message*; *location* names the path's zone or region
        parameter ("" for a global resource)."""

        def handler(params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
            resource = read_body(body, message, "resource")
            where = params[location] if location else ""
            return 200, operation_json(insert(params["project"], where, resource))

        return handler

    def _aggregated(self, kind: str, render: Callable[[Any], Json]) -> Handler:
        """An aggregated list (gcloud's `list` without a zone), all on one page."""

        def handler(params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
            found = self.simulator.compute.groups.aggregated(params["project"], kind, query_str(query, "filter"))
            base = f"projects/{params['project']}/aggregated/{kind}"
            items = {scope: {kind: [render(item) for item in listed]} for scope, listed in sorted(found.items())}
            singular = kind[0].upper() + kind[1:-1]
            return 200, {
                "kind": f"compute#{singular[0].lower()}{singular[1:]}AggregatedList",
                "id": base,
                "items": items,
            }

        return handler

    def _no_autoscalers(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        """No MIG here is autoscaled (gcloud asks before describing one)."""
        base = f"projects/{params['project']}/zones/{params['zone']}/autoscalers"
        return 200, {"kind": "compute#autoscalerList", "id": base}

    def _list_instance_groups(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        """Each MIG's instance group (gcloud's `managed list` reads their sizes here)."""
        listing = self.simulator.compute.groups.list_groups(params["project"], params["zone"], *_listing_args(query))
        base = f"projects/{params['project']}/zones/{params['zone']}/instanceGroups"
        return 200, list_json("compute#instanceGroupList", base, listing, instance_group_json)

    def _list_instances(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        listing = self.simulator.compute.vms.list_instances(params["project"], params["zone"], *_listing_args(query))
        base = f"projects/{params['project']}/zones/{params['zone']}/instances"
        return 200, list_json("compute#instanceList", base, listing, instance_json)

    def _set_metadata(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        metadata = read_body(body, compute_v1.Metadata, "resource")
        return 200, operation_json(
            self.simulator.compute.vms.set_metadata(params["project"], params["zone"], params["id"], metadata)
        )

    def _list_groups(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        listing = self.simulator.compute.groups.list_groups(params["project"], params["zone"], *_listing_args(query))
        base = f"projects/{params['project']}/zones/{params['zone']}/instanceGroupManagers"
        return 200, list_json("compute#instanceGroupManagerList", base, listing, group_json)

    def _list_managed(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        listing = self.simulator.compute.groups.list_managed_instances(
            params["project"], params["zone"], params["id"], *_listing_args(query)
        )
        out: Json = {"managedInstances": [managed_instance_json(m) for m in listing.items]}
        if listing.next_page_token:
            out["nextPageToken"] = listing.next_page_token
        return 200, out

    def _resize(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        if not query_str(query, "size"):
            raise invalid_field("size", "", "This field is required.")
        operation = self.simulator.compute.groups.resize_group(
            params["project"], params["zone"], params["id"], query_whole(query, "size")
        )
        return 200, operation_json(operation)

    def _list_policies(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        listing = self.simulator.compute.operations.list_policies(
            params["project"], params["region"], *_listing_args(query)
        )
        base = f"projects/{params['project']}/regions/{params['region']}/resourcePolicies"
        return 200, list_json("compute#resourcePolicyList", base, listing, policy_json)

    def _list_templates(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        region = params.get("region", "")
        listing = self.simulator.compute.operations.list_templates(params["project"], region, *_listing_args(query))
        where = f"regions/{region}" if region else "global"
        base = f"projects/{params['project']}/{where}/instanceTemplates"
        return 200, list_json("compute#instanceTemplateList", base, listing, template_json)

    @staticmethod
    def _scope(params: Mapping[str, str]) -> str:
        if "zone" in params:
            return f"zones/{params['zone']}"
        return f"regions/{params['region']}" if "region" in params else "global"

    def _list_operations(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        scope = self._scope(params)
        listing = self.simulator.compute.operations.list_compute_operations(
            params["project"], scope, *_listing_args(query)
        )
        base = f"projects/{params['project']}/{scope}/operations"
        return 200, list_json("compute#operationList", base, listing, operation_json)

    def _get_operation(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        view = self.simulator.compute.operations.get_compute_operation(
            params["project"], self._scope(params), params["id"]
        )
        return 200, operation_json(view)

    def _wait_operation(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        """Held until the operation is DONE or WAIT_SECONDS pass (then answered as it is)."""
        deadline = time.monotonic() + WAIT_SECONDS
        scope = self._scope(params)
        while True:
            seen = self.simulator.generation()
            view = self.simulator.compute.operations.get_compute_operation(params["project"], scope, params["id"])
            remaining = deadline - time.monotonic()
            if view.status == "DONE" or remaining <= 0 or self._stopping.is_set():
                return 200, operation_json(view)
            self.simulator.wait_for_change(seen, min(remaining, 0.5))


def compute_state(simulator: Simulator) -> Json:
    """Every Compute resource of every project, for GET /simulator/v1/state."""
    tables = simulator.compute.groups.compute_snapshot()
    return {
        "resourcePolicies": [policy_json(p) for p in tables["policies"]],
        "instanceTemplates": [template_json(t) for t in tables["templates"]],
        "instanceGroupManagers": [group_json(g) for g in tables["groups"]],
        "instances": [instance_json(i) for i in tables["instances"]],
    }

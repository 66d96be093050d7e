"""The simulator's control endpoints under /simulator/v1/ (`client.SimulatorControl`, `tpujobs dev fault`):
health, state and config; faults (preempt, fail, kill-host, sigterm, no-boot, reboot, maintenance now or
announced ahead, node health and state, planned API errors); a QR's worker processes. Google has
no such API: these are how tests and developers make happen what Google makes happen.
"""

from __future__ import annotations

from collections.abc import Callable

from tpujobs.local.simulator.compute_api import compute_state
from tpujobs.local.simulator.errors import FAULT_METHODS, Code, Fault, SimulatorError
from tpujobs.local.simulator.http import Routes
from tpujobs.local.simulator.messages import json_object, query_str
from tpujobs.local.simulator.model import Simulator
from tpujobs.local.simulator.tpu_json import (
    Json,
    Query,
    flag,
    node_json,
    operation_json,
    query_int,
    query_optional_int,
    queued_resource_json,
    where,
    whole,
    worker_json,
)
from tpujobs.local.simulator.workers import WorkerPool

CONTROL_PREFIX = "/simulator/v1"
_QR = "/queuedResources/<zone>/<id:id>"
Handler = Callable[[dict[str, str], Query, bytes], tuple[int, Json]]


class ControlApi:
    """Routes one control request to the model; no field masks and no planned faults apply here."""

    def __init__(self, simulator: Simulator, worker_pool: WorkerPool | None = None) -> None:
        self.simulator = simulator
        self.worker_pool = worker_pool
        routes: list[tuple[str, str, Handler]] = [
            ("GET", "/health", self._health),
            ("GET", "/state", self._state),
            ("GET", "/config", self._get_config),
            ("POST", "/config", self._set_config),
            ("GET", "/faults", self._get_faults),
            ("POST", "/faults:clear", self._clear_faults),
            ("POST", "/faults/errors", self._inject_errors),
            ("POST", "/faults/no-boot", self._no_boot_next),
            ("POST", _QR + ":preempt", self._preempt),
            ("POST", _QR + ":fail", self._fail),
            ("POST", _QR + ":kill-host", self._kill_host),
            ("POST", _QR + ":no-boot", self._no_boot),
            ("POST", _QR + ":reboot", self._reboot),
            ("POST", _QR + ":maintenance", self._maintenance),
            ("POST", _QR + ":upcoming-maintenance", self._upcoming_maintenance),
            ("POST", _QR + ":node-health", self._node_health),
            ("POST", _QR + ":node-state", self._node_state),
            ("GET", _QR + ":workers", self._workers),
            ("POST", _QR + ":sigterm", self._sigterm),
        ]
        self._routes = Routes([(method, CONTROL_PREFIX + path, handler) for method, path, handler in routes])

    def route(self, method: str, path: str, query: Query, body: bytes) -> tuple[int, Json] | None:
        """The answer to a control request, or None when *path* is no control endpoint."""
        found = self._routes.match(method, path)
        if found is None:
            return None
        handler, params = found
        return handler(params, query, body)

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
        self.simulator.fault_plan.reconfigure(config)
        return 200, config.to_json()

    def _preempt(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        qr = self.simulator.queued_resources.preempt(
            params["id"], zone=params["zone"], project=query_str(query, "project") or None
        )
        return 200, queued_resource_json(qr)

    def _fail(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        details = json_object(body.strip(), "the failure")
        code = details.get("code") or Code.INTERNAL.grpc_code
        if not isinstance(code, int):
            raise SimulatorError(Code.INVALID_ARGUMENT, f"code must be a google.rpc.Code number, got {code!r}")
        qr = self.simulator.queued_resources.fail(
            params["id"],
            str(details.get("message") or "failed by the tpujobs simulator"),
            zone=params["zone"],
            project=query_str(query, "project") or None,
            code=code,
        )
        return 200, queued_resource_json(qr)

    def _kill_host(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        node = self.simulator.nodes.kill_host(
            params["id"],
            query_int(query, "slice"),
            query_int(query, "worker"),
            zone=params["zone"],
            project=query_str(query, "project") or None,
        )
        return 200, node_json(node)

    def _get_faults(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        return 200, self.simulator.fault_plan.faults()

    def _clear_faults(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        return 200, self.simulator.fault_plan.clear_faults()

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
                quota=flag(request, "quota"),
                applied=flag(request, "applied"),
                message=str(request.get("message") or ""),
            )
        except ValueError as exc:
            raise SimulatorError(Code.INVALID_ARGUMENT, str(exc)) from exc
        return 200, self.simulator.fault_plan.inject_errors(method, fault, whole(request.get("count", 1), "count"))

    def _no_boot_next(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        request = json_object(body, "the fault")
        return 200, self.simulator.fault_plan.no_boot(whole(request.get("count", 1), "count"))

    def _no_boot(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        qr = self.simulator.fault_plan.no_boot_queued_resource(params["id"], **where(params, query))
        return 200, queued_resource_json(qr)

    def _reboot(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        nodes = self.simulator.nodes.reboot(
            params["id"],
            query_optional_int(query, "slice"),
            query_optional_int(query, "worker"),
            **where(params, query),
        )
        return 200, {"nodes": [node_json(node) for node in nodes]}

    def _maintenance(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        notice = query_str(query, "notice")
        try:
            notice_seconds = float(notice) if notice else None
        except ValueError as exc:
            raise SimulatorError(Code.INVALID_ARGUMENT, f"notice must be a number of seconds, got {notice!r}") from exc
        nodes = self.simulator.nodes.maintenance(
            params["id"],
            query_optional_int(query, "slice"),
            notice_seconds,
            **where(params, query),
        )
        return 200, {"nodes": [node_json(node) for node in nodes]}

    def _upcoming_maintenance(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        """A maintenance window announced ahead: {"notice": seconds until it starts, "window": its length}."""
        request = json_object(body.strip() or b"{}", "the maintenance")
        notice, window = request.get("notice", 3600.0), request.get("window", 3600.0)
        for name, value in (("notice", notice), ("window", window)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SimulatorError(Code.INVALID_ARGUMENT, f"{name} must be a number of seconds, got {value!r}")
        nodes = self.simulator.nodes.schedule_maintenance_window(
            params["id"], query_optional_int(query, "slice"), float(notice), float(window), **where(params, query)
        )
        return 200, {"nodes": [node_json(node) for node in nodes]}

    def _node_health(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        request = json_object(body, "the node health")
        nodes = self.simulator.nodes.set_node_health(
            params["id"],
            str(request.get("health") or ""),
            str(request.get("description") or ""),
            query_optional_int(query, "slice"),
            **where(params, query),
        )
        return 200, {"nodes": [node_json(node) for node in nodes]}

    def _node_state(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        request = json_object(body, "the node state")
        nodes = self.simulator.nodes.set_node_state(
            params["id"],
            str(request.get("state") or ""),
            query_optional_int(query, "slice"),
            **where(params, query),
        )
        return 200, {"nodes": [node_json(node) for node in nodes]}

    def _sigterm(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        """SIGTERM to the QR's running hosts (or one slice's, or one worker's), with no notice."""
        if self.worker_pool is None:
            raise SimulatorError(Code.FAILED_PRECONDITION, "this simulator runs no host processes")
        signalled = self.worker_pool.sigterm(
            params["id"],
            zone=params["zone"],
            project=query_str(query, "project") or None,
            slice_index=query_optional_int(query, "slice"),
            worker=query_optional_int(query, "worker"),
        )
        if not signalled:
            raise SimulatorError(Code.NOT_FOUND, f"no running host of {params['id']} to signal")
        return 200, {"workers": [worker_json(w) for w in signalled]}

    def _workers(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        if self.worker_pool is None:
            return 200, {"workers": []}
        found = self.worker_pool.workers(params["id"], zone=params["zone"], project=query_str(query, "project") or None)
        return 200, {"workers": [worker_json(w) for w in found]}

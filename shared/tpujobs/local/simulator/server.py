"""The simulator's HTTP face: the Cloud TPU v2 REST API as google-cloud-tpu's REST client calls it,
the v1, v2 and v2alpha1 paths gcloud asks besides (`catalog`; simulateMaintenanceEvent), v2alpha1's
nodes (the only client types with upcomingMaintenance), Compute Engine v1 as google-cloud-compute's
does (`compute_api`), plus control endpoints under
/simulator/v1/ (`control_api`: preempt, fail, faults, config; `client.SimulatorControl`),
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

from google.cloud import tpu_v2

from tpujobs.local.simulator import fields
from tpujobs.local.simulator.catalog import CatalogApi
from tpujobs.local.simulator.compute_api import ComputeApi
from tpujobs.local.simulator.compute_hosts import overlay_of
from tpujobs.local.simulator.control_api import ControlApi
from tpujobs.local.simulator.http import ApiServer, JsonRequestHandler, Routes, google_answer
from tpujobs.local.simulator.identity import CERTS_CACHE_CONTROL, CERTS_PATH, IdentitySigner
from tpujobs.local.simulator.messages import camel, canonical, json_object, query_str
from tpujobs.local.simulator.metadata import MetadataReply, MetadataService, metadata_url
from tpujobs.local.simulator.model import (
    Code,
    JsonStateFile,
    NodeRecord,
    Simulator,
    SimulatorConfig,
    SimulatorError,
)
from tpujobs.local.simulator.tpu_json import (
    Json,
    Query,
    node_json,
    operation_json,
    page_json,
    parse_queued_resource,
    query_bool,
    query_int,
    queued_resource_json,
)
from tpujobs.local.simulator.workers import WorkerInfo, WorkerPool

_log = logging.getLogger(__name__)

# -- routing ----------------------------------------------------------------------------------

_LOCATION = "/v2/projects/<project>/locations/<zone>"
# gcloud alpha's simulate-maintenance-event; nodes with upcomingMaintenance (adapters/tpu_maintenance.py)
_ALPHA_LOCATION = "/v2alpha1/projects/<project>/locations/<zone>"
_ID = "<id:id>"
Handler = Callable[[dict[str, str], Query, bytes], tuple[int, Json]]


@dataclass(frozen=True)
class _TpuMethod:
    """One TPU API method: what a fault aimed at it is called, and what message it answers."""

    handler: Handler
    fault_method: str | None  # one of FAULT_METHODS, or None for operations
    response: str  # a fields.RESPONSES name, to check field masks against


def _tpu_route(
    method: str, path: str, handler: Handler, fault_method: str | None, response: str, location: str = _LOCATION
) -> tuple[str, str, _TpuMethod]:
    return method, location + path, _TpuMethod(handler, fault_method, response)


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
            simulator.node_updates.host_node,
            stopping=stopping,
            changes=simulator,
            signer=self.identity_signer,
            overlay=overlay_of(simulator),
        )
        self.compute_api = ComputeApi(simulator, worker_pool, stopping)
        self.control_api = ControlApi(simulator, worker_pool)
        self.catalog_api = CatalogApi(simulator)
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
                _tpu_route("POST", f"{nodes}/{_ID}:stop", self._stop_node, None, "Operation"),
                _tpu_route("POST", f"{nodes}/{_ID}:start", self._start_node, None, "Operation"),
                _tpu_route("GET", operations, self._list_operations, None, "ListOperationsResponse"),
                _tpu_route("GET", f"{operations}/{_ID}", self._get_operation, None, "Operation"),
                # v2alpha1's Node has upcomingMaintenance (google-cloud-tpu's v2 Node has not)
                _tpu_route("GET", nodes, self._list_nodes, "list", "AlphaListNodesResponse", _ALPHA_LOCATION),
                _tpu_route("GET", f"{nodes}/{_ID}", self._get_node, "get", "AlphaNode", _ALPHA_LOCATION),
                _tpu_route(
                    "POST",
                    f"{nodes}/{_ID}:simulateMaintenanceEvent",
                    self._simulate_maintenance,
                    None,
                    "Operation",
                    _ALPHA_LOCATION,
                ),
                _tpu_route("GET", f"{operations}/{_ID}", self._get_operation, None, "Operation", _ALPHA_LOCATION),
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
        answer = self.catalog_api.route(method, path, query) or self.control_api.route(method, path, query, body)
        if answer is not None:
            return answer
        if path.startswith(("/v1/", "/v2/", "/v2alpha1/")):
            raise SimulatorError(Code.UNIMPLEMENTED, f"the tpujobs simulator does not implement {method} {path}")
        raise SimulatorError(Code.NOT_FOUND, f"no such endpoint: {method} {path}")

    def _call_tpu(
        self, route: _TpuMethod, params: dict[str, str], query: Query, body: bytes, field_mask: str
    ) -> tuple[int, Json]:
        fault = self.simulator.fault_plan.next_fault(route.fault_method)
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
        operation = self.simulator.queued_resources.create_queued_resource(
            params["project"], params["zone"], query_str(query, "queuedResourceId"), request
        )
        return 200, operation_json(operation)

    def _list_queued_resources(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        page = self.simulator.queued_resources.list_queued_resources(
            params["project"], params["zone"], query_int(query, "pageSize"), query_str(query, "pageToken")
        )
        return 200, page_json("queuedResources", page, queued_resource_json)

    def _get_queued_resource(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        return 200, queued_resource_json(
            self.simulator.queued_resources.get_queued_resource(params["project"], params["zone"], params["id"])
        )

    def _delete_queued_resource(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        operation = self.simulator.queued_resources.delete_queued_resource(
            params["project"], params["zone"], params["id"], force=query_bool(query, "force")
        )
        return 200, operation_json(operation)

    def _list_nodes(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        page = self.simulator.nodes.list_nodes(
            params["project"], params["zone"], query_int(query, "pageSize"), query_str(query, "pageToken")
        )
        return 200, page_json("nodes", page, node_json)

    def _get_node(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        return 200, node_json(self.simulator.nodes.get_node(params["project"], params["zone"], params["id"]))

    def _update_node(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        """PATCH v2/{name=projects/*/locations/*/nodes/*}?updateMask=a,b with a Node body."""
        mask = [camel(path) for path in query_str(query, "updateMask").split(",") if path.strip()]
        node = canonical(body, tpu_v2.Node.pb(), "Node")
        operation = self.simulator.node_updates.update_node(params["project"], params["zone"], params["id"], mask, node)
        return 200, operation_json(operation)

    def _stop_node(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        """POST v2/{name=projects/*/locations/*/nodes/*}:stop with a StopNodeRequest (empty)."""
        return 200, operation_json(self.simulator.node_power.stop_node(params["project"], params["zone"], params["id"]))

    def _start_node(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        """POST v2/{name=projects/*/locations/*/nodes/*}:start with a StartNodeRequest (empty)."""
        return 200, operation_json(
            self.simulator.node_power.start_node(params["project"], params["zone"], params["id"])
        )

    def _simulate_maintenance(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        """POST v2alpha1/{name=projects/*/locations/*/nodes/*}:simulateMaintenanceEvent with
        {"workerIds": ["0", ...]}; no workers named means worker 0, as gcloud documents."""
        request = json_object(body.strip() or b"{}", "the SimulateMaintenanceEventRequest")
        raw = request.get("workerIds") or ["0"]
        try:
            workers = [int(worker) for worker in raw]
        except (TypeError, ValueError) as exc:
            raise SimulatorError(Code.INVALID_ARGUMENT, f"workerIds must be worker numbers, got {raw!r}") from exc
        operation = self.simulator.node_power.simulate_maintenance_event(
            params["project"], params["zone"], params["id"], workers
        )
        return 200, operation_json(operation)

    def _list_operations(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        page = self.simulator.queued_resources.list_operations(
            params["project"], params["zone"], query_int(query, "pageSize"), query_str(query, "pageToken")
        )
        return 200, page_json("operations", page, operation_json)

    def _get_operation(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        return 200, operation_json(
            self.simulator.queued_resources.get_operation(params["project"], params["zone"], params["id"])
        )


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

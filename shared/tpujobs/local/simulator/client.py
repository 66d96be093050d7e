"""A client of the TPU simulator's control API (``/simulator/v1/...``, see ``server.py``).

Why one: tests, the benches and ``tpujobs dev fault`` all preempt, fail, kill and reconfigure
the simulator; one small class keeps the paths, quoting and JSON in one place. Standard
library only, so it costs no import time. An HTTP error answer raises ``urllib.error.HTTPError``
(its body is Google's error JSON); a simulator that does not answer raises ``OSError``.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any
from urllib.parse import quote, urlencode

CONTROL_PATH = "/simulator/v1"
TIMEOUT_S = 10.0
# The simulator is local: a proxy named in the environment must not stand between them.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class SimulatorControl:
    """The control API of the simulator at `endpoint` (its base URL, as the TPU client gets it)."""

    def __init__(self, endpoint: str, timeout: float = TIMEOUT_S) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout = timeout

    def call(
        self, method: str, path: str, body: dict[str, Any] | None = None, query: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """One control call (`path` under /simulator/v1/); its JSON answer. None-valued query items are left out."""
        url = f"{self.endpoint}{CONTROL_PATH}/{path}"
        wanted = {key: value for key, value in (query or {}).items() if value is not None}
        if wanted:
            url += "?" + urlencode(wanted)
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        with _OPENER.open(request, timeout=self.timeout) as response:
            answer: dict[str, Any] = json.load(response)
        return answer

    # -- the simulator as a whole -------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return self.call("GET", "health")

    def state(self) -> dict[str, Any]:
        """Every queued resource, with its nodes and workers."""
        return self.call("GET", "state")

    def config(self) -> dict[str, Any]:
        return self.call("GET", "config")

    def configure(self, **changes: Any) -> dict[str, Any]:
        """Change SimulatorConfig fields (JSON names); the whole config after."""
        return self.call("POST", "config", changes)

    def faults(self) -> dict[str, Any]:
        """The planned errors and the no-boot budget."""
        return self.call("GET", "faults")

    def clear_faults(self) -> dict[str, Any]:
        return self.call("POST", "faults:clear", {})

    def plan_errors(
        self,
        method: str,
        code: int | str,
        count: int = 1,
        quota: bool = False,
        applied: bool = False,
        message: str = "",
    ) -> dict[str, Any]:
        """The next `count` TPU API calls of `method` (create, get, list, delete, update) answer `code`."""
        body = {"method": method, "code": code, "count": count, "quota": quota, "applied": applied, "message": message}
        return self.call("POST", "faults/errors", body)

    def no_boot_next(self, count: int = 1) -> dict[str, Any]:
        """The next `count` queued resources created get hosts that never run their startup script."""
        return self.call("POST", "faults/no-boot", {"count": count})

    # -- one queued resource ------------------------------------------------------------------

    def on_queued_resource(
        self,
        zone: str,
        qr_id: str,
        verb: str,
        body: dict[str, Any] | None = None,
        method: str = "POST",
        **query: Any,
    ) -> dict[str, Any]:
        """A control verb on one queued resource (``queuedResources/{zone}/{id}:{verb}``)."""
        path = f"queuedResources/{quote(zone, safe='')}/{quote(qr_id, safe='')}:{verb}"
        return self.call(method, path, {} if body is None and method == "POST" else body, query)

    def preempt(self, zone: str, qr_id: str, project: str | None = None) -> dict[str, Any]:
        return self.on_queued_resource(zone, qr_id, "preempt", project=project)

    def fail(self, zone: str, qr_id: str, code: str | None = None, message: str | None = None) -> dict[str, Any]:
        body = {key: value for key, value in {"code": code, "message": message}.items() if value is not None}
        return self.on_queued_resource(zone, qr_id, "fail", body)

    def kill_host(self, zone: str, qr_id: str, worker: int, slice_index: int | None = None) -> dict[str, Any]:
        return self.on_queued_resource(zone, qr_id, "kill-host", worker=worker, slice=slice_index)

    def sigterm(
        self, zone: str, qr_id: str, worker: int | None = None, slice_index: int | None = None
    ) -> dict[str, Any]:
        """SIGTERM to the hosts' processes with no preemption notice (every host, or one)."""
        return self.on_queued_resource(zone, qr_id, "sigterm", worker=worker, slice=slice_index)

    def no_boot(self, zone: str, qr_id: str, project: str | None = None) -> dict[str, Any]:
        return self.on_queued_resource(zone, qr_id, "no-boot", project=project)

    def reboot(
        self, zone: str, qr_id: str, worker: int | None = None, slice_index: int | None = None
    ) -> dict[str, Any]:
        return self.on_queued_resource(zone, qr_id, "reboot", worker=worker, slice=slice_index)

    def maintenance(
        self, zone: str, qr_id: str, notice: float | None = None, slice_index: int | None = None
    ) -> dict[str, Any]:
        return self.on_queued_resource(zone, qr_id, "maintenance", notice=notice, slice=slice_index)

    def upcoming_maintenance(
        self,
        zone: str,
        qr_id: str,
        notice: float = 3600.0,
        window: float = 3600.0,
        slice_index: int | None = None,
        project: str | None = None,
    ) -> dict[str, Any]:
        """Announce a maintenance window *notice* seconds ahead, lasting *window* seconds, on the
        nodes of a queued resource (or one slice): their upcomingMaintenance and metadata key."""
        body = {"notice": notice, "window": window}
        return self.on_queued_resource(zone, qr_id, "upcoming-maintenance", body, slice=slice_index, project=project)

    def node_health(
        self, zone: str, qr_id: str, health: str, description: str = "", slice_index: int | None = None
    ) -> dict[str, Any]:
        body = {"health": health, "description": description}
        return self.on_queued_resource(zone, qr_id, "node-health", body, slice=slice_index)

    def node_state(self, zone: str, qr_id: str, state: str, slice_index: int | None = None) -> dict[str, Any]:
        return self.on_queued_resource(zone, qr_id, "node-state", {"state": state}, slice=slice_index)

    def workers(self, zone: str, qr_id: str) -> list[dict[str, Any]]:
        """The worker processes of one queued resource, as the simulator runs them."""
        workers: list[dict[str, Any]] = self.on_queued_resource(zone, qr_id, "workers", method="GET")["workers"]
        return workers

    # -- Compute Engine VMs and MIGs ------------------------------------------------------------

    def on_compute(
        self,
        zone: str,
        collection: str,
        name: str,
        verb: str,
        body: dict[str, Any] | None = None,
        method: str = "POST",
        **query: Any,
    ) -> dict[str, Any]:
        """A control verb on one Compute VM or MIG (``compute/{zone}/{collection}/{name}:{verb}``);
        *collection* is ``instances`` or ``instanceGroupManagers``."""
        path = f"compute/{quote(zone, safe='')}/{collection}/{quote(name, safe='')}:{verb}"
        return self.call(method, path, {} if body is None and method == "POST" else body, query)

    def preempt_instance(self, zone: str, name: str, project: str | None = None) -> dict[str, Any]:
        """Spot preemption of one VM: `instance/preempted` TRUE, SIGTERM, TERMINATED after the grace."""
        return self.on_compute(zone, "instances", name, "preempt", project=project)

    def preempt_group(self, zone: str, name: str, project: str | None = None) -> dict[str, Any]:
        """Spot preemption of every running VM of a MIG."""
        return self.on_compute(zone, "instanceGroupManagers", name, "preempt", project=project)

    def schedule_maintenance(
        self, zone: str, name: str, notice: float = 3600.0, window: float = 3600.0, project: str | None = None
    ) -> dict[str, Any]:
        """Announce a host maintenance *notice* seconds ahead, lasting *window* seconds."""
        body = {"notice": notice, "window": window}
        return self.on_compute(zone, "instances", name, "maintenance", body, project=project)

    def reset_group(
        self, zone: str, name: str, worker: int | None = None, project: str | None = None
    ) -> dict[str, Any]:
        """instances.reset of one member of a MIG (*worker*) or of all: processes die, the startup
        script runs again on the same disk."""
        return self.on_compute(zone, "instanceGroupManagers", name, "reset", worker=worker, project=project)

    def kill_group_host(self, zone: str, name: str, worker: int = 0, project: str | None = None) -> dict[str, Any]:
        """One member's host dies without notice; the API shows nothing."""
        return self.on_compute(zone, "instanceGroupManagers", name, "kill-host", worker=worker, project=project)

    def no_boot_group(self, zone: str, name: str, project: str | None = None) -> dict[str, Any]:
        """The hosts of a MIG whose VMs are not RUNNING yet never run their startup script."""
        return self.on_compute(zone, "instanceGroupManagers", name, "no-boot", project=project)

    def group_maintenance(
        self, zone: str, name: str, notice: float | None = None, project: str | None = None
    ) -> dict[str, Any]:
        """Host maintenance of a MIG's VMs: announced on upcomingMaintenance, then after *notice*
        seconds each VM shut down and TERMINATED for good (instance/maintenance-event stays NONE)."""
        body = {} if notice is None else {"notice": notice}
        return self.on_compute(zone, "instanceGroupManagers", name, "maintenance", body, project=project)

    def schedule_group_maintenance(
        self, zone: str, name: str, notice: float = 3600.0, window: float = 3600.0, project: str | None = None
    ) -> dict[str, Any]:
        """Google's advance notice of a maintenance on every VM of a MIG (schedule_maintenance each)."""
        body = {"notice": notice, "window": window}
        return self.on_compute(zone, "instanceGroupManagers", name, "upcoming-maintenance", body, project=project)

    def fail_topology(
        self, zone: str, name: str, state: str = "FAILED", message: str = "", project: str | None = None
    ) -> dict[str, Any]:
        """A MIG slice's interconnect (appliedAcceleratorTopologies) turns FAILED or INCOMPLETE."""
        body = {"state": state, "message": message}
        return self.on_compute(zone, "instanceGroupManagers", name, "topology", body, project=project)

    def grant_partially(
        self, zone: str, name: str, hosts: int | None = None, project: str | None = None
    ) -> dict[str, Any]:
        """Of a MIG slice waiting for capacity, *hosts* VMs run now (default all but one)."""
        body = {} if hosts is None else {"hosts": hosts}
        return self.on_compute(zone, "instanceGroupManagers", name, "partial", body, project=project)

    def instance_workers(self, zone: str, name: str, project: str | None = None) -> list[dict[str, Any]]:
        """The worker process of a lone VM, with its instance name."""
        found: list[dict[str, Any]] = self.on_compute(
            zone, "instances", name, "workers", method="GET", project=project
        )["workers"]
        return found

    def group_workers(self, zone: str, name: str, project: str | None = None) -> list[dict[str, Any]]:
        """The worker processes of a MIG's slice, each with its instance name, by worker."""
        found: list[dict[str, Any]] = self.on_compute(
            zone, "instanceGroupManagers", name, "workers", method="GET", project=project
        )["workers"]
        return found

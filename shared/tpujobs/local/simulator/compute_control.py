"""The simulator's control endpoints for Compute Engine, under /simulator/v1/compute/{zone}/: what the
cloud does to a VM or a MIG's slice (Spot preemption, a reset, a host lost without notice, hosts
that never boot, host maintenance now or announced ahead, a slice's interconnect FAILED or
INCOMPLETE, part of a waiting slice granted) and the worker processes of a slice.
`client.SimulatorControl` calls them; `tpujobs dev fault` and `tpujobs dev preempt` through it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tpujobs.local.simulator.compute_errors import ComputeError, invalid_field, not_found
from tpujobs.local.simulator.compute_groups import GroupView
from tpujobs.local.simulator.compute_json import group_json, instance_json
from tpujobs.local.simulator.messages import json_object, query_str
from tpujobs.local.simulator.model import Simulator
from tpujobs.local.simulator.workers import WorkerPool

Json = dict[str, Any]
Query = Mapping[str, list[str]]
Handler = Callable[[dict[str, str], Query, bytes], tuple[int, Json]]
CONTROL = "/simulator/v1/compute/<zone>"
_ID = "<id:id>"
_VM, _MIG = "instances", "instanceGroupManagers"


def _seconds(request: Mapping[str, Any], name: str, default: float) -> float:
    value = request.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ComputeError(400, "invalid", f"{name} must be a number of seconds")
    return float(value)


def _worker(query: Query) -> int | None:
    raw = query_str(query, "worker")
    if not raw:
        return None
    if not raw.isdigit():
        raise invalid_field("worker", raw, "It must be a whole number.")
    return int(raw)


def slice_json(view: GroupView) -> Json:
    """A MIG with its members' names, workers and statuses: what a control answer shows."""
    members = [{"name": m.record.name, "worker": m.record.worker, "status": m.status} for m in view.members]
    return {**group_json(view), "instances": members}


class ComputeControl:
    """The control handlers; `rules` lists them for the Compute face's router."""

    def __init__(self, simulator: Simulator, worker_pool: WorkerPool | None = None) -> None:
        self.simulator = simulator
        self.worker_pool = worker_pool

    def rules(self) -> list[tuple[str, str, Handler]]:
        vm, mig = f"{CONTROL}/{_VM}/{_ID}", f"{CONTROL}/{_MIG}/{_ID}"
        return [
            ("POST", vm + ":preempt", self._preempt_instance),
            ("POST", vm + ":maintenance", self._schedule_instance_maintenance),
            ("GET", vm + ":workers", self._instance_workers),
            ("POST", mig + ":preempt", self._preempt_group),
            ("POST", mig + ":reset", self._reset_group),
            ("POST", mig + ":kill-host", self._kill_host),
            ("POST", mig + ":no-boot", self._no_boot),
            ("POST", mig + ":maintenance", self._group_maintenance),
            ("POST", mig + ":upcoming-maintenance", self._schedule_group_maintenance),
            ("POST", mig + ":topology", self._force_topology),
            ("POST", mig + ":partial", self._grant_partially),
            ("GET", mig + ":workers", self._group_workers),
        ]

    def _project(self, params: Mapping[str, str], query: Query, kind: str) -> str:
        """The ?project= of a control call, or the one project that has such a resource there."""
        named = query_str(query, "project")
        if named:
            return named
        projects = self.simulator.compute.groups.compute_projects(params["zone"], kind, params["id"])
        if len(projects) != 1:
            what = f"{kind} {params['id']!r} in {params['zone']}"
            if not projects:
                raise not_found(what)
            raise ComputeError(400, "invalid", f"{what} is in several projects; name one with ?project=")
        return projects[0]

    def _preempt_instance(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        project = self._project(params, query, _VM)
        return 200, instance_json(self.simulator.compute.vms.preempt_instance(project, params["zone"], params["id"]))

    def _schedule_instance_maintenance(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        request = json_object(body.strip(), "the maintenance")
        project = self._project(params, query, _VM)
        notice, window = _seconds(request, "notice", 3600.0), _seconds(request, "window", 3600.0)
        view = self.simulator.compute.vms.schedule_maintenance(project, params["zone"], params["id"], notice, window)
        return 200, instance_json(view)

    def _preempt_group(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        project = self._project(params, query, _MIG)
        return 200, slice_json(self.simulator.compute.groups.preempt_group(project, params["zone"], params["id"]))

    def _reset_group(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        project = self._project(params, query, _MIG)
        view = self.simulator.compute.faults.reset_group(project, params["zone"], params["id"], _worker(query))
        return 200, slice_json(view)

    def _kill_host(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        project = self._project(params, query, _MIG)
        view = self.simulator.compute.faults.kill_group_host(project, params["zone"], params["id"], _worker(query) or 0)
        return 200, slice_json(view)

    def _no_boot(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        project = self._project(params, query, _MIG)
        return 200, slice_json(self.simulator.compute.faults.no_boot_group(project, params["zone"], params["id"]))

    def _group_maintenance(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        """Maintenance now: the hosts are told, then terminated after the notice."""
        request = json_object(body.strip(), "the maintenance")
        notice = _seconds(request, "notice", 0.0) if "notice" in request else None
        project = self._project(params, query, _MIG)
        view = self.simulator.compute.faults.terminate_for_maintenance(project, params["zone"], params["id"], notice)
        return 200, slice_json(view)

    def _schedule_group_maintenance(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        """Google's advance notice, on every VM of the MIG."""
        request = json_object(body.strip(), "the maintenance")
        notice, window = _seconds(request, "notice", 3600.0), _seconds(request, "window", 3600.0)
        project = self._project(params, query, _MIG)
        view = self.simulator.compute.faults.schedule_group_maintenance(
            project, params["zone"], params["id"], notice, window
        )
        return 200, slice_json(view)

    def _force_topology(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        """The slice's interconnect turns {"state": FAILED|INCOMPLETE}, with {"message"} as its reason."""
        request = json_object(body.strip(), "the interconnect's state")
        state, message = request.get("state"), request.get("message", "")
        if not isinstance(state, str) or not isinstance(message, str):
            raise ComputeError(400, "invalid", "state (FAILED or INCOMPLETE) and message must be strings")
        project = self._project(params, query, _MIG)
        view = self.simulator.compute.slices.force_topology(
            project, params["zone"], params["id"], state.upper(), message
        )
        return 200, slice_json(view)

    def _grant_partially(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        """Of a waiting slice, {"hosts": K} VMs come now (default all but one)."""
        request = json_object(body.strip(), "the partial grant")
        hosts = request.get("hosts")
        if hosts is not None and (isinstance(hosts, bool) or not isinstance(hosts, int)):
            raise invalid_field("hosts", hosts, "It must be a whole number.")
        project = self._project(params, query, _MIG)
        return 200, slice_json(
            self.simulator.compute.slices.grant_partially(project, params["zone"], params["id"], hosts)
        )

    def _instance_workers(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        project = self._project(params, query, _VM)
        view = self.simulator.compute.vms.get_instance(project, params["zone"], params["id"])
        return 200, {"workers": self._workers(project, params["zone"], view.record.backing, {0: view.record.name})}

    def _group_workers(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        project = self._project(params, query, _MIG)
        view = self.simulator.compute.groups.get_group(project, params["zone"], params["id"])
        names = {m.record.worker: m.record.name for m in view.members}
        return 200, {"workers": self._workers(project, params["zone"], view.record.backing, names)}

    def _workers(self, project: str, zone: str, backing: str, names: Mapping[int, str]) -> list[Json]:
        if self.worker_pool is None or not backing:
            return []
        found = self.worker_pool.workers(backing, zone=zone, project=project)
        return [{**w.to_json(), "instance": names.get(w.worker, "")} for w in found]

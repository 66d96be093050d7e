"""The simulated Compute Engine's VMs: lone TPU VMs (insert, get, list, delete), setMetadata with
its fingerprint, and what the cloud does to a VM (Spot preemption, scheduled maintenance).

A VM's status follows the TPU model's queued resource under its slice (waiting for chips: no VM
yet, or PENDING for flex-start; PROVISIONING, then STAGING for the second half of
provisioning_seconds; RUNNING once ACTIVE) until something happens to the VM itself (Phase).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpujobs.domain.platforms import ComputeShape
from tpujobs.local.simulator.compute_checks import check_name, check_vm, metadata_items, slice_shape
from tpujobs.local.simulator.compute_errors import ComputeError, already_exists, condition_not_met, in_use, not_found
from tpujobs.local.simulator.compute_lists import name_filter
from tpujobs.local.simulator.compute_model import ComputeCore, Listing, OperationView
from tpujobs.local.simulator.compute_records import (
    RUNTIME_VERSION,
    ComputeOperation,
    Effect,
    InstanceRecord,
    Phase,
    Step,
    rfc3339,
)
from tpujobs.local.simulator.errors import Code, SimulatorError
from tpujobs.local.simulator.quota_counts import compute_refusal, holdings, shortfall
from tpujobs.local.simulator.records import (
    HostAction,
    Initiator,
    NodeRecord,
    QrState,
    QueuedResourceRecord,
    QueuedResourceRequest,
    SliceRequest,
    backs_compute,
)

STOCKOUT = "ZONE_RESOURCE_POOL_EXHAUSTED"
QUOTA = "QUOTA_EXCEEDED"
# The operation's HTTP status when a lone VM's insert is refused (a stockout: 503).
_HTTP_OF_REFUSAL = {QUOTA: (403, "FORBIDDEN"), "CONDITION_NOT_MET": (400, "BAD REQUEST")}
_WAITING = frozenset({QrState.CREATING, QrState.ACCEPTED, QrState.WAITING_FOR_RESOURCES})


@dataclass(frozen=True)
class InstanceView:
    """A VM as the API shows it now."""

    record: InstanceRecord
    status: str | None  # None: the VM does not exist (yet, or any more)
    address: str  # its internal IP once it has one
    current_action: str  # as a MIG's listManagedInstances says
    errors: tuple[tuple[str, str], ...] = ()  # lastAttempt.errors: why it is not created yet


@dataclass(frozen=True)
class HostInstance:
    """The VM behind one host of a Compute slice, for its metadata server."""

    record: InstanceRecord
    preempted: bool


class ComputeVms(ComputeCore):
    """Lone TPU VMs and what every VM, in a MIG or not, goes through."""

    def insert_instance(self, project: str, zone: str, body: Mapping[str, Any]) -> OperationView:
        """instances.insert of one single-host TPU VM; the operation is DONE once the VM has
        capacity, or fails with ZONE_RESOURCE_POOL_EXHAUSTED / QUOTA_EXCEEDED when it finds none
        (a FLEX_START VM waits, PENDING, instead)."""
        name = check_name(body.get("name"))
        machine_type = check_vm(body, "resource", zone)
        shape = slice_shape(machine_type, 1, None)
        with self._transaction() as now:
            path = f"projects/{project}/zones/{zone}/instances/{name}"
            if (project, zone, name) in self._compute.instances:
                raise already_exists(path)
            backing = f"vm.{name}.{self._count('compute-backing')}"
            items = metadata_items(body.get("metadata") or {}, "resource.metadata")
            vm = InstanceRecord(
                project=project,
                zone=zone,
                name=name,
                number=self._new_number(),
                body=dict(body),
                metadata=items,
                create_time=self._wall_clock(),
                backing=backing,
                topology=shape.topology,
            )
            self._compute.instances[(project, zone, name)] = vm
            self._back(vm, shape, path, now)
            return self._new_compute_operation(
                project, f"zones/{zone}", "insert", path, vm.number, now, Effect.CHECK_CAPACITY
            )

    def get_instance(self, project: str, zone: str, name: str) -> InstanceView:
        with self._transaction() as now:
            return self._existing(project, zone, name, now)

    def list_instances(
        self, project: str, zone: str, filter_text: str = "", max_results: int = 0, token: str = ""
    ) -> Listing:
        """The VMs that exist (a MIG's included), by name."""
        keep = name_filter(filter_text)
        with self._transaction() as now:
            found = [
                view
                for key, vm in self._compute.instances.items()
                if key[:2] == (project, zone) and keep(vm.name)
                for view in [self._view(vm, now)]
                if view.status is not None
            ]
        return self._page(found, lambda view: view.record.name, max_results, token)

    def delete_instance(self, project: str, zone: str, name: str) -> OperationView:
        """A lone VM: its hosts get SIGTERM, and it is gone when the operation is DONE. A MIG's
        VM is refused: resize or delete the group."""
        with self._transaction() as now:
            vm = self._existing(project, zone, name, now).record
            if vm.group:
                group = f"projects/{project}/zones/{zone}/instanceGroupManagers/{vm.group}"
                raise in_use("instance", vm.path, group)
            self._compute.instances[(project, zone, name)] = dataclasses.replace(vm, deleting=True)
            self._unback(vm.backing, project, zone, now)
            return self._new_compute_operation(
                project, f"zones/{zone}", "delete", vm.path, vm.number, now, Effect.REMOVE_INSTANCE
            )

    def set_metadata(self, project: str, zone: str, name: str, metadata: Mapping[str, Any]) -> OperationView:
        """instances.setMetadata: the items are replaced at once (the host's metadata server answers
        them) when `fingerprint` is the current one; a stale or missing one is 412 conditionNotMet."""
        items = metadata_items(metadata, "resource")
        with self._transaction() as now:
            vm = self._existing(project, zone, name, now).record
            if metadata.get("fingerprint") != vm.fingerprint:
                raise condition_not_met("Supplied fingerprint does not match current metadata fingerprint.")
            self._compute.instances[(project, zone, name)] = dataclasses.replace(vm, metadata=items)
            self._dirty = True
            return self._new_compute_operation(project, f"zones/{zone}", "setMetadata", vm.path, vm.number, now)

    def preempt_instance(self, project: str, zone: str, name: str) -> InstanceView:
        """Spot preemption of one RUNNING VM: `instance/preempted` TRUE at once, ACPI soft-off (SIGTERM,
        SIGKILL after preemption_grace_seconds), STOPPING until then, TERMINATED after, and deleted
        next when its instanceTerminationAction is DELETE."""
        with self._transaction() as now:
            view = self._existing(project, zone, name, now)
            self._preempt(view, now)
            return self._view(self._compute.instances[(project, zone, name)], now)

    def stop_instance(self, project: str, zone: str, name: str) -> OperationView:
        """instances.stop, a MIG's VM included (a DO_NOTHING MIG does not repair it): ACPI soft-off
        (SIGTERM, SIGKILL after delete_grace_seconds), STOPPING, then TERMINATED and kept (Step.STOP).
        A VM already STOPPING or TERMINATED is left as it is; one not RUNNING yet is refused."""
        with self._transaction() as now:
            view = self._existing(project, zone, name, now)
            vm = view.record
            if view.status == "RUNNING":
                grace = self._config.delete_grace_seconds
                self._compute.instances[(project, zone, name)] = dataclasses.replace(
                    vm, phase=Phase.STOPPING, next_at=now + grace, step=Step.STOP
                )
                self._dirty = True
                qr = self._qrs.get((project, zone, vm.backing))
                if qr is not None:
                    self._queue_host_event(qr, 0, (vm.worker,), HostAction.SHUTDOWN)
            elif view.status not in ("STOPPING", "TERMINATED"):
                raise ComputeError(400, "conditionNotMet", f"{vm.path} is {view.status}; only a RUNNING VM is stopped")
            return self._new_compute_operation(project, f"zones/{zone}", "stop", vm.path, vm.number, now)

    def schedule_maintenance(
        self, project: str, zone: str, name: str, notice_seconds: float, window_seconds: float = 3600.0
    ) -> InstanceView:
        """Announce a host maintenance: instances.get shows `upcomingMaintenance`, and the VM's
        `instance/upcoming-maintenance` says when. Nothing else happens to the VM."""
        if notice_seconds < 0 or window_seconds <= 0:
            raise SimulatorError(Code.INVALID_ARGUMENT, "the notice must not be negative, the window positive")
        with self._transaction() as now:
            vm = self._existing(project, zone, name, now).record
            start = self._wall_clock() + notice_seconds
            maintenance = {
                "type": "SCHEDULED",
                "maintenanceStatus": "PENDING",
                "canReschedule": True,
                "windowStartTime": rfc3339(start),
                "windowEndTime": rfc3339(start + window_seconds),
                "latestWindowStartTime": rfc3339(start),
            }
            changed = dataclasses.replace(vm, upcoming_maintenance=maintenance)
            self._compute.instances[(project, zone, name)] = changed
            self._dirty = True
            return self._view(changed, now)

    def host_node(self, project: str, zone: str, node_id: str) -> NodeRecord:
        """Any node, a Compute slice's included: what a host's metadata server reads."""
        with self._transaction():
            node = self._nodes.get((project, zone, node_id))
            if node is None:
                raise SimulatorError(Code.NOT_FOUND, f"no node {node_id!r} in {project}/{zone}")
            return node

    def host_instance(self, node: NodeRecord, worker: int) -> HostInstance | None:
        """The VM behind worker *worker* of a Compute slice's node; None for a TPU API node."""
        if not backs_compute(node.qr_id):
            return None
        with self._lock:
            for vm in self._compute.instances.values():
                if (vm.project, vm.zone, vm.backing, vm.worker) == (node.project, node.zone, node.qr_id, worker):
                    return HostInstance(vm, vm.preempted)
        return None

    # -- the rules (callers hold the lock) ------------------------------------------------------

    def _back(self, vm: InstanceRecord, shape: ComputeShape, path: str, now: float) -> None:
        """A queued resource of the TPU model for the slice *vm* heads: it waits for chips of its
        pool, provisions and runs the hosts' startup script as a TPU node does."""
        account: Mapping[str, Any] = next(iter(vm.body.get("serviceAccounts") or []), {})
        template = {"metadata": dict(vm.metadata), "serviceAccount": {"email": account.get("email", "default")}}
        hosts_boot = self._no_boot_budget == 0
        if not hosts_boot:
            self._no_boot_budget -= 1
        request = QueuedResourceRequest(
            slices=(SliceRequest(shape.accelerator_type, RUNTIME_VERSION, node_id=vm.backing, template=template),),
            spot=vm.spot,
            flex_start=vm.scheduling.get("provisioningModel") == "FLEX_START",
            reserved=vm.scheduling.get("provisioningModel") == "RESERVATION_BOUND",
            reservation_name=_reservation_of(vm.body),
        )
        self._put_qr(
            QueuedResourceRecord(
                project=vm.project,
                zone=vm.zone,
                qr_id=vm.backing,
                request=request,
                state=QrState.CREATING,
                initiator=Initiator.USER,
                create_time=self._wall_clock(),
                queue_number=self._count("queue"),
                next_at=now + self._config.accept_seconds,
                hosts_boot=hosts_boot,
                backing=path,
            )
        )

    def _existing(self, project: str, zone: str, name: str, now: float) -> InstanceView:
        vm = self._compute.instances.get((project, zone, name))
        view = None if vm is None else self._view(vm, now)
        if view is None or view.status is None:
            raise not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        return view

    def _view(self, vm: InstanceRecord, now: float) -> InstanceView:
        qr = self._qrs.get((vm.project, vm.zone, vm.backing))
        node = self._nodes.get((vm.project, vm.zone, vm.backing))
        address = node.host_addresses[vm.worker] if node is not None and vm.worker < len(node.host_addresses) else ""
        deleting = vm.deleting or self._group_deleting(vm)
        if vm.phase is Phase.DELETED:
            return InstanceView(vm, None, address, "DELETING" if deleting else "NONE")
        if vm.phase is not Phase.NONE:
            return InstanceView(vm, vm.phase.value, address, "DELETING" if deleting else "NONE")
        errors: tuple[tuple[str, str], ...] = ()
        if qr is None:
            status, action = None, "NONE"
        elif qr.state in _WAITING:
            flex = vm.scheduling.get("provisioningModel") == "FLEX_START"
            status = "PENDING" if flex and not vm.group else None if vm.group else "PROVISIONING"
            action = "CREATING"
            if qr.state is QrState.WAITING_FOR_RESOURCES and qr.next_at is None:
                errors = (self._held_back_by(qr),)
        elif qr.state is QrState.PROVISIONING:
            half = self._config.provisioning_seconds / 2
            status = "STAGING" if qr.next_at is not None and qr.next_at - now <= half else "PROVISIONING"
            action = "CREATING"
        elif qr.state is QrState.ACTIVE:
            status, action = "RUNNING", "NONE"
        elif qr.state in (QrState.DELETING, QrState.SUSPENDING):
            status, action = "STOPPING", "DELETING" if qr.state is QrState.DELETING else "NONE"
        else:  # SUSPENDED, FAILED
            status, action = "TERMINATED", "NONE"
        if deleting:
            status, action = ("STOPPING" if status is not None else None), "DELETING"
        return InstanceView(vm, status, address, action, errors)

    def _group_deleting(self, vm: InstanceRecord) -> bool:
        group = self._compute.groups.get((vm.project, vm.zone, vm.group)) if vm.group else None
        return group is not None and group.deleting

    def _held_back_by(self, qr: QueuedResourceRecord) -> tuple[str, str]:
        """Why a waiting slice has no chips: the project's quota (counted as admission counts it,
        quota_counts), a full reservation, or else the zone's capacity."""
        short = shortfall(self._config.quota_book, holdings(self._qrs.values()), qr)
        if short is not None:
            return compute_refusal(short)
        return STOCKOUT, (
            f"The zone 'projects/{qr.project}/zones/{qr.zone}' does not have enough resources available to "
            "fulfill the request. Try a different zone, or try again later."
        )

    def _capacity_verdict(
        self, op: ComputeOperation
    ) -> tuple[float | None, tuple[tuple[str, str], ...], tuple[int, str]]:
        """A lone VM's insert: put off while its slice waits its turn; failed, the VM gone, when
        it is held back; done once admitted (or when it is FLEX_START, which waits PENDING)."""
        key = (op.project, op.scope.split("/")[1], op.target.rsplit("/", 1)[1])
        vm = self._compute.instances.get(key)
        qr = None if vm is None else self._qrs.get((vm.project, vm.zone, vm.backing))
        if vm is None or qr is None or qr.state not in _WAITING:
            return None, (), (0, "")
        if vm.scheduling.get("provisioningModel") == "FLEX_START":
            return None, (), (0, "")
        if qr.next_at is not None:
            return qr.next_at, (), (0, "")
        code, message = self._held_back_by(qr)
        del self._qrs[(qr.project, qr.zone, qr.qr_id)]
        del self._compute.instances[key]
        return None, ((code, message),), _HTTP_OF_REFUSAL.get(code, (503, "SERVICE UNAVAILABLE"))

    def _preempt(self, view: InstanceView, now: float) -> None:
        vm = view.record
        if not vm.spot:
            raise ComputeError(400, "conditionNotMet", f"{vm.path} is no Spot VM; only Spot VMs are preempted")
        if view.status != "RUNNING":  # before, its host has not booted: simulated preemption waits for that
            raise ComputeError(400, "conditionNotMet", f"{vm.path} is {view.status}; it cannot be preempted")
        grace = self._config.preemption_grace_seconds
        self._compute.instances[(vm.project, vm.zone, vm.name)] = dataclasses.replace(
            vm, phase=Phase.STOPPING, preempted=True, next_at=now + grace, step=Step.TERMINATE
        )
        self._dirty = True
        qr = self._qrs.get((vm.project, vm.zone, vm.backing))
        if qr is not None:
            self._queue_host_event(qr, 0, (vm.worker,), HostAction.PREEMPT)
        op = self._new_compute_operation(
            vm.project, f"zones/{vm.zone}", "compute.instances.preempted", vm.path, vm.number, now, delay=0.0
        )
        self._complete(op.record, now)

    def _step_instance(self, vm: InstanceRecord, at: float) -> None:
        """TERMINATE: the grace is over; DELETE: a terminated VM whose action is DELETE goes (a
        MIG's stays listed as DELETED; a lone VM's slice is taken away)."""
        key = (vm.project, vm.zone, vm.name)
        if vm.step in (Step.TERMINATE, Step.STOP):
            delete = vm.step is Step.TERMINATE and vm.scheduling.get("instanceTerminationAction") == "DELETE"
            self._compute.instances[key] = dataclasses.replace(
                vm,
                phase=Phase.TERMINATED,
                next_at=at + self._config.compute_operation_seconds if delete else None,
                step=Step.DELETE if delete else Step.NONE,
            )
        elif vm.group:
            self._compute.instances[key] = dataclasses.replace(self._clear_step(vm), phase=Phase.DELETED)
        else:
            del self._compute.instances[key]
            self._unback(vm.backing, vm.project, vm.zone, at)
        self._dirty = True


def _reservation_of(body: Mapping[str, Any]) -> str:
    """The reservation a VM's reservationAffinity names (SPECIFIC_RESERVATION), or ""."""
    affinity = body.get("reservationAffinity") or {}
    if not isinstance(affinity, Mapping) or affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION":
        return ""
    values = affinity.get("values") or []
    return str(values[0]) if isinstance(values, list) and values else ""

"""The simulated Compute Engine's VMs: lone TPU VMs (insert, get, list, delete), setMetadata with
its fingerprint, and what the cloud does to a VM (Spot preemption, scheduled maintenance).

A VM's status follows the TPU model's queued resource under its slice (waiting for chips: no VM
yet, or PENDING for flex-start; PROVISIONING, then STAGING for the second half of
provisioning_seconds; RUNNING once ACTIVE) until something happens to the VM itself (Phase).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from tpujobs.local.simulator.clockwork import Clockwork, DueStep
from tpujobs.local.simulator.compute_backing import QUOTA, Backings
from tpujobs.local.simulator.compute_checks import check_name, check_vm, metadata_items, slice_shape
from tpujobs.local.simulator.compute_errors import ComputeError, already_exists, condition_not_met, in_use, not_found
from tpujobs.local.simulator.compute_lists import name_filter
from tpujobs.local.simulator.compute_model import ComputeOperations, Listing, OperationView, Verdict
from tpujobs.local.simulator.compute_records import (
    ComputeOperation,
    Effect,
    InstanceRecord,
    Phase,
    Step,
    rfc3339,
)
from tpujobs.local.simulator.errors import Code, SimulatorError
from tpujobs.local.simulator.records import (
    HostAction,
    NodeRecord,
    QrState,
    backs_compute,
)
from tpujobs.local.simulator.world import World

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


# A step of a VM's that another part takes on (host maintenance, a run duration's end).
StepHandler = Callable[[InstanceRecord, float], None]
# How a MIG shows its member: the member and its view as a lone VM's, to the view the MIG gives.
MemberView = Callable[[InstanceRecord, "InstanceView"], "InstanceView"]


class ComputeVms:
    """Lone TPU VMs and what every VM, in a MIG or not, goes through (a due source of the
    clockwork for the VMs' timed steps)."""

    def __init__(self, world: World, clockwork: Clockwork, operations: ComputeOperations, backings: Backings) -> None:
        self._world = world
        self._clockwork = clockwork
        self._operations = operations
        self._backings = backings
        self._step_handlers: dict[Step, StepHandler] = {}
        self._member_view: MemberView = lambda _vm, view: view
        clockwork.add_due_source(self._due)
        operations.handle(Effect.CHECK_CAPACITY, self._capacity_verdict)

    def on_step(self, step: Step, handler: StepHandler) -> None:
        """A VM's timed *step* is *handler*'s to apply, not the VM's own rules."""
        self._step_handlers[step] = handler

    def show_members_with(self, member_view: MemberView) -> None:
        """How a MIG's member shows (the slices' part says: partly granted, bulk mode)."""
        self._member_view = member_view

    def insert_instance(self, project: str, zone: str, body: Mapping[str, Any]) -> OperationView:
        """instances.insert of one single-host TPU VM; the operation is DONE once the VM has
        capacity, or fails with ZONE_RESOURCE_POOL_EXHAUSTED / QUOTA_EXCEEDED when it finds none
        (a FLEX_START VM waits, PENDING, instead)."""
        name = check_name(body.get("name"))
        machine_type = check_vm(body, "resource", zone)
        shape = slice_shape(machine_type, 1, None)
        with self._clockwork.transaction() as now:
            path = f"projects/{project}/zones/{zone}/instances/{name}"
            if (project, zone, name) in self._world.compute.instances:
                raise already_exists(path)
            backing = f"vm.{name}.{self._world.count('compute-backing')}"
            items = metadata_items(body.get("metadata") or {}, "resource.metadata")
            vm = InstanceRecord(
                project=project,
                zone=zone,
                name=name,
                number=self._operations.new_number(),
                body=dict(body),
                metadata=items,
                create_time=self._world.wall_clock(),
                backing=backing,
                topology=shape.topology,
            )
            self._world.compute.instances[(project, zone, name)] = vm
            self._backings.back(vm, shape, path, now)
            return self._operations.new_operation(
                project, f"zones/{zone}", "insert", path, vm.number, now, Effect.CHECK_CAPACITY
            )

    def get_instance(self, project: str, zone: str, name: str) -> InstanceView:
        with self._clockwork.transaction() as now:
            return self.existing(project, zone, name, now)

    def list_instances(
        self, project: str, zone: str, filter_text: str = "", max_results: int = 0, token: str = ""
    ) -> Listing:
        """The VMs that exist (a MIG's included), by name."""
        keep = name_filter(filter_text)
        with self._clockwork.transaction() as now:
            found = [
                view
                for key, vm in self._world.compute.instances.items()
                if key[:2] == (project, zone) and keep(vm.name)
                for view in [self.view(vm, now)]
                if view.status is not None
            ]
        return self._operations.page(found, lambda view: view.record.name, max_results, token)

    def delete_instance(self, project: str, zone: str, name: str) -> OperationView:
        """A lone VM: its hosts get SIGTERM, and it is gone when the operation is DONE. A MIG's
        VM is refused: resize or delete the group."""
        with self._clockwork.transaction() as now:
            vm = self.existing(project, zone, name, now).record
            if vm.group:
                group = f"projects/{project}/zones/{zone}/instanceGroupManagers/{vm.group}"
                raise in_use("instance", vm.path, group)
            self._world.compute.instances[(project, zone, name)] = dataclasses.replace(vm, deleting=True)
            self._backings.unback(vm.backing, project, zone, now)
            return self._operations.new_operation(
                project, f"zones/{zone}", "delete", vm.path, vm.number, now, Effect.REMOVE_INSTANCE
            )

    def set_metadata(self, project: str, zone: str, name: str, metadata: Mapping[str, Any]) -> OperationView:
        """instances.setMetadata: the items are replaced at once (the host's metadata server answers
        them) when `fingerprint` is the current one; a stale or missing one is 412 conditionNotMet."""
        items = metadata_items(metadata, "resource")
        with self._clockwork.transaction() as now:
            vm = self.existing(project, zone, name, now).record
            if metadata.get("fingerprint") != vm.fingerprint:
                raise condition_not_met("Supplied fingerprint does not match current metadata fingerprint.")
            self._world.compute.instances[(project, zone, name)] = dataclasses.replace(vm, metadata=items)
            self._world.dirty = True
            return self._operations.new_operation(project, f"zones/{zone}", "setMetadata", vm.path, vm.number, now)

    def preempt_instance(self, project: str, zone: str, name: str) -> InstanceView:
        """Spot preemption of one RUNNING VM: `instance/preempted` TRUE at once, ACPI soft-off (SIGTERM,
        SIGKILL after preemption_grace_seconds), STOPPING until then, TERMINATED after, and deleted
        next when its instanceTerminationAction is DELETE."""
        with self._clockwork.transaction() as now:
            view = self.existing(project, zone, name, now)
            self.preempt(view, now)
            return self.view(self._world.compute.instances[(project, zone, name)], now)

    def stop_instance(self, project: str, zone: str, name: str) -> OperationView:
        """instances.stop, a MIG's VM included (a DO_NOTHING MIG does not repair it): ACPI soft-off
        (SIGTERM, SIGKILL after delete_grace_seconds), STOPPING, then TERMINATED and kept (Step.STOP).
        A VM already STOPPING or TERMINATED is left as it is; one not RUNNING yet is refused."""
        with self._clockwork.transaction() as now:
            view = self.existing(project, zone, name, now)
            vm = view.record
            if view.status == "RUNNING":
                grace = self._world.config.delete_grace_seconds
                self._world.compute.instances[(project, zone, name)] = dataclasses.replace(
                    vm, phase=Phase.STOPPING, next_at=now + grace, step=Step.STOP
                )
                self._world.dirty = True
                qr = self._world.qrs.get((project, zone, vm.backing))
                if qr is not None:
                    self._world.queue_host_event(qr, 0, (vm.worker,), HostAction.SHUTDOWN)
            elif view.status not in ("STOPPING", "TERMINATED"):
                raise ComputeError(400, "conditionNotMet", f"{vm.path} is {view.status}; only a RUNNING VM is stopped")
            return self._operations.new_operation(project, f"zones/{zone}", "stop", vm.path, vm.number, now)

    def schedule_maintenance(
        self, project: str, zone: str, name: str, notice_seconds: float, window_seconds: float = 3600.0
    ) -> InstanceView:
        """Announce a host maintenance: instances.get shows `upcomingMaintenance`, and the VM's
        `instance/upcoming-maintenance` says when. Nothing else happens to the VM."""
        if notice_seconds < 0 or window_seconds <= 0:
            raise SimulatorError(Code.INVALID_ARGUMENT, "the notice must not be negative, the window positive")
        with self._clockwork.transaction() as now:
            vm = self.existing(project, zone, name, now).record
            start = self._world.wall_clock() + notice_seconds
            maintenance = {
                "type": "SCHEDULED",
                "maintenanceStatus": "PENDING",
                "canReschedule": True,
                "windowStartTime": rfc3339(start),
                "windowEndTime": rfc3339(start + window_seconds),
                "latestWindowStartTime": rfc3339(start),
            }
            changed = dataclasses.replace(vm, upcoming_maintenance=maintenance)
            self._world.compute.instances[(project, zone, name)] = changed
            self._world.dirty = True
            return self.view(changed, now)

    def host_instance(self, node: NodeRecord, worker: int) -> HostInstance | None:
        """The VM behind worker *worker* of a Compute slice's node; None for a TPU API node."""
        if not backs_compute(node.qr_id):
            return None
        with self._world.lock:
            for vm in self._world.compute.instances.values():
                if (vm.project, vm.zone, vm.backing, vm.worker) == (node.project, node.zone, node.qr_id, worker):
                    return HostInstance(vm, vm.preempted)
        return None

    # -- the rules (callers hold the lock) ------------------------------------------------------

    def existing(self, project: str, zone: str, name: str, now: float) -> InstanceView:
        vm = self._world.compute.instances.get((project, zone, name))
        view = None if vm is None else self.view(vm, now)
        if view is None or view.status is None:
            raise not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        return view

    def view(self, vm: InstanceRecord, now: float) -> InstanceView:
        """The VM as the API shows it now; a MIG's member as its MIG shows it (show_members_with)."""
        view = self._lone_view(vm, now)
        return self._member_view(vm, view) if vm.group else view

    def _lone_view(self, vm: InstanceRecord, now: float) -> InstanceView:
        qr = self._world.qrs.get((vm.project, vm.zone, vm.backing))
        node = self._world.nodes.get((vm.project, vm.zone, vm.backing))
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
                errors = (self._backings.held_back_by(qr),)
        elif qr.state is QrState.PROVISIONING:
            half = self._world.config.provisioning_seconds / 2
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
        group = self._world.compute.groups.get((vm.project, vm.zone, vm.group)) if vm.group else None
        return group is not None and group.deleting

    def _capacity_verdict(self, op: ComputeOperation) -> Verdict:
        """A lone VM's insert: put off while its slice waits its turn; failed, the VM gone, when
        it is held back; done once admitted (or when it is FLEX_START, which waits PENDING)."""
        key = (op.project, op.scope.split("/")[1], op.target.rsplit("/", 1)[1])
        vm = self._world.compute.instances.get(key)
        qr = None if vm is None else self._world.qrs.get((vm.project, vm.zone, vm.backing))
        if vm is None or qr is None or qr.state not in _WAITING:
            return None, (), (0, "")
        if vm.scheduling.get("provisioningModel") == "FLEX_START":
            return None, (), (0, "")
        if qr.next_at is not None:
            return qr.next_at, (), (0, "")
        code, message = self._backings.held_back_by(qr)
        del self._world.qrs[(qr.project, qr.zone, qr.qr_id)]
        del self._world.compute.instances[key]
        return None, ((code, message),), _HTTP_OF_REFUSAL.get(code, (503, "SERVICE UNAVAILABLE"))

    def preempt(self, view: InstanceView, now: float) -> None:
        vm = view.record
        if not vm.spot:
            raise ComputeError(400, "conditionNotMet", f"{vm.path} is no Spot VM; only Spot VMs are preempted")
        if view.status != "RUNNING":  # before, its host has not booted: simulated preemption waits for that
            raise ComputeError(400, "conditionNotMet", f"{vm.path} is {view.status}; it cannot be preempted")
        grace = self._world.config.preemption_grace_seconds
        self._world.compute.instances[(vm.project, vm.zone, vm.name)] = dataclasses.replace(
            vm, phase=Phase.STOPPING, preempted=True, next_at=now + grace, step=Step.TERMINATE
        )
        self._world.dirty = True
        qr = self._world.qrs.get((vm.project, vm.zone, vm.backing))
        if qr is not None:
            self._world.queue_host_event(qr, 0, (vm.worker,), HostAction.PREEMPT)
        op = self._operations.new_operation(
            vm.project, f"zones/{vm.zone}", "compute.instances.preempted", vm.path, vm.number, now, delay=0.0
        )
        self._operations.complete(op.record, now)

    def _due(self, now: float) -> list[DueStep]:
        return [
            (vm.next_at, 3, vm.number, partial(self._step_instance, vm))
            for vm in self._world.compute.instances.values()
            if vm.next_at is not None and vm.next_at <= now
        ]

    def _step_instance(self, vm: InstanceRecord, at: float) -> None:
        """TERMINATE: the grace is over; DELETE: a terminated VM whose action is DELETE goes (a
        MIG's stays listed as DELETED; a lone VM's slice is taken away); a step another part
        registered (on_step) is that part's."""
        handler = self._step_handlers.get(vm.step)
        if handler is not None:
            handler(vm, at)
            return
        key = (vm.project, vm.zone, vm.name)
        if vm.step in (Step.TERMINATE, Step.STOP):
            delete = vm.step is Step.TERMINATE and vm.scheduling.get("instanceTerminationAction") == "DELETE"
            self._world.compute.instances[key] = dataclasses.replace(
                vm,
                phase=Phase.TERMINATED,
                next_at=at + self._world.config.compute_operation_seconds if delete else None,
                step=Step.DELETE if delete else Step.NONE,
            )
        elif vm.group:
            self._world.compute.instances[key] = dataclasses.replace(
                dataclasses.replace(vm, next_at=None, step=Step.NONE), phase=Phase.DELETED
            )
        else:
            del self._world.compute.instances[key]
            self._backings.unback(vm.backing, vm.project, vm.zone, at)
        self._world.dirty = True

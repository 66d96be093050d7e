"""What the cloud does to a Compute Engine slice's hosts besides a Spot preemption, for `tpujobs dev
fault`: a VM reset, a host lost without notice, hosts that never boot, host maintenance, and the
end of a VM's maxRunDuration (compute_stops says when and how).

A reset and a lost host act on the MIG's backing queued resource (compute_records), whose node runs
the hosts, so the TPU model's timed node steps and the worker pool's host events apply as they do
to a TPU API node; the instance status follows the slice (RUNNING), except a host that failed,
whose VM is TERMINATED. Host maintenance and a run duration's end act on the VMs themselves: a
TERMINATE VM without automatic restart is shut down and stays TERMINATED (a DO_NOTHING MIG does
not repair it); a VM out of run duration gets its instanceTerminationAction.
"""

from __future__ import annotations

import dataclasses

from tpujobs.local.simulator.clockwork import Clockwork
from tpujobs.local.simulator.compute_errors import ComputeError
from tpujobs.local.simulator.compute_groups import ComputeGroups, GroupView
from tpujobs.local.simulator.compute_model import ComputeOperations, OperationView
from tpujobs.local.simulator.compute_records import InstanceRecord, Phase, Step, rfc3339
from tpujobs.local.simulator.compute_stops import (
    MAINTENANCE_OPERATION,
    SIMULATE_OPERATION,
    check_maintainable,
    run_seconds,
)
from tpujobs.local.simulator.compute_vms import ComputeVms
from tpujobs.local.simulator.records import (
    LIVE_STATES,
    HostAction,
    NodeRecord,
    NodeState,
    NodeStep,
    QrState,
    QueuedResourceRecord,
)
from tpujobs.local.simulator.world import World


class ComputeFaults:
    """Faults of one MIG's hosts; each answers the MIG as it is after. It takes on the VMs'
    maintenance and run-duration steps and follows the slices' queued resources (RUN_OUT timers)."""

    def __init__(
        self,
        world: World,
        clockwork: Clockwork,
        operations: ComputeOperations,
        vms: ComputeVms,
        groups: ComputeGroups,
    ) -> None:
        self._world = world
        self._clockwork = clockwork
        self._operations = operations
        self._vms = vms
        self._groups = groups
        vms.on_step(Step.MAINTENANCE, self._vm_maintenance_now)
        vms.on_step(Step.RUN_OUT, self._run_out)
        clockwork.on_qr_step(self._qr_stepped)

    def reset_group(self, project: str, zone: str, name: str, worker: int | None = None) -> GroupView:
        """instances.reset of one member (*worker*) or all: processes die at once, no SIGTERM, and
        the startup script runs again on the same disk after reboot_seconds."""
        with self._clockwork.transaction() as now:
            qr, node = self._running_slice(project, zone, name, "reset")
            if node.step is not NodeStep.NONE:
                raise _busy(node)
            workers = self._hosts(node, worker)
            self._world.put_node(
                dataclasses.replace(
                    node,
                    state=NodeState.RESTARTING,
                    next_at=now + self._world.config.reboot_seconds,
                    step=NodeStep.REBOOTED,
                    rebooting_workers=workers,
                )
            )
            self._world.queue_host_event(qr, 0, workers, HostAction.RESET)
            return self._groups.group_view(self._groups.group(project, zone, name), now)

    def kill_group_host(self, project: str, zone: str, name: str, worker: int) -> GroupView:
        """One member's host fails without notice, as a host error does: its processes are SIGKILLed,
        instance/preempted stays FALSE, and the VM is TERMINATED (a compute.instances.hostError
        operation), which only a poll of the VMs finds."""
        with self._clockwork.transaction() as now:
            qr, node = self._running_slice(project, zone, name, "kill")
            (lost,) = self._hosts(node, worker)
            member = next(
                m
                for m in self._groups.group_view(self._groups.group(project, zone, name), now).members
                if m.record.worker == lost
            )
            vm = member.record
            self._world.compute.instances[(vm.project, vm.zone, vm.name)] = dataclasses.replace(
                vm, phase=Phase.TERMINATED
            )
            self._world.put_node(dataclasses.replace(node, failed_workers=tuple(sorted({*node.failed_workers, lost}))))
            self._world.queue_hooks(self._world.on_host_failed, qr, 0, lost)
            op = self._operations.new_operation(
                project, f"zones/{zone}", "compute.instances.hostError", vm.path, vm.number, now, delay=0.0
            )
            self._operations.complete(op.record, now)
            return self._groups.group_view(self._groups.group(project, zone, name), now)

    def no_boot_group(self, project: str, zone: str, name: str) -> GroupView:
        """The hosts of a MIG whose slice is not running yet never run their startup script."""
        with self._clockwork.transaction() as now:
            group = self._groups.group(project, zone, name)
            qr = self._world.qrs.get((project, zone, group.backing)) if group.backing else None
            if qr is None or qr.state not in LIVE_STATES - {QrState.ACTIVE}:
                shown = "running" if qr is not None and qr.state is QrState.ACTIVE else "not waiting for hosts"
                raise ComputeError(
                    400,
                    "conditionNotMet",
                    f"{group.path} is {shown}; only a slice whose VMs are not RUNNING yet can get hosts "
                    "that never boot",
                )
            self._world.put_qr(dataclasses.replace(qr, hosts_boot=False))
            return self._groups.group_view(group, now)

    def terminate_for_maintenance(self, project: str, zone: str, name: str, notice: float | None = None) -> GroupView:
        """Host maintenance of every RUNNING VM of the MIG, *notice* seconds from now (default
        maintenance_notice_seconds): each VM's upcomingMaintenance says when meanwhile (its
        instance/maintenance-event stays NONE, as Google leaves it for TERMINATE VMs); then each is
        terminated for good (`simulate_instance_maintenance`)."""
        wait = self._world.config.maintenance_notice_seconds if notice is None else notice
        if wait < 0:
            raise ComputeError(400, "invalid", f"the notice must not be negative, got {wait}")
        with self._clockwork.transaction() as now:
            self._running_slice(project, zone, name, "go into maintenance")
            view = self._groups.group_view(self._groups.group(project, zone, name), now)
            running = [m for m in view.members if m.status == "RUNNING"]
            for member in running:
                check_maintainable(member.record, member.status)
            for member in running:
                if wait > 0:
                    self._vm_maintenance_ahead(member.record, wait, now)
                else:
                    self._vm_maintenance_now(member.record, now)
            return self._groups.group_view(view.record, now)

    def simulate_instance_maintenance(self, project: str, zone: str, instance_name: str) -> OperationView:
        """instances.simulateMaintenanceEvent: host maintenance of one VM now. A TPU VM (TERMINATE,
        automaticRestart false) is shut down (ACPI soft-off: SIGTERM, SIGKILL after
        delete_grace_seconds) and stays TERMINATED; a compute.instances.terminateOnHostMaintenance
        operation says so. A VM that is not RUNNING is refused, naming its status."""
        with self._clockwork.transaction() as now:
            view = self._vms.existing(project, zone, instance_name, now)
            check_maintainable(view.record, view.status)
            self._vm_maintenance_now(view.record, now)
            vm = view.record
            return self._operations.new_operation(project, f"zones/{zone}", SIMULATE_OPERATION, vm.path, vm.number, now)

    def schedule_group_maintenance(
        self, project: str, zone: str, name: str, notice: float, window: float = 3600.0
    ) -> GroupView:
        """Google's advance notice of a maintenance, on every VM of the MIG (schedule_maintenance)."""
        view = self._groups.get_group(project, zone, name)
        members = [m for m in view.members if m.status is not None]
        if not members:
            raise ComputeError(400, "conditionNotMet", f"{view.record.path} has no VM to announce a maintenance to")
        for member in members:
            self._vms.schedule_maintenance(project, zone, member.record.name, notice, window)
        return self._groups.get_group(project, zone, name)

    # -- the rules (callers hold the lock) ------------------------------------------------------

    def _vm_maintenance_ahead(self, vm: InstanceRecord, wait: float, now: float) -> None:
        """Maintenance in *wait* seconds: upcomingMaintenance says so, then MAINTENANCE is due."""
        start = self._world.wall_clock() + wait
        announced = {
            "type": "UNSCHEDULED",
            "maintenanceStatus": "PENDING",
            "canReschedule": False,
            "windowStartTime": rfc3339(start),
            "latestWindowStartTime": rfc3339(start),
        }
        self._world.compute.instances[(vm.project, vm.zone, vm.name)] = dataclasses.replace(
            vm, upcoming_maintenance=announced, next_at=now + wait, step=Step.MAINTENANCE
        )
        self._world.dirty = True

    def _vm_maintenance_now(self, vm: InstanceRecord, now: float) -> None:
        """ACPI soft-off for host maintenance: STOPPING, then TERMINATED and kept (Step.STOP)."""
        ongoing = (
            None if vm.upcoming_maintenance is None else {**vm.upcoming_maintenance, "maintenanceStatus": "ONGOING"}
        )
        self._vm_soft_off(vm, now, Step.STOP, HostAction.SHUTDOWN, upcoming_maintenance=ongoing)
        op = self._operations.new_operation(
            vm.project, f"zones/{vm.zone}", MAINTENANCE_OPERATION, vm.path, vm.number, now, delay=0.0
        )
        self._operations.complete(op.record, now)

    def _vm_soft_off(self, vm: InstanceRecord, now: float, then: Step, action: HostAction, **changes: object) -> None:
        """SIGTERM to the VM's host, SIGKILL after delete_grace_seconds; STOPPING until *then*."""
        grace = self._world.config.delete_grace_seconds
        self._world.compute.instances[(vm.project, vm.zone, vm.name)] = dataclasses.replace(
            vm,
            phase=Phase.STOPPING,
            next_at=now + grace,
            step=then,
            **changes,  # type: ignore[arg-type]
        )
        self._world.dirty = True
        qr = self._world.qrs.get((vm.project, vm.zone, vm.backing))
        if qr is not None:
            self._world.queue_host_event(qr, 0, (vm.worker,), action)

    def _run_out(self, vm: InstanceRecord, at: float) -> None:
        """The VM's maxRunDuration is over: its instanceTerminationAction begins (a soft-off)."""
        self._vm_soft_off(vm, at, Step.TERMINATE, HostAction.DELETE)

    def _qr_stepped(self, qr: QueuedResourceRecord, at: float) -> None:
        """A Compute slice that turns ACTIVE: its VMs are RUNNING, so those with a maxRunDuration
        get their terminationTimestamp and the timer that ends them (RUN_OUT). The clockwork
        calls this after each timed step of a queued resource (*qr* as it was)."""
        current = self._world.qrs.get((qr.project, qr.zone, qr.qr_id))
        if not qr.backing or current is None or current.state is not QrState.ACTIVE or qr.state is QrState.ACTIVE:
            return
        wall = self._world.wall_clock() - (self._world.clock() - at)
        for key, vm in list(self._world.compute.instances.items()):
            seconds = run_seconds(vm)
            seconds = None if seconds is None else seconds * self._world.config.run_duration_scale
            if (vm.project, vm.zone, vm.backing) == (qr.project, qr.zone, qr.qr_id) and seconds is not None:
                self._world.compute.instances[key] = dataclasses.replace(
                    vm, next_at=at + seconds, step=Step.RUN_OUT, terminates_at=wall + seconds
                )
        self._world.dirty = True

    def _running_slice(self, project: str, zone: str, name: str, doing: str) -> tuple[QueuedResourceRecord, NodeRecord]:
        group = self._groups.group(project, zone, name)
        qr = self._world.qrs.get((project, zone, group.backing)) if group.backing else None
        nodes = self._world.nodes_of(qr) if qr is not None else []
        if qr is None or qr.state is not QrState.ACTIVE or not nodes:
            raise ComputeError(
                400, "conditionNotMet", f"{group.path} has no RUNNING VMs; there are no hosts to {doing}"
            )
        return qr, nodes[0]

    @staticmethod
    def _hosts(node: NodeRecord, worker: int | None) -> tuple[int, ...]:
        count = len(node.host_addresses)
        if worker is None:
            return tuple(range(count))
        if not 0 <= worker < count:
            raise ComputeError(400, "invalid", f"the slice has workers 0..{count - 1}, not {worker}")
        return (worker,)


def _busy(node: NodeRecord) -> ComputeError:
    return ComputeError(
        400,
        "conditionNotMet",
        f"the slice's hosts are {node.state.value} ({node.step.value}); try again when they run",
    )

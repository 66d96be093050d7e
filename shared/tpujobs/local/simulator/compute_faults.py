"""What the cloud does to a Compute Engine slice's hosts besides a Spot preemption, for `tpujobs dev
fault`: a VM reset, a host lost without notice, hosts that never boot, and host maintenance that
terminates the hosts for a while (TPU VMs cannot live-migrate).

Each acts on the MIG's backing queued resource (compute_records), whose node runs the hosts, so
the TPU model's timed node steps and the worker pool's host events apply as they do to a TPU API
node. The instance status the Compute API shows follows the slice (RUNNING), except a host that
failed, whose VM is TERMINATED.
"""

from __future__ import annotations

import dataclasses

from tpujobs.local.simulator.compute_errors import ComputeError
from tpujobs.local.simulator.compute_groups import ComputeGroups, GroupView
from tpujobs.local.simulator.compute_records import Phase
from tpujobs.local.simulator.records import (
    LIVE_STATES,
    MAINTENANCE_TERMINATE,
    HostAction,
    NodeRecord,
    NodeState,
    NodeStep,
    QrState,
    QueuedResourceRecord,
)


class ComputeFaults(ComputeGroups):
    """Faults of one MIG's hosts; each answers the MIG as it is after."""

    def reset_group(self, project: str, zone: str, name: str, worker: int | None = None) -> GroupView:
        """instances.reset of one member (*worker*) or all: processes die at once, no SIGTERM, and
        the startup script runs again on the same disk after reboot_seconds."""
        with self._transaction() as now:
            qr, node = self._running_slice(project, zone, name, "reset")
            if node.step is not NodeStep.NONE:
                raise _busy(node)
            workers = self._hosts(node, worker)
            self._put_node(
                dataclasses.replace(
                    node,
                    state=NodeState.RESTARTING,
                    next_at=now + self._config.reboot_seconds,
                    step=NodeStep.REBOOTED,
                    rebooting_workers=workers,
                )
            )
            self._queue_host_event(qr, 0, workers, HostAction.RESET)
            return self._group_view(self._group(project, zone, name), now)

    def kill_group_host(self, project: str, zone: str, name: str, worker: int) -> GroupView:
        """One member's host fails without notice, as a host error does: its processes are SIGKILLed,
        instance/preempted stays FALSE, and the VM is TERMINATED (a compute.instances.hostError
        operation), which only a poll of the VMs finds."""
        with self._transaction() as now:
            qr, node = self._running_slice(project, zone, name, "kill")
            (lost,) = self._hosts(node, worker)
            member = next(
                m for m in self._group_view(self._group(project, zone, name), now).members if m.record.worker == lost
            )
            vm = member.record
            self._compute.instances[(vm.project, vm.zone, vm.name)] = dataclasses.replace(vm, phase=Phase.TERMINATED)
            self._put_node(dataclasses.replace(node, failed_workers=tuple(sorted({*node.failed_workers, lost}))))
            self._queue_hooks(self.on_host_failed, qr, 0, lost)
            op = self._new_compute_operation(
                project, f"zones/{zone}", "compute.instances.hostError", vm.path, vm.number, now, delay=0.0
            )
            self._complete(op.record, now)
            return self._group_view(self._group(project, zone, name), now)

    def no_boot_group(self, project: str, zone: str, name: str) -> GroupView:
        """The hosts of a MIG whose slice is not running yet never run their startup script."""
        with self._transaction() as now:
            group = self._group(project, zone, name)
            qr = self._qrs.get((project, zone, group.backing)) if group.backing else None
            if qr is None or qr.state not in LIVE_STATES - {QrState.ACTIVE}:
                shown = "running" if qr is not None and qr.state is QrState.ACTIVE else "not waiting for hosts"
                raise ComputeError(
                    400,
                    "conditionNotMet",
                    f"{group.path} is {shown}; only a slice whose VMs are not RUNNING yet can get hosts "
                    "that never boot",
                )
            self._put_qr(dataclasses.replace(qr, hosts_boot=False))
            return self._group_view(group, now)

    def terminate_for_maintenance(self, project: str, zone: str, name: str, notice: float | None = None) -> GroupView:
        """Host maintenance now: instance/maintenance-event turns TERMINATE_ON_HOST_MAINTENANCE;
        after *notice* seconds (default maintenance_notice_seconds) the hosts shut down, and
        maintenance_seconds later they boot again."""
        wait = self._config.maintenance_notice_seconds if notice is None else notice
        if wait < 0:
            raise ComputeError(400, "invalid", f"the notice must not be negative, got {wait}")
        with self._transaction() as now:
            _, node = self._running_slice(project, zone, name, "go into maintenance")
            if node.step is not NodeStep.NONE:
                raise _busy(node)
            self._put_node(
                dataclasses.replace(
                    node, maintenance_event=MAINTENANCE_TERMINATE, next_at=now + wait, step=NodeStep.MAINTENANCE_STARTS
                )
            )
            return self._group_view(self._group(project, zone, name), now)

    def schedule_group_maintenance(
        self, project: str, zone: str, name: str, notice: float, window: float = 3600.0
    ) -> GroupView:
        """Google's advance notice of a maintenance, on every VM of the MIG (schedule_maintenance)."""
        view = self.get_group(project, zone, name)
        members = [m for m in view.members if m.status is not None]
        if not members:
            raise ComputeError(400, "conditionNotMet", f"{view.record.path} has no VM to announce a maintenance to")
        for member in members:
            self.schedule_maintenance(project, zone, member.record.name, notice, window)
        return self.get_group(project, zone, name)

    # -- the rules (callers hold the lock) ------------------------------------------------------

    def _running_slice(self, project: str, zone: str, name: str, doing: str) -> tuple[QueuedResourceRecord, NodeRecord]:
        group = self._group(project, zone, name)
        qr = self._qrs.get((project, zone, group.backing)) if group.backing else None
        nodes = self._nodes_of(qr) if qr is not None else []
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

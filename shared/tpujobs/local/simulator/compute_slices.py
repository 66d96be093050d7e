"""What the simulated Compute Engine does to a MIG's slice besides making and deleting it: the
moment its VMs all run (its interconnect ACTIVATING from then), a fault on its interconnect, part of
a waiting slice granted in individual mode, a member deleted outside the MIG, and how members show
in bulk mode or partly granted. The rules are compute_topology's; this part applies them to the
world's records (callers of the underscored methods hold the lock).
"""

from __future__ import annotations

import dataclasses
from functools import partial

from tpujobs.local.simulator.clockwork import Clockwork, DueStep
from tpujobs.local.simulator.compute_backing import STOCKOUT
from tpujobs.local.simulator.compute_errors import ComputeError, invalid_field
from tpujobs.local.simulator.compute_groups import ComputeGroups, GroupView
from tpujobs.local.simulator.compute_model import ComputeOperations, OperationView
from tpujobs.local.simulator.compute_records import Effect, GroupRecord, InstanceRecord, Phase, Step
from tpujobs.local.simulator.compute_topology import MemberFacts, forced_fault, member_status
from tpujobs.local.simulator.compute_vms import ComputeVms, InstanceView
from tpujobs.local.simulator.records import HostAction, QrState
from tpujobs.local.simulator.world import World

_WAITING = frozenset({QrState.CREATING, QrState.ACCEPTED, QrState.WAITING_FOR_RESOURCES})


class ComputeSlices:
    """A MIG slice's interconnect, partial grants and members lost outside the MIG (a due source
    of the clockwork for the moment a slice's VMs all run; how `ComputeVms` shows a member)."""

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
        clockwork.add_due_source(self._due)
        vms.show_members_with(self._member_view)

    def delete_instance(self, project: str, zone: str, name: str) -> OperationView:
        """instances.delete of a MIG's member too, as Google allows ("deleted by an action not
        initiated by the MIG", about-repair): its host gets SIGTERM (SIGKILL after the delete grace)
        and it leaves the MIG, whose target size stays. A DO_NOTHING MIG does not make it again,
        and its listManagedInstances no longer names it (the unkind reading of what Google leaves
        undocumented); the simulator repairs no MIG (tpujobs makes none with REPAIR)."""
        with self._world.lock:
            vm = self._world.compute.instances.get((project, zone, name))
            member = vm is not None and bool(vm.group)
        if not member:
            return self._vms.delete_instance(project, zone, name)
        with self._clockwork.transaction() as now:
            view = self._vms.existing(project, zone, name, now)
            vm = view.record
            self._world.compute.instances[(project, zone, name)] = dataclasses.replace(
                vm, phase=Phase.STOPPING, next_at=None, step=Step.NONE
            )
            qr = self._world.qrs.get((project, zone, vm.backing))
            if qr is not None and view.status == "RUNNING":
                self._world.queue_host_event(qr, 0, (vm.worker,), HostAction.DELETE)
            self._world.dirty = True
            return self._operations.new_operation(
                project, f"zones/{zone}", "delete", vm.path, vm.number, now, Effect.REMOVE_INSTANCE
            )

    def force_topology(self, project: str, zone: str, name: str, state: str, message: str = "") -> GroupView:
        """The slice's interconnect turns FAILED or INCOMPLETE, with *message* as its stateDetails
        error, whatever its VMs do, until the MIG's slice ends."""
        with self._clockwork.transaction() as now:
            group = self._groups.group(project, zone, name)
            if not self._groups.topology_of(group) or group.deleting or not group.target_size:
                raise ComputeError(
                    400,
                    "conditionNotMet",
                    f"{group.path} has no slice with an accelerator topology (a workload policy's, "
                    "VMs asked for, not being deleted); its interconnect has no state to change",
                )
            try:
                fault = forced_fault(state, message, self._world.wall_clock())
            except ValueError as error:
                raise invalid_field("state", state, str(error)) from None
            changed = dataclasses.replace(group, topology_fault=fault)
            self._world.compute.groups[(project, zone, name)] = changed
            self._world.dirty = True
            return self._groups.group_view(changed, now)

    def grant_partially(self, project: str, zone: str, name: str, hosts: int | None = None) -> GroupView:
        """Individual mode "creates as many instances as possible with the available capacity":
        of a slice waiting for capacity, workers 0..hosts-1 (default all but one) run now; the rest
        wait for the capacity as before, with the zone's stockout in lastAttempt."""
        with self._clockwork.transaction() as now:
            group = self._groups.group(project, zone, name)
            qr = self._world.qrs.get((project, zone, group.backing)) if group.backing else None
            if group.bulk:
                raise ComputeError(
                    400, "conditionNotMet", f"{group.path} is in bulk mode: it creates its VMs all at once or none"
                )
            if qr is None or qr.state not in _WAITING:
                shown = qr.state.value if qr is not None else "not asking for VMs"
                raise ComputeError(
                    400,
                    "conditionNotMet",
                    f"{group.path} is {shown}, not waiting for capacity; only a waiting slice is granted in part",
                )
            count = group.target_size - 1 if hosts is None else hosts
            if not 0 < count < group.target_size:
                raise invalid_field("hosts", count, f"It must be within 1..{group.target_size - 1}.")
            changed = dataclasses.replace(group, partial=count)
            self._world.compute.groups[(project, zone, name)] = changed
            self._world.dirty = True
            return self._groups.group_view(changed, now)

    def _member_view(self, vm: InstanceRecord, view: InstanceView) -> InstanceView:
        """A member as its MIG shows it: partly granted, or in bulk mode (compute_topology)."""
        group = self._world.compute.groups.get((vm.project, vm.zone, vm.group)) if vm.group else None
        if group is None or not (group.bulk or group.partial):
            return view
        qr = self._world.qrs.get((vm.project, vm.zone, vm.backing))
        stockout = (
            STOCKOUT,
            f"The zone 'projects/{vm.project}/zones/{vm.zone}' does not have enough resources available to "
            "fulfill the request. Try a different zone, or try again later.",
        )
        facts = MemberFacts(group.bulk, group.partial, qr.state.value if qr is not None else "", stockout)
        status, action, errors = member_status(
            view.status, view.current_action, view.errors, vm.worker, vm.phase, vm.deleting or group.deleting, facts
        )
        return dataclasses.replace(view, status=status, current_action=action, errors=errors)

    def _due(self, now: float) -> list[DueStep]:
        """And the moment a slice's VMs all run, which starts its interconnect's ACTIVATING: just
        before its queued resource turns ACTIVE (at that time), or now for one seen ACTIVE already."""
        due: list[DueStep] = []
        for group in self._world.compute.groups.values():
            qr = self._world.qrs.get((group.project, group.zone, group.backing)) if group.backing else None
            if qr is None or group.active_at is not None or not group.policy:
                continue
            if qr.state is QrState.PROVISIONING and qr.next_at is not None and qr.next_at <= now:
                due.append((qr.next_at, -1, group.number, partial(self._slice_runs, group, qr.next_at)))
            elif qr.state is QrState.ACTIVE:
                due.append((now, -1, group.number, partial(self._slice_runs, group, now)))
        return due

    def _slice_runs(self, group: GroupRecord, when: float, at: float) -> None:
        key = (group.project, group.zone, group.name)
        current = self._world.compute.groups.get(key)
        if current is not None and current.backing == group.backing:
            self._world.compute.groups[key] = dataclasses.replace(current, active_at=when)
            self._world.dirty = True

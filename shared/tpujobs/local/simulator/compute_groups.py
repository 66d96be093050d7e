"""The simulated Compute Engine's zonal managed instance groups: insert, get, list, delete,
listManagedInstances and resize, with the TPU rules: a multi-host slice is a MIG whose workload
policy names its topology, made whole or not at all; bulk mode only for RESERVATION_BOUND and
FLEX_START VMs, and it grows only from 0.

A MIG's members are workers 0..N-1 of one slice (one TPU-model queued resource), named
`{baseInstanceName}-{4 letters}` the same way every time (``predicted_member_names``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpujobs.local.simulator.clockwork import Clockwork
from tpujobs.local.simulator.compute_aic import check_all_instances_config, vm_properties
from tpujobs.local.simulator.compute_backing import Backings
from tpujobs.local.simulator.compute_checks import check_bulk, check_group_body, slice_shape
from tpujobs.local.simulator.compute_errors import already_exists, invalid, invalid_field, not_found
from tpujobs.local.simulator.compute_lists import name_filter
from tpujobs.local.simulator.compute_model import DONE, ComputeOperations, Listing, OperationView, Verdict
from tpujobs.local.simulator.compute_records import (
    ComputeOperation,
    Effect,
    GroupRecord,
    InstanceRecord,
    TemplateRecord,
    predicted_member_names,
    region_of,
)
from tpujobs.local.simulator.compute_topology import TopologyView, running_count, topology_view, without_slice_state
from tpujobs.local.simulator.compute_vms import ComputeVms, InstanceView
from tpujobs.local.simulator.records import QrState
from tpujobs.local.simulator.world import World

_URL = r"(?:https://(?:www|compute)\.googleapis\.com/compute/v1/)?"
_TEMPLATE = re.compile(
    _URL + r"(?:projects/(?P<project>[^/]+)/)?(?:regions/(?P<region>[^/]+)|global)/instanceTemplates/(?P<name>[^/]+)"
)
_POLICY = re.compile(
    _URL + r"(?:projects/(?P<project>[^/]+)/)?regions/(?P<region>[^/]+)/resourcePolicies/(?P<name>[^/]+)"
)
ACTIONS = (
    "none", "creating", "creatingWithoutRetries", "verifying", "recreating", "deleting", "abandoning",
    "restarting", "refreshing", "resuming", "starting", "stopping", "suspending",
)  # fmt: skip


@dataclass(frozen=True)
class GroupView:
    """A MIG as the API shows it now, with its members."""

    record: GroupRecord
    members: tuple[InstanceView, ...]
    topology: TopologyView | None = None  # status.appliedAcceleratorTopologies[0] (compute_topology)
    progress_error: tuple[str, str] | None = None  # a bulk MIG's lastProgressCheck error: why it waits
    checked_at: float = 0.0  # wall clock of that check

    @property
    def current_actions(self) -> dict[str, int]:
        counts = dict.fromkeys(ACTIONS, 0)
        for member in self.members:
            action = _camel_action(member.current_action)
            counts[action] = counts.get(action, 0) + 1
        return counts

    @property
    def stable(self) -> bool:
        return not self.record.deleting and all(m.current_action == "NONE" for m in self.members)


class ComputeGroups:
    """Zonal MIGs of TPU VMs: each a slice of members (VMs of `ComputeVms`) on one backing."""

    def __init__(
        self,
        world: World,
        clockwork: Clockwork,
        operations: ComputeOperations,
        vms: ComputeVms,
        backings: Backings,
    ) -> None:
        self._world = world
        self._clockwork = clockwork
        self._operations = operations
        self._vms = vms
        self._backings = backings
        operations.handle(Effect.REMOVE_GROUP, self._remove_group)

    def insert_group(self, project: str, zone: str, body: Mapping[str, Any]) -> OperationView:
        """instanceGroupManagers.insert; the operation is DONE soon whatever the capacity: the
        members show lastAttempt errors while their slice waits for chips."""
        with self._clockwork.transaction() as now:
            template = _template_of(self._operations, project, zone, str(body.get("instanceTemplate") or ""))
            scheduling = template.properties.get("scheduling") or {}
            size = check_group_body(body, scheduling)
            check_all_instances_config(body)
            policy = _policy_of(self._operations, project, zone, body)
            path = f"projects/{project}/zones/{zone}/instanceGroupManagers/{body['name']}"
            if (project, zone, str(body["name"])) in self._world.compute.groups:
                raise already_exists(path)
            group = GroupRecord(
                project=project,
                zone=zone,
                name=str(body["name"]),
                number=self._operations.new_number(),
                body=dict(body),
                template=template.path,
                properties=dict(template.properties),
                policy=policy,
                target_size=size,
                create_time=self._world.wall_clock(),
            )
            self._check_size(group, size)
            self._world.compute.groups[(project, zone, group.name)] = group
            if size:
                self._start_slice(group, size, now)
            return self._operations.new_operation(
                project, f"zones/{zone}", "compute.instanceGroupManagers.insert", path, group.number, now
            )

    def get_group(self, project: str, zone: str, name: str) -> GroupView:
        with self._clockwork.transaction() as now:
            return self.group_view(self.group(project, zone, name), now)

    def list_groups(
        self, project: str, zone: str, filter_text: str = "", max_results: int = 0, token: str = ""
    ) -> Listing:
        keep = name_filter(filter_text)
        with self._clockwork.transaction() as now:
            found = [
                self.group_view(g, now)
                for k, g in self._world.compute.groups.items()
                if k[:2] == (project, zone) and keep(g.name)
            ]
        return self._operations.page(found, lambda view: view.record.name, max_results, token)

    def list_managed_instances(
        self, project: str, zone: str, name: str, filter_text: str = "", max_results: int = 0, token: str = ""
    ) -> Listing:
        """Every member, a deleted one of a DO_NOTHING MIG too (with no instance status); pages
        only when the MIG asked for PAGINATED results, as Google pages them."""
        keep = name_filter(filter_text)
        with self._clockwork.transaction() as now:
            view = self.group_view(self.group(project, zone, name), now)
        members = [m for m in view.members if keep(m.record.name)]
        if not view.record.paged_members:
            return Listing(tuple(sorted(members, key=lambda m: m.record.name)))
        return self._operations.page(members, lambda m: m.record.name, max_results, token)

    def resize_group(self, project: str, zone: str, name: str, size: int) -> OperationView:
        """A slice's MIG goes from 0 to its size or back to 0 (which deletes its VMs); a bulk
        MIG grows only from 0."""
        with self._clockwork.transaction() as now:
            group = self.group(project, zone, name)
            if group.deleting:
                raise invalid(f"{group.path} is being deleted.")
            if size < 0:
                raise invalid_field("size", size, "It must not be negative.")
            if group.bulk and size > 0 and group.target_size != 0:
                raise invalid_field("size", size, "A MIG in bulk mode grows only from a target size of 0.")
            self._check_size(group, size)
            if size != group.target_size:
                if group.target_size:
                    self._stop_slice(group, now)
                group = dataclasses.replace(self._world.compute.groups[(project, zone, name)], target_size=size)
                self._world.compute.groups[(project, zone, name)] = group
                if size:
                    self._start_slice(group, size, now)
                self._world.dirty = True
            return self._operations.new_operation(
                project, f"zones/{zone}", "compute.instanceGroupManagers.resize", group.path, group.number, now
            )

    def delete_group(self, project: str, zone: str, name: str) -> OperationView:
        """The MIG and its VMs: their hosts get SIGTERM at once; the MIG (and its use of its
        template and policy) is gone when the operation is DONE."""
        with self._clockwork.transaction() as now:
            group = self.group(project, zone, name)
            self._world.compute.groups[(project, zone, name)] = dataclasses.replace(group, deleting=True)
            if group.backing:
                self._backings.unback(group.backing, project, zone, now)
            self._world.dirty = True
            return self._operations.new_operation(
                project,
                f"zones/{zone}",
                "compute.instanceGroupManagers.delete",
                group.path,
                group.number,
                now,
                Effect.REMOVE_GROUP,
            )

    def preempt_group(self, project: str, zone: str, name: str) -> GroupView:
        """Spot preemption of every RUNNING member (preempt_instance each)."""
        with self._clockwork.transaction() as now:
            view = self.group_view(self.group(project, zone, name), now)
            chosen = [m for m in view.members if m.status == "RUNNING"]
            if not chosen:
                raise invalid(f"{view.record.path} has no VM to preempt.")
            for member in chosen:
                self._vms.preempt(member, now)
            return self.group_view(view.record, now)

    def compute_snapshot(self) -> dict[str, list[Any]]:
        """Every policy, template, MIG (GroupView) and existing VM (InstanceView), by path."""
        with self._clockwork.transaction() as now:
            tables = self._world.compute
            return {
                "policies": sorted(tables.policies.values(), key=lambda p: p.path),
                "templates": sorted(tables.templates.values(), key=lambda t: t.path),
                "groups": [self.group_view(g, now) for g in sorted(tables.groups.values(), key=lambda g: g.path)],
                "instances": [
                    view
                    for vm in sorted(tables.instances.values(), key=lambda vm: vm.path)
                    for view in [self._vms.view(vm, now)]
                    if view.status is not None
                ],
            }

    def aggregated(self, project: str, kind: str, filter_text: str = "") -> dict[str, list[Any]]:
        """An aggregated list: "zones/Z" (VMs that exist, MIGs) or "regions/R" (policies) to the
        resources there, by name; *kind* is instances, instanceGroupManagers or resourcePolicies."""
        keep = name_filter(filter_text)
        found: dict[str, list[Any]] = {}
        with self._clockwork.transaction() as now:
            tables = self._world.compute
            if kind == "instances":
                for vm in sorted(tables.instances.values(), key=lambda vm: vm.name):
                    view = self._vms.view(vm, now)
                    if vm.project == project and keep(vm.name) and view.status is not None:
                        found.setdefault(f"zones/{vm.zone}", []).append(view)
            elif kind == "instanceGroupManagers":
                for group in sorted(tables.groups.values(), key=lambda g: g.name):
                    if group.project == project and keep(group.name):
                        found.setdefault(f"zones/{group.zone}", []).append(self.group_view(group, now))
            else:
                for policy in sorted(tables.policies.values(), key=lambda p: p.name):
                    if policy.project == project and keep(policy.name):
                        found.setdefault(f"regions/{policy.region}", []).append(policy)
        return found

    def compute_projects(self, zone: str, kind: str, name: str) -> list[str]:
        """The projects that have a VM (kind "instances") or MIG of that name in *zone*."""
        with self._world.lock:
            table = self._world.compute.instances if kind == "instances" else self._world.compute.groups
            return sorted({project for project, where, named in table if (where, named) == (zone, name)})

    # -- the rules (callers hold the lock) ------------------------------------------------------

    def group(self, project: str, zone: str, name: str) -> GroupRecord:
        group = self._world.compute.groups.get((project, zone, name))
        if group is None:
            raise not_found(f"projects/{project}/zones/{zone}/instanceGroupManagers/{name}")
        return group

    def group_view(self, group: GroupRecord, now: float) -> GroupView:
        members = sorted(
            (
                vm
                for vm in self._world.compute.instances.values()
                if (vm.project, vm.zone, vm.group) == (group.project, group.zone, group.name)
            ),
            key=lambda vm: vm.worker,
        )
        views = tuple(self._vms.view(vm, now) for vm in members)
        running = running_count(view.status for view in views)
        activation = self._world.config.topology_activation_seconds
        topology = topology_view(group, self.topology_of(group), running, now, activation)
        qr = self._world.qrs.get((group.project, group.zone, group.backing)) if group.backing else None
        held_back = None
        if group.bulk and qr is not None and qr.state is QrState.WAITING_FOR_RESOURCES and qr.next_at is None:
            held_back = self._backings.held_back_by(qr)
        return GroupView(group, views, topology, held_back, self._world.wall_clock())

    def topology_of(self, group: GroupRecord) -> str:
        policy = self._world.compute.policies.get(_policy_key(group.policy)) if group.policy else None
        return policy.topology if policy is not None else ""

    def _check_size(self, group: GroupRecord, size: int) -> None:
        """A slice's MIG holds exactly its slice's VMs: the policy's topology of its machine type
        (check_slice), or one VM without a policy."""
        check_bulk(group.body, group.properties.get("scheduling") or {})
        if not size:
            return
        machine_type = str(group.properties.get("machineType"))
        if not group.policy:
            if size > 1:
                raise invalid(
                    f"A MIG of {size} TPU VMs needs a workload policy naming its accelerator topology "
                    "(the tpujobs simulator serves multi-host slices only so)."
                )
            slice_shape(machine_type, 1, None)
            return
        policy = self._world.compute.policies[_policy_key(group.policy)]
        if not policy.topology:
            raise invalid(f"The workload policy {policy.path} names no acceleratorTopology for a TPU slice.")
        slice_shape(machine_type, size, policy.topology)

    def _start_slice(self, group: GroupRecord, size: int, now: float) -> None:
        """Members 0..size-1 and the queued resource their slice waits on."""
        generation = group.generation + 1
        # Unique for good: a MIG made again under its name must not meet its predecessor's slice,
        # which may still be deleting.
        backing = f"mig.{group.name}.{self._world.count('compute-backing')}"
        machine_type = str(group.properties.get("machineType"))
        policy = self._world.compute.policies.get(_policy_key(group.policy)) if group.policy else None
        shape = slice_shape(machine_type, size, policy.topology if policy else None)
        properties, items = vm_properties(group.properties, group.body)
        names = predicted_member_names(group.base_instance_name, group.name, size)
        members = [
            InstanceRecord(
                project=group.project,
                zone=group.zone,
                name=member,
                number=self._operations.new_number(),
                body=properties,
                metadata=items,
                create_time=self._world.wall_clock(),
                backing=backing,
                group=group.name,
                worker=worker,
                topology=shape.topology,
            )
            for worker, member in enumerate(names)
        ]
        for member in members:
            self._world.compute.instances[(member.project, member.zone, member.name)] = member
        self._world.compute.groups[(group.project, group.zone, group.name)] = dataclasses.replace(
            without_slice_state(group), backing=backing, generation=generation
        )
        self._backings.back(members[0], shape, group.path, now)
        self._world.dirty = True

    def _stop_slice(self, group: GroupRecord, now: float) -> None:
        for key, vm in list(self._world.compute.instances.items()):
            if (vm.project, vm.zone, vm.group) == (group.project, group.zone, group.name):
                del self._world.compute.instances[key]
        self._backings.unback(group.backing, group.project, group.zone, now)
        self._world.compute.groups[(group.project, group.zone, group.name)] = dataclasses.replace(
            without_slice_state(group), backing=""
        )

    def _remove_group(self, op: ComputeOperation) -> Verdict:
        """A MIG's delete is due: the MIG and its members go."""
        parts = op.target.split("/")
        group = self._world.compute.groups.pop((parts[1], parts[3], parts[5]), None)
        if group is not None:
            for key, vm in list(self._world.compute.instances.items()):
                if (vm.project, vm.zone, vm.group) == (group.project, group.zone, group.name):
                    del self._world.compute.instances[key]
        return DONE


def _template_of(operations: ComputeOperations, project: str, zone: str, text: str) -> TemplateRecord:
    if not text:
        raise invalid_field("resource.instanceTemplate", "", "This field is required.")
    match = _TEMPLATE.fullmatch(text)
    if match is None:
        raise invalid_field("resource.instanceTemplate", text, "It must name an instance template.")
    region = match["region"] or ""
    if region and region != region_of(zone):
        raise invalid_field("resource.instanceTemplate", text, f"A regional template must be of {region_of(zone)}.")
    return operations.template(match["project"] or project, region, match["name"])


def _policy_of(operations: ComputeOperations, project: str, zone: str, body: Mapping[str, Any]) -> str:
    text = str((body.get("resourcePolicies") or {}).get("workloadPolicy") or "")
    if not text:
        return ""
    match = _POLICY.fullmatch(text)
    if match is None:
        raise invalid_field("resource.resourcePolicies.workloadPolicy", text, "It must name a resource policy.")
    if match["region"] != region_of(zone):
        raise invalid_field(
            "resource.resourcePolicies.workloadPolicy", text, f"The policy must be of region {region_of(zone)}."
        )
    return operations.policy(match["project"] or project, match["region"], match["name"]).path


def _policy_key(path: str) -> tuple[str, str, str]:
    parts = path.split("/")
    return parts[1], parts[3], parts[5]


def _camel_action(action: str) -> str:
    head, *rest = action.lower().split("_")
    return head + "".join(part.title() for part in rest)

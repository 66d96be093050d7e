"""Compute Engine v1 JSON out: the simulator's Compute records as the REST API renders them
(`kind`, ids as strings, selfLinks and other links as full URLs, output-only fields filled in)."""

from __future__ import annotations

from typing import Any

from tpujobs.local.simulator.compute_groups import GroupView
from tpujobs.local.simulator.compute_model import Listing, OperationView
from tpujobs.local.simulator.compute_records import (
    GroupRecord,
    PolicyRecord,
    TemplateRecord,
    rfc3339,
    self_link,
)
from tpujobs.local.simulator.compute_topology import TopologyView
from tpujobs.local.simulator.compute_vms import InstanceView

Json = dict[str, Any]


def operation_json(view: OperationView) -> Json:
    op = view.record
    out: Json = {
        "kind": "compute#operation",
        "id": str(op.number),
        "name": op.name,
        "operationType": op.operation_type,
        "targetLink": self_link(op.target),
        "targetId": str(op.target_number),
        "status": view.status,
        "user": "tpujobs-simulator@example.com",
        "progress": 100 if view.status == "DONE" else 0,
        "insertTime": rfc3339(op.insert_time),
        "selfLink": self_link(op.path),
    }
    scope_kind, _, location = op.scope.partition("/")
    if scope_kind == "zones":
        out["zone"] = self_link(f"projects/{op.project}/zones/{location}")
    elif scope_kind == "regions":
        out["region"] = self_link(f"projects/{op.project}/regions/{location}")
    if view.status != "PENDING":
        out["startTime"] = rfc3339(op.insert_time)
    if view.status == "DONE" and op.end_time is not None:
        out["endTime"] = rfc3339(op.end_time)
    if op.errors:
        out["error"] = {"errors": [{"code": code, "message": message} for code, message in op.errors]}
        out["httpErrorStatusCode"] = op.http_status
        out["httpErrorMessage"] = op.http_message
    return out


def policy_json(policy: PolicyRecord) -> Json:
    return {
        **policy.body,
        "kind": "compute#resourcePolicy",
        "id": str(policy.number),
        "creationTimestamp": rfc3339(policy.create_time),
        "region": self_link(f"projects/{policy.project}/regions/{policy.region}"),
        "selfLink": self_link(policy.path),
        "status": "READY",
    }


def template_json(template: TemplateRecord) -> Json:
    out: Json = {
        **template.body,
        "kind": "compute#instanceTemplate",
        "id": str(template.number),
        "creationTimestamp": rfc3339(template.create_time),
        "selfLink": self_link(template.path),
    }
    if template.region:
        out["region"] = self_link(f"projects/{template.project}/regions/{template.region}")
    return out


def instance_json(view: InstanceView) -> Json:
    vm = view.record
    zone = f"projects/{vm.project}/zones/{vm.zone}"
    machine = str(vm.body.get("machineType", "")).rsplit("/", 1)[-1]
    interfaces = [dict(nic) for nic in vm.body.get("networkInterfaces") or []]
    if interfaces and view.address:
        interfaces[0] = {**interfaces[0], "networkIP": view.address, "name": "nic0"}
    out: Json = {
        **vm.body,
        "kind": "compute#instance",
        "id": str(vm.number),
        "name": vm.name,
        "creationTimestamp": rfc3339(vm.create_time),
        "zone": self_link(zone),
        "machineType": self_link(f"{zone}/machineTypes/{machine}"),
        "status": view.status,
        "networkInterfaces": interfaces,
        "metadata": {
            "kind": "compute#metadata",
            "fingerprint": vm.fingerprint,
            "items": [{"key": key, "value": value} for key, value in vm.metadata],
        },
        "selfLink": self_link(vm.path),
    }
    if vm.upcoming_maintenance is not None:  # where google-cloud-compute's Instance has it
        out["resourceStatus"] = {
            **(vm.body.get("resourceStatus") or {}),
            "upcomingMaintenance": dict(vm.upcoming_maintenance),
        }
    if vm.terminates_at is not None:  # its maxRunDuration's end, set when it turned RUNNING
        status = out.setdefault("resourceStatus", dict(vm.body.get("resourceStatus") or {}))
        status["scheduling"] = {"terminationTimestamp": rfc3339(vm.terminates_at)}
    if vm.group:
        out["metadata"]["items"].append(
            {"key": "created-by", "value": f"projects/{vm.project}/zones/{vm.zone}/instanceGroupManagers/{vm.group}"}
        )
    return out


def group_json(view: GroupView) -> Json:
    group: GroupRecord = view.record
    zone = f"projects/{group.project}/zones/{group.zone}"
    out: Json = {
        **group.body,
        "kind": "compute#instanceGroupManager",
        "id": str(group.number),
        "creationTimestamp": rfc3339(group.create_time),
        "zone": self_link(zone),
        "instanceTemplate": self_link(group.template),
        "instanceGroup": self_link(f"{zone}/instanceGroups/{group.name}"),
        "targetSize": group.target_size,
        "currentActions": view.current_actions,
        "status": {
            "isStable": view.stable,
            "versionTarget": {"isReached": True},
            "stateful": {"hasStatefulConfig": False, "perInstanceConfigs": {"allEffective": True}},
            "bulkInstanceOperation": _bulk_operation(view),
        },
        "instanceLifecyclePolicy": {
            **(group.body.get("instanceLifecyclePolicy") or {}),
            "defaultActionOnFailure": group.action_on_failure,
        },
        "targetSizePolicy": {"mode": "BULK" if group.bulk else "INDIVIDUAL"},
        "listManagedInstancesResults": "PAGINATED" if group.paged_members else "PAGELESS",
        "selfLink": self_link(group.path),
    }
    if group.policy:
        out["resourcePolicies"] = {"workloadPolicy": self_link(group.policy)}
    if group.body.get("allInstancesConfig"):  # made with the MIG: its VMs have it from their creation
        out["status"]["allInstancesConfig"] = {"effective": True, "currentRevision": rfc3339(group.create_time)}
    if view.topology is not None:
        out["status"]["appliedAcceleratorTopologies"] = [_topology_json(view.topology)]
    return out


def _errors(code: str, message: str) -> Json:
    return {"errors": [{"code": code, "message": message}]}


def _bulk_operation(view: GroupView) -> Json:
    """status.bulkInstanceOperation: in progress until every VM is made, and why it waits."""
    out: Json = {"inProgress": view.record.bulk and not view.stable}
    if view.progress_error is not None:
        out["lastProgressCheck"] = {"timestamp": rfc3339(view.checked_at), "error": _errors(*view.progress_error)}
    return out


def _topology_json(topology: TopologyView) -> Json:
    """One status.appliedAcceleratorTopologies[] entry (InstanceGroupManagerStatusAcceleratorTopology)."""
    out: Json = {"acceleratorTopology": topology.topology, "state": topology.state}
    if topology.error is not None:
        details: Json = {"error": _errors(*topology.error)}
        if topology.error_time is not None:
            details["timestamp"] = rfc3339(topology.error_time)
        out["stateDetails"] = details
    return out


def instance_group_json(view: GroupView) -> Json:
    """The unmanaged face of a MIG: its instance group, sized by the VMs that exist."""
    group = view.record
    zone = f"projects/{group.project}/zones/{group.zone}"
    return {
        "kind": "compute#instanceGroup",
        "id": str(group.number),
        "name": group.name,
        "creationTimestamp": rfc3339(group.create_time),
        "zone": self_link(zone),
        "size": sum(1 for member in view.members if member.status is not None),
        "selfLink": self_link(f"{zone}/instanceGroups/{group.name}"),
    }


def managed_instance_json(view: InstanceView) -> Json:
    vm = view.record
    out: Json = {
        "instance": self_link(vm.path),
        "name": vm.name,
        "currentAction": view.current_action,
    }
    if view.status is not None:
        out["instanceStatus"] = view.status
        out["id"] = str(vm.number)
        if vm.terminates_at is not None:
            out["scheduling"] = {"terminationTimestamp": rfc3339(vm.terminates_at)}
    if view.errors:
        out["lastAttempt"] = {
            "errors": {"errors": [{"code": code, "message": message} for code, message in view.errors]}
        }
    return out


def list_json(kind: str, base: str, listing: Listing, render: Any, key: str = "items") -> Json:
    """A list answer: `kind`, `items` (left out when empty, as Google does) and `nextPageToken`."""
    out: Json = {"kind": kind, "id": base, "selfLink": self_link(base)}
    items = [render(item) for item in listing.items]
    if items:
        out[key] = items
    if listing.next_page_token:
        out["nextPageToken"] = listing.next_page_token
    return out

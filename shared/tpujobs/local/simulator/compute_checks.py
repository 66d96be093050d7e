"""What the simulated Compute Engine refuses in a request body, before it changes anything.

Bodies are read into google-cloud-compute's own message types, so an unknown field is a 400 as
Google answers it; Compute's enums are strings in its protos, so every enum value is checked against
the enum the message type declares for it. The TPU rules (machine types, workload policy
topologies, provisioning models) follow ../shared/design/compute-engine.md and are strict where it
says UNCONFIRMED; the slice shapes come from ``tpujobs.domain.platforms``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format

from tpujobs.domain.accelerators import BadTopology, UnknownAcceleratorType, topology_chips
from tpujobs.domain.platforms import COMPUTE_FAMILIES, ComputeFamily, ComputeShape, compute_shape
from tpujobs.local.simulator.checks import check_labels, check_metadata
from tpujobs.local.simulator.compute_errors import invalid, invalid_field, required
from tpujobs.local.simulator.messages import BadBody, json_object

_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
# Every TPU machine type Compute Engine offers: (family, chips per VM).
TPU_MACHINE_TYPES: dict[str, tuple[ComputeFamily, int]] = {
    f"{family.machine_prefix}-{chips}t": (family, chips)
    for family in COMPUTE_FAMILIES.values()
    for chips in {*family.single_host_chips, family.chips_per_host}
}
_MACHINE_PATH = re.compile(
    r"(?:https://(?:www|compute)\.googleapis\.com/compute/v1/)?(?:projects/[^/]+/)?zones/(?P<zone>[^/]+)"
    r"/machineTypes/(?P<name>[^/]+)"
)


def read_body(body: bytes, message_type: Any, field: str) -> dict[str, Any]:
    """*body* read as *message_type* (a google.cloud.compute_v1 type), as canonical JSON; an unknown
    field, a wrong JSON type or a bad enum value is 400 invalid."""
    try:
        data = json_object(body, field)
    except BadBody as exc:
        raise invalid(f"Invalid JSON payload received. {exc}") from None
    try:
        parsed = json_format.ParseDict(data, message_type.pb()(), ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise invalid(f"Invalid JSON payload received at '{field}': {first}") from None
    canonical: dict[str, Any] = json_format.MessageToDict(parsed)
    check_enums(canonical, message_type, "resource")
    return canonical


def check_enums(data: Mapping[str, Any], message_type: Any, path: str) -> None:
    """Every string field that the message type declares an enum for holds one of its names."""
    declared = {name: value for name, value in vars(message_type).items() if isinstance(value, type)}
    for name, field in message_type.meta.fields.items():
        key = _camel(name)
        if key not in data:
            continue
        value = data[key]
        nested = getattr(field, "message", None)
        if nested is not None and not nested.__name__.endswith("Entry"):
            for index, item in enumerate(value if isinstance(value, list) else [value]):
                where = f"{path}.{key}" + (f"[{index}]" if isinstance(value, list) else "")
                if isinstance(item, dict):
                    check_enums(item, nested, where)
            continue
        enum = declared.get(_pascal(name))
        if enum is None or not hasattr(enum, "__members__"):
            continue
        allowed = sorted(m for m in enum.__members__ if not m.startswith("UNDEFINED_"))
        for item in value if isinstance(value, list) else [value]:
            if item not in allowed:
                raise invalid_field(f"{path}.{key}", item, f"It must be one of {', '.join(allowed)}.")


def check_name(name: Any, path: str = "resource.name") -> str:
    if not name:
        raise required(path)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise invalid_field(
            path, name, f"Must be a match of regex '{_NAME.pattern}' (RFC 1035: lowercase letters, digits, hyphens)"
        )
    return name


def machine_type_name(value: Any, zone: str | None, path: str) -> str:
    """The TPU machine type a field names: a bare name in a template (*zone* None), a
    `zones/ZONE/machineTypes/NAME` path or URL of the instance's own zone otherwise."""
    if not value:
        raise required(path)
    text = str(value)
    if zone is None:
        name = text
    else:
        match = _MACHINE_PATH.fullmatch(text)
        if match is None:
            raise invalid_field(path, text, "It must be zones/ZONE/machineTypes/NAME.")
        if match["zone"] != zone:
            raise invalid_field(path, text, f"The machine type must be of the instance's zone {zone}.")
        name = match["name"]
    if name not in TPU_MACHINE_TYPES:
        offered = ", ".join(sorted(TPU_MACHINE_TYPES))
        if any(name.startswith(f"{family.machine_prefix}-") for family in COMPUTE_FAMILIES.values()):
            where = f" in zone '{zone}'" if zone else ""
            raise invalid_field(
                path, text, f"Machine type with name '{name}' does not exist{where}. TPU machine types: {offered}."
            )
        raise invalid_field(path, text, f"The tpujobs simulator serves TPU machine types only: {offered}.")
    return name


def slice_shape(machine_type: str, hosts: int, topology: str | None) -> ComputeShape:
    """The slice *hosts* VMs of *machine_type* make, checked against a workload policy's topology
    (None: one VM, no policy); 400 when they do not make that slice."""
    family, chips = TPU_MACHINE_TYPES[machine_type]
    total = chips * hosts
    if topology is not None:
        try:
            held = topology_chips(topology, family.name)
        except BadTopology as exc:
            raise invalid(
                f"The workload policy's acceleratorTopology {topology!r} is no {family.name} shape: {exc}."
            ) from None
        if held != total:
            raise invalid(
                f"The workload policy's acceleratorTopology {topology} holds {held} chips, but the MIG's "
                f"targetSize of {hosts} x {machine_type} holds {total}."
            )
    accelerator_type = f"{family.name}-{total * 2 if family.counts_cores else total}"
    try:
        shape = compute_shape(accelerator_type, topology)
    except (UnknownAcceleratorType, BadTopology) as exc:
        raise invalid(
            f"{hosts} x {machine_type} ({total} chips) make no TPU slice Compute Engine offers: {exc}."
        ) from None
    if (shape.machine_type, shape.hosts) != (machine_type, hosts):
        raise invalid(
            f"{hosts} x {machine_type} do not make {accelerator_type} {shape.topology}: that slice is "
            f"{shape.hosts} x {shape.machine_type}."
        )
    return shape


def check_vm(properties: Mapping[str, Any], path: str, zone: str | None) -> str:
    """An instance, or a template's properties: the machine type (returned), disks, network,
    metadata, labels and scheduling as Compute Engine takes them for a TPU VM."""
    machine_type = machine_type_name(properties.get("machineType"), zone, f"{path}.machineType")
    if not properties.get("disks"):
        raise invalid_field(f"{path}.disks", "", "Boot disk must be specified.")
    if not properties.get("networkInterfaces"):
        raise invalid_field(f"{path}.networkInterfaces", "", "At least one network interface is required.")
    metadata_items(properties.get("metadata") or {}, f"{path}.metadata")
    if "labels" in properties:
        check_labels(properties["labels"], f"{path}.labels")
    check_scheduling(properties.get("scheduling") or {}, f"{path}.scheduling")
    check_reservation_affinity(properties, path)
    return machine_type


RESERVATION_NAME_KEY = "compute.googleapis.com/reservation-name"


def check_reservation_affinity(properties: Mapping[str, Any], path: str) -> None:
    """RESERVATION_BOUND VMs "must specifically target the reservation" (Compute Engine's
    about-reservation-bound-vms; ANY_RESERVATION, the API's default, is refused for them), and
    SPECIFIC_RESERVATION "must specify key value fields" naming it (ReservationAffinity)."""
    affinity = properties.get("reservationAffinity") or {}
    kind = affinity.get("consumeReservationType", "ANY_RESERVATION")
    model = (properties.get("scheduling") or {}).get("provisioningModel", "STANDARD")
    where = f"{path}.reservationAffinity"
    if model == "RESERVATION_BOUND" and kind != "SPECIFIC_RESERVATION":
        raise invalid_field(
            f"{where}.consumeReservationType",
            kind,
            "RESERVATION_BOUND VMs must specifically target a reservation: SPECIFIC_RESERVATION, with key "
            f"{RESERVATION_NAME_KEY} and the reservation's name in values.",
        )
    if kind != "SPECIFIC_RESERVATION":
        return
    if affinity.get("key") != RESERVATION_NAME_KEY:
        raise invalid_field(
            f"{where}.key", affinity.get("key", ""), f"SPECIFIC_RESERVATION needs key {RESERVATION_NAME_KEY}."
        )
    values = affinity.get("values") or []
    if len(values) != 1 or not values[0]:
        raise invalid_field(f"{where}.values", values, "SPECIFIC_RESERVATION needs the one reservation's name.")


def metadata_items(metadata: Mapping[str, Any], path: str) -> tuple[tuple[str, str], ...]:
    """A Metadata message's items, in order; a key given twice, a bad key or value is 400."""
    items = metadata.get("items") or []
    seen: dict[str, str] = {}
    for item in items:
        key = str(item.get("key", ""))
        if key in seen:
            raise invalid_field(f"{path}.items", key, "Duplicate metadata key.")
        seen[key] = str(item.get("value", ""))
    check_metadata(seen, path)
    return tuple(seen.items())


def check_scheduling(scheduling: Mapping[str, Any], path: str) -> None:
    """TPU VMs terminate for host maintenance; flex-start and reservation-bound VMs are deleted at
    their end; bulk rules are the group's (check_group_body)."""
    if scheduling.get("onHostMaintenance") == "MIGRATE":
        raise invalid_field(f"{path}.onHostMaintenance", "MIGRATE", "TPU VMs cannot live-migrate; use TERMINATE.")
    model = scheduling.get("provisioningModel", "STANDARD")
    if model in ("FLEX_START", "RESERVATION_BOUND") and scheduling.get("instanceTerminationAction") != "DELETE":
        raise invalid_field(
            f"{path}.instanceTerminationAction",
            scheduling.get("instanceTerminationAction", ""),
            f"{model} VMs need instanceTerminationAction DELETE.",
        )
    if model == "FLEX_START" and not scheduling.get("maxRunDuration"):
        raise required(f"{path}.maxRunDuration")
    if model != "SPOT" and scheduling.get("preemptible") and "provisioningModel" in scheduling:
        raise invalid_field(f"{path}.preemptible", True, f"A preemptible VM cannot be {model}.")


def check_policy_body(body: Mapping[str, Any]) -> None:
    """A resource policy: a name and a workload policy (the only kind simulated), whose
    acceleratorTopology needs HIGH_THROUGHPUT and excludes maxTopologyDistance."""
    check_name(body.get("name"))
    kinds = [k for k in body if k.endswith("Policy") or k == "groupPlacementPolicy"]
    workload = body.get("workloadPolicy")
    if workload is None or kinds != ["workloadPolicy"]:
        raise invalid("The tpujobs simulator serves resource policies with exactly one workloadPolicy and no other.")
    if not workload.get("type"):
        raise required("resource.workloadPolicy.type")
    topology = workload.get("acceleratorTopology")
    if topology and workload["type"] != "HIGH_THROUGHPUT":
        raise invalid_field(
            "resource.workloadPolicy.acceleratorTopology", topology, "Only HIGH_THROUGHPUT allows acceleratorTopology."
        )
    if topology and "maxTopologyDistance" in workload:
        raise invalid("acceleratorTopology cannot be combined with maxTopologyDistance.")
    if topology and not re.fullmatch(r"[1-9][0-9]*(x[1-9][0-9]*){1,2}", topology):
        raise invalid_field("resource.workloadPolicy.acceleratorTopology", topology, "It must be such as 2x2x2.")


def check_group_body(body: Mapping[str, Any], scheduling: Mapping[str, Any]) -> int:
    """A MIG: a name, a base instance name, a template and a target size (returned); bulk mode
    only with RESERVATION_BOUND or FLEX_START VMs."""
    check_name(body.get("name"))
    check_name(body.get("baseInstanceName"), "resource.baseInstanceName")
    if not body.get("instanceTemplate"):
        raise required("resource.instanceTemplate")
    if "targetSize" not in body:
        raise required("resource.targetSize")
    size = int(body["targetSize"])
    if size < 0:
        raise invalid_field("resource.targetSize", size, "It must not be negative.")
    check_bulk(body, scheduling)
    return size


def check_bulk(body: Mapping[str, Any], scheduling: Mapping[str, Any]) -> None:
    if (body.get("targetSizePolicy") or {}).get("mode") != "BULK":
        return
    model = scheduling.get("provisioningModel", "STANDARD")
    if model not in ("RESERVATION_BOUND", "FLEX_START"):
        raise invalid_field(
            "resource.targetSizePolicy.mode",
            "BULK",
            f"Bulk mode needs RESERVATION_BOUND or FLEX_START VMs; the template's are {model}.",
        )
    if (body.get("instanceLifecyclePolicy") or {}).get("defaultActionOnFailure") != "DO_NOTHING":
        raise invalid_field(
            "resource.instanceLifecyclePolicy.defaultActionOnFailure",
            (body.get("instanceLifecyclePolicy") or {}).get("defaultActionOnFailure", ""),
            "Bulk mode needs DO_NOTHING.",
        )


def _camel(name: str) -> str:
    head, *rest = name.rstrip("_").split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _pascal(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.rstrip("_").split("_"))

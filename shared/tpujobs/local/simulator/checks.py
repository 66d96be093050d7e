"""What the TPU API refuses in a request before queueing it: resource ids, accelerator
configs, VM options (network, disks, tags), metadata and labels, and UpdateNode's masks."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from tpujobs.domain.accelerators import BadTopology, UnknownAcceleratorType, accelerator_type_of, parse_accelerator_type
from tpujobs.local.simulator.errors import Code, SimulatorError, bad_request
from tpujobs.local.simulator.records import SliceRequest

_RESOURCE_ID = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
MAX_RESOURCE_ID_LENGTH = 63


def check_resource_id(kind: str, value: str) -> None:
    """Refuse ids the TPU API refuses, with the same rule, so tests catch bad names locally."""
    if not isinstance(value, str) or len(value) > MAX_RESOURCE_ID_LENGTH or not _RESOURCE_ID.fullmatch(value):
        raise SimulatorError(
            Code.INVALID_ARGUMENT,
            f"Invalid {kind} {value!r}: it must be 1 to {MAX_RESOURCE_ID_LENGTH} characters, "
            "start with a lowercase letter, hold only lowercase letters, digits and hyphens, "
            "and not end with a hyphen",
        )


# The node's VM options as the API checks them, with Compute Engine's names: networks,
# subnetworks, tags and disks are RFC 1035 labels; a resource may be named by its path, or by
# its full Compute API URL.
_LABEL = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
_COMPUTE_URL = r"(?:https://www\.googleapis\.com/compute/v1/)?"
_NETWORK = re.compile(rf"{_LABEL}|{_COMPUTE_URL}projects/[^/]+/global/networks/{_LABEL}")
_SUBNETWORK = re.compile(
    rf"{_LABEL}|{_COMPUTE_URL}projects/[^/]+/regions/(?P<region>[a-z]+-[a-z]+[0-9]+)/subnetworks/{_LABEL}"
)
_DISK = re.compile(rf"{_COMPUTE_URL}projects/[^/]+/zones/(?P<zone>[a-z]+-[a-z]+[0-9]+-[a-z])/disks/{_LABEL}")
MAX_TAGS = 64  # Compute Engine's limit of network tags on a VM
# AttachedDisk.DiskMode names; unspecified attaches read-write, as Compute Engine's default.
_DISK_MODES = frozenset({"READ_WRITE", "READ_ONLY", "DISK_MODE_UNSPECIFIED"})


def accelerator_type_of_config(config: Mapping[str, Any], field_path: str) -> str:
    """The accelerator type an AcceleratorConfig ({type, topology}) names, or INVALID_ARGUMENT:
    an unknown type, a topology with the wrong number of axes for the family, or a chip count
    the family is not offered in."""
    try:
        return accelerator_type_of(str(config.get("type", "")), str(config.get("topology", "")))
    except (UnknownAcceleratorType, BadTopology) as exc:
        raise bad_request(field_path, f"Invalid accelerator_config: {exc}") from exc


def check_vm_options(spec: SliceRequest, zone: str, field_path: str) -> None:
    """Refuse the node options the real API refuses: a malformed network or subnetwork, a
    subnetwork of another region than the zone, malformed tags, a data disk of another zone or
    of an unknown mode, a read-write disk on more than one VM, and an accelerator_config that
    is not the node's accelerator type."""
    node = spec.template
    region = zone.rsplit("-", 1)[0]
    network_config = node.get("networkConfig") or {}
    if not isinstance(network_config, dict):
        raise bad_request(f"{field_path}.network_config", "network_config must be an object")
    network = str(network_config.get("network") or "")
    if network and not _NETWORK.fullmatch(network):
        raise bad_request(
            f"{field_path}.network_config.network",
            f"Invalid value for field 'network': {network!r}. It must be a network name or "
            "projects/PROJECT/global/networks/NAME.",
        )
    subnetwork = str(network_config.get("subnetwork") or "")
    match = _SUBNETWORK.fullmatch(subnetwork) if subnetwork else None
    if subnetwork and match is None:
        raise bad_request(
            f"{field_path}.network_config.subnetwork",
            f"Invalid value for field 'subnetwork': {subnetwork!r}. It must be a subnetwork name or "
            "projects/PROJECT/regions/REGION/subnetworks/NAME.",
        )
    if match is not None and match["region"] and match["region"] != region:
        raise bad_request(
            f"{field_path}.network_config.subnetwork",
            f"Subnetwork {subnetwork!r} is in region {match['region']}, but the node is in zone {zone} "
            f"of region {region}: a TPU node uses a subnetwork of its zone's region.",
        )
    check_tags(node.get("tags") or [], f"{field_path}.tags")
    disks = node.get("dataDisks") or []
    if not isinstance(disks, list):
        raise bad_request(f"{field_path}.data_disks", "data_disks must be a list")
    vms = parse_accelerator_type(spec.accelerator_type).hosts * len(spec.node_ids)
    for index, disk in enumerate(disks):
        where = f"{field_path}.data_disks[{index}]"
        source = str(disk.get("sourceDisk") or "") if isinstance(disk, dict) else ""
        found = _DISK.fullmatch(source)
        if found is None:
            raise bad_request(
                f"{where}.source_disk",
                f"Invalid source_disk {source!r}: it must be projects/PROJECT/zones/ZONE/disks/NAME.",
            )
        if found["zone"] != zone:
            raise bad_request(
                f"{where}.source_disk",
                f"Disk {source!r} is in zone {found['zone']}, but the node is in zone {zone}: "
                "a persistent disk attaches only to VMs of its own zone.",
            )
        mode = disk.get("mode", "DISK_MODE_UNSPECIFIED")
        if mode not in _DISK_MODES:
            raise bad_request(f"{where}.mode", f"Invalid disk mode {mode!r}: it must be READ_WRITE or READ_ONLY.")
        if mode != "READ_ONLY" and vms > 1:
            raise bad_request(
                f"{where}.mode",
                f"Disk {source!r} is attached READ_WRITE to {vms} VMs: a persistent disk attaches read-write "
                "to one VM only; attach it READ_ONLY.",
            )
    config = node.get("acceleratorConfig")
    if config is not None:
        if not isinstance(config, dict):
            raise bad_request(f"{field_path}.accelerator_config", "accelerator_config must be an object")
        named = accelerator_type_of_config(config, f"{field_path}.accelerator_config")
        if named != spec.accelerator_type:
            raise bad_request(
                f"{field_path}.accelerator_config",
                f"accelerator_config names {named}, but the node's accelerator type is {spec.accelerator_type}.",
            )


def check_tags(tags: Any, field_path: str) -> None:
    """Network tags as Compute Engine takes them: at most MAX_TAGS RFC 1035 labels."""
    if not isinstance(tags, list) or len(tags) > MAX_TAGS:
        raise bad_request(field_path, f"tags must be a list of at most {MAX_TAGS} network tags")
    for tag in tags:
        if not isinstance(tag, str) or not re.fullmatch(_LABEL, tag):
            raise bad_request(
                field_path,
                f"Invalid network tag {tag!r}: it must be 1 to 63 lowercase letters, digits or hyphens, "
                "start with a letter and not end with a hyphen.",
            )


# UpdateNode's update_mask: the Node fields it may change (UpdateNodeRequest's docstring), as
# JSON paths, each with the proto path its refusals name. A map or list the mask names is
# replaced whole, and one the body leaves out is cleared, as proto field masks do.
UPDATABLE_NODE_FIELDS = {
    "description": "description",
    "tags": "tags",
    "labels": "labels",
    "metadata": "metadata",
    "networkConfig.enableExternalIps": "network_config.enable_external_ips",
}
# Compute Engine's limits on instance metadata and labels, which TPU VMs inherit.
_METADATA_KEY = re.compile(r"[a-zA-Z0-9_-]{1,128}")
MAX_METADATA_BYTES = 512 * 1024  # all keys and values together
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
MAX_LABELS = 64


def check_metadata(metadata: Any, field_path: str) -> None:
    """Refuse metadata GCE refuses: keys of letters, digits, '-' and '_' up to 128 characters,
    string values, at most MAX_METADATA_BYTES in all."""
    if not isinstance(metadata, dict):
        raise bad_request(field_path, "metadata must be a map of strings to strings")
    size = 0
    for key, value in metadata.items():
        if not _METADATA_KEY.fullmatch(key):
            raise bad_request(
                field_path,
                f"Invalid metadata key {key!r}: it must be 1 to 128 letters, digits, hyphens or underscores.",
            )
        if not isinstance(value, str):
            raise bad_request(field_path, f"The value of metadata key {key!r} must be a string.")
        size += len(key.encode("utf-8")) + len(value.encode("utf-8"))
    if size > MAX_METADATA_BYTES:
        raise bad_request(field_path, f"Metadata is {size} bytes; it may hold at most {MAX_METADATA_BYTES} bytes.")


def check_labels(labels: Any, field_path: str) -> None:
    """Refuse labels GCE refuses: at most MAX_LABELS, keys and values of lowercase letters,
    digits, '-' and '_' up to 63 characters, keys starting with a letter."""
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
        raise bad_request(field_path, f"labels must be a map of at most {MAX_LABELS} strings to strings")
    for key, value in labels.items():
        if not _LABEL_KEY.fullmatch(key):
            raise bad_request(
                field_path,
                f"Invalid label key {key!r}: it must be 1 to 63 lowercase letters, digits, hyphens or "
                "underscores, and start with a letter.",
            )
        if not isinstance(value, str) or not _LABEL_VALUE.fullmatch(value):
            raise bad_request(
                field_path,
                f"Invalid value {value!r} of label {key!r}: it must be 0 to 63 lowercase letters, digits, "
                "hyphens or underscores.",
            )


def updated_template(template: Mapping[str, Any], mask: Sequence[str], node: Mapping[str, Any]) -> dict[str, Any]:
    """*template* with the fields *mask* names taken from *node* (camelCase JSON), checked as
    UpdateNode checks them; INVALID_ARGUMENT for an empty mask, a field it cannot update, or a
    value the API refuses."""
    supported = ", ".join(UPDATABLE_NODE_FIELDS.values())
    if not mask:
        raise bad_request("update_mask", f"update_mask is required: name the node fields to update ({supported}).")
    out = dict(template)
    for path in mask:
        if path not in UPDATABLE_NODE_FIELDS:
            raise bad_request(
                "update_mask", f"Field {path!r} of a node cannot be updated; update_mask may name {supported}."
            )
        where = f"node.{UPDATABLE_NODE_FIELDS[path]}"
        if path == "networkConfig.enableExternalIps":
            sent = node.get("networkConfig") or {}
            if not isinstance(sent, dict):
                raise bad_request("node.network_config", "network_config must be an object.")
            network_config = dict(out.get("networkConfig") or {})
            value = sent.get("enableExternalIps", False)
            if not isinstance(value, bool):
                raise bad_request(where, "enable_external_ips must be true or false.")
            network_config["enableExternalIps"] = value
            out["networkConfig"] = network_config
            continue
        if path not in node:  # named but not sent: cleared
            out.pop(path, None)
            continue
        value = node[path]
        if path == "metadata":
            check_metadata(value, where)
        elif path == "labels":
            check_labels(value, where)
        elif path == "tags":
            check_tags(value, where)
        elif not isinstance(value, str):
            raise bad_request(where, "description must be a string.")
        out[path] = value
    return out

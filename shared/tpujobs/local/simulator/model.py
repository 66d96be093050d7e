"""The simulated Cloud TPU service: queued resources, nodes and operations as a state machine.

Why a model apart from the HTTP server: the lifecycle rules (who gets capacity, when a
queued resource turns ACTIVE, what preemption does) are the part worth testing, and they
test best with a fake clock and no sockets. The server only translates JSON.

Why time moves lazily: every public call first advances the world to ``clock()``, applying
due transitions in time order, so a fake clock gives exact, repeatable histories. The
server's ticker calls ``advance()`` too, so changes (and hooks) happen with nobody asking.

The life of a queued resource (QR); each arrow happens at the time shown:

    CREATING --accept_seconds--> ACCEPTED            the create operation completes
    ACCEPTED --at once--> WAITING_FOR_RESOURCES
    WAITING_FOR_RESOURCES --waiting_seconds, then chips free, first come first served-->
        PROVISIONING                                  nodes appear, CREATING
    PROVISIONING --provisioning_seconds--> ACTIVE     nodes READY; on_active hooks
    PROVISIONING, ACTIVE --preempt()--> SUSPENDING    nodes PREEMPTED, their metadata
                                                      preempted=TRUE; on_stopped hooks
    SUSPENDING --suspending_seconds--> SUSPENDED
    ACTIVE --kill_host()--> ACTIVE                    one worker host dies: its node REPAIRING;
                                                      on_host_failed hooks
    CREATING..ACTIVE --fail()--> FAILED               nodes gone; on_stopped hooks
    any state but DELETING --delete--> DELETING       on_stopped hooks
    DELETING --deleting_seconds--> gone               the delete operation completes

A QR holds the chips of its pools ("family@zone") from PROVISIONING until it is gone: a
SUSPENDED or FAILED one keeps them, as the real quota does, until someone deletes it.
Deleting without force is refused while the QR still has nodes, as the real API does.

A failed host (``kill_host``) is shown as the TPU API shows a slice under repair: the node's
state REPAIRING, its health UNHEALTHY_MAINTENANCE and a health description naming the dead
worker, while the QR stays ACTIVE (a broken host does not change the queued resource). The
simulator never finishes the repair; the control plane is expected to notice (by polling, or
by the missing worker's silence) and delete the QR.

Nodes of an ACTIVE QR have timed steps of their own (``tpujobs dev fault``):

    READY --reboot()--> RESTARTING --reboot_seconds--> READY     on_hosts RESET, then BOOT
    READY --maintenance()--> READY, instance/maintenance-event TERMINATE_ON_HOST_MAINTENANCE
          --notice--> REPAIRING, UNHEALTHY_MAINTENANCE            on_hosts SHUTDOWN
          --maintenance_seconds--> READY, event NONE              on_hosts BOOT

``update_node`` (the API's UpdateNode) replaces a READY node's description, tags, labels,
metadata or external-IP setting at once; its hosts' metadata servers answer the new values,
and every change of state wakes the metadata requests held on it (``wait_for_change``).
``set_node_health`` and ``set_node_state`` only change what the API shows. ``no_boot`` gives
QRs hosts that never run their startup script. ``inject_errors`` plans the errors the next
calls of one API method answer with (``errors.Fault``); ``api_error_rate`` rolls dice for all.

The model starts no processes: ``workers.WorkerPool`` listens to the hooks and does that.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import ipaddress
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from tpujobs.domain.accelerators import (
    FAMILIES,
    BadTopology,
    UnknownAcceleratorType,
    accelerator_type_of,
    parse_accelerator_type,
)
from tpujobs.local.simulator.errors import (
    FAULT_METHODS,
    Code,
    Fault,
    SimulatorError,
    bad_request,
    project_number,
)

_log = logging.getLogger(__name__)

_RESOURCE_ID = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
MAX_RESOURCE_ID_LENGTH = 63
FIRST_WORKER_ADDRESS = ipaddress.IPv4Address("127.1.0.0")  # loopback: workers can bind it
WORKER_PORT = 8470
MEGASCALE_PORT = 8080  # where a multislice's coordinator listens, as tpu-env names it
FIRST_NODE_NUMBER = 1_000_000_000_000_000_000  # node ids look like the real 19-digit ones
STATE_FILE_VERSION = 1


def compute_default_account(project: str) -> str:
    """The Compute Engine default service account: what a VM runs as when none is named."""
    return f"{project_number(project)}-compute@developer.gserviceaccount.com"


class QrState(str, Enum):
    """QueuedResourceState.State members; the values are the API's names."""

    CREATING = "CREATING"  # received, not yet accepted
    ACCEPTED = "ACCEPTED"  # accepted; the create operation is done
    WAITING_FOR_RESOURCES = "WAITING_FOR_RESOURCES"  # queued for chips
    PROVISIONING = "PROVISIONING"  # chips granted, nodes being created
    ACTIVE = "ACTIVE"  # nodes READY
    SUSPENDING = "SUSPENDING"  # preempted, nodes going away
    SUSPENDED = "SUSPENDED"  # preempted; nodes remain as PREEMPTED until deleted
    FAILED = "FAILED"  # gave up; failed_data says why
    DELETING = "DELETING"  # being deleted; gone after deleting_seconds


LIVE_STATES = frozenset(
    {
        QrState.CREATING,
        QrState.ACCEPTED,
        QrState.WAITING_FOR_RESOURCES,
        QrState.PROVISIONING,
        QrState.ACTIVE,
    }
)
PREEMPTIBLE_STATES = frozenset({QrState.PROVISIONING, QrState.ACTIVE})


class NodeState(str, Enum):
    """Node.State members; the values are the API's names. The model sets the first seven
    itself; ``set_node_state`` (``tpujobs dev fault node-state``) may show any of them."""

    CREATING = "CREATING"  # its QR is PROVISIONING
    READY = "READY"  # its QR is ACTIVE
    RESTARTING = "RESTARTING"  # reboot: its hosts are resetting; READY after reboot_seconds
    REPAIRING = "REPAIRING"  # a host failed (kill_host, never repaired) or is under maintenance
    PREEMPTED = "PREEMPTED"  # its QR was preempted
    DELETING = "DELETING"  # its QR is being deleted
    STATE_UNSPECIFIED = "STATE_UNSPECIFIED"
    REIMAGING = "REIMAGING"
    STOPPED = "STOPPED"
    STOPPING = "STOPPING"
    STARTING = "STARTING"
    TERMINATED = "TERMINATED"
    HIDING = "HIDING"
    HIDDEN = "HIDDEN"
    UNHIDING = "UNHIDING"
    UNKNOWN = "UNKNOWN"


# Node.Health names. The model shows HEALTHY on READY nodes and UNHEALTHY_MAINTENANCE on ones
# under repair; ``set_node_health`` (``tpujobs dev fault node-health``) may show any.
NODE_HEALTHS = (
    "HEALTH_UNSPECIFIED",
    "HEALTHY",
    "TIMEOUT",
    "UNHEALTHY_TENSORFLOW",
    "UNHEALTHY_MAINTENANCE",
)
MAINTENANCE_NONE = "NONE"
MAINTENANCE_TERMINATE = "TERMINATE_ON_HOST_MAINTENANCE"


class NodeStep(str, Enum):
    """What a node's own timer (NodeRecord.next_at) does when it is due."""

    NONE = ""
    REBOOTED = "rebooted"  # RESTARTING -> READY; the reset hosts boot again
    MAINTENANCE_STARTS = "maintenance-starts"  # notice over: REPAIRING, hosts shut down
    MAINTENANCE_ENDS = "maintenance-ends"  # READY, the event NONE again; the hosts boot again


class Initiator(str, Enum):
    """QueuedResourceState.StateInitiator: who caused the current state."""

    USER = "USER"
    SERVICE = "SERVICE"


@dataclass(frozen=True)
class SimulatorConfig:
    """How the simulated service behaves: delays in seconds, chips on offer, injected faults."""

    accept_seconds: float = 0.0  # CREATING -> ACCEPTED; the create operation waits for it
    waiting_seconds: float = 0.2  # the least time in WAITING_FOR_RESOURCES
    provisioning_seconds: float = 0.5  # PROVISIONING -> ACTIVE
    suspending_seconds: float = 0.1  # SUSPENDING -> SUSPENDED
    deleting_seconds: float = 0.0  # DELETING -> gone; 0 lets operation.result() finish at once
    capacity: Mapping[str, int] = field(default_factory=dict)  # chips per "family@zone"; absent: unlimited
    api_error_rate: float = 0.0  # share of TPU API calls refused with an injected error
    # What the random errors pick from: HTTP statuses (400..599) or google.rpc.Code names.
    api_error_codes: tuple[int | str, ...] = (503, 429)
    seed: int = 0  # seeds the fault dice, so a failing run can be repeated
    tick_seconds: float = 0.05  # how often the server's ticker advances time
    preemption_grace_seconds: float = 30.0  # preempt: SIGTERM, then SIGKILL this much later
    delete_grace_seconds: float = 2.0  # delete or shutdown: SIGTERM, then SIGKILL this much later
    reboot_seconds: float = 0.5  # reboot: RESTARTING this long, then READY and booted again
    # maintenance: instance/maintenance-event says TERMINATE_ON_HOST_MAINTENANCE this long
    # before the hosts go down (GCE gives about 60 s), and they are down this long.
    maintenance_notice_seconds: float = 60.0
    maintenance_seconds: float = 60.0
    default_page_size: int = 0  # list calls without pageSize get pages this big; 0: all at once

    def __post_init__(self) -> None:
        for name in (
            "accept_seconds",
            "waiting_seconds",
            "provisioning_seconds",
            "suspending_seconds",
            "deleting_seconds",
            "preemption_grace_seconds",
            "delete_grace_seconds",
            "reboot_seconds",
            "maintenance_notice_seconds",
            "maintenance_seconds",
            "default_page_size",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.tick_seconds <= 0:
            raise ValueError(f"tick_seconds must be positive, got {self.tick_seconds}")
        if not 0.0 <= self.api_error_rate <= 1.0:
            raise ValueError(f"api_error_rate must be within 0..1, got {self.api_error_rate}")
        if not self.api_error_codes:
            raise ValueError("api_error_codes must name at least one HTTP status or code")
        for code in self.api_error_codes:
            Fault.parse(code)  # ValueError names what is wrong
        for pool, chips in self.capacity.items():
            family, _, zone = pool.partition("@")
            if family not in FAMILIES or not zone:
                known = ", ".join(sorted(FAMILIES))
                raise ValueError(
                    f"capacity key {pool!r} is not FAMILY@ZONE such as v4@us-central2-b (families: {known})"
                )
            if not isinstance(chips, int) or chips < 0:
                raise ValueError(f"capacity of {pool} must be a whole number of chips, got {chips!r}")

    def updated(self, changes: Mapping[str, Any]) -> SimulatorConfig:
        """A copy with JSON changes applied (the control endpoint); unknown keys are an error."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown config keys: {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        values = dict(changes)
        if "capacity" in values:
            values["capacity"] = {str(k): int(v) for k, v in dict(values["capacity"]).items()}
        for name in ("seed", "default_page_size"):
            if name in values:
                values[name] = int(values[name])
        if "api_error_codes" in values:
            codes = values["api_error_codes"]
            if isinstance(codes, (str, int)):
                codes = [codes]
            values["api_error_codes"] = tuple(error_code(c) for c in codes)
        for name in known - {"capacity", "seed", "default_page_size", "api_error_codes"}:
            if name in values:
                values[name] = float(values[name])
        return dataclasses.replace(self, **values)

    def to_json(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "capacity": dict(self.capacity),
            "api_error_codes": list(self.api_error_codes),
        }


def error_code(value: int | str) -> int | str:
    """One of `api_error_codes` as written on the command line or in JSON: digits are an HTTP
    status, anything else a google.rpc.Code name (checked by SimulatorConfig)."""
    text = str(value).strip()
    return int(text) if text.isdigit() else text.upper()


def pool_key(family: str, zone: str) -> str:
    """The capacity pool a slice draws from, as written in SimulatorConfig.capacity."""
    return f"{family}@{zone}"


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


@dataclass(frozen=True)
class SliceRequest:
    """One nodeSpec of a queued resource: which nodes it names and what they are."""

    accelerator_type: str
    runtime_version: str
    node_id: str = ""  # a single node; or the two multislice fields below
    node_id_prefix: str = ""
    node_count: int = 0
    template: Mapping[str, Any] = field(default_factory=dict)  # the node JSON, output-only fields removed

    @property
    def multislice(self) -> bool:
        return bool(self.node_id_prefix or self.node_count)

    @property
    def node_ids(self) -> tuple[str, ...]:
        """One node per slice: the node id, or PREFIX-0 .. PREFIX-(N-1) as the real API names them."""
        if self.multislice:
            return tuple(f"{self.node_id_prefix}-{i}" for i in range(self.node_count))
        return (self.node_id,)


@dataclass(frozen=True)
class QueuedResourceRequest:
    """What a caller asked for; the fields the simulator echoes back but does not act on are JSON."""

    slices: tuple[SliceRequest, ...]
    spot: bool = False
    guaranteed: Mapping[str, Any] | None = None
    reservation_name: str = ""
    queueing_policy: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class QueuedResourceRecord:
    """One queued resource as it is now. Times on the model's clock, except *create_time* (wall)."""

    project: str
    zone: str
    qr_id: str
    request: QueuedResourceRequest
    state: QrState
    initiator: Initiator
    create_time: float
    queue_number: int  # order of arrival: first come, first served
    next_at: float | None = None  # when the next timed transition is due; None: none is
    holds_capacity: bool = False
    error_code: int = 0  # failed_data.error, when FAILED
    error_message: str = ""
    create_operation: str = ""
    delete_operation: str = ""
    hosts_boot: bool = True  # False: its hosts never run the startup script (no_boot)

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}"

    @property
    def name(self) -> str:
        return f"{self.parent}/queuedResources/{self.qr_id}"

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(node_id for spec in self.request.slices for node_id in spec.node_ids)

    def demand(self) -> dict[str, int]:
        """Chips wanted from each pool: chips per slice times slices, summed over node specs."""
        wanted: dict[str, int] = {}
        for spec in self.request.slices:
            shape = parse_accelerator_type(spec.accelerator_type)
            key = pool_key(shape.family, self.zone)
            wanted[key] = wanted.get(key, 0) + shape.chips * len(spec.node_ids)
        return wanted


@dataclass(frozen=True)
class NodeRecord:
    """One TPU slice created for a queued resource; one network endpoint per worker host."""

    project: str
    zone: str
    node_id: str
    qr_id: str
    number: int  # Node.id
    accelerator_type: str
    runtime_version: str
    template: Mapping[str, Any]
    state: NodeState
    host_addresses: tuple[str, ...]
    create_time: float  # wall clock
    multislice: bool
    spot: bool
    preempted: bool = False  # what the metadata server answers for instance/preempted
    failed_workers: tuple[int, ...] = ()  # worker hosts killed by kill_host, in order
    health: str = ""  # a NODE_HEALTHS name, or "" when the API shows none
    health_description: str = ""
    maintenance_event: str = MAINTENANCE_NONE  # what instance/maintenance-event answers
    next_at: float | None = None  # when `step` is due, on the model's clock
    step: NodeStep = NodeStep.NONE
    rebooting_workers: tuple[int, ...] = ()  # hosts a reboot reset; they boot at REBOOTED
    # A node of a multislice request: its slice number, the number of slices, and the
    # address of worker 0 of slice 0 (the MEGASCALE coordinator); 0, 0, "" otherwise.
    slice_id: int = 0
    num_slices: int = 0
    coordinator_address: str = ""

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}"

    @property
    def name(self) -> str:
        return f"{self.parent}/nodes/{self.node_id}"

    @property
    def metadata(self) -> Mapping[str, str]:
        """The node's metadata as the caller set it (``startup-script`` among them)."""
        values = self.template.get("metadata") or {}
        return {str(k): str(v) for k, v in values.items()} if isinstance(values, dict) else {}

    @property
    def service_account(self) -> str:
        """The email the node's VMs run as: `serviceAccount.email` of the create request, or,
        when it names none (or "default"), the project's Compute Engine default, as GCE does."""
        account = self.template.get("serviceAccount")
        email = account.get("email") if isinstance(account, dict) else None
        if isinstance(email, str) and email.strip() and email.strip() != "default":
            return email.strip()
        return compute_default_account(self.project)

    @property
    def preemptible(self) -> bool:
        """Spot or preemptible, by the QR or by the node's scheduling config."""
        scheduling = self.template.get("schedulingConfig") or {}
        return self.spot or (
            isinstance(scheduling, dict) and bool(scheduling.get("spot") or scheduling.get("preemptible"))
        )

    @property
    def queued_resource(self) -> str:
        return f"{self.parent}/queuedResources/{self.qr_id}"


@dataclass(frozen=True)
class OperationRecord:
    """A long-running operation. Done with *result* (create), *node* (update), with nothing
    (delete) or an error."""

    project: str
    zone: str
    operation_id: str
    verb: str  # "create", "delete" or "update"
    target: str  # the queued resource's name; the node's for an update
    create_time: float  # wall clock
    end_time: float | None = None
    done: bool = False
    result: QueuedResourceRecord | None = None  # the QR when a create completed
    node: NodeRecord | None = None  # the node as an update left it
    error_code: int = 0
    error_message: str = ""

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/operations/{self.operation_id}"


T = TypeVar("T")


class _Named(Protocol):
    @property
    def name(self) -> str: ...


NamedT = TypeVar("NamedT", bound=_Named)


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list call; an empty token means there is no next page."""

    items: tuple[T, ...]
    next_page_token: str = ""


@dataclass(frozen=True)
class SimulatorState:
    """Everything the simulator holds, for the state endpoint and for tests."""

    queued_resources: tuple[QueuedResourceRecord, ...]
    nodes: tuple[NodeRecord, ...]
    operations: tuple[OperationRecord, ...]


class StateStore(Protocol):
    """Where the simulator keeps its state between runs."""

    def load(self) -> dict[str, Any] | None: ...

    def save(self, snapshot: dict[str, Any]) -> None: ...


class JsonStateFile:
    """A StateStore in one JSON file, replaced atomically so a crash never leaves half a file,
    and readable by its owner only: node metadata holds report keys, Secret Manager values."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def load(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        loaded: dict[str, Any] = json.loads(self.path.read_text(encoding="utf-8"))
        return loaded

    def save(self, snapshot: dict[str, Any]) -> None:
        partial = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(snapshot, out, indent=1, sort_keys=True)
        os.replace(partial, self.path)


class HostAction(str, Enum):
    """What happens to some worker hosts of one node (a HostEvent)."""

    RESET = "reset"  # reboot: the hosts lose power at once; nothing gets a signal first
    SHUTDOWN = "shutdown"  # maintenance: the hosts shut down (SIGTERM, then SIGKILL)
    BOOT = "boot"  # the hosts boot again from the same disk and rerun the startup script


@dataclass(frozen=True)
class HostEvent:
    """Some worker hosts of slice *slice_index* of *qr* go down or come back up."""

    qr: QueuedResourceRecord
    slice_index: int
    workers: tuple[int, ...]
    action: HostAction

    @property
    def name(self) -> str:
        return self.qr.name


Hook = Callable[[QueuedResourceRecord], None]
HostHook = Callable[[QueuedResourceRecord, int, int], None]  # (QR, slice index, worker)
HostsHook = Callable[[HostEvent], None]


class Simulator:
    """The simulated TPU service. Thread-safe: one lock guards all state.

    Hooks run outside the lock, one at a time, in the order their events happened; a call
    returns only after the hooks queued before it have run, so once a caller sees ACTIVE,
    on_active has finished. Hooks should therefore be quick (start processes, not wait on them).
    """

    def __init__(
        self,
        config: SimulatorConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        store: StateStore | None = None,
    ) -> None:
        self._config = config or SimulatorConfig()
        self._clock = clock
        self._wall_clock = wall_clock
        self._store = store
        self._lock = threading.Lock()
        self._dispatch_lock = threading.RLock()  # one dispatcher; a hook may call back in
        self._pending_hooks: list[tuple[list[Callable[..., None]], tuple[Any, ...]]] = []
        self._dice = random.Random(self._config.seed)
        self._qrs: dict[tuple[str, str, str], QueuedResourceRecord] = {}
        self._nodes: dict[tuple[str, str, str], NodeRecord] = {}
        self._operations: dict[tuple[str, str, str], OperationRecord] = {}
        self._counters = {"queue": 0, "operation": 0, "node": 0, "address": 0}
        self._dirty = False
        # Bumped and announced whenever state changes, so a held metadata request
        # (wait_for_change) wakes at once instead of polling.
        self._changed = threading.Condition(threading.Lock())
        self._generation = 0
        self.on_active: list[Hook] = []  # a QR became ACTIVE: start its workers
        self.on_stopped: list[Hook] = []  # a QR was preempted, failed or is being deleted
        self.on_host_failed: list[HostHook] = []  # kill_host: one worker host died silently
        self.on_hosts: list[HostsHook] = []  # reboot and maintenance take hosts down and up
        self._planned_faults: dict[str, list[Fault]] = {method: [] for method in FAULT_METHODS}
        self._no_boot_budget = 0  # how many of the next QRs created get hosts that never boot
        if store is not None:
            snapshot = store.load()
            if snapshot is not None:
                self._restore(snapshot)

    # -- configuration and faults ------------------------------------------------------

    @property
    def config(self) -> SimulatorConfig:
        return self._config

    def reconfigure(self, config: SimulatorConfig) -> None:
        """Apply new delays, capacity or fault settings; scheduled transitions keep their times."""
        with self._transaction() as now:
            if config.seed != self._config.seed:
                self._dice = random.Random(config.seed)
            self._config = config
            self._admit(now)

    def roll_for_fault(self, project: str = "", zone: str = "") -> None:
        """Raise a random injected error as often as api_error_rate says (the method-blind
        dice; ``next_fault`` also serves the planned ones)."""
        with self._lock:
            fault = self._roll()
        if fault is not None:
            raise fault.error(project, zone)

    def inject_errors(self, method: str, fault: Fault, count: int = 1) -> dict[str, Any]:
        """The next *count* calls of *method* (create, get, list, delete, update) answer with *fault*,
        after any planned before; returns every planned fault (``faults()``)."""
        if method not in FAULT_METHODS:
            raise SimulatorError(
                Code.INVALID_ARGUMENT,
                f"method must be one of {', '.join(FAULT_METHODS)}, got {method!r}",
            )
        if count < 1:
            raise SimulatorError(Code.INVALID_ARGUMENT, f"count must be at least 1, got {count}")
        with self._lock:
            self._planned_faults[method].extend([fault] * count)
            return self._faults_json()

    def next_fault(self, method: str | None) -> Fault | None:
        """The error a TPU API call of *method* answers with, if any: a planned one first,
        else the dice. The server calls this once per TPU API call; operations pass None."""
        with self._lock:
            planned = self._planned_faults.get(method or "")
            if planned:
                return planned.pop(0)
            return self._roll()

    def no_boot(self, count: int) -> dict[str, Any]:
        """The hosts of the next *count* queued resources created never run their startup
        script: they turn ACTIVE and READY, and nothing reports from them."""
        if count < 1:
            raise SimulatorError(Code.INVALID_ARGUMENT, f"count must be at least 1, got {count}")
        with self._lock:
            self._no_boot_budget += count
            return self._faults_json()

    def faults(self) -> dict[str, Any]:
        """The planned faults: errors per method and the no-boot budget, as JSON."""
        with self._lock:
            return self._faults_json()

    def clear_faults(self) -> dict[str, Any]:
        """Forget every planned error and the no-boot budget (random errors stay configured)."""
        with self._lock:
            for planned in self._planned_faults.values():
                planned.clear()
            self._no_boot_budget = 0
            return self._faults_json()

    def _roll(self) -> Fault | None:
        rate = self._config.api_error_rate
        if rate <= 0 or self._dice.random() >= rate:
            return None
        return Fault.parse(self._dice.choice(self._config.api_error_codes))

    def _faults_json(self) -> dict[str, Any]:
        return {
            "errors": {
                method: [fault.to_json() for fault in planned] for method, planned in self._planned_faults.items()
            },
            "noBoot": self._no_boot_budget,
        }

    # -- change notices (the metadata server's wait_for_change) ---------------------------

    def generation(self) -> int:
        """A number that grows whenever any queued resource, node or operation changes."""
        with self._changed:
            return self._generation

    def wait_for_change(self, seen: int, timeout: float) -> int:
        """Block until the generation is no longer *seen*, *timeout* passes or ``wake_waiters``
        is called; returns the generation then. Callers re-read what they watch: a wake-up
        says only that something may have changed."""
        with self._changed:
            if self._generation == seen:
                self._changed.wait(max(timeout, 0.0))
            return self._generation

    def wake_waiters(self) -> None:
        """Wake every ``wait_for_change`` (the server stopping)."""
        with self._changed:
            self._changed.notify_all()

    # -- time ----------------------------------------------------------------------------

    def advance(self) -> None:
        """Apply every transition due by now; the server's ticker calls this."""
        with self._transaction():
            pass

    @contextmanager
    def _transaction(self) -> Iterator[float]:
        """Hold the lock with the world advanced to now; then save, and run hooks outside the lock."""
        try:
            with self._lock:
                now = self._clock()
                self._advance(now)
                try:
                    yield now
                finally:
                    self._save_if_changed()
        finally:
            self._run_hooks()

    # -- queued resources ------------------------------------------------------------------

    def create_queued_resource(
        self, project: str, zone: str, qr_id: str, request: QueuedResourceRequest
    ) -> OperationRecord:
        """Queue a request for TPUs; the operation completes once the QR is ACCEPTED."""
        check_resource_id("queued resource id", qr_id)
        self._check_request(request, zone)
        with self._transaction() as now:
            name = f"projects/{project}/locations/{zone}/queuedResources/{qr_id}"
            if (project, zone, qr_id) in self._qrs:
                raise SimulatorError(Code.ALREADY_EXISTS, f"Resource '{name}' already exists")
            taken = {
                node_id
                for qr in self._qrs.values()
                if (qr.project, qr.zone) == (project, zone)
                for node_id in qr.node_ids
            }
            for node_id in (n for spec in request.slices for n in spec.node_ids):
                if node_id in taken:
                    raise SimulatorError(
                        Code.ALREADY_EXISTS,
                        f"Resource 'projects/{project}/locations/{zone}/nodes/{node_id}' already exists",
                    )
            operation = self._new_operation(project, zone, "create", name)
            hosts_boot = self._no_boot_budget == 0
            if not hosts_boot:
                self._no_boot_budget -= 1
            self._put_qr(
                QueuedResourceRecord(
                    project=project,
                    zone=zone,
                    qr_id=qr_id,
                    request=request,
                    state=QrState.CREATING,
                    initiator=Initiator.USER,
                    create_time=self._wall_clock(),
                    queue_number=self._count("queue"),
                    next_at=now + self._config.accept_seconds,
                    create_operation=operation.operation_id,
                    hosts_boot=hosts_boot,
                )
            )
            return operation

    def get_queued_resource(self, project: str, zone: str, qr_id: str) -> QueuedResourceRecord:
        with self._transaction():
            return self._find_qr(project, zone, qr_id)

    def list_queued_resources(
        self, project: str, zone: str, page_size: int = 0, page_token: str = ""
    ) -> Page[QueuedResourceRecord]:
        """Queued resources by name; zone "-" lists every zone, as the real API allows."""
        with self._transaction():
            found = [qr for qr in self._qrs.values() if _in_location(qr, project, zone)]
        return _page(found, page_size or self._config.default_page_size, page_token)

    def delete_queued_resource(self, project: str, zone: str, qr_id: str, force: bool = False) -> OperationRecord:
        """Start deleting; without force, a QR that still has nodes is refused."""
        with self._transaction() as now:
            qr = self._find_qr(project, zone, qr_id)
            if qr.state is QrState.DELETING:
                return self._operations[(project, zone, qr.delete_operation)]
            if self._nodes_of(qr) and not force:
                raise SimulatorError(
                    Code.FAILED_PRECONDITION,
                    f"Queued resource {qr.name} in state {qr.state.value} has nodes; "
                    "delete them first or set force to true",
                )
            operation = self._new_operation(project, zone, "delete", qr.name)
            for node in self._nodes_of(qr):
                self._put_node(_settled(node, state=NodeState.DELETING, health=""))
            deleting = self._put_qr(
                dataclasses.replace(
                    qr,
                    state=QrState.DELETING,
                    initiator=Initiator.USER,
                    next_at=now + self._config.deleting_seconds,
                    delete_operation=operation.operation_id,
                )
            )
            self._queue_hooks(self.on_stopped, deleting)
            self._admit(now)
            return operation

    def preempt(self, qr_id: str, *, zone: str | None = None, project: str | None = None) -> QueuedResourceRecord:
        """Take a QR's TPUs back as the service does to spot capacity: SUSPENDING, nodes PREEMPTED.

        The nodes' metadata says preempted=TRUE before on_stopped hooks run, so a worker that
        gets the SIGTERM and asks the metadata server already reads TRUE, as on GCE. The QR
        keeps its chips (they count against the quota) until it is deleted.
        """
        with self._transaction() as now:
            qr = self._resolve(qr_id, zone, project)
            if qr.state not in PREEMPTIBLE_STATES:
                raise SimulatorError(
                    Code.FAILED_PRECONDITION,
                    f"Queued resource {qr.name} is {qr.state.value}; only PROVISIONING or ACTIVE ones can be preempted",
                )
            for node in self._nodes_of(qr):
                self._put_node(_settled(node, state=NodeState.PREEMPTED, preempted=True, health=""))
            suspending = self._put_qr(
                dataclasses.replace(
                    qr,
                    state=QrState.SUSPENDING,
                    initiator=Initiator.SERVICE,
                    next_at=now + self._config.suspending_seconds,
                )
            )
            self._queue_hooks(self.on_stopped, suspending)
            self._admit(now)
            return suspending

    def kill_host(
        self,
        qr_id: str,
        slice_index: int,
        worker: int,
        *,
        zone: str | None = None,
        project: str | None = None,
    ) -> NodeRecord:
        """One worker host of an ACTIVE QR dies without notice: its node turns REPAIRING.

        The QR stays ACTIVE and the metadata says nothing; on_host_failed hooks kill the
        worker's processes. *slice_index* counts nodes in the order the node specs name them.
        """
        with self._transaction():
            qr = self._resolve(qr_id, zone, project)
            if qr.state is not QrState.ACTIVE:
                raise SimulatorError(
                    Code.FAILED_PRECONDITION,
                    f"Queued resource {qr.name} is {qr.state.value}; only an ACTIVE one has hosts to kill",
                )
            nodes = self._nodes_of(qr)
            if not 0 <= slice_index < len(nodes):
                raise SimulatorError(
                    Code.INVALID_ARGUMENT,
                    f"{qr.name} has slices 0..{len(nodes) - 1}, not {slice_index}",
                )
            node = nodes[slice_index]
            if not 0 <= worker < len(node.host_addresses):
                raise SimulatorError(
                    Code.INVALID_ARGUMENT,
                    f"node {node.node_id} has workers 0..{len(node.host_addresses) - 1}, not {worker}",
                )
            failed = tuple(sorted({*node.failed_workers, worker}))
            workers = ", ".join(str(w) for w in failed)
            repairing = dataclasses.replace(
                node,
                state=NodeState.REPAIRING,
                failed_workers=failed,
                health="UNHEALTHY_MAINTENANCE",
                health_description=(
                    f"Worker {workers} of this node failed (hardware failure simulated by "
                    "tpujobs); the node is being repaired"
                ),
            )
            self._put_node(repairing)
            self._queue_hooks(self.on_host_failed, qr, slice_index, worker)
            return repairing

    def fail(
        self,
        qr_id: str,
        message: str,
        *,
        zone: str | None = None,
        project: str | None = None,
        code: int = Code.INTERNAL.grpc_code,
    ) -> QueuedResourceRecord:
        """Give up on a live QR as the service does (say, a stockout): FAILED, its nodes removed;
        chips it held stay held (against the quota) until it is deleted."""
        with self._transaction() as now:
            qr = self._resolve(qr_id, zone, project)
            if qr.state not in LIVE_STATES:
                raise SimulatorError(
                    Code.FAILED_PRECONDITION,
                    f"Queued resource {qr.name} is {qr.state.value}; only live ones can fail",
                )
            for node in self._nodes_of(qr):
                del self._nodes[(node.project, node.zone, node.node_id)]
            failed = self._put_qr(
                dataclasses.replace(
                    qr,
                    state=QrState.FAILED,
                    initiator=Initiator.SERVICE,
                    next_at=None,
                    error_code=code,
                    error_message=message,
                )
            )
            self._finish_create(failed, error=(code, message))
            self._queue_hooks(self.on_stopped, failed)
            self._admit(now)
            return failed

    # -- faults of hosts and nodes (tpujobs dev fault) -------------------------------------

    def no_boot_queued_resource(
        self, qr_id: str, *, zone: str | None = None, project: str | None = None
    ) -> QueuedResourceRecord:
        """The hosts of a QR that has not turned ACTIVE yet will never run their startup script."""
        with self._transaction():
            qr = self._resolve(qr_id, zone, project)
            if qr.state not in LIVE_STATES - {QrState.ACTIVE}:
                raise SimulatorError(
                    Code.FAILED_PRECONDITION,
                    f"Queued resource {qr.name} is {qr.state.value}; only one that is not ACTIVE "
                    "yet can get hosts that never boot (use a count for the next ones)",
                )
            return self._put_qr(dataclasses.replace(qr, hosts_boot=False))

    def reboot(
        self,
        qr_id: str,
        slice_index: int | None = None,
        worker: int | None = None,
        *,
        zone: str | None = None,
        project: str | None = None,
    ) -> tuple[NodeRecord, ...]:
        """Reset hosts as a VM reset does: their processes die at once (on_hosts RESET), the
        node is RESTARTING for reboot_seconds, then READY and the hosts boot again from the
        same disk (on_hosts BOOT). No slice: every slice; no worker: every host of the slice."""
        with self._transaction() as now:
            qr, chosen = self._active_nodes(qr_id, slice_index, zone, project, "reboot")
            plan = [(index, node, self._workers_of(node, worker)) for index, node in chosen]
            for _, node, _ in plan:
                if node.step in (NodeStep.MAINTENANCE_STARTS, NodeStep.MAINTENANCE_ENDS):
                    raise SimulatorError(
                        Code.FAILED_PRECONDITION,
                        f"node {node.node_id} is under host maintenance; it cannot reboot now",
                    )
            changed = []
            for index, node, workers in plan:
                restarting = dataclasses.replace(
                    node,
                    state=NodeState.RESTARTING,
                    health="",
                    health_description="",
                    next_at=now + self._config.reboot_seconds,
                    step=NodeStep.REBOOTED,
                    rebooting_workers=tuple(sorted({*node.rebooting_workers, *workers})),
                )
                self._put_node(restarting)
                changed.append(restarting)
                self._queue_host_event(qr, index, workers, HostAction.RESET)
            return tuple(changed)

    def maintenance(
        self,
        qr_id: str,
        slice_index: int | None = None,
        notice_seconds: float | None = None,
        *,
        zone: str | None = None,
        project: str | None = None,
    ) -> tuple[NodeRecord, ...]:
        """Host maintenance as GCE announces it to a VM that terminates for it: the nodes'
        instance/maintenance-event turns TERMINATE_ON_HOST_MAINTENANCE now; after the notice
        (default maintenance_notice_seconds) the node is REPAIRING with health
        UNHEALTHY_MAINTENANCE and its hosts shut down (on_hosts SHUTDOWN); maintenance_seconds
        later it is READY, the event NONE, and the hosts boot again (on_hosts BOOT)."""
        notice = self._config.maintenance_notice_seconds if notice_seconds is None else notice_seconds
        if notice < 0:
            raise SimulatorError(Code.INVALID_ARGUMENT, f"the notice must not be negative, got {notice}")
        with self._transaction() as now:
            _, chosen = self._active_nodes(qr_id, slice_index, zone, project, "go into maintenance")
            for _, node in chosen:
                if node.step is not NodeStep.NONE:
                    raise SimulatorError(
                        Code.FAILED_PRECONDITION,
                        f"node {node.node_id} is already {node.state.value} "
                        f"({node.step.value}); try again when it is READY",
                    )
            changed = []
            for _, node in chosen:
                announced = dataclasses.replace(
                    node,
                    maintenance_event=MAINTENANCE_TERMINATE,
                    next_at=now + notice,
                    step=NodeStep.MAINTENANCE_STARTS,
                )
                self._put_node(announced)
                changed.append(announced)
            return tuple(changed)

    def set_node_health(
        self,
        qr_id: str,
        health: str,
        description: str = "",
        slice_index: int | None = None,
        *,
        zone: str | None = None,
        project: str | None = None,
    ) -> tuple[NodeRecord, ...]:
        """Show *health* (a Node.Health name) and *description* on a QR's nodes; nothing else
        changes: processes run on, and the next transition of the node sets its own health."""
        name = str(health).strip().upper()
        if name not in NODE_HEALTHS:
            raise SimulatorError(
                Code.INVALID_ARGUMENT,
                f"health must be one of {', '.join(NODE_HEALTHS)}, got {health!r}",
            )
        with self._transaction():
            qr = self._resolve(qr_id, zone, project)
            changed = []
            for _, node in self._chosen_nodes(qr, slice_index):
                shown = dataclasses.replace(
                    node,
                    health="" if name == "HEALTH_UNSPECIFIED" else name,
                    health_description=description,
                )
                self._put_node(shown)
                changed.append(shown)
            return tuple(changed)

    def set_node_state(
        self,
        qr_id: str,
        state: str,
        slice_index: int | None = None,
        *,
        zone: str | None = None,
        project: str | None = None,
    ) -> tuple[NodeRecord, ...]:
        """Show *state* (a Node.State name) on a QR's nodes; nothing else changes: processes
        run on, and a reboot or maintenance under way still ends as it would."""
        try:
            wanted = NodeState(str(state).strip().upper())
        except ValueError:
            names = ", ".join(member.value for member in NodeState)
            raise SimulatorError(Code.INVALID_ARGUMENT, f"state must be one of {names}, got {state!r}") from None
        with self._transaction():
            qr = self._resolve(qr_id, zone, project)
            changed = []
            for _, node in self._chosen_nodes(qr, slice_index):
                shown = dataclasses.replace(node, state=wanted)
                self._put_node(shown)
                changed.append(shown)
            return tuple(changed)

    def _active_nodes(
        self,
        qr_id: str,
        slice_index: int | None,
        zone: str | None,
        project: str | None,
        doing: str,
    ) -> tuple[QueuedResourceRecord, list[tuple[int, NodeRecord]]]:
        qr = self._resolve(qr_id, zone, project)
        if qr.state is not QrState.ACTIVE:
            raise SimulatorError(
                Code.FAILED_PRECONDITION,
                f"Queued resource {qr.name} is {qr.state.value}; only an ACTIVE one has hosts to {doing}",
            )
        return qr, self._chosen_nodes(qr, slice_index)

    def _chosen_nodes(self, qr: QueuedResourceRecord, slice_index: int | None) -> list[tuple[int, NodeRecord]]:
        """(slice index, node) of one slice, or of every slice when *slice_index* is None."""
        nodes = list(enumerate(self._nodes_of(qr)))
        if not nodes:
            raise SimulatorError(Code.FAILED_PRECONDITION, f"Queued resource {qr.name} has no nodes")
        if slice_index is None:
            return nodes
        if not 0 <= slice_index < len(nodes):
            raise SimulatorError(
                Code.INVALID_ARGUMENT,
                f"{qr.name} has slices 0..{len(nodes) - 1}, not {slice_index}",
            )
        return [nodes[slice_index]]

    @staticmethod
    def _workers_of(node: NodeRecord, worker: int | None) -> tuple[int, ...]:
        hosts = len(node.host_addresses)
        if worker is None:
            return tuple(range(hosts))
        if not 0 <= worker < hosts:
            raise SimulatorError(
                Code.INVALID_ARGUMENT,
                f"node {node.node_id} has workers 0..{hosts - 1}, not {worker}",
            )
        return (worker,)

    # -- nodes and operations -------------------------------------------------------------

    def get_node(self, project: str, zone: str, node_id: str) -> NodeRecord:
        with self._transaction():
            node = self._nodes.get((project, zone, node_id))
            if node is None:
                raise SimulatorError(
                    Code.NOT_FOUND,
                    f"Resource 'projects/{project}/locations/{zone}/nodes/{node_id}' was not found",
                )
            return node

    def update_node(
        self, project: str, zone: str, node_id: str, mask: Sequence[str], node: Mapping[str, Any]
    ) -> OperationRecord:
        """UpdateNode: the fields *mask* names (camelCase JSON paths, UPDATABLE_NODE_FIELDS) take
        *node*'s values at once; the operation is done, with the node as its response. The
        metadata server answers the new metadata from then on. A node that is not READY is
        FAILED_PRECONDITION, as the API refuses to change a node that is being created,
        repaired, preempted or deleted."""
        with self._transaction():
            found = self._nodes.get((project, zone, node_id))
            name = f"projects/{project}/locations/{zone}/nodes/{node_id}"
            template = updated_template(found.template if found else {}, mask, node)
            if found is None:
                raise SimulatorError(Code.NOT_FOUND, f"Resource '{name}' was not found")
            if found.state is not NodeState.READY:
                raise SimulatorError(
                    Code.FAILED_PRECONDITION,
                    f"Cannot update node {name}: it is {found.state.value}, and only a READY node can be updated.",
                )
            changed = dataclasses.replace(found, template=template)
            self._put_node(changed)
            operation = self._new_operation(project, zone, "update", name)
            finished = dataclasses.replace(operation, done=True, end_time=self._wall_clock(), node=changed)
            self._operations[(project, zone, operation.operation_id)] = finished
            return finished

    def list_nodes(self, project: str, zone: str, page_size: int = 0, page_token: str = "") -> Page[NodeRecord]:
        with self._transaction():
            found = [n for n in self._nodes.values() if _in_location(n, project, zone)]
        return _page(found, page_size or self._config.default_page_size, page_token)

    def nodes_of(self, qr: QueuedResourceRecord) -> tuple[NodeRecord, ...]:
        """The nodes a QR has now, in the order its node specs name them; for hooks."""
        with self._lock:
            return tuple(self._nodes_of(qr))

    def get_operation(self, project: str, zone: str, operation_id: str) -> OperationRecord:
        with self._transaction():
            operation = self._operations.get((project, zone, operation_id))
            if operation is None:
                raise SimulatorError(
                    Code.NOT_FOUND,
                    f"Resource 'projects/{project}/locations/{zone}/operations/{operation_id}' was not found",
                )
            return operation

    def list_operations(
        self, project: str, zone: str, page_size: int = 0, page_token: str = ""
    ) -> Page[OperationRecord]:
        with self._transaction():
            found = [op for op in self._operations.values() if _in_location(op, project, zone)]
        return _page(found, page_size or self._config.default_page_size, page_token)

    def state(self) -> SimulatorState:
        """Everything, sorted by name: for the state endpoint and for tests."""
        with self._transaction():
            return SimulatorState(
                queued_resources=tuple(sorted(self._qrs.values(), key=lambda r: r.name)),
                nodes=tuple(sorted(self._nodes.values(), key=lambda n: n.name)),
                operations=tuple(sorted(self._operations.values(), key=lambda o: o.name)),
            )

    # -- the state machine (callers hold the lock) ---------------------------------------

    def _advance(self, now: float) -> None:
        """Apply due transitions of QRs and nodes one at a time, earliest first, admitting
        after each."""
        while True:
            due: list[tuple[float, int, int, QueuedResourceRecord | NodeRecord]] = [
                (qr.next_at, 0, qr.queue_number, qr)
                for qr in self._qrs.values()
                if qr.next_at is not None and qr.next_at <= now
            ]
            due.extend(
                (node.next_at, 1, node.number, node)
                for node in self._nodes.values()
                if node.next_at is not None and node.next_at <= now
            )
            if not due:
                break
            at, _, _, item = min(due, key=lambda entry: entry[:3])
            if isinstance(item, QueuedResourceRecord):
                self._step(item, at)
            else:
                self._step_node(item, at)
            self._admit(at)
        self._admit(now)

    def _step(self, qr: QueuedResourceRecord, at: float) -> None:
        """The timed transition of one QR, at the time it was due."""
        if qr.state is QrState.CREATING:
            accepted = self._put_qr(dataclasses.replace(qr, state=QrState.ACCEPTED, next_at=at))
            self._finish_create(accepted)
        elif qr.state is QrState.ACCEPTED:
            self._put_qr(
                dataclasses.replace(
                    qr,
                    state=QrState.WAITING_FOR_RESOURCES,
                    next_at=at + self._config.waiting_seconds,
                )
            )
        elif qr.state is QrState.WAITING_FOR_RESOURCES:
            self._put_qr(dataclasses.replace(qr, next_at=None))  # now it waits only for chips
        elif qr.state is QrState.PROVISIONING:
            for node in self._nodes_of(qr):
                self._put_node(dataclasses.replace(node, state=NodeState.READY, health="HEALTHY"))
            active = self._put_qr(dataclasses.replace(qr, state=QrState.ACTIVE, next_at=None))
            self._queue_hooks(self.on_active, active)
        elif qr.state is QrState.SUSPENDING:
            self._put_qr(dataclasses.replace(qr, state=QrState.SUSPENDED, next_at=None))
        elif qr.state is QrState.DELETING:
            self._remove(qr)
        else:  # pragma: no cover - no other state schedules a transition
            raise AssertionError(f"{qr.name} has a timed transition in state {qr.state}")

    def _step_node(self, node: NodeRecord, at: float) -> None:
        """The timed transition of one node (reboot, maintenance), at the time it was due."""
        qr = self._qrs.get((node.project, node.zone, node.qr_id))
        nodes = self._nodes_of(qr) if qr is not None else []
        if qr is None or qr.state is not QrState.ACTIVE or node not in nodes:
            self._put_node(_settled(node))  # its QR moved on; the QR's own rules apply
            return
        index = nodes.index(node)
        every_host = tuple(range(len(node.host_addresses)))
        if node.step is NodeStep.REBOOTED:
            failed = tuple(w for w in node.failed_workers if w not in node.rebooting_workers)
            self._put_node(
                _settled(
                    node,
                    state=NodeState.REPAIRING if failed else NodeState.READY,
                    health="UNHEALTHY_MAINTENANCE" if failed else "HEALTHY",
                    health_description=node.health_description if failed else "",
                    failed_workers=failed,
                )
            )
            self._queue_host_event(qr, index, node.rebooting_workers, HostAction.BOOT)
        elif node.step is NodeStep.MAINTENANCE_STARTS:
            self._put_node(
                dataclasses.replace(
                    node,
                    state=NodeState.REPAIRING,
                    health="UNHEALTHY_MAINTENANCE",
                    health_description=(
                        "Host maintenance (simulated by tpujobs): the hosts were terminated "
                        "for it and restart when it ends"
                    ),
                    next_at=at + self._config.maintenance_seconds,
                    step=NodeStep.MAINTENANCE_ENDS,
                )
            )
            self._queue_host_event(qr, index, every_host, HostAction.SHUTDOWN)
        elif node.step is NodeStep.MAINTENANCE_ENDS:
            self._put_node(
                _settled(
                    node,
                    state=NodeState.READY,
                    health="HEALTHY",
                    health_description="",
                    maintenance_event=MAINTENANCE_NONE,
                    failed_workers=(),
                )
            )
            self._queue_host_event(qr, index, every_host, HostAction.BOOT)
        else:  # pragma: no cover - no other step schedules a transition
            raise AssertionError(f"{node.name} has a timed transition with no step")

    def _admit(self, at: float) -> None:
        """Start provisioning waiting QRs whose chips are free, strictly in order of arrival per pool."""
        waiting = sorted(
            (qr for qr in self._qrs.values() if qr.state is QrState.WAITING_FOR_RESOURCES and qr.next_at is None),
            key=lambda r: r.queue_number,
        )
        if not waiting:
            return
        free = self._free_chips()
        blocked: set[str] = set()  # pools where an earlier QR is still waiting
        for qr in waiting:
            wanted = qr.demand()
            fits = all(pool not in free or free[pool] >= chips for pool, chips in wanted.items())
            if blocked.isdisjoint(wanted) and fits:
                for pool, chips in wanted.items():
                    if pool in free:
                        free[pool] -= chips
                self._provision(qr, at)
            else:
                blocked.update(wanted)

    def _free_chips(self) -> dict[str, int]:
        free = dict(self._config.capacity)
        for qr in self._qrs.values():
            if qr.holds_capacity:
                for pool, chips in qr.demand().items():
                    if pool in free:
                        free[pool] -= chips
        return free

    def _provision(self, qr: QueuedResourceRecord, at: float) -> None:
        wall = self._wall_clock()
        for spec in qr.request.slices:
            hosts = parse_accelerator_type(spec.accelerator_type).hosts
            coordinator = ""
            for slice_id, node_id in enumerate(spec.node_ids):
                addresses = tuple(str(FIRST_WORKER_ADDRESS + self._count("address")) for _ in range(hosts))
                if spec.multislice and slice_id == 0:
                    coordinator = f"{addresses[0]}:{MEGASCALE_PORT}"
                self._put_node(
                    NodeRecord(
                        project=qr.project,
                        zone=qr.zone,
                        node_id=node_id,
                        qr_id=qr.qr_id,
                        number=FIRST_NODE_NUMBER + self._count("node"),
                        accelerator_type=spec.accelerator_type,
                        runtime_version=spec.runtime_version,
                        template=spec.template,
                        state=NodeState.CREATING,
                        host_addresses=addresses,
                        create_time=wall,
                        multislice=spec.multislice,
                        spot=qr.request.spot,
                        slice_id=slice_id if spec.multislice else 0,
                        num_slices=spec.node_count if spec.multislice else 0,
                        coordinator_address=coordinator,
                    )
                )
        self._put_qr(
            dataclasses.replace(
                qr,
                state=QrState.PROVISIONING,
                next_at=at + self._config.provisioning_seconds,
                holds_capacity=True,
            )
        )

    def _remove(self, qr: QueuedResourceRecord) -> None:
        for node in self._nodes_of(qr):
            del self._nodes[(node.project, node.zone, node.node_id)]
        del self._qrs[(qr.project, qr.zone, qr.qr_id)]
        self._dirty = True
        self._finish_create(qr, error=(Code.ABORTED.grpc_code, f"{qr.name} was deleted before it was accepted"))
        key = (qr.project, qr.zone, qr.delete_operation)
        self._operations[key] = dataclasses.replace(self._operations[key], done=True, end_time=self._wall_clock())

    def _finish_create(self, qr: QueuedResourceRecord, error: tuple[int, str] | None = None) -> None:
        """Complete the QR's create operation if it is still running: with the QR, or an error."""
        key = (qr.project, qr.zone, qr.create_operation)
        operation = self._operations.get(key)
        if operation is None or operation.done:
            return
        if error is None:
            finished = dataclasses.replace(operation, done=True, end_time=self._wall_clock(), result=qr)
        else:
            finished = dataclasses.replace(
                operation,
                done=True,
                end_time=self._wall_clock(),
                error_code=error[0],
                error_message=error[1],
            )
        self._operations[key] = finished
        self._dirty = True

    def _new_operation(self, project: str, zone: str, verb: str, target: str) -> OperationRecord:
        wall = self._wall_clock()
        operation = OperationRecord(
            project=project,
            zone=zone,
            operation_id=f"operation-{int(wall * 1000)}-{self._count('operation'):012x}",
            verb=verb,
            target=target,
            create_time=wall,
        )
        self._operations[(project, zone, operation.operation_id)] = operation
        self._dirty = True
        return operation

    def _put_qr(self, qr: QueuedResourceRecord) -> QueuedResourceRecord:
        self._qrs[(qr.project, qr.zone, qr.qr_id)] = qr
        self._dirty = True
        return qr

    def _put_node(self, node: NodeRecord) -> None:
        self._nodes[(node.project, node.zone, node.node_id)] = node
        self._dirty = True

    def _nodes_of(self, qr: QueuedResourceRecord) -> list[NodeRecord]:
        found = (self._nodes.get((qr.project, qr.zone, node_id)) for node_id in qr.node_ids)
        return [n for n in found if n is not None and n.qr_id == qr.qr_id]

    def _find_qr(self, project: str, zone: str, qr_id: str) -> QueuedResourceRecord:
        qr = self._qrs.get((project, zone, qr_id))
        if qr is None:
            raise SimulatorError(
                Code.NOT_FOUND,
                f"Resource 'projects/{project}/locations/{zone}/queuedResources/{qr_id}' was not found",
            )
        return qr

    def _resolve(self, qr_id: str, zone: str | None, project: str | None) -> QueuedResourceRecord:
        """Find a QR by id for the control calls, where zone and project may be left out."""
        matches = [
            qr
            for qr in self._qrs.values()
            if qr.qr_id == qr_id and zone in (None, qr.zone) and project in (None, qr.project)
        ]
        if not matches:
            raise SimulatorError(Code.NOT_FOUND, f"no queued resource {qr_id!r} (zone {zone}, project {project})")
        if len(matches) > 1:
            names = ", ".join(sorted(qr.name for qr in matches))
            raise SimulatorError(Code.INVALID_ARGUMENT, f"{qr_id!r} is ambiguous: {names}; name the zone and project")
        return matches[0]

    def _count(self, counter: str) -> int:
        self._counters[counter] += 1
        return self._counters[counter]

    def _check_request(self, request: QueuedResourceRequest, zone: str) -> None:
        """Refuse what the real API refuses before queueing: bad names, unknown shapes, VM
        options that do not fit (check_vm_options)."""
        if not request.slices:
            raise SimulatorError(Code.INVALID_ARGUMENT, "queued_resource.tpu.node_spec must name at least one node")
        seen: set[str] = set()
        for spec in request.slices:
            if spec.multislice == bool(spec.node_id):
                raise SimulatorError(
                    Code.INVALID_ARGUMENT,
                    "each node_spec needs exactly one of node_id or multislice_params",
                )
            if spec.multislice:
                check_resource_id("node_id_prefix", spec.node_id_prefix)
                if spec.node_count < 1:
                    raise SimulatorError(
                        Code.INVALID_ARGUMENT,
                        f"multislice_params.node_count must be at least 1, got {spec.node_count}",
                    )
            for node_id in spec.node_ids:
                check_resource_id("node id", node_id)
                if node_id in seen:
                    raise SimulatorError(Code.INVALID_ARGUMENT, f"node id {node_id!r} is named twice")
                seen.add(node_id)
            try:
                parse_accelerator_type(spec.accelerator_type)
            except UnknownAcceleratorType as exc:
                raise SimulatorError(Code.INVALID_ARGUMENT, str(exc)) from exc
            if not spec.runtime_version:
                raise SimulatorError(Code.INVALID_ARGUMENT, "node.runtime_version is required")
        for index, spec in enumerate(request.slices):
            check_vm_options(spec, zone, f"queued_resource.tpu.node_spec[{index}].node")

    # -- hooks -------------------------------------------------------------------------------

    def _queue_hooks(self, hooks: list[Hook] | list[HostHook], qr: QueuedResourceRecord, *more: int) -> None:
        if hooks:
            self._pending_hooks.append((list(hooks), (qr, *more)))

    def _queue_host_event(
        self,
        qr: QueuedResourceRecord,
        slice_index: int,
        workers: tuple[int, ...],
        action: HostAction,
    ) -> None:
        if self.on_hosts and workers:
            self._pending_hooks.append((list(self.on_hosts), (HostEvent(qr, slice_index, workers, action),)))

    def _run_hooks(self) -> None:
        """Call queued hooks outside the state lock, so a hook may call the simulator."""
        with self._dispatch_lock:
            while True:
                with self._lock:
                    if not self._pending_hooks:
                        return
                    hooks, args = self._pending_hooks.pop(0)
                for hook in hooks:
                    try:
                        hook(*args)
                    except Exception:  # a broken hook must not stop the service
                        _log.exception("simulator hook %r failed for %s", hook, args[0].name)

    # -- persistence ------------------------------------------------------------------------

    def _save_if_changed(self) -> None:
        if not self._dirty:
            return
        if self._store is not None:
            self._store.save(self._snapshot())
        self._dirty = False
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def _snapshot(self) -> dict[str, Any]:
        """All state as JSON; clock times are saved with the clock's reading to rebase on load."""
        return {
            "version": STATE_FILE_VERSION,
            "clock": self._clock(),
            "counters": dict(self._counters),
            "queued_resources": [_qr_to_json(qr) for qr in self._qrs.values()],
            "nodes": [_node_to_json(node) for node in self._nodes.values()],
            "operations": [_operation_to_json(op) for op in self._operations.values()],
        }

    def _restore(self, snapshot: Mapping[str, Any]) -> None:
        if snapshot.get("version") != STATE_FILE_VERSION:
            raise ValueError(f"state file version {snapshot.get('version')!r} is not {STATE_FILE_VERSION}")
        shift = self._clock() - float(snapshot["clock"])
        self._counters.update(snapshot["counters"])
        for data in snapshot["queued_resources"]:
            self._put_qr(_qr_from_json(data, shift))
        for data in snapshot["nodes"]:
            self._put_node(_node_from_json(data, shift))
        for data in snapshot["operations"]:
            op = _operation_from_json(data, shift)
            self._operations[(op.project, op.zone, op.operation_id)] = op
        self._dirty = False


def _settled(node: NodeRecord, **changes: Any) -> NodeRecord:
    """*node* with *changes* and no timed step left: its QR's transition overrides it."""
    return dataclasses.replace(node, next_at=None, step=NodeStep.NONE, rebooting_workers=(), **changes)


def _in_location(resource: QueuedResourceRecord | NodeRecord | OperationRecord, project: str, zone: str) -> bool:
    return resource.project == project and zone in ("-", resource.zone)


def _page(items: Iterable[NamedT], page_size: int, page_token: str) -> Page[NamedT]:
    """Pages ordered by name; the token is the last name returned, so deletions shift nothing."""
    ordered = sorted(items, key=lambda item: item.name)
    if page_size < 0:
        raise SimulatorError(Code.INVALID_ARGUMENT, f"page_size must not be negative, got {page_size}")
    if page_token:
        try:
            after = base64.b64decode(page_token, altchars=b"-_", validate=True).decode("utf-8")
            if not after.startswith("projects/"):
                raise ValueError(after)
        except (binascii.Error, UnicodeError, ValueError) as exc:
            raise SimulatorError(Code.INVALID_ARGUMENT, f"invalid page_token {page_token!r}") from exc
        ordered = [item for item in ordered if item.name > after]
    if page_size == 0 or len(ordered) <= page_size:
        return Page(tuple(ordered))
    shown = ordered[:page_size]
    token = base64.urlsafe_b64encode(shown[-1].name.encode("utf-8")).decode("ascii")
    return Page(tuple(shown), token)


# -- JSON for the state file -------------------------------------------------------------------


def _shifted(value: float | None, shift: float) -> float | None:
    return None if value is None else value + shift


def _qr_to_json(qr: QueuedResourceRecord) -> dict[str, Any]:
    data = dataclasses.asdict(qr)
    data["state"] = qr.state.value
    data["initiator"] = qr.initiator.value
    return data


def _qr_from_json(data: Mapping[str, Any], shift: float) -> QueuedResourceRecord:
    request = data["request"]
    return QueuedResourceRecord(
        **{
            **data,
            "request": QueuedResourceRequest(
                **{**request, "slices": tuple(SliceRequest(**s) for s in request["slices"])}
            ),
            "state": QrState(data["state"]),
            "initiator": Initiator(data["initiator"]),
            "next_at": _shifted(data["next_at"], shift),
        }
    )


def _node_to_json(node: NodeRecord) -> dict[str, Any]:
    data = dataclasses.asdict(node)
    data["state"] = node.state.value
    data["step"] = node.step.value
    return data


def _node_from_json(data: Mapping[str, Any], shift: float) -> NodeRecord:
    state = NodeState(data["state"])
    if "health" not in data:  # a state file from before health was kept: as it was shown
        health = {NodeState.READY: "HEALTHY", NodeState.REPAIRING: "UNHEALTHY_MAINTENANCE"}
        data = {**data, "health": health.get(state, "")}
    return NodeRecord(
        **{
            **data,
            "state": state,
            "host_addresses": tuple(data["host_addresses"]),
            "failed_workers": tuple(data.get("failed_workers", ())),
            "rebooting_workers": tuple(data.get("rebooting_workers", ())),
            "step": NodeStep(data.get("step", "")),
            "next_at": _shifted(data.get("next_at"), shift),
        }
    )


def _operation_to_json(op: OperationRecord) -> dict[str, Any]:
    data = dataclasses.asdict(op)
    data["result"] = None if op.result is None else _qr_to_json(op.result)
    data["node"] = None if op.node is None else _node_to_json(op.node)
    return data


def _operation_from_json(data: Mapping[str, Any], shift: float) -> OperationRecord:
    result, node = data["result"], data.get("node")
    return OperationRecord(
        **{
            **data,
            "result": None if result is None else _qr_from_json(result, shift),
            "node": None if node is None else _node_from_json(node, shift),
        }
    )

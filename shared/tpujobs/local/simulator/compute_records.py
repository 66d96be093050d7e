"""The simulated Compute Engine's data: workload policies, instance templates, managed instance
groups (MIGs), instances and operations, as immutable records (compute_model.py tells the rules).

A MIG's slice, or a lone TPU VM, is backed by one of the TPU model's own queued resources with one
node (``QueuedResourceRecord.backing`` names the Compute resource), so capacity, hosts, metadata
servers and identity tokens are the TPU simulator's; these records keep what Compute Engine adds.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from tpujobs.local.simulator.messages import timestamp

SELF_LINK_ROOT = "https://www.googleapis.com/compute/v1/"  # what selfLinks start with, whatever the endpoint
COMPUTE_ROOT = "/compute/v1/"
RUNTIME_VERSION = "compute-engine"  # what a backing node's runtime version says


class Phase(str, Enum):
    """What happened to one instance on its own; NONE: its status follows its slice's."""

    NONE = ""
    STOPPING = "STOPPING"  # preempted: ACPI soft-off, SIGTERM sent, the grace runs
    TERMINATED = "TERMINATED"  # stopped; deleted next when its termination action is DELETE
    DELETED = "DELETED"  # gone; a DO_NOTHING MIG still lists it, with no instance status


class Step(str, Enum):
    """What an instance's own timer (InstanceRecord.next_at) does when it is due."""

    NONE = ""
    TERMINATE = "terminate"  # the soft-off grace is over: TERMINATED
    STOP = "stop"  # instances.stop's soft-off grace is over: TERMINATED, kept whatever its termination action
    DELETE = "delete"  # a TERMINATED Spot VM with instanceTerminationAction DELETE goes away
    RUN_OUT = "run-out"  # its maxRunDuration is over: soft-off, then its instanceTerminationAction
    MAINTENANCE = "maintenance"  # host maintenance starts: soft-off, then TERMINATED for good (STOP)


class Effect(str, Enum):
    """What completing an operation does (ComputeOperation.effect)."""

    NONE = ""
    REMOVE_POLICY = "remove-policy"
    REMOVE_TEMPLATE = "remove-template"
    REMOVE_GROUP = "remove-group"
    REMOVE_INSTANCE = "remove-instance"
    CHECK_CAPACITY = "check-capacity"  # a lone VM's insert: fails if its slice found no capacity


@dataclass(frozen=True)
class PolicyRecord:
    """A regional resource policy with a workload policy (the only kind simulated)."""

    project: str
    region: str
    name: str
    number: int
    body: Mapping[str, Any]  # the caller's JSON, canonical camelCase
    create_time: float  # wall clock

    @property
    def path(self) -> str:
        return f"projects/{self.project}/regions/{self.region}/resourcePolicies/{self.name}"

    @property
    def policy_type(self) -> str:
        return str((self.body.get("workloadPolicy") or {}).get("type", ""))

    @property
    def topology(self) -> str:
        return str((self.body.get("workloadPolicy") or {}).get("acceleratorTopology", ""))


@dataclass(frozen=True)
class TemplateRecord:
    """An instance template: global (region "") or regional."""

    project: str
    region: str
    name: str
    number: int
    body: Mapping[str, Any]
    create_time: float

    @property
    def path(self) -> str:
        where = f"regions/{self.region}" if self.region else "global"
        return f"projects/{self.project}/{where}/instanceTemplates/{self.name}"

    @property
    def properties(self) -> Mapping[str, Any]:
        found = self.body.get("properties") or {}
        return found if isinstance(found, dict) else {}


@dataclass(frozen=True)
class GroupRecord:
    """A zonal MIG. Its members are InstanceRecords naming it; *backing* is the queued resource
    its slice runs on ("" while its target size is 0)."""

    project: str
    zone: str
    name: str
    number: int
    body: Mapping[str, Any]
    template: str  # the template's path
    properties: Mapping[str, Any]  # the template's properties when the group was made
    policy: str  # the workload policy's path, or ""
    target_size: int
    create_time: float
    backing: str = ""
    deleting: bool = False
    generation: int = 0  # how many slices it has had (each resize from 0 makes one)
    # Its slice's interconnect (compute_topology): when every VM ran (model clock; ACTIVATING
    # for topology_activation_seconds from then), and a state a fault forced on it with the
    # stateDetails error it shows ({"state", "code", "message", "time"}; None: none forced).
    active_at: float | None = None
    topology_fault: Mapping[str, Any] | None = None
    partial: int = 0  # hosts granted of a slice still waiting for the rest (individual mode)

    @property
    def path(self) -> str:
        return f"projects/{self.project}/zones/{self.zone}/instanceGroupManagers/{self.name}"

    @property
    def bulk(self) -> bool:
        return (self.body.get("targetSizePolicy") or {}).get("mode") == "BULK"

    @property
    def action_on_failure(self) -> str:
        return str((self.body.get("instanceLifecyclePolicy") or {}).get("defaultActionOnFailure") or "REPAIR")

    @property
    def base_instance_name(self) -> str:
        return str(self.body.get("baseInstanceName", ""))

    @property
    def paged_members(self) -> bool:
        return self.body.get("listManagedInstancesResults") == "PAGINATED"


@dataclass(frozen=True)
class InstanceRecord:
    """One VM: a lone instance (group "") or worker *worker* of a MIG's slice."""

    project: str
    zone: str
    name: str
    number: int
    body: Mapping[str, Any]  # the instance (or template properties) as asked for
    metadata: tuple[tuple[str, str], ...]  # items in order; setMetadata replaces them
    create_time: float
    backing: str  # the queued resource of its slice
    group: str = ""  # the MIG's name
    worker: int = 0
    topology: str = ""  # its slice's, as tpu-env's TOPOLOGY says
    phase: Phase = Phase.NONE
    preempted: bool = False
    next_at: float | None = None  # when `step` is due, on the model's clock
    step: Step = Step.NONE
    upcoming_maintenance: Mapping[str, Any] | None = None
    deleting: bool = False  # an instances.delete is under way
    terminates_at: float | None = None  # wall clock: its maxRunDuration's end (terminationTimestamp)

    @property
    def path(self) -> str:
        return f"projects/{self.project}/zones/{self.zone}/instances/{self.name}"

    @property
    def scheduling(self) -> Mapping[str, Any]:
        found = self.body.get("scheduling") or {}
        return found if isinstance(found, dict) else {}

    @property
    def spot(self) -> bool:
        return self.scheduling.get("provisioningModel") == "SPOT" or bool(self.scheduling.get("preemptible"))

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.metadata)


@dataclass(frozen=True)
class ComputeOperation:
    """A compute#operation: PENDING when made, RUNNING a moment later, DONE at *due_at*."""

    project: str
    scope: str  # "zones/Z", "regions/R" or "global"
    name: str
    number: int
    operation_type: str
    target: str  # the target's path
    target_number: int
    insert_time: float  # wall clock
    start_at: float  # model clock: RUNNING from here
    due_at: float  # model clock: DONE from here
    effect: Effect = Effect.NONE
    done: bool = False
    end_time: float | None = None  # wall clock
    errors: tuple[tuple[str, str], ...] = ()  # (code, message)
    http_status: int = 0
    http_message: str = ""

    @property
    def path(self) -> str:
        return f"projects/{self.project}/{self.scope}/operations/{self.name}"


@dataclass
class ComputeTables:
    """Every Compute Engine record, keyed by (project, location, name); guarded by the world's lock."""

    policies: dict[tuple[str, str, str], PolicyRecord] = field(default_factory=dict)
    templates: dict[tuple[str, str, str], TemplateRecord] = field(default_factory=dict)  # region "" is global
    groups: dict[tuple[str, str, str], GroupRecord] = field(default_factory=dict)
    instances: dict[tuple[str, str, str], InstanceRecord] = field(default_factory=dict)
    operations: dict[tuple[str, str, str], ComputeOperation] = field(default_factory=dict)  # (project, scope, name)

    def to_json(self) -> dict[str, Any]:
        def rows(table: Mapping[Any, Any]) -> list[dict[str, Any]]:
            return [dataclasses.asdict(record) for record in table.values()]

        return {
            "policies": rows(self.policies),
            "templates": rows(self.templates),
            "groups": rows(self.groups),
            "instances": rows(self.instances),
            "operations": rows(self.operations),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None, shift: float) -> ComputeTables:
        """Tables from `to_json`; model-clock times move by *shift*, as the TPU records' do."""
        tables = cls()
        if not data:
            return tables
        for row in data.get("policies", []):
            policy = PolicyRecord(**row)
            tables.policies[(policy.project, policy.region, policy.name)] = policy
        for row in data.get("templates", []):
            template = TemplateRecord(**row)
            tables.templates[(template.project, template.region, template.name)] = template
        for row in data.get("groups", []):
            active_at = row.get("active_at")
            group = GroupRecord(**{**row, "active_at": None if active_at is None else active_at + shift})
            tables.groups[(group.project, group.zone, group.name)] = group
        for row in data.get("instances", []):
            instance = InstanceRecord(
                **{
                    **row,
                    "metadata": tuple((str(k), str(v)) for k, v in row["metadata"]),
                    "phase": Phase(row["phase"]),
                    "step": Step(row["step"]),
                    "next_at": None if row["next_at"] is None else row["next_at"] + shift,
                }
            )
            tables.instances[(instance.project, instance.zone, instance.name)] = instance
        for row in data.get("operations", []):
            operation = ComputeOperation(
                **{
                    **row,
                    "effect": Effect(row["effect"]),
                    "errors": tuple((str(c), str(m)) for c, m in row["errors"]),
                    "start_at": row["start_at"] + shift,
                    "due_at": row["due_at"] + shift,
                }
            )
            tables.operations[(operation.project, operation.scope, operation.name)] = operation
        return tables


def fingerprint(items: tuple[tuple[str, str], ...]) -> str:
    """A metadata fingerprint: a hash of the items, base64 as Compute Engine's look."""
    digest = hashlib.sha256(repr(items).encode("utf-8")).digest()[:8]
    return base64.urlsafe_b64encode(digest).decode("ascii")


def predicted_member_names(base: str, group: str, size: int) -> tuple[str, ...]:
    """The names of a MIG's workers 0..size-1: `{base}-{4 lowercase letters}`, the same for the
    same (group, worker), so a test can predict them; a clash takes the next draw."""
    names: list[str] = []
    for worker in range(size):
        attempt = 0
        while True:
            digest = hashlib.sha256(f"{group}/{worker}/{attempt}".encode()).digest()
            name = f"{base}-" + "".join("abcdefghijklmnopqrstuvwxyz"[b % 26] for b in digest[:4])
            if name not in names:
                names.append(name)
                break
            attempt += 1
    return tuple(names)


def self_link(path: str) -> str:
    return SELF_LINK_ROOT + path


def rfc3339(wall: float) -> str:
    """Compute Engine's timestamps: RFC 3339 (it writes a zone offset; UTC here)."""
    return timestamp(wall)


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]

"""The simulated TPU service's data: states, configuration and the immutable records of
queued resources, nodes and operations, as the model keeps them (model.py tells the rules)."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any, Generic, Protocol, TypeVar

from tpujobs.domain.accelerators import FAMILIES, parse_accelerator_type
from tpujobs.domain.quotas import PoolKey, QuotaBook, pool_key
from tpujobs.local.simulator.errors import Fault, project_number

FIRST_WORKER_ADDRESS = ipaddress.IPv4Address("127.1.0.0")  # loopback: workers can bind it
WORKER_PORT = 8470
MEGASCALE_PORT = 8080  # where a multislice's coordinator listens, as tpu-env names it
FIRST_NODE_NUMBER = 1_000_000_000_000_000_000  # node ids look like the real 19-digit ones


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
    # A Compute Engine slice's interconnect is ACTIVATING this long after its VMs all run, then
    # ACTIVE (status.appliedAcceleratorTopologies; compute_topology.py)
    topology_activation_seconds: float = 0.3
    suspending_seconds: float = 0.1  # SUSPENDING -> SUSPENDED
    deleting_seconds: float = 0.0  # DELETING -> gone; 0 lets operation.result() finish at once
    # The zone's chips on offer per "family@zone"; absent: unlimited. "family@zone:spot", when
    # named, is Spot capacity of its own; otherwise Spot slices share "family@zone".
    capacity: Mapping[str, int] = field(default_factory=dict)
    # The project's quota: a `config/quotas` document (domain/quotas.py), counted as admission
    # counts it: per family and tier, zonal or regional, a named reservation by its size.
    # Compute Engine shows QUOTA_EXCEEDED when it, not capacity, holds a slice back; none: unlimited.
    quota: Mapping[str, Any] = field(default_factory=dict)
    compute_operation_seconds: float = 0.2  # a Compute Engine operation is PENDING/RUNNING this long
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
    # UpdateNode's operation runs this long (another update of the node meanwhile is 409 ABORTED),
    # and the hosts' metadata servers answer the new metadata this much later still.
    update_node_seconds: float = 0.1
    metadata_propagation_seconds: float = 0.05
    # A VM's maxRunDuration counts this much of itself (terminationTimestamp = RUNNING + duration x
    # scale): Google's floor is 10 minutes, so tests shorten it; Google's own is 1
    run_duration_scale: float = 1.0

    def __post_init__(self) -> None:
        for name in (
            "accept_seconds",
            "waiting_seconds",
            "provisioning_seconds",
            "topology_activation_seconds",
            "suspending_seconds",
            "deleting_seconds",
            "preemption_grace_seconds",
            "delete_grace_seconds",
            "reboot_seconds",
            "maintenance_notice_seconds",
            "maintenance_seconds",
            "default_page_size",
            "compute_operation_seconds",
            "update_node_seconds",
            "metadata_propagation_seconds",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.run_duration_scale <= 0:
            raise ValueError(f"run_duration_scale must be positive, got {self.run_duration_scale}")
        if self.tick_seconds <= 0:
            raise ValueError(f"tick_seconds must be positive, got {self.tick_seconds}")
        if not 0.0 <= self.api_error_rate <= 1.0:
            raise ValueError(f"api_error_rate must be within 0..1, got {self.api_error_rate}")
        if not self.api_error_codes:
            raise ValueError("api_error_codes must name at least one HTTP status or code")
        for code in self.api_error_codes:
            Fault.parse(code)  # ValueError names what is wrong
        for pool, chips in self.capacity.items():
            family, _, zone = pool.removesuffix(SPOT_POOL_SUFFIX).partition("@")
            if family not in FAMILIES or not zone:
                known = ", ".join(sorted(FAMILIES))
                raise ValueError(
                    f"capacity key {pool!r} is not FAMILY@ZONE[:spot] such as v4@us-central2-b (families: {known})"
                )
            if not isinstance(chips, int) or chips < 0:
                raise ValueError(f"capacity of {pool} must be a whole number of chips, got {chips!r}")
        if not isinstance(self.quota, Mapping):
            raise ValueError(f"quota must be a config/quotas document (a JSON object), got {self.quota!r}")
        if self.quota_book.problems:  # Firestore skips these; a simulator told them is told wrong
            raise ValueError("quota: " + "; ".join(self.quota_book.problems))

    @cached_property
    def quota_book(self) -> QuotaBook:
        """`quota` read as admission reads `config/quotas`."""
        return QuotaBook(self.quota)

    def updated(self, changes: Mapping[str, Any]) -> SimulatorConfig:
        """A copy with JSON changes applied (the control endpoint); unknown keys are an error."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown config keys: {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        values = dict(changes)
        if "capacity" in values:
            values["capacity"] = {str(k): int(v) for k, v in dict(values["capacity"]).items()}
        if "quota" in values:
            values["quota"] = _document(values["quota"])
        for name in ("seed", "default_page_size"):
            if name in values:
                values[name] = int(values[name])
        if "api_error_codes" in values:
            codes = values["api_error_codes"]
            if isinstance(codes, (str, int)):
                codes = [codes]
            values["api_error_codes"] = tuple(error_code(c) for c in codes)
        for name in known - {"capacity", "quota", "seed", "default_page_size", "api_error_codes"}:
            if name in values:
                values[name] = float(values[name])
        return dataclasses.replace(self, **values)

    def to_json(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "capacity": dict(self.capacity),
            "quota": _document(self.quota),
            "api_error_codes": list(self.api_error_codes),
        }


def _document(value: Any) -> Any:
    """A JSON document, copied (a mapping's nested maps included), so no caller shares it."""
    return json.loads(json.dumps(value)) if isinstance(value, Mapping) else value


def error_code(value: int | str) -> int | str:
    """One of `api_error_codes` as written on the command line or in JSON: digits are an HTTP
    status, anything else a google.rpc.Code name (checked by SimulatorConfig)."""
    text = str(value).strip()
    return int(text) if text.isdigit() else text.upper()


SPOT_POOL_SUFFIX = ":spot"


def backs_compute(qr_id: str) -> bool:
    """Whether a queued resource (or its node) stands for a Compute Engine MIG or VM: their ids
    hold a dot (`mig.NAME.N`, `vm.NAME.N`), which no TPU API id may."""
    return "." in qr_id


def capacity_pool(family: str, zone: str, spot: bool = False, separate: Collection[str] = ()) -> str:
    """The capacity pool a slice draws from, as written in SimulatorConfig.capacity: Spot slices
    draw from "family@zone:spot" when that pool is *separate* (configured), else share it."""
    key = f"{family}@{zone}"
    return key + SPOT_POOL_SUFFIX if spot and key + SPOT_POOL_SUFFIX in separate else key


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
    flex_start: bool = False  # a Compute Engine FLEX_START slice (the TPU API's requests are never)
    reserved: bool = False  # a Compute Engine slice bound to a reservation (RESERVATION_BOUND)

    @property
    def capacity(self) -> str:
        """The capacity kind it draws on, as `domain.quotas.TIER_OF_CAPACITY` names them: spot when
        it or its nodes' schedulingConfig ask it (or preemptible), reserved when it is guaranteed,
        names a reservation or its nodes ask `schedulingConfig.reserved`."""
        if self.spot or self._nodes_ask("spot") or self._nodes_ask("preemptible"):
            return "spot"
        if self.flex_start:
            return "flex-start"
        if self.reserved or self.guaranteed is not None or self.reservation_name or self._nodes_ask("reserved"):
            return "reserved"
        return "on-demand"

    def _nodes_ask(self, flag: str) -> bool:
        return any(
            isinstance(s.template.get("schedulingConfig"), Mapping) and bool(s.template["schedulingConfig"].get(flag))
            for s in self.slices
        )

    @property
    def reservation(self) -> str:
        """The reservation's short name (`projects/P/locations/Z/reservations/NAME` -> NAME)."""
        return self.reservation_name.rstrip("/").rsplit("/", 1)[-1]


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
    backing: str = ""  # the Compute Engine MIG or instance (path) it stands for; "" for the TPU API's own

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}"

    @property
    def name(self) -> str:
        return f"{self.parent}/queuedResources/{self.qr_id}"

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(node_id for spec in self.request.slices for node_id in spec.node_ids)

    def demand(self, separate: Collection[str] = ()) -> dict[str, int]:
        """Chips wanted from each capacity pool: chips per slice times slices, summed over node
        specs; *separate*: the configured pools (a Spot pool of its own, capacity_pool)."""
        wanted: dict[str, int] = {}
        for spec in self.request.slices:
            shape = parse_accelerator_type(spec.accelerator_type)
            key = capacity_pool(shape.family, self.zone, self.request.spot, separate)
            wanted[key] = wanted.get(key, 0) + shape.chips * len(spec.node_ids)
        return wanted

    def quota_demand(self) -> dict[PoolKey, int]:
        """Chips counted in each quota pool (domain.quotas.pool_key), as admission counts a job's."""
        wanted: dict[PoolKey, int] = {}
        for spec in self.request.slices:
            shape = parse_accelerator_type(spec.accelerator_type)
            key = pool_key(shape.family, self.request.capacity, self.zone, self.request.reservation)
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
    # Google's advance notice of a maintenance window, as the API's Node.upcomingMaintenance
    # shows it (camelCase JSON); None when none is scheduled. Its window starts at `next_at`
    # (step MAINTENANCE_STARTS) and it is cleared when the maintenance ends.
    upcoming_maintenance: Mapping[str, Any] | None = None
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


class HostAction(str, Enum):
    """What happens to some worker hosts of one node (a HostEvent)."""

    RESET = "reset"  # reboot: the hosts lose power at once; nothing gets a signal first
    SHUTDOWN = "shutdown"  # maintenance: the hosts shut down (SIGTERM, then SIGKILL)
    BOOT = "boot"  # the hosts boot again from the same disk and rerun the startup script
    PREEMPT = "preempt"  # Compute Engine preempts these VMs: SIGTERM, SIGKILL after the preemption grace
    DELETE = "delete"  # Compute Engine deletes these VMs: SIGTERM, SIGKILL after the delete grace


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


def settled(node: NodeRecord, **changes: Any) -> NodeRecord:
    """*node* with *changes* and no timed step left: its QR's transition overrides it."""
    return dataclasses.replace(node, next_at=None, step=NodeStep.NONE, rebooting_workers=(), **changes)

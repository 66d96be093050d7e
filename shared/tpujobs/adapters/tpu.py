"""Cloud TPU queued resources through the real google-cloud-tpu (v2) client.

Locally the same client talks REST to the simulator (`TPUJOBS_TPU_ENDPOINT`). Names are
deterministic, so ALREADY_EXISTS on create means an earlier delivery already asked for
this attempt (or this warm-pool unit's generation): the resource is adopted, never bought
twice, once its labels show that tpujobs made it for that holding. Labels name the job and
attempt, or the pool and unit: they are tpujobs' ownership marker (`domain.ownership`), so a
queued resource or node named like a holding without them is someone else's, and is never
adopted (NotOurs), written into (NotOurs) or deleted (left alone, logged). A warm-pool unit's
agents get their assignments through their nodes' metadata: `tell_hosts` merges tpujobs'
keys into what each node has (others, such as gcloud's `ssh-keys`, write the same map) with
UpdateNode.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Literal

from google.api_core import exceptions as api_exceptions
from google.api_core.future import polling
from google.api_core.retry import Retry
from google.rpc import code_pb2

from tpujobs.adapters.google_errors import is_retryable, transient_retry, translated
from tpujobs.adapters.tpu_maintenance import NodeMaintenance
from tpujobs.domain import naming, ownership
from tpujobs.domain.accelerators import FAMILIES, parse_accelerator_type
from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.job import Job
from tpujobs.domain.spec import JobSpec
from tpujobs.engine.errors import NotOurs, PermanentError, QuotaExhausted, TransientError
from tpujobs.engine.ports import CapacityStatus, HostBoot, UnitRequest

if TYPE_CHECKING:
    from google.api_core.operation import Operation
    from google.cloud import tpu_v2
    from google.longrunning import operations_pb2

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 30.0  # the client has no default: a hung call must not hold a function forever
SERVICE = "TPU API"  # how errors name the service: "TPU API failed to ..."
# UpdateNode answers 409 (ABORTED) while another update of the node is in flight (gcloud's ssh
# says so): read again, merge again, write again, this often, backing off from this delay.
METADATA_TRIES = 4
METADATA_BACKOFF_S = 0.5
# How long in all tell_hosts follows its updates: a handler must not wait out each slice's
# operation (tens of seconds); one still running is confirmed by the next tell.
METADATA_FOLLOW_S = 4.0
# The client polls an operation first after 1 s, then less often: too slow to follow for 4 s.
METADATA_POLLING = polling.DEFAULT_POLLING.with_delay(initial=0.2, maximum=1.0, multiplier=1.5)


def build_client(endpoint: str = "") -> tpu_v2.TpuClient:
    """The TPU client: REST against `endpoint` when given (the simulator), else the real API."""
    from google.cloud import tpu_v2

    if not endpoint:
        return tpu_v2.TpuClient()
    from google.auth.credentials import AnonymousCredentials

    return tpu_v2.TpuClient(
        transport="rest",
        client_options={"api_endpoint": endpoint},
        credentials=AnonymousCredentials(),
    )


def job_labels(job: Job) -> dict[str, str]:
    """The user's labels plus ours, so a resource can always be traced back to its job."""
    return {**job.spec.labels, "tpujobs-job": job.job_id, "tpujobs-attempt": str(job.attempt)}


# The VM account's IAM roles are what limit it; the scope only has to let them through.
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


def queued_resource_for(job: Job, project: str, boot: HostBoot) -> tpu_v2.QueuedResource:
    """The QueuedResource of the job's current attempt (`_queued_resource`), labelled with
    the job and attempt, in the capacity the attempt asks for (a fallback may switch it)."""
    return _queued_resource(job.spec, job.queued_resource, job.zone, job.capacity, job_labels(job), project, boot)


def unit_queued_resource(unit: UnitRequest, project: str, boot: HostBoot) -> tpu_v2.QueuedResource:
    """The QueuedResource of one warm-pool unit (`_queued_resource`): the pool's shape, labelled
    with the pool and unit only (no `tpujobs-job`: no job owns it)."""
    return _queued_resource(unit.spec, unit.name, unit.zone, unit.spec.capacity, dict(unit.labels), project, boot)


def _queued_resource(
    spec: JobSpec,
    name: str,
    zone: str,
    capacity: str,
    labels: Mapping[str, str],
    project: str,
    boot: HostBoot,
) -> tpu_v2.QueuedResource:
    """The QueuedResource `name` in `zone`: tier, slices, labels, the VM options (network, tags,
    data disks, topology) and the boot of its TPU VMs: their metadata and their own account.
    Without one they would run as the Compute default account, which has project Editor: that
    is refused, never requested."""
    from google.cloud import tpu_v2

    if not boot.service_account:
        raise PermanentError(
            "no service account for the TPU VMs: set TPUJOBS_TPU_SERVICE_ACCOUNT (infra/ does); "
            "tpujobs never lets them fall back to the Compute default account"
        )
    node = tpu_v2.Node(
        runtime_version=spec.runtime_version,
        labels=dict(labels),
        metadata=dict(boot.metadata),
        # `reserved`: any matching reservation of the project (gcloud's --reserved); with a
        # named one, reservation_name below says which.
        scheduling_config=tpu_v2.SchedulingConfig(spot=capacity == "spot", reserved=capacity == "reserved"),
        service_account=tpu_v2.ServiceAccount(email=boot.service_account, scope=[CLOUD_PLATFORM_SCOPE]),
        tags=list(spec.tags),
        data_disks=[
            tpu_v2.AttachedDisk(source_disk=disk.source_disk, mode=_DISK_MODES[disk.mode]) for disk in spec.data_disks
        ],
    )
    if spec.topology:  # one or the other, as gcloud's --accelerator-type | --type --topology
        family = parse_accelerator_type(spec.accelerator_type).family
        node.accelerator_config = tpu_v2.AcceleratorConfig(type_=FAMILIES[family].config_type, topology=spec.topology)
    else:
        node.accelerator_type = spec.accelerator_type
    if spec.network or spec.subnetwork or spec.internal_ips:
        # enable_external_ips is a plain bool: a NetworkConfig sent without it means no external
        # IPs, so it is always set; without any network option none is sent (the API's default).
        node.network_config = tpu_v2.NetworkConfig(
            network=spec.network or "", subnetwork=spec.subnetwork or "", enable_external_ips=not spec.internal_ips
        )
    node_spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=f"projects/{project}/locations/{zone}", node=node)
    if spec.slices == 1:
        node_spec.node_id = name
    else:  # nodes {name}-0 .. {name}-(N-1), as naming.node_id says
        node_spec.multislice_params = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(
            node_count=spec.slices, node_id_prefix=name
        )
    resource = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[node_spec]))
    if capacity == "spot":
        resource.spot = tpu_v2.QueuedResource.Spot()
    elif capacity == "reserved":
        # Reserved capacity is the guaranteed tier (v2alpha1 said it as guaranteed.reserved;
        # v2 moved `reserved` to the node's SchedulingConfig, set above).
        resource.guaranteed = tpu_v2.QueuedResource.Guaranteed()
        if spec.reservation:
            resource.reservation_name = _reservation_path(spec.reservation, project, zone)
    return resource


# The spec's disk modes as AttachedDisk.DiskMode names them.
_DISK_MODES = {"read-only": "READ_ONLY", "read-write": "READ_WRITE"}


def _reservation_path(reservation: str, project: str, zone: str) -> str:
    """A short reservation name becomes the full path the API wants; full paths pass through."""
    if reservation.startswith("projects/"):
        return reservation
    return f"projects/{project}/locations/{zone}/reservations/{reservation}"


class CloudTpu:
    """The Capacity port (`engine.ports.Capacity`) on a `tpu_v2.TpuClient`: each holding is a
    queued resource, named as the engine names it."""

    def __init__(
        self,
        client: tpu_v2.TpuClient,
        project: str,
        *,
        retry: Retry | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        maintenance: NodeMaintenance | None = None,
    ) -> None:
        """`retry` wraps every call (the client retries nothing by itself): by default
        `google_errors.transient_retry()`, whose predicate is the one error table. `sleep` and
        `clock` time the metadata writes' backoff and follow-up. `maintenance` reads the nodes'
        announced maintenance (by default through v2alpha1 beside `client`, made at first use)."""
        self._client = client
        self._maintenance = maintenance
        self._project = project
        self._retry = retry or transient_retry()
        # An update refused for a concurrent one must not be sent again as it was: its map was
        # merged from a read that the other update makes stale (tell_hosts reads again).
        self._update_retry = self._retry.with_predicate(lambda error: is_retryable(error) and not _conflict(error))
        self._sleep = sleep
        self._clock = clock

    def _parent(self, zone: str) -> str:
        return f"projects/{self._project}/locations/{zone}"

    def request(self, job: Job, boot: HostBoot) -> CapacityStatus:
        """Create the attempt's queued resource, or adopt it; read what the create's operation
        said. A create refused for TPU quota raises QuotaExhausted (a TransientError) whose words
        are Google's own, for the job's reason."""
        return self._create(job.zone, job.queued_resource, queued_resource_for(job, self._project, boot))

    def request_unit(self, unit: UnitRequest, boot: HostBoot) -> CapacityStatus:
        """Create a warm-pool unit's queued resource, or adopt it, exactly as `request` does."""
        return self._create(unit.zone, unit.name, unit_queued_resource(unit, self._project, boot))

    def _create(self, zone: str, name: str, resource: tpu_v2.QueuedResource) -> CapacityStatus:
        """Create the queued resource `name`, or adopt it when it already exists."""
        try:
            with _translated(f"request queued resource {name}"):
                created = self._client.create_queued_resource(
                    parent=self._parent(zone),
                    queued_resource=resource,
                    queued_resource_id=name,
                    retry=self._retry,
                    timeout=CALL_TIMEOUT_S,
                )
        except QuotaExhausted as error:
            raise QuotaExhausted(_google_said(error.__cause__) or str(error), error.region) from error
        except PermanentError as error:
            # REST maps ALREADY_EXISTS (and ABORTED) to a bare 409 Conflict: look before adopting.
            if not isinstance(error.__cause__, api_exceptions.Conflict):
                raise
            existing = self._get(zone, name)
            if existing is None:
                raise TransientError(f"{error}; no such resource exists, so retry") from error
            if not _marked(existing, name):
                raise _not_ours(f"the existing queued resource {name}", name) from error
            return _status(existing, zone)
        # Create answers with a long-running operation (done once the resource is ACCEPTED); the
        # resource's own state is what we mirror, and the operation's name is kept, so a create
        # that fails later can say why (`create_error`).
        operation = created.operation
        status = self.status(zone, name)
        if status is None and operation.done and operation.HasField("error"):
            said = _operation_error(operation)
            return CapacityStatus(name, zone, HoldingState.FAILED, said, operation=operation.name)
        status = status or CapacityStatus(name, zone, QUEUED_RESOURCE_STATES["CREATING"])
        return dataclasses.replace(status, operation=operation.name)

    def tell_hosts(self, zone: str, name: str, slices: int, metadata: Mapping[str, str]) -> None:
        """Set tpujobs' keys (those of `metadata`) on every node of the queued resource `name`,
        keeping every other key (gcloud's `ssh-keys` above all): read the node, merge, UpdateNode
        with mask `metadata` (which replaces the map). Returns once every node has them. An
        update still running after METADATA_FOLLOW_S, or refused as concurrent METADATA_TRIES
        times, raises TransientError: not confirmed, so told again later. A node that does not
        exist or is not READY raises PermanentError with Google's words; one without tpujobs'
        marker of the holding (its labels, its queued resource) raises NotOurs, never written."""
        started: list[tuple[str, Operation]] = []
        for index in range(slices):
            node_id = naming.node_id(name, index, slices)
            operation = self._merge_metadata(zone, name, node_id, metadata)
            if operation is not None:
                started.append((node_id, operation))
        deadline = self._clock() + METADATA_FOLLOW_S
        running = []
        for node_id, operation in started:
            with _translated(f"write the metadata of node {node_id}"):
                try:
                    left = max(0.1, deadline - self._clock())
                    operation.result(timeout=left, retry=self._retry, polling=METADATA_POLLING.with_timeout(left))
                except futures.TimeoutError:  # still running: fine, not confirmed
                    running.append(node_id)
        if running:
            raise TransientError(
                f"{SERVICE}: the metadata update of node {', '.join(running)} is still running; not confirmed yet"
            )

    def _merge_metadata(self, zone: str, holding: str, node_id: str, metadata: Mapping[str, str]) -> Operation | None:
        """Start the update that merges `metadata` into the node's own; None when it has them.
        Each read checks the node is the holding's (NotOurs else) before anything is written."""
        from google.cloud import tpu_v2
        from google.protobuf import field_mask_pb2

        node = f"{self._parent(zone)}/nodes/{node_id}"
        doing = f"write the metadata of node {node_id}"
        for attempt in range(METADATA_TRIES):
            if attempt:
                self._sleep(METADATA_BACKOFF_S * 2 ** (attempt - 1))
            with _translated(doing):
                found = self._client.get_node(name=node, retry=self._retry, timeout=CALL_TIMEOUT_S)
            if not _node_marked(found, holding):
                raise _not_ours(f"node {node_id}", holding)
            current = dict(found.metadata)
            if all(current.get(key) == value for key, value in metadata.items()):
                return None
            try:
                with _translated(doing):
                    return self._client.update_node(
                        node=tpu_v2.Node(name=node, metadata={**current, **metadata}),
                        update_mask=field_mask_pb2.FieldMask(paths=["metadata"]),
                        retry=self._update_retry,
                        timeout=CALL_TIMEOUT_S,
                    )
            except (TransientError, PermanentError) as error:
                if not _conflict(error.__cause__):
                    raise
        raise TransientError(
            f"{SERVICE}: node {node_id} had another update in flight at each of {METADATA_TRIES} writes"
        )

    def status(self, zone: str, name: str) -> CapacityStatus | None:
        resource = self._get(zone, name)
        return None if resource is None else _status(resource, zone)

    def _get(self, zone: str, name: str) -> tpu_v2.QueuedResource | None:
        """The queued resource `name` as read; None when it does not exist."""
        try:
            with _translated(f"read queued resource {name}"):
                return self._client.get_queued_resource(
                    name=f"{self._parent(zone)}/queuedResources/{name}", retry=self._retry, timeout=CALL_TIMEOUT_S
                )
        except PermanentError as error:
            if isinstance(error.__cause__, api_exceptions.NotFound):
                return None
            raise

    def create_error(self, operation: str) -> str | None:
        if not operation:
            return None
        try:
            with _translated(f"read operation {operation}"):
                found = self._client.get_operation(
                    request={"name": operation}, retry=self._retry, timeout=CALL_TIMEOUT_S
                )
        except PermanentError as error:
            if isinstance(error.__cause__, api_exceptions.NotFound):
                return None  # operations are kept for a while only
            raise
        return _operation_error(found) if found.done and found.HasField("error") else None

    def release(self, zone: str, name: str) -> None:
        """Delete the queued resource (forced: its nodes too) once read and found marked as
        tpujobs' for this holding; absent is fine. One without the marker is someone else's:
        left alone, logged (tpujobs holds nothing of that name to give back)."""
        existing = self._get(zone, name)
        if existing is None:
            return
        if not _marked(existing, name):
            log.warning("%s: %s", SERVICE, ownership.refusal(f"queued resource {name} in {zone}", name))
            return
        try:
            with _translated(f"delete queued resource {name}"):
                self._client.delete_queued_resource(
                    request={"name": f"{self._parent(zone)}/queuedResources/{name}", "force": True},
                    retry=self._retry,
                    timeout=CALL_TIMEOUT_S,
                )
        except PermanentError as error:
            if not isinstance(error.__cause__, api_exceptions.NotFound):
                raise

    def list_capacity(self, zone: str) -> Sequence[CapacityStatus]:
        """Every queued resource of the zone with the health of its nodes: two list calls, and a
        third (v2alpha1's nodes, `tpu_maintenance`) for the maintenance announced on the nodes of
        ACTIVE ones, when there are any."""
        parent = self._parent(zone)
        with _translated(f"list queued resources in {zone}"):
            resources = list(
                self._client.list_queued_resources(
                    parent=parent,
                    retry=self._retry,
                    timeout=CALL_TIMEOUT_S,
                    metadata=[("x-goog-fieldmask", QUEUED_RESOURCE_FIELDS)],
                )
            )
            nodes = list(
                self._client.list_nodes(
                    parent=parent,
                    retry=self._retry,
                    timeout=CALL_TIMEOUT_S,
                    metadata=[("x-goog-fieldmask", NODE_FIELDS)],
                )
            )
        lost: dict[str, int] = {}
        suspect: dict[str, list[tuple[str, str]]] = {}
        for node in nodes:
            verdict, condition = host_verdict(node.state.name, node.health.name)
            owner = node.queued_resource.rsplit("/", 1)[-1]
            if verdict == "lost":
                lost[owner] = lost.get(owner, 0) + max(1, len(node.network_endpoints))
            elif verdict == "suspect":
                suspect.setdefault(owner, []).append((node.name.rsplit("/", 1)[-1], condition))
        statuses = []
        for resource in resources:
            status = _status(resource, zone, lost.get(resource.name.rsplit("/", 1)[-1], 0))
            hosts = tuple(sorted(suspect.get(status.name, ())))
            statuses.append(dataclasses.replace(status, suspect_hosts=hosts) if hosts else status)
        if not nodes or all(status.state is not HoldingState.ACTIVE for status in statuses):
            return statuses
        if self._maintenance is None:
            self._maintenance = NodeMaintenance.beside(self._client)
        windows = self._maintenance.windows(parent)
        return [
            dataclasses.replace(status, maintenance=windows[status.name])
            if status.state is HoldingState.ACTIVE and status.name in windows
            else status
            for status in statuses
        ]


# Only what the reconciler compares: without a mask every resource brings its startup
# script (the agent, ~46 KB), and a zone of 5,000 jobs would be ~440 MB a tick.
QUEUED_RESOURCE_FIELDS = (
    "queuedResources.name,queuedResources.state,queuedResources.tpu.nodeSpec.node.labels,nextPageToken"
)
NODE_FIELDS = "nodes.name,nodes.state,nodes.health,nodes.queuedResource,nodes.networkEndpoints.ipAddress,nextPageToken"

# tpu_v2 QueuedResourceState.State, every member, as the capacity port's state
# (tests/unit/engine/test_engine_speaks_holdings.py holds the table to the enum). Google's words for each:
# https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources#State
QUEUED_RESOURCE_STATES: dict[str, HoldingState] = {
    "STATE_UNSPECIFIED": HoldingState.UNKNOWN,  # not set: no signal, never acted on
    "CREATING": HoldingState.WAITING,  # being created, not yet accepted
    "ACCEPTED": HoldingState.WAITING,  # accepted, to be scheduled when it can be
    "WAITING_FOR_RESOURCES": HoldingState.WAITING,  # scheduled, waiting for capacity
    "PROVISIONING": HoldingState.PROVISIONING,  # capacity found, its nodes being made
    "ACTIVE": HoldingState.ACTIVE,  # every node made and usable
    "SUSPENDING": HoldingState.LOSING,  # its nodes being deleted (a preemption): their grace runs
    "SUSPENDED": HoldingState.LOST,  # its nodes deleted; the resource is left until deleted
    "FAILED": HoldingState.FAILED,  # it could not be made (`failed_data` says why); no nodes
    "DELETING": HoldingState.RELEASING,  # being deleted
}

HostVerdict = Literal["ok", "suspect", "lost"]
"""What a node's state or health means for the attempt on it: nothing (`ok`), a condition that
often passes (`suspect`: lost only once it lasts past `unhealthy_grace_seconds`, remembered on
the job as `suspect_hosts`), or a lost host at once (`lost`: the job's `on_preemption` rule)."""

# tpu_v2 Node.State, every member (tests/unit/adapters/test_node_states.py holds the table to the enum).
NODE_STATES: dict[str, tuple[HostVerdict, str]] = {
    "STATE_UNSPECIFIED": ("ok", "not set, or masked out: no signal, never acted on"),
    "CREATING": ("ok", "being created: the boot timeout watches a host that never reports"),
    "READY": ("ok", "created and usable"),
    "RESTARTING": (
        "suspect",
        "being restarted: its processes die and its startup script runs "
        "again; a restart that lasts past the grace is a lost host",
    ),
    "REIMAGING": ("lost", "its boot disk is being rewritten: the attempt's processes and files are gone"),
    "DELETING": ("lost", "being deleted: the host is going away"),
    "REPAIRING": ("lost", "being repaired and may be unusable (help_description says why)"),
    "STOPPED": ("lost", "stopped: its processes are gone"),
    "STOPPING": ("lost", "stopping: its processes are going"),
    "STARTING": ("suspect", "starting after a stop or a restart; lost if it does not come up within the grace"),
    "PREEMPTED": ("lost", "preempted (spot and preemptible capacity)"),
    "TERMINATED": ("lost", "terminated for maintenance or at the end of its life"),
    "HIDING": ("suspect", "being hidden: undocumented beyond its name, so never acted on at once"),
    "HIDDEN": ("suspect", "hidden: undocumented beyond its name; lost if it lasts past the grace"),
    "UNHIDING": ("suspect", "being unhidden: it should come back; lost if it does not within the grace"),
    "UNKNOWN": (
        "suspect",
        "unknown after a failed repair: the API does not know, so it is never acted on "
        "alone; lost unless a definite state comes within the grace",
    ),
}

# tpu_v2 Node.Health, every member.
NODE_HEALTH: dict[str, tuple[HostVerdict, str]] = {
    "HEALTH_UNSPECIFIED": ("ok", "not initialized or unreadable: no signal"),
    "HEALTHY": ("ok", "healthy"),
    "TIMEOUT": ("suspect", "unresponsive to the health monitor: often a busy host; lost past the grace"),
    "UNHEALTHY_TENSORFLOW": (
        "suspect",
        "the in-guest ML stack is unhealthy: often while a job (re)starts the TPU runtime; lost past the grace",
    ),
    "UNHEALTHY_MAINTENANCE": ("lost", "under maintenance: rescheduled, its processes are gone until it resumes"),
}

_RANK: dict[HostVerdict, int] = {"ok": 0, "suspect": 1, "lost": 2}


def host_verdict(state: str, health: str) -> tuple[HostVerdict, str]:
    """The worse of what a node's state and its health mean, and the condition that decided it
    ("state RESTARTING", "health TIMEOUT"). A name the table does not know (a newer API) is
    suspect: never acted on at once, lost if it lasts."""
    by_state = NODE_STATES.get(state, ("suspect", ""))[0]
    by_health = NODE_HEALTH.get(health, ("suspect", ""))[0]
    if _RANK[by_health] > _RANK[by_state]:
        return by_health, f"health {health}"
    return by_state, f"state {state}"


def _conflict(error: BaseException | None) -> bool:
    """A 409: over REST both ABORTED (a concurrent update) and ALREADY_EXISTS, which UpdateNode
    never answers."""
    return isinstance(error, api_exceptions.Conflict)


def _google_said(call: BaseException | None) -> str:
    """Google's own message on an API error, without the REST transport's "METHOD URL: " prefix."""
    if not isinstance(call, api_exceptions.GoogleAPICallError):
        return ""
    response = call.response
    if response is not None and hasattr(response, "json"):  # REST: the body as Google sent it
        try:
            said = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            said = None
        if isinstance(said, str) and said:
            return said
    return call.message or ""


def _operation_error(operation: operations_pb2.Operation) -> str:
    """A failed operation's google.rpc.Status as a sentence: its code's name and message."""
    error = operation.error
    try:
        code = code_pb2.Code.Name(error.code)
    except ValueError:  # a code newer than these protos
        code = f"code {error.code}"
    return f"operation {operation.name} failed with {code}: {error.message}"


def _marked(resource: tpu_v2.QueuedResource, holding: str) -> bool:
    """Whether the queued resource carries tpujobs' marker of `holding`: its nodes' labels."""
    specs = resource.tpu.node_spec
    return bool(specs) and all(ownership.marked(holding, dict(spec.node.labels)) for spec in specs)


def _node_marked(node: tpu_v2.Node, holding: str) -> bool:
    """Whether a node is tpujobs' of `holding`: its labels, and the queued resource that made it."""
    made_by = node.queued_resource.rsplit("/", 1)[-1]
    return ownership.marked(holding, dict(node.labels)) and made_by in ("", holding)


def _not_ours(what: str, holding: str) -> NotOurs:
    return NotOurs(f"{SERVICE}: {ownership.refusal(what, holding)}")


def _status(resource: tpu_v2.QueuedResource, zone: str, unhealthy_hosts: int = 0) -> CapacityStatus:
    state = QUEUED_RESOURCE_STATES.get(resource.state.state.name, HoldingState.UNKNOWN)
    detail = ""
    if state is HoldingState.FAILED:
        detail = resource.state.failed_data.error.message
    specs = resource.tpu.node_spec
    labels = specs[0].node.labels if specs else {}
    return CapacityStatus(
        resource.name.rsplit("/", 1)[-1],
        zone,
        state,
        detail,
        unhealthy_hosts,
        job_label=labels.get("tpujobs-job"),
        pool_label=labels.get("tpujobs-pool"),
    )


def _translated(doing: str) -> AbstractContextManager[None]:
    """Library errors through the one table (adapters/google_errors.py): TransientError
    (QuotaExhausted when a TPU quota ran out) to retry the message, PermanentError to record."""
    return translated(SERVICE, doing)

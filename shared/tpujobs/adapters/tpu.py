"""Cloud TPU queued resources through the real google-cloud-tpu (v2) client.

Locally the same client talks REST to the simulator (`TPUJOBS_TPU_ENDPOINT`). Names are
deterministic, so ALREADY_EXISTS on create means an earlier delivery already asked for
this attempt: the resource is ours and is adopted, never bought twice. (Labels name the
job and attempt too, so anyone can trace a resource back.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from google.api_core import exceptions as api_exceptions

from tpujobs.domain.job import Job
from tpujobs.errors import PermanentError, TransientError
from tpujobs.ports import CapacityStatus, HostBoot

if TYPE_CHECKING:
    from google.cloud import tpu_v2

CALL_TIMEOUT_S = 30.0  # the client has no default: a hung call must not hold a function forever

_TRANSIENT = (
    api_exceptions.ServiceUnavailable,
    api_exceptions.TooManyRequests,
    api_exceptions.InternalServerError,
    api_exceptions.DeadlineExceeded,
    api_exceptions.GatewayTimeout,
    api_exceptions.Aborted,
    api_exceptions.RetryError,
)


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
    """The QueuedResource of the job's current attempt: tier, slices, labels, and the boot of
    its TPU VMs: their metadata and their own account. Without one they would run as the
    Compute default account, which has project Editor: that is refused, never requested."""
    from google.cloud import tpu_v2

    spec = job.spec
    if not boot.service_account:
        raise PermanentError(
            "no service account for the TPU VMs: set TPUJOBS_TPU_SERVICE_ACCOUNT (infra/ does); "
            "tpujobs never lets them fall back to the Compute default account"
        )
    node = tpu_v2.Node(
        accelerator_type=spec.accelerator_type,
        runtime_version=spec.runtime_version,
        labels=job_labels(job),
        metadata=dict(boot.metadata),
        scheduling_config=tpu_v2.SchedulingConfig(
            spot=job.capacity == "spot", reserved=job.capacity == "reserved"
        ),
        service_account=tpu_v2.ServiceAccount(email=boot.service_account, scope=[CLOUD_PLATFORM_SCOPE]),
    )
    node_spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=f"projects/{project}/locations/{job.zone}", node=node)
    if spec.slices == 1:
        node_spec.node_id = job.queued_resource
    else:
        node_spec.multislice_params = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(
            node_count=spec.slices, node_id_prefix=job.queued_resource
        )
    resource = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[node_spec]))
    if job.capacity == "spot":
        resource.spot = tpu_v2.QueuedResource.Spot()
    elif job.capacity == "reserved":
        resource.guaranteed = tpu_v2.QueuedResource.Guaranteed()
        resource.reservation_name = _reservation_path(spec.reservation or "", project, job.zone)
    return resource


def _reservation_path(reservation: str, project: str, zone: str) -> str:
    """A short reservation name becomes the full path the API wants; full paths pass through."""
    if reservation.startswith("projects/"):
        return reservation
    return f"projects/{project}/locations/{zone}/reservations/{reservation}"


class CloudTpu:
    """The Tpu port on a `tpu_v2.TpuClient`."""

    def __init__(self, client: tpu_v2.TpuClient, project: str) -> None:
        self._client = client
        self._project = project

    def _parent(self, zone: str) -> str:
        return f"projects/{self._project}/locations/{zone}"

    def request(self, job: Job, boot: HostBoot) -> CapacityStatus:
        resource = queued_resource_for(job, self._project, boot)
        try:
            with _translated(f"request queued resource {job.queued_resource}"):
                self._client.create_queued_resource(
                    parent=self._parent(job.zone),
                    queued_resource=resource,
                    queued_resource_id=job.queued_resource,
                    timeout=CALL_TIMEOUT_S,
                )
        except PermanentError as error:
            # REST maps ALREADY_EXISTS (and ABORTED) to a bare 409 Conflict: look before adopting.
            if not isinstance(error.__cause__, api_exceptions.Conflict):
                raise
            existing = self.status(job.zone, job.queued_resource)
            if existing is None:
                raise TransientError(f"{error}; no such resource exists, so retry") from error
            return existing
        # Create answers with an operation; the resource's own state is what we mirror.
        status = self.status(job.zone, job.queued_resource)
        return status or CapacityStatus(job.queued_resource, job.zone, "CREATING")

    def status(self, zone: str, name: str) -> CapacityStatus | None:
        try:
            with _translated(f"read queued resource {name}"):
                resource = self._client.get_queued_resource(
                    name=f"{self._parent(zone)}/queuedResources/{name}", timeout=CALL_TIMEOUT_S
                )
        except PermanentError as error:
            if isinstance(error.__cause__, api_exceptions.NotFound):
                return None
            raise
        return _status(resource, zone)

    def release(self, zone: str, name: str) -> None:
        try:
            with _translated(f"delete queued resource {name}"):
                self._client.delete_queued_resource(
                    request={"name": f"{self._parent(zone)}/queuedResources/{name}", "force": True},
                    timeout=CALL_TIMEOUT_S,
                )
        except PermanentError as error:
            if not isinstance(error.__cause__, api_exceptions.NotFound):
                raise

    def list(self, zone: str) -> Sequence[CapacityStatus]:
        """Every queued resource of the zone with the health of its nodes: two list calls."""
        parent = self._parent(zone)
        with _translated(f"list queued resources in {zone}"):
            resources = list(
                self._client.list_queued_resources(
                    parent=parent, timeout=CALL_TIMEOUT_S, metadata=[("x-goog-fieldmask", _QR_FIELDS)]
                )
            )
            nodes = list(
                self._client.list_nodes(
                    parent=parent, timeout=CALL_TIMEOUT_S, metadata=[("x-goog-fieldmask", _NODE_FIELDS)]
                )
            )
        unhealthy: dict[str, int] = {}
        for node in nodes:
            if node.state.name in _LOST_NODE_STATES or node.health.name in _UNHEALTHY:
                owner = node.queued_resource.rsplit("/", 1)[-1]
                unhealthy[owner] = unhealthy.get(owner, 0) + max(1, len(node.network_endpoints))
        return [
            _status(resource, zone, unhealthy.get(resource.name.rsplit("/", 1)[-1], 0))
            for resource in resources
        ]


# Only what the reconciler compares: without a mask every resource brings its startup
# script (the agent, ~46 KB), and a zone of 5,000 jobs would be ~440 MB a tick.
_QR_FIELDS = (
    "queuedResources.name,queuedResources.state,queuedResources.tpu.nodeSpec.node.labels,nextPageToken"
)
_NODE_FIELDS = "nodes.name,nodes.state,nodes.health,nodes.queuedResource,nodes.networkEndpoints.ipAddress,nextPageToken"
_LOST_NODE_STATES = frozenset({"PREEMPTED", "TERMINATED", "REPAIRING", "STOPPING", "STOPPED"})
_UNHEALTHY = frozenset({"TIMEOUT", "UNHEALTHY_TENSORFLOW", "UNHEALTHY_MAINTENANCE"})


def _status(resource: tpu_v2.QueuedResource, zone: str, unhealthy_hosts: int = 0) -> CapacityStatus:
    state = resource.state.state.name
    detail = ""
    if state == "FAILED":
        detail = resource.state.failed_data.error.message
    specs = resource.tpu.node_spec
    label = specs[0].node.labels.get("tpujobs-job") if specs else None
    return CapacityStatus(resource.name.rsplit("/", 1)[-1], zone, state, detail, unhealthy_hosts, label)


@contextmanager
def _translated(doing: str) -> Iterator[None]:
    """Library errors become TransientError (retry the message) or PermanentError (record it)."""
    try:
        yield
    except _TRANSIENT as error:
        raise TransientError(f"TPU API failed to {doing}: {error}") from error
    except api_exceptions.GoogleAPICallError as error:
        raise PermanentError(f"TPU API refused to {doing}: {error}") from error
    except (ConnectionError, OSError) as error:
        raise TransientError(f"TPU API unreachable while trying to {doing}: {error}") from error

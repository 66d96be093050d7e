"""TPU slices on Compute Engine through the real google-cloud-compute client.

A holding is one MIG per slice (`compute_requests`): each MIG makes its VMs from a regional
template, and a multi-host slice's MIG also names a workload policy; both are shared by every
holding of the shape (`compute_shared`), the MIG carrying what is the holding's own (its
all-instances configuration: boot metadata, labels). Names are deterministic,
so a create answered 409 adopts what an earlier delivery made, once its marker shows tpujobs made
it for that slice (`compute_ownership`; anyone else's raises NotOurs). Nothing without the marker
is ever deleted or written into (`compute_metadata`). The MIGs and their managed
instances are read into the port's states through one table (`compute_states`). Locally the same
client talks to the simulator (`TPUJOBS_COMPUTE_ENDPOINT`). Facts: ../shared/design/compute-engine.md.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from functools import partial
from typing import TYPE_CHECKING, Any

from google.api_core import exceptions as api_exceptions
from google.api_core.retry import Retry

from tpujobs.adapters import compute_requests as bodies
from tpujobs.adapters.compute_listing import Listing, group_zone, holding_status
from tpujobs.adapters.compute_metadata import METADATA_TRIES, HostMetadata
from tpujobs.adapters.compute_operations import ALREADY_EXISTS as _ALREADY_EXISTS
from tpujobs.adapters.compute_operations import IN_USE as _IN_USE
from tpujobs.adapters.compute_operations import NOT_READY as _NOT_READY
from tpujobs.adapters.compute_operations import OperationFollower, describe, operation_error
from tpujobs.adapters.compute_operations import has_reason as _has_reason
from tpujobs.adapters.compute_ownership import check_adopted, ours
from tpujobs.adapters.compute_shared import SharedResources, names_missing
from tpujobs.adapters.google_errors import transient_retry, translate, translated
from tpujobs.domain.accelerators import BadTopology, UnknownAcceleratorType
from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.job import Job
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.ports import CapacityStatus, HostBoot, UnitRequest

if TYPE_CHECKING:
    from google.cloud import compute_v1

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 30.0  # a hung call must not hold a function forever
OPERATION_WAIT_S = 20.0  # how long a create or delete follows its operation before reading what is
RELEASE_WAIT_S = 3.0  # how long a release follows its MIGs' deletion before trying their templates and policies
SERVICE = "Compute Engine"
__all__ = ["METADATA_TRIES", "ComputeClients", "ComputeEngine", "build_clients"]


@dataclasses.dataclass(frozen=True)
class ComputeClients:
    """The google-cloud-compute clients one holding needs (all REST: compute_v1 has no gRPC)."""

    instances: compute_v1.InstancesClient
    groups: compute_v1.InstanceGroupManagersClient
    templates: compute_v1.RegionInstanceTemplatesClient
    policies: compute_v1.ResourcePoliciesClient
    zone_operations: compute_v1.ZoneOperationsClient
    region_operations: compute_v1.RegionOperationsClient


def build_clients(endpoint: str = "") -> ComputeClients:
    """The clients against `endpoint` with anonymous credentials (the simulator), else the real
    API with the environment's credentials."""
    from google.cloud import compute_v1

    if endpoint:
        from google.auth.credentials import AnonymousCredentials

        options: dict[str, Any] = {"client_options": {"api_endpoint": endpoint}, "credentials": AnonymousCredentials()}
    else:  # found once and shared, rather than looked up (and refreshed) by each client
        import google.auth

        credentials, _ = google.auth.default(scopes=[bodies.CLOUD_PLATFORM_SCOPE])
        options = {"credentials": credentials}
    return ComputeClients(
        compute_v1.InstancesClient(**options),
        compute_v1.InstanceGroupManagersClient(**options),
        compute_v1.RegionInstanceTemplatesClient(**options),
        compute_v1.ResourcePoliciesClient(**options),
        compute_v1.ZoneOperationsClient(**options),
        compute_v1.RegionOperationsClient(**options),
    )


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class ComputeEngine:
    """The Capacity port (`engine.ports.Capacity`) on Compute Engine's MIGs, templates and policies."""

    def __init__(
        self,
        clients: ComputeClients,
        project: str,
        images: bodies.Images | None = None,
        *,
        retry: Retry | None = None,
        clock: Callable[[], datetime] = utc_now,
        sleep: Callable[[float], None] = time.sleep,
        operation_wait_s: float = OPERATION_WAIT_S,
    ) -> None:
        """`retry` wraps every call (by default `google_errors.transient_retry()`); `clock` dates
        leftovers (`compute_listing`); `sleep` paces operation polls and setMetadata's fingerprint retries."""
        self._clients = clients
        self._project = project
        self._images = images or bodies.Images()
        self._retry = retry or transient_retry()
        self._clock = clock
        self._sleep = sleep
        self._wait_s = operation_wait_s
        self._operations = OperationFollower(
            clients.zone_operations, clients.region_operations, project, self._call, sleep=sleep
        )
        self._shared = SharedResources(
            clients.templates, clients.policies, project, self._call, self._operations, operation_wait_s
        )
        self._metadata = HostMetadata(clients.instances, clients.groups, project, self._call, self._follow, sleep)

    # -- asking -------------------------------------------------------------------------------

    def request(self, job: Job, boot: HostBoot) -> CapacityStatus:
        """Create the attempt's slices (policies and templates all at once, then the MIGs), or
        adopt those that exist; a MIG that existed is read for what it is now."""
        return self._create(bodies.job_holding(job), boot)

    def request_unit(self, unit: UnitRequest, boot: HostBoot) -> CapacityStatus:
        """Create a warm-pool unit's slices, or adopt them, exactly as `request` does."""
        return self._create(bodies.unit_holding(unit), boot)

    def _create(self, holding: bodies.Holding, boot: HostBoot) -> CapacityStatus:
        """The MIGs name a shared template (and, multi-host, a shared workload policy) that an
        earlier holding of the same VMs most often made: each is read (and found marked as
        tpujobs' shared one, NotOurs else), and only one that is missing is inserted and waited
        for, both at once (`compute_shared`): Google documents no insert that may name a resource
        whose own insert is not DONE. The MIGs are then inserted, each with its slice's metadata
        and labels (its all-instances configuration), and their own operations are not waited
        for: a MIG's insert being DONE says nothing of its VMs (capacity and quota show on its
        managed instances), and the operations' names are kept so that a create that fails later
        can say why (`create_error`). A MIG insert refused because its template or policy went
        meanwhile (the reconciler's sweep gives back unused ones) makes them again, once. Fresh
        MIGs are WAITING with no read; a MIG that existed (an earlier delivery's) is read."""
        try:
            holding.shape  # noqa: B018 - an unknown shape is refused before any call
        except (UnknownAcceleratorType, BadTopology) as error:
            raise PermanentError(f"{SERVICE} cannot make {holding.spec.accelerator_type}: {error}") from error
        c, zone = self._clients, holding.zone
        call = self._call(project=self._project)
        shared = self._shared.parts(holding, boot, self._images)
        self._shared.ensure(holding, shared)
        managers = [
            bodies.instance_group_manager(holding, i, self._project, shared.template, boot, shared.policy)
            for i in range(holding.spec.slices)
        ]
        migs = _Inserts(
            "MIG",
            [partial(c.groups.insert_unary, zone=zone, instance_group_manager_resource=m, **call) for m in managers],
            [partial(c.groups.get, zone=zone, instance_group_manager=m.name, **call) for m in managers],
        )
        try:
            made = _start(migs)
        except PermanentError as error:
            if not names_missing(error.__cause__):
                raise
            log.info("%s: %s: a shared template or policy went meanwhile; made again", SERVICE, holding.name)
            self._shared.ensure(holding, shared, read_first=False)
            made = _start(migs)
        for index in (i for i, op in enumerate(made) if op is None):
            _adopt(migs, holding, index)
        operation = ",".join(f"zones/{zone}/operations/{op.name}" for op in made if op is not None)
        if all(op is not None for op in made):
            labels = holding.labels
            return CapacityStatus(
                holding.name,
                zone,
                HoldingState.WAITING,
                job_label=labels.get("tpujobs-job"),
                pool_label=labels.get("tpujobs-pool"),
                operation=operation,
            )
        status = self.status(zone, holding.name) or CapacityStatus(holding.name, zone, HoldingState.WAITING)
        return dataclasses.replace(status, operation=operation)

    def _follow(
        self, operation: compute_v1.Operation, doing: str, failures_raise: bool = True, wait_s: float | None = None
    ) -> str:
        """Wait for the operation a while (`wait_s`, else the adapter's): "" when it is done well,
        still running or found the resource existing; else its error raised (translated), or a
        permanent one returned as a sentence when not `failures_raise`."""
        return _judged(self._followed(operation, doing, wait_s), doing, failures_raise)

    def _followed(
        self, operation: compute_v1.Operation, doing: str, wait_s: float | None = None
    ) -> compute_v1.Operation:
        with _translated(doing):
            return self._operations.follow(operation, self._wait_s if wait_s is None else wait_s)

    # -- reading ------------------------------------------------------------------------------

    def status(self, zone: str, name: str) -> CapacityStatus | None:
        """The holding's MIGs (one filtered list), each MIG's managed instances, and its VMs (one
        filtered list, for upcoming maintenance); leftovers when no MIG is left; None: nothing."""
        listing = self._listing(zone, bodies.holding_filter(name), bodies.holding_filter(name, instances=True))
        managed = {
            mig.name: self._managed_instances(zone, mig.name) for mig in listing.migs if ours(mig.description, name)
        }
        return holding_status(name, zone, listing, managed, self._clock())

    def list_capacity(self, zone: str) -> Sequence[CapacityStatus]:
        """Every tpujobs holding of the zone: four filtered, paged lists (MIGs, VMs, the region's
        templates and policies) whatever the zone's size; hosts judged by their VMs' status."""
        pattern = bodies.name_filter(bodies.SLICE_RE2)
        regional = bodies.name_filter(f"({bodies.SLICE_RE2})|({bodies.SHARED_RE2})")
        listing = self._listing(zone, pattern, bodies.name_filter(bodies.INSTANCE_RE2), regional)
        self._shared.sweep(zone, listing, self._clock())
        return group_zone(zone, listing, self._clock())

    def _listing(self, zone: str, slices: str, instances: str | None, regional: str | None = None) -> Listing:
        """MIGs, VMs (unless `instances` is None), templates and policies whose names the filters
        keep (`regional`, else `slices`, for templates and policies)."""
        c, project, region = self._clients, self._project, bodies.region_of(zone)
        regional = regional or slices
        zonal = {"project": project, "zone": zone}
        where = {"project": project, "region": region}
        with _translated(f"list the tpujobs MIGs, VMs, templates and policies of {zone}"):
            return Listing(
                migs=list(c.groups.list(request={**zonal, "filter": slices}, **self._call())),
                instances=[]
                if instances is None
                else list(c.instances.list(request={**zonal, "filter": instances}, **self._call(INSTANCE_FIELDS))),
                templates=list(c.templates.list(request={**where, "filter": regional}, **self._call(TEMPLATE_FIELDS))),
                policies=list(c.policies.list(request={**where, "filter": regional}, **self._call())),
            )

    def _managed_instances(self, zone: str, mig: str) -> list[compute_v1.ManagedInstance]:
        try:
            with _translated(f"list the VMs of MIG {mig}"):
                return list(
                    self._clients.groups.list_managed_instances(
                        project=self._project, zone=zone, instance_group_manager=mig, **self._call()
                    )
                )
        except PermanentError as error:
            if isinstance(error.__cause__, api_exceptions.NotFound):
                return []  # deleted since the listing
            raise

    def _call(self, fields: str = "", **more: Any) -> dict[str, Any]:
        """Every call's retry and timeout (and `more`); `fields` asks only for them (the rest is never read)."""
        extra: dict[str, Any] = {"metadata": [("x-goog-fieldmask", fields)]} if fields else {}
        return {"retry": self._retry, "timeout": CALL_TIMEOUT_S, **extra, **more}

    def create_error(self, operation: str) -> str | None:
        """What the first failed of a request's MIG inserts (`zones/Z/operations/N`, comma-separated) said."""
        for each in filter(None, operation.split(",")):
            parts = each.split("/")
            if len(parts) != 4 or parts[0] != "zones" or parts[2] != "operations":
                continue
            try:
                with _translated(f"read operation {each}"):
                    found = self._clients.zone_operations.get(
                        project=self._project, zone=parts[1], operation=parts[3], **self._call()
                    )
            except PermanentError as error:
                if isinstance(error.__cause__, api_exceptions.NotFound):
                    continue  # operations are kept for a while only
                raise
            if operation_error(found) is not None:
                return f"operation {each} failed: {describe(found)}"
        return None

    # -- giving back --------------------------------------------------------------------------

    def release(self, zone: str, name: str) -> None:
        """Delete the holding's MIGs (and so their VMs), then the holding's own templates and
        policies, which an earlier version made (at once, followed together): absent is fine;
        the shared ones are never the holding's (`compute_shared` gives them back). The MIGs'
        deletion is followed only briefly (deleting VMs takes minutes): a template or policy
        still in use then is left, never waited for; `list_capacity` reports the leftovers of a
        holding no attempt owns, and the reconciler's sweep releases them at a later tick. Only
        what carries tpujobs' marker of this holding is deleted: a MIG, template or policy of
        its names without it is someone else's, left alone and logged."""
        c, region = self._clients, bodies.region_of(zone)
        call = self._call(project=self._project)
        listing = self._listing(zone, bodies.holding_filter(name), None)
        _log_foreign(name, listing)
        going = [
            self._delete(
                f"MIG {m.name}", partial(c.groups.delete_unary, zone=zone, instance_group_manager=m.name, **call)
            )
            for m in listing.migs
            if ours(m.description, name)
        ]
        with _translated(f"delete the MIGs of {name}"):
            followed = self._operations.follow_all([op for op in going if op is not None], RELEASE_WAIT_S)
        for operation in followed:
            _judged(operation, f"delete the MIGs of {name}", failures_raise=True)
        deletes = [
            (
                f"instance template {t.name}",
                partial(c.templates.delete_unary, region=region, instance_template=t.name, **call),
            )
            for t in listing.templates
            if ours(t.description, name)
        ]
        deletes += [
            (
                f"workload policy {p.name}",
                partial(c.policies.delete_unary, region=region, resource_policy=p.name, **call),
            )
            for p in listing.policies
            if ours(p.description, name)
        ]
        in_use = self._delete_all(deletes)
        if in_use:
            log.info("%s: %s still in use while %s is deleted; the reconciler sweeps them", SERVICE, in_use, name)

    def _delete(self, what: str, delete: Callable[[], compute_v1.Operation]) -> compute_v1.Operation | None:
        """Start one delete: its operation; None when it is already gone or going. A resource in
        use raises _InUse."""
        try:
            with _translated(f"delete {what}"):
                return delete()
        except PermanentError as error:
            cause = error.__cause__
            if isinstance(cause, api_exceptions.NotFound) or _has_reason(cause, _NOT_READY):
                return None
            if _has_reason(cause, _IN_USE):
                raise _InUse(what) from error
            raise

    def _delete_all(self, deletes: Sequence[tuple[str, Callable[[], compute_v1.Operation]]]) -> list[str]:
        """Start every delete (templates and policies name nothing of each other), then follow
        their operations together: what is still in use (by a MIG that is going), left for the
        reconciler's sweep."""
        in_use: list[str] = []
        started: list[tuple[str, compute_v1.Operation]] = []
        for what, delete in deletes:
            try:
                operation = self._delete(what, delete)
            except _InUse:
                in_use.append(what)
                continue
            if operation is not None:
                started.append((what, operation))
        with _translated(f"delete {', '.join(what for what, _ in started)}"):
            followed = self._operations.follow_all([op for _, op in started], self._wait_s)
        for (what, _), operation in zip(started, followed, strict=True):
            try:
                _judged(operation, f"delete {what}", failures_raise=True)
            except PermanentError as error:  # the operation itself said in use
                if not _has_reason(error.__cause__, _IN_USE):
                    raise
                in_use.append(what)
        return in_use

    # -- warm-pool assignments ----------------------------------------------------------------

    def tell_hosts(self, zone: str, name: str, slices: int, metadata: Mapping[str, str]) -> None:
        """Set tpujobs' keys (those of `metadata`) on every VM of the holding, keeping every other
        key (such as `ssh-keys`), with the fingerprint read (`compute_metadata`). A MIG or VM
        without tpujobs' marker of this holding raises NotOurs and is never written; a VM not
        RUNNING (or a slice without VMs) raises PermanentError; each write is waited for."""
        self._metadata.write(zone, name, slices, metadata)


class _InUse(Exception):
    """A template or policy still used by a MIG that is going."""


@dataclasses.dataclass(frozen=True)
class _Inserts:
    """One kind of resource for every slice of a holding: how to insert each, how to read it back."""

    kind: str
    inserts: Sequence[Callable[[], compute_v1.Operation]]
    reads: Sequence[Callable[[], Any]]


def _start(part: _Inserts) -> list[compute_v1.Operation | None]:
    """Start every insert of one kind (slice i's at i): its operation, or None for a resource
    that already existed (an earlier delivery made it, or someone else did: `_settle` reads it)."""
    started: list[compute_v1.Operation | None] = []
    for insert in part.inserts:
        try:
            with _translated(f"create a {part.kind}"):
                started.append(insert())
        except (PermanentError, TransientError) as error:
            if not _has_reason(error.__cause__, _ALREADY_EXISTS):
                raise
            started.append(None)
    return started


def _settle(part: _Inserts, holding: bodies.Holding, followed: Sequence[compute_v1.Operation | None]) -> None:
    """Judge each insert as followed: a failed operation raises (translated); a resource that
    already existed (None, or an operation that says so) is adopted (`_adopt`)."""
    for index, operation in enumerate(followed):
        if operation is None or _has_reason(operation_error(operation), _ALREADY_EXISTS):
            _adopt(part, holding, index)
        else:
            _judged(operation, f"create a {part.kind}", failures_raise=True)


def _adopt(part: _Inserts, holding: bodies.Holding, index: int) -> None:
    """A resource of slice `index` that already existed is ours only once read
    (`part.reads[index]`) and found marked as tpujobs' for that slice (NotOurs else)."""
    with _translated(f"read the existing {part.kind} of {holding.name}"):
        found = part.reads[index]()
    check_adopted(part.kind, found, holding.name, index)


def _judged(operation: compute_v1.Operation, doing: str, failures_raise: bool) -> str:
    """ "" for an operation done well, still running, or that found its resource existing; else
    its error raised (translated), or a permanent one as a sentence when not `failures_raise`."""
    error = operation_error(operation)
    if error is None or _has_reason(error, _ALREADY_EXISTS):
        return ""
    translation = translate(error, SERVICE, doing) or PermanentError(str(error))
    if failures_raise or not isinstance(translation, PermanentError):
        raise translation from error  # a transient failure (a full quota too) is retried
    return f"operation {operation.name} failed: {describe(operation)}"


# Only what a listing reads: a template's properties hold the startup script (the agent), and a
# zone of many holdings would bring it once per slice.
INSTANCE_FIELDS = "items.name,items.status,items.resourceStatus.upcomingMaintenance,nextPageToken"
TEMPLATE_FIELDS = "items.name,items.description,items.creationTimestamp,nextPageToken"


def _log_foreign(holding: str, listing: Listing) -> None:
    """Say which resources named exactly as the holding's slices are someone else's (left alone)."""
    found: list[Any] = [*listing.migs, *listing.templates, *listing.policies]  # the filter keeps the slices' names
    foreign = sorted(r.name for r in found if not ours(r.description, holding))
    if foreign:
        log.warning("%s: %s named like %s left alone: not made by tpujobs (no marker)", SERVICE, foreign, holding)


def _translated(doing: str) -> AbstractContextManager[None]:
    """Library errors through the one table (adapters/google_errors.py)."""
    return translated(SERVICE, doing)

"""The instance templates and workload policies that holdings share on Compute Engine.

Both are immutable, so one template serves every holding whose VMs are alike and one policy every
slice of a topology (`compute_requests.instance_template`, `workload_policy`: named by a hash of
what they hold, marked as tpujobs' shared ones). A request reads them and inserts only what is
missing, waiting for those inserts alone (`ensure`): only the first holding of a shape waits. They
are never a holding's, so a release leaves them; the reconciler's zone listing gives back those
no MIG has named for a while (`sweep`), and Google refuses to delete one still in use
(resourceInUseByAnotherResource), which is fine. Facts: ../shared/design/compute-engine.md.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from google.api_core import exceptions as api_exceptions

from tpujobs.adapters import compute_requests as bodies
from tpujobs.adapters.compute_listing import Listing, unused_shared
from tpujobs.adapters.compute_operations import (
    ALREADY_EXISTS,
    IN_USE,
    NOT_READY,
    OperationFollower,
    has_reason,
    operation_error,
)
from tpujobs.adapters.compute_ownership import check_shared
from tpujobs.adapters.google_errors import translate, translated
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.ports import HostBoot

if TYPE_CHECKING:
    from google.cloud import compute_v1

log = logging.getLogger(__name__)

SERVICE = "Compute Engine"
SHARED_FIELDS = "name,description"  # what a request reads of a shared template or policy: its marker


@dataclasses.dataclass(frozen=True)
class Shared:
    """A shared template or policy: its kind and name, how to insert it and how to read it."""

    kind: str
    name: str
    insert: Callable[[], Any]
    read: Callable[[], Any]


@dataclasses.dataclass(frozen=True)
class SharedParts:
    """What a holding's MIGs name: the shared template, the shared policy ("" single-host)."""

    template: str
    policy: str
    parts: Sequence[Shared]


def names_missing(error: BaseException | None) -> bool:
    """Whether a MIG insert was refused for naming a template or policy that is gone (or going)."""
    return isinstance(error, api_exceptions.NotFound) or has_reason(error, NOT_READY)


class SharedResources:
    """Reads, inserts and gives back the shared templates and policies of one project."""

    def __init__(
        self,
        templates: compute_v1.RegionInstanceTemplatesClient,
        policies: compute_v1.ResourcePoliciesClient,
        project: str,
        call: Callable[..., dict[str, Any]],
        operations: OperationFollower,
        wait_s: float,
    ) -> None:
        self._templates = templates
        self._policies = policies
        self._project = project
        self._call = call
        self._operations = operations
        self._wait_s = wait_s

    def parts(self, holding: bodies.Holding, boot: HostBoot, images: bodies.Images) -> SharedParts:
        """The shared template (and, multi-host, the shared policy) of the holding's VMs."""
        templates, policies, region = self._templates, self._policies, holding.region
        call = self._call(project=self._project)
        read = self._call(SHARED_FIELDS, project=self._project)
        template = bodies.instance_template(holding, boot, self._project, images)
        parts = [
            Shared(
                "instance template",
                template.name,
                partial(templates.insert_unary, region=region, instance_template_resource=template, **call),
                partial(templates.get, region=region, instance_template=template.name, **read),
            )
        ]
        if not holding.shape.multi_host:
            return SharedParts(template.name, "", parts)
        policy = bodies.workload_policy(holding)
        parts.insert(
            0,
            Shared(
                "workload policy",
                policy.name,
                partial(policies.insert_unary, region=region, resource_policy_resource=policy, **call),
                partial(policies.get, region=region, resource_policy=policy.name, **read),
            ),
        )
        return SharedParts(template.name, policy.name, parts)

    def ensure(self, holding: bodies.Holding, shared: SharedParts, read_first: bool = True) -> None:
        """Each shared template or policy exists and is tpujobs' (NotOurs else): read first (when
        `read_first`), and what is missing inserted, all at once, and followed together. One
        found existing by its insert (another holding made it meanwhile) is read and checked too."""
        missing = list(shared.parts)
        if read_first:
            missing = []
            for each in shared.parts:
                try:
                    with translated(SERVICE, f"read the {each.kind} {each.name}"):
                        found = each.read()
                except PermanentError as error:
                    if not isinstance(error.__cause__, api_exceptions.NotFound):
                        raise
                    missing.append(each)
                    continue
                check_shared(each.kind, found)
        if not missing:
            return
        started: list[tuple[Shared, Any]] = []
        for each in missing:
            try:
                with translated(SERVICE, f"create the {each.kind} {each.name}"):
                    started.append((each, each.insert()))
            except (PermanentError, TransientError) as error:
                if not has_reason(error.__cause__, ALREADY_EXISTS):
                    raise
                started.append((each, None))
        with translated(SERVICE, f"create the shared templates and policies of {holding.name}"):
            done = iter(self._operations.follow_all([op for _, op in started if op is not None], self._wait_s))
        for each, op in started:
            failed = None if op is None else operation_error(next(done))
            if op is None or has_reason(failed, ALREADY_EXISTS):
                with translated(SERVICE, f"read the existing {each.kind} {each.name}"):
                    check_shared(each.kind, each.read())
            elif failed is not None:  # a failed insert: translated (a full quota is retried)
                doing = f"create the {each.kind} {each.name}"
                raise translate(failed, SERVICE, doing) or PermanentError(str(failed)) from failed

    def sweep(self, zone: str, listing: Listing, now: datetime) -> None:
        """Give back the shared templates and policies no MIG has named for a while
        (`unused_shared`), once a tick with the reconciler's listing: deletes started, never
        followed. One in use (by another zone's MIG, or one inserted since the listing) Google
        refuses to delete, which is fine; any other failure is logged, never fails the listing."""
        templates, policies, region = self._templates, self._policies, bodies.region_of(zone)
        call = self._call(project=self._project)
        for kind, name in unused_shared(listing, now):
            if kind == "instance template":
                delete = partial(templates.delete_unary, region=region, instance_template=name, **call)
            else:
                delete = partial(policies.delete_unary, region=region, resource_policy=name, **call)
            try:
                with translated(SERVICE, f"delete the unused {kind} {name}"):
                    delete()
            except (PermanentError, TransientError) as error:
                cause = error.__cause__
                if not (isinstance(cause, api_exceptions.NotFound) or has_reason(cause, IN_USE | NOT_READY)):
                    log.warning("%s: could not give back the unused %s %s: %s", SERVICE, kind, name, error)
                continue
            log.info("%s: giving back the unused %s %s", SERVICE, kind, name)

"""Compute Engine listings grouped into holdings, each as the capacity port's status.

A holding's resources are known by the marker in their descriptions (`compute_requests`), so
nothing of anyone else's is ever reported. `holding_status` reads one holding precisely (its
managed instances, with their last creation errors); `group_zone` reads a whole zone from four
lists, judging hosts by their VMs' status and their MIG's action counts. Templates and policies
left without a MIG (a release that must be finished, or a create cut short) are reported too:
WAITING while young, FAILED after, so the reconciler's sweep (which skips RELEASING) gives them back.
Shared templates and policies (`compute_requests.shared_description`) are no holding's and never
reported: `unused_shared` picks those no MIG of the zone names, for the adapter to give back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from tpujobs.adapters import compute_states as states
from tpujobs.adapters.compute_ownership import shared_ours
from tpujobs.adapters.compute_requests import parse_description
from tpujobs.domain.times import rfc3339
from tpujobs.engine.ports import CapacityStatus

if TYPE_CHECKING:
    from google.cloud import compute_v1

# A create makes policies, then templates, then MIGs, within seconds: leftovers younger than
# this may be a create under way, older ones a release to finish.
PARTIAL_GRACE = timedelta(minutes=5)
# A shared template or policy younger than this is kept even when no MIG names it: the next
# holding of its shape most often comes soon, and one just made may not be named by its MIG yet.
SHARED_IDLE = timedelta(hours=1)


@dataclass(frozen=True)
class Listing:
    """What one read of a zone (or of one holding in it) found."""

    migs: Sequence[compute_v1.InstanceGroupManager]
    instances: Sequence[compute_v1.Instance]
    templates: Sequence[compute_v1.InstanceTemplate]
    policies: Sequence[compute_v1.ResourcePolicy]


def _said(resource: Any) -> dict[str, Any] | None:
    return parse_description(resource.description or "")


def _labelled(name: str, zone: str, said: Mapping[str, Any], **fields: Any) -> CapacityStatus:
    labels = said.get("labels") or {}
    return CapacityStatus(
        name, zone, job_label=labels.get("tpujobs-job"), pool_label=labels.get("tpujobs-pool"), **fields
    )


def holding_status(
    name: str,
    zone: str,
    listing: Listing,
    managed: Mapping[str, Sequence[compute_v1.ManagedInstance]],
    now: datetime,
) -> CapacityStatus | None:
    """One holding from its MIGs and their managed instances (`managed`, by MIG name)."""
    migs = [m for m in listing.migs if (_said(m) or {}).get("holding") == name]
    if not migs:
        return next(iter(_leftovers(zone, listing, set(), now, only=name)), None)
    verdicts: list[states.Verdict] = []
    for mig in migs:
        hosts = managed.get(mig.name, ())
        verdicts += [
            states.host(
                states.Host(
                    mi.name,
                    mi.instance_status or "",
                    mi.current_action or "UNDEFINED_CURRENT_ACTION",
                    tuple((e.code, e.message) for e in mi.last_attempt.errors.errors),
                )
            )
            for mi in hosts
        ]
        verdicts += _unlisted(mig, len(hosts))
    judged = _judged(migs, verdicts)
    said = _said(migs[0]) or {}
    return _labelled(
        name,
        zone,
        said,
        state=judged.state,
        detail=judged.detail,
        unhealthy_hosts=judged.lost_hosts,
        maintenance=_maintenance(listing.instances, {m.name for m in migs}),
        quota_region=judged.quota_region,
        run_ends=_earliest(mi.scheduling.termination_timestamp for mig in migs for mi in managed.get(mig.name, ())),
    )


def group_zone(zone: str, listing: Listing, now: datetime) -> list[CapacityStatus]:
    """Every holding of the zone. Per MIG: its VMs' statuses; hosts with no VM while the MIG
    creates some are waiting; hosts with no VM and no action (more NONE actions than VMs) ran
    and were deleted: lost; any host being deleted makes the holding RELEASING."""
    by_holding: dict[str, list[compute_v1.InstanceGroupManager]] = {}
    for mig in listing.migs:
        said = _said(mig)
        if said is not None:
            by_holding.setdefault(said["holding"], []).append(mig)
    vms: dict[str, list[compute_v1.Instance]] = {}
    for vm in listing.instances:
        vms.setdefault(vm.name.rsplit("-", 1)[0], []).append(vm)
    found = []
    for holding, migs in sorted(by_holding.items()):
        verdicts: list[states.Verdict] = []
        for mig in migs:
            verdicts += _mig_verdicts(mig, vms.get(mig.name, []))
        judged = _judged(migs, verdicts)
        found.append(
            _labelled(
                holding,
                zone,
                _said(migs[0]) or {},
                state=judged.state,
                detail=judged.detail,
                unhealthy_hosts=judged.lost_hosts,
                maintenance=_maintenance(listing.instances, {m.name for m in migs}),
                run_ends=_earliest(
                    vm.resource_status.scheduling.termination_timestamp for mig in migs for vm in vms.get(mig.name, [])
                ),
            )
        )
    return found + _leftovers(zone, listing, set(by_holding), now)


def _judged(migs: Sequence[compute_v1.InstanceGroupManager], verdicts: list[states.Verdict]) -> states.HoldingReading:
    """The holding from its hosts' verdicts and what its MIGs say of themselves: stability, a
    bulk creation in progress (and why it waits), each slice's interconnect."""
    bulk = [m for m in migs if m.status.bulk_instance_operation.in_progress]
    for mig in bulk:
        check = mig.status.bulk_instance_operation.last_progress_check
        errors = tuple((e.code, e.message) for e in check.error.errors)
        if errors:
            verdicts = [*verdicts, states.bulk_waits(mig.name, errors)]
    interconnects = [
        states.Interconnect(
            mig.name,
            applied.accelerator_topology,
            applied.state or "UNDEFINED_STATE",
            tuple((e.code, e.message) for e in applied.state_details.error.errors),
        )
        for mig in migs
        for applied in mig.status.applied_accelerator_topologies
    ]
    return states.holding_state(
        verdicts,
        all_stable=all(m.status.is_stable for m in migs),
        waiting_in_bulk=bool(bulk),
        interconnects=interconnects,
    )


def _unlisted(mig: compute_v1.InstanceGroupManager, listed: int) -> list[states.Verdict]:
    """Hosts of the target size the MIG no longer accounts for (a VM deleted outside it: a
    DO_NOTHING MIG need not list it): lost once the MIG is stable with no bulk creation under
    way, whatever the listing shows; waiting while it still makes VMs."""
    missing = max(0, mig.target_size - listed)
    if not missing:
        return []
    if mig.status.is_stable and not mig.status.bulk_instance_operation.in_progress:
        lost = f"MIG {mig.name} accounts for {listed} of its {mig.target_size} hosts: a VM was deleted outside it"
        return [states.Verdict(states.PROVISIONING, True, lost)] * missing
    return [states.Verdict(states.WAITING, False)] * missing


def _mig_verdicts(mig: compute_v1.InstanceGroupManager, vms: Sequence[compute_v1.Instance]) -> list[states.Verdict]:
    actions = mig.current_actions
    verdicts = [states.host(states.Host(vm.name, vm.status or "", "UNDEFINED_CURRENT_ACTION")) for vm in vms]
    gone = max(0, actions.none - len(vms))  # NONE hosts beyond the VMs that exist: deleted
    lost = f"a host of MIG {mig.name} has no VM any more (preempted or deleted)"
    verdicts += [states.Verdict(states.PROVISIONING, True, lost)] * gone
    counted = sum(getattr(actions, name) for name in _ACTIONS)  # the hosts the MIG accounts for
    verdicts += _unlisted(mig, max(counted, len(vms)))
    waiting = max(0, min(counted, mig.target_size) - len(vms) - gone)
    verdicts += [states.Verdict(states.WAITING, False)] * waiting
    if actions.deleting:
        verdicts.append(states.Verdict(states.RELEASING, False))
    return verdicts


# InstanceGroupManagerActionsSummary's counts: every host the MIG lists is in exactly one.
_ACTIONS = (
    "abandoning", "creating", "creating_without_retries", "deleting", "none", "recreating", "refreshing",
    "restarting", "resuming", "starting", "stopping", "suspending", "verifying",
)  # fmt: skip


def _earliest(timestamps: Iterable[str]) -> str:
    """The earliest of the VMs' terminationTimestamps (maxRunDuration's end), "" if none has one."""
    known = [(when, stamp) for stamp in timestamps if (when := rfc3339(stamp)) is not None]
    return min(known)[1] if known else ""


def _maintenance(instances: Iterable[compute_v1.Instance], migs: set[str]) -> tuple[tuple[str, str], ...]:
    """(VM, window start) of the holding's VMs with host maintenance scheduled."""
    found = []
    for vm in instances:
        if vm.name.rsplit("-", 1)[0] not in migs:
            continue
        upcoming = vm.resource_status.upcoming_maintenance
        start = upcoming.window_start_time or upcoming.latest_window_start_time
        if start or upcoming.maintenance_status or upcoming.type_:
            found.append((vm.name, start))
    return tuple(sorted(found))


def _leftovers(
    zone: str, listing: Listing, with_migs: set[str], now: datetime, only: str | None = None
) -> list[CapacityStatus]:
    """Holdings of this zone with templates or policies but no MIG."""
    left: dict[str, list[Any]] = {}
    for resource in [*listing.templates, *listing.policies]:
        said = _said(resource)
        if said is None or said.get("zone") != zone or said["holding"] in with_migs:
            continue
        if only is None or said["holding"] == only:
            left.setdefault(said["holding"], []).append(resource)
    found = []
    for holding, resources in sorted(left.items()):
        names = ", ".join(sorted(r.name for r in resources))
        newest = max((t for t in (rfc3339(r.creation_timestamp) for r in resources) if t), default=None)
        young = newest is not None and now - newest < PARTIAL_GRACE
        state = states.WAITING if young else states.FAILED
        detail = f"no MIG; only its templates and policies remain ({names})"
        found.append(_labelled(holding, zone, _said(resources[0]) or {}, state=state, detail=detail))
    return found


def unused_shared(listing: Listing, now: datetime) -> list[tuple[str, str]]:
    """(kind, name) of the shared templates and policies (marked as tpujobs' shared ones) older
    than SHARED_IDLE that no MIG of the listing names. A MIG of another zone may still use one:
    Google then refuses its deletion (resourceInUseByAnotherResource), which is fine."""
    used: set[str] = set()
    for mig in listing.migs:
        used.add((mig.instance_template or "").rsplit("/", 1)[-1])
        used.add((mig.resource_policies.workload_policy or "").rsplit("/", 1)[-1])
    found = []
    for kind, resources in (("instance template", listing.templates), ("workload policy", listing.policies)):
        for resource in resources:
            if resource.name in used or not shared_ours(resource.description, kind, resource.name):
                continue
            made = rfc3339(resource.creation_timestamp)
            if made is not None and now - made >= SHARED_IDLE:
                found.append((kind, resource.name))
    return found

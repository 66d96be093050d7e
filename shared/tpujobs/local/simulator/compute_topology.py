"""What Compute Engine adds to a MIG's slice beyond its VMs, as pure rules the groups model applies:
the slice's interconnect (`status.appliedAcceleratorTopologies[]`), hosts granted part of a slice in
individual mode, and why a bulk MIG waits (`status.bulkInstanceOperation.lastProgressCheck`).

The interconnect's states are InstanceGroupManagerStatusAcceleratorTopology.State's (google-cloud-compute
1.57): INCOMPLETE ("cannot be activated due to insufficient number of running VMs") while any VM of
the slice is not RUNNING, ACTIVATING for `topology_activation_seconds` once every VM runs, then ACTIVE;
DEACTIVATING while the MIG is deleted. FAILED or INCOMPLETE may be forced by a fault
(`tpujobs dev fault topology`), with the stateDetails error it shows. How long Google activates, and
what it shows while the VMs are created, are not documented: the simulator takes the unkind reading.

Individual mode "creates as many instances as possible with the available capacity" [BULK]: a
partial grant (`tpujobs dev fault partial`) shows workers 0..K-1 RUNNING while the slice waits for
the rest, whose managed instances keep a stockout in lastAttempt. Bulk mode reports why it waits on
the MIG, not per instance, so bulk members show no lastAttempt errors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tpujobs.local.simulator.compute_records import GroupRecord, Phase

ACTIVATING, ACTIVE, DEACTIVATING = "ACTIVATING", "ACTIVE", "DEACTIVATING"
FAILED, INCOMPLETE = "FAILED", "INCOMPLETE"
FAULT_STATES = (FAILED, INCOMPLETE)  # what `tpujobs dev fault topology` may force
# The stateDetails error code a forced state shows: Google documents none, so the simulator's own.
FAULT_CODE = "ACCELERATOR_TOPOLOGY_UNHEALTHY"
_WAITING_QR = frozenset({"CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES"})


@dataclass(frozen=True)
class TopologyView:
    """One entry of `status.appliedAcceleratorTopologies[]`."""

    topology: str  # as the workload policy names it, "4x4x4"
    state: str
    error: tuple[str, str] | None = None  # stateDetails.error.errors[0] (code, message)
    error_time: float | None = None  # wall clock: stateDetails.timestamp, "shown only if there is an error"


def topology_view(
    group: GroupRecord, topology: str, running: int, now: float, activation_seconds: float
) -> TopologyView | None:
    """The interconnect of *group*'s slice now; None for a MIG without a workload policy's topology
    or with no VMs asked for. *running*: its members whose VM is RUNNING."""
    if not topology or not group.target_size:
        return None
    if group.deleting:
        return TopologyView(topology, DEACTIVATING)
    fault = group.topology_fault
    if fault is not None:
        error = (str(fault.get("code") or FAULT_CODE), str(fault.get("message") or ""))
        return TopologyView(topology, str(fault["state"]), error, float(fault.get("time") or 0.0) or None)
    if running < group.target_size:
        return TopologyView(topology, INCOMPLETE)
    if group.active_at is None or now < group.active_at + activation_seconds:
        return TopologyView(topology, ACTIVATING)
    return TopologyView(topology, ACTIVE)


def forced_fault(state: str, message: str, wall: float) -> Mapping[str, Any]:
    """The record of a forced interconnect state (GroupRecord.topology_fault)."""
    if state not in FAULT_STATES:
        raise ValueError(f"the interconnect may be forced to {' or '.join(FAULT_STATES)}, not {state!r}")
    said = message or (
        "The accelerator topology failed (simulated by tpujobs)."
        if state == FAILED
        else "The accelerator topology cannot be activated: not every VM of the slice is usable (simulated by tpujobs)."
    )
    return {"state": state, "code": FAULT_CODE, "message": said, "time": wall}


@dataclass(frozen=True)
class MemberFacts:
    """What a member's view needs from its MIG and slice, read under the lock."""

    bulk: bool
    partial: int  # hosts granted while the slice waits; 0: none
    slice_state: str  # the backing queued resource's state ("" if none)
    stockout: tuple[str, str]  # the zone's stockout, for the hosts that did not come


def member_status(
    status: str | None,
    action: str,
    errors: tuple[tuple[str, str], ...],
    worker: int,
    phase: Phase,
    deleting: bool,
    facts: MemberFacts,
) -> tuple[str | None, str, tuple[tuple[str, str], ...]]:
    """(instance status, current action, lastAttempt errors) of one MIG member: a partial grant's
    hosts RUNNING and the others waiting with the stockout; bulk members without errors."""
    if facts.partial and facts.slice_state in _WAITING_QR and phase is Phase.NONE and not deleting:
        if worker < facts.partial:
            return "RUNNING", "NONE", ()
        return None, "CREATING", () if facts.bulk else (facts.stockout,)
    if facts.bulk:
        return status, action, ()
    return status, action, errors


def running_count(statuses: Iterable[str | None]) -> int:
    return sum(1 for status in statuses if status == "RUNNING")


def without_slice_state(group: GroupRecord) -> GroupRecord:
    """*group* as a new slice starts or an old one stops: no interconnect time, fault or partial grant."""
    return dataclasses.replace(group, active_at=None, topology_fault=None, partial=0)

"""What Compute Engine says of a slice's VMs, as the capacity port's `HoldingState`: the one table.

A holding's MIGs and their managed instances are read; each host (managed instance) is placed
by its instance status and the MIG's current action for it (`INSTANCE_STATUSES`,
`CURRENT_ACTIONS`), and by the errors of its last creation attempt. The holding is the least
advanced of its hosts: RELEASING, then FAILED, then WAITING, then PROVISIONING;
ACTIVE only when every MIG is stable, every host RUNNING and every slice's interconnect ACTIVE
(`TOPOLOGY_STATES`: a FAILED one, or one INCOMPLETE with every VM running, fails the holding
with Google's stateDetails). Hosts that are lost (preempted, stopped, deleted, recreated, or
missing from a stable MIG's list) count in `unhealthy_hosts`, which the engine treats as a loss
whatever the state. A host that came while others wait leaves the holding waiting, saying how
many came, so the zone wait bounds what a partial slice costs. A bulk MIG says why it waits on
itself (`bulkInstanceOperation.lastProgressCheck`), read as a host's lastAttempt is.
TPU VMs cannot stop or suspend, so no holding is ever LOSING or LOST: its lost hosts say it.
Sources: ../shared/design/compute-engine.md §3 and the compute_v1 enums' own docstrings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from tpujobs.domain.holdings import HoldingState

HostVerdict = Literal["ok", "lost"]

# The port's states this backend uses, least advanced first wins (`holding_state`).
RELEASING = HoldingState.RELEASING
FAILED = HoldingState.FAILED
WAITING = HoldingState.WAITING
PROVISIONING = HoldingState.PROVISIONING
ACTIVE = HoldingState.ACTIVE
_PRECEDENCE = (RELEASING, FAILED, WAITING, PROVISIONING, ACTIVE)


@dataclass(frozen=True)
class Meaning:
    """What one status or action says of a host: the holding state it allows, and whether the
    host is lost (its processes are gone, so the attempt on it is over)."""

    state: HoldingState
    verdict: HostVerdict
    why: str


# compute_v1.Instance.Status, every member (tests/unit/adapters/test_compute_states.py holds it to the enum).
INSTANCE_STATUSES: dict[str, Meaning] = {
    "UNDEFINED_STATUS": Meaning(WAITING, "ok", "no VM yet (empty instanceStatus): the MIG has not got its capacity"),
    "PENDING": Meaning(WAITING, "ok", "flex-start: waiting for capacity from the Dynamic Workload Scheduler"),
    "PROVISIONING": Meaning(PROVISIONING, "ok", "resources are being allocated"),
    "STAGING": Meaning(PROVISIONING, "ok", "resources allocated; the VM is starting"),
    "RUNNING": Meaning(ACTIVE, "ok", "running"),
    "REPAIRING": Meaning(PROVISIONING, "lost", "in repair after a host error: its processes are gone"),
    "PENDING_STOP": Meaning(PROVISIONING, "lost", "shutting down gracefully (a Spot preemption's soft-off)"),
    "STOPPING": Meaning(PROVISIONING, "lost", "stopping: being deleted or killed (preemption, maintenance)"),
    "STOPPED": Meaning(PROVISIONING, "lost", "stopped: a TPU VM cannot be started again"),
    "TERMINATED": Meaning(PROVISIONING, "lost", "terminated: preempted, or stopped for host maintenance"),
    "SUSPENDING": Meaning(PROVISIONING, "lost", "suspending: TPU VMs cannot suspend, so the host is going"),
    "SUSPENDED": Meaning(PROVISIONING, "lost", "suspended: TPU VMs cannot resume, so the host is gone"),
    "DEPROVISIONING": Meaning(PROVISIONING, "lost", "halted; its network, IPs and disks being torn down"),
}

# compute_v1.ManagedInstance.CurrentAction, every member, plus the two its docstring says may
# come outside the enum (STOPPING, SUSPENDING). None: the instance status alone decides.
CURRENT_ACTIONS: dict[str, Meaning | None] = {
    "UNDEFINED_CURRENT_ACTION": None,  # not set: no signal
    "NONE": None,  # no action scheduled: the VM is as its status says (no VM at all: `host`)
    "CREATING": None,  # the VM is being created, retried until it is: its status says how far
    "CREATING_WITHOUT_RETRIES": None,  # created once only: its status (and lastAttempt) say how far
    "VERIFYING": Meaning(PROVISIONING, "ok", "created, being verified"),
    "REFRESHING": Meaning(PROVISIONING, "ok", "configuration applied without a stop: not stable meanwhile"),
    "RECREATING": Meaning(PROVISIONING, "lost", "being recreated: a new VM, the old one's processes gone"),
    "RESTARTING": Meaning(PROVISIONING, "lost", "being restarted: its processes die"),
    "STARTING": Meaning(PROVISIONING, "lost", "being started again after a stop: its processes were gone"),
    "RESUMING": Meaning(PROVISIONING, "lost", "being resumed: TPU VMs cannot suspend, so it was gone"),
    "STOPPING": Meaning(PROVISIONING, "lost", "being stopped"),
    "SUSPENDING": Meaning(PROVISIONING, "lost", "being suspended: TPU VMs cannot"),
    "ABANDONING": Meaning(PROVISIONING, "lost", "being taken out of the group"),
    "DELETING": Meaning(RELEASING, "lost", "being deleted for good"),
}
# compute_v1.InstanceGroupManagerStatusAcceleratorTopology.State, every member: what a slice's
# interconnect (status.appliedAcceleratorTopologies[]) allows. Only ACTIVE lets a holding be ACTIVE.
TOPOLOGY_STATES: dict[str, str] = {
    "UNDEFINED_STATE": "in no state Compute Engine names",
    "ACTIVATING": "being activated: its VMs run, their chips are not linked yet",
    "ACTIVE": "active",
    "DEACTIVATING": "being deactivated",
    "FAILED": "failed",
    "INCOMPLETE": "incomplete: it cannot be activated with the VMs running",
    "REACTIVATING": "being reactivated",
}
_CREATING = frozenset({"CREATING", "CREATING_WITHOUT_RETRIES"})
_NO_ACTION = frozenset({"NONE", "UNDEFINED_CURRENT_ACTION", ""})

# lastAttempt error codes that mean no capacity now: wait (the zone wait then fails over) [RA].
STOCKOUT_PREFIX = "ZONE_RESOURCE_POOL_EXHAUSTED"
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED"})
# Where a quota is, as Compute Engine words it: "Quota 'TPU_V5P_CHIPS' exceeded. Limit: 8.0 in
# region us-east5.", a zone's "... in zone us-east5-a.", a global one "globally", as in
# "Quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0 globally." (fastai/course-v3#165). Only a
# region's names `quota_region`: a zone's full quota says nothing of the region's other zones,
# so the zone wait moves to the next zone as for a stockout.
# Both may be said at once, as the TPU API does ("Limit: 0,0 in region us-central1,zone us-central1-a").
_QUOTA_WHERE = re.compile(r"\b(region|zone) ([a-z]+-[a-z]+[0-9]+(?:-[a-z])?)\b")


@dataclass(frozen=True)
class Host:
    """One host as its MIG reports it (listManagedInstances), its name's VM as read (if any)."""

    name: str
    status: str  # Instance.Status name; "" when no VM exists
    action: str  # ManagedInstance.CurrentAction name
    errors: tuple[tuple[str, str], ...] = ()  # lastAttempt.errors (code, message)


@dataclass(frozen=True)
class Verdict:
    """One host's place: the holding state it allows, whether it is lost, and what it said."""

    state: HoldingState
    lost: bool
    detail: str = ""
    quota_region: str = ""  # the region whose quota its last creation exceeded
    host: bool = True  # False: what a MIG says of its hosts at once (a bulk MIG's progress check)


@dataclass(frozen=True)
class Interconnect:
    """One entry of a MIG's status.appliedAcceleratorTopologies: its slice's chips' links."""

    mig: str
    topology: str  # "4x4x4", as the workload policy names it
    state: str  # a TOPOLOGY_STATES name
    errors: tuple[tuple[str, str], ...] = ()  # stateDetails.error.errors (code, message)

    def said(self) -> str:
        why = TOPOLOGY_STATES.get(self.state, "in a state newer than this table")
        what = f"the interconnect of MIG {self.mig} (accelerator topology {self.topology}) is {self.state}: {why}"
        return what + "".join(f"; {code}: {message}" for code, message in self.errors)


def host(h: Host) -> Verdict:
    """Where one host stands. A host the MIG no longer creates and that has no VM ran and was
    deleted (a Spot VM preempted with DELETE; DO_NOTHING never makes it again): lost. Its last
    creation's errors: a stockout or a full quota is waiting for capacity, with Google's words;
    any other error waits too, saying so, so the engine's zone wait decides (never a guess)."""
    action = CURRENT_ACTIONS.get(h.action, Meaning(PROVISIONING, "ok", "an action newer than this table"))
    if action is not None:
        lost = action.verdict == "lost"
        return Verdict(action.state, lost, f"host {h.name} is {h.action}: {action.why}" if lost else "")
    if not h.status and h.action in _NO_ACTION:
        return Verdict(PROVISIONING, True, f"host {h.name} has no VM any more (preempted or deleted)")
    status = INSTANCE_STATUSES.get(h.status or "UNDEFINED_STATUS", Meaning(PROVISIONING, "ok", "unknown"))
    lost = status.verdict == "lost"
    if status.state == WAITING or (h.errors and h.action in _CREATING and status.state != ACTIVE):
        return Verdict(WAITING, lost, _said(f"host {h.name}", h.errors), quota_region(h.errors))
    return Verdict(status.state, lost, f"host {h.name} is {h.status}: {status.why}" if lost else "")


def bulk_waits(mig: str, errors: tuple[tuple[str, str], ...]) -> Verdict:
    """A bulk MIG whose creation is in progress, with its last progress check's errors: waiting,
    saying why as a host's lastAttempt would (quota and its region, stockout)."""
    return Verdict(WAITING, False, _said(f"the hosts of MIG {mig}", errors), quota_region(errors), host=False)


def _said(what: str, errors: tuple[tuple[str, str], ...]) -> str:
    """Creation errors as a sentence: quota named as such, stockouts as Google says."""
    if not errors:
        return ""
    code, message = errors[0]
    if code in QUOTA_CODES:
        return f"quota exhausted creating {what}: {code}: {message}"
    if code.startswith(STOCKOUT_PREFIX):
        return f"no capacity for {what}: {code}: {message}"
    return f"Compute Engine could not create {what} yet: {code}: {message}"


def quota_region(errors: tuple[tuple[str, str], ...]) -> str:
    """The region named by a QUOTA_EXCEEDED among creation errors ("in region R"); "" for a
    zone's quota ("in zone Z") or none."""
    for code, message in errors:
        for scope, where in _QUOTA_WHERE.findall(message) if code in QUOTA_CODES else ():
            if scope == "region":
                return str(where)
    return ""


@dataclass(frozen=True)
class HoldingReading:
    """A holding as the port says it: its state, why, how many hosts are lost, and the region
    whose full quota keeps a waiting host from being created ("" if none does)."""

    state: HoldingState
    detail: str
    lost_hosts: int
    quota_region: str = ""


def holding_state(
    verdicts: Iterable[Verdict],
    all_stable: bool,
    waiting_in_bulk: bool = False,
    interconnects: Iterable[Interconnect] = (),
) -> HoldingReading:
    """The least advanced of the hosts' states (ACTIVE only when every MIG is stable and every
    slice's interconnect ACTIVE too), the first detail of a host in that state, and the lost
    hosts. A MIG whose bulk creation is in progress is waiting for capacity as a whole [BULK].
    An interconnect that FAILED, or is INCOMPLETE with every host running, fails the holding:
    the slice cannot run a collective."""
    verdicts = list(verdicts)
    states = [v.state for v in verdicts] + ([WAITING] if waiting_in_bulk else [])
    if not states:
        states = [WAITING]  # a MIG with no managed instance yet
    state = min(states, key=_PRECEDENCE.index)
    running = state == ACTIVE and all_stable
    if state == ACTIVE and not all_stable:
        state = PROVISIONING
    detail = next((v.detail for v in verdicts if v.state == state and v.detail), "")
    lost = sum(1 for v in verdicts if v.lost)
    if not detail and lost:
        detail = next((v.detail for v in verdicts if v.lost and v.detail), "")
    hosts = [v for v in verdicts if v.host]
    came = sum(1 for v in hosts if v.state == ACTIVE and not v.lost)
    if state == WAITING and came:
        detail = f"{came} of {len(hosts)} hosts came; the others wait" + (f": {detail}" if detail else "")
    broken = [i for i in interconnects if i.state == "FAILED" or (i.state == "INCOMPLETE" and running)]
    unready = [i for i in interconnects if i.state != "ACTIVE"]
    if broken and state != RELEASING:
        state, detail = FAILED, broken[0].said()
    elif running and unready:
        state, detail = PROVISIONING, unready[0].said()
    region = next((v.quota_region for v in verdicts if v.state == WAITING and v.quota_region), "")
    return HoldingReading(state, detail, lost, region if state == WAITING else "")

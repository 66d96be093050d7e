"""The TPU model's queued resource under each Compute Engine slice: made when a lone VM or a MIG's
slice asks for hosts, taken away when it is deleted, and why one waiting has no chips yet. VMs and
MIGs share these rules, so they are a part of their own, given to both."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tpujobs.domain.platforms import ComputeShape
from tpujobs.local.simulator.clockwork import Clockwork
from tpujobs.local.simulator.compute_records import RUNTIME_VERSION, InstanceRecord
from tpujobs.local.simulator.fault_plan import FaultPlan
from tpujobs.local.simulator.quota_counts import compute_refusal, holdings, shortfall
from tpujobs.local.simulator.records import (
    Initiator,
    NodeState,
    QrState,
    QueuedResourceRecord,
    QueuedResourceRequest,
    SliceRequest,
    settled,
)
from tpujobs.local.simulator.world import World

STOCKOUT = "ZONE_RESOURCE_POOL_EXHAUSTED"
QUOTA = "QUOTA_EXCEEDED"


class Backings:
    """Back a Compute slice with a queued resource, take it away, say what holds one back.
    Callers hold the lock."""

    def __init__(self, world: World, clockwork: Clockwork, faults: FaultPlan) -> None:
        self._world = world
        self._clockwork = clockwork
        self._faults = faults  # the no-boot budget new slices draw on

    def back(self, vm: InstanceRecord, shape: ComputeShape, path: str, now: float) -> None:
        """A queued resource of the TPU model for the slice *vm* heads: it waits for chips of its
        pool, provisions and runs the hosts' startup script as a TPU node does."""
        account: Mapping[str, Any] = next(iter(vm.body.get("serviceAccounts") or []), {})
        template = {"metadata": dict(vm.metadata), "serviceAccount": {"email": account.get("email", "default")}}
        hosts_boot = not self._faults.take_no_boot()
        request = QueuedResourceRequest(
            slices=(SliceRequest(shape.accelerator_type, RUNTIME_VERSION, node_id=vm.backing, template=template),),
            spot=vm.spot,
            flex_start=vm.scheduling.get("provisioningModel") == "FLEX_START",
            reserved=vm.scheduling.get("provisioningModel") == "RESERVATION_BOUND",
            reservation_name=_reservation_of(vm.body),
        )
        self._world.put_qr(
            QueuedResourceRecord(
                project=vm.project,
                zone=vm.zone,
                qr_id=vm.backing,
                request=request,
                state=QrState.CREATING,
                initiator=Initiator.USER,
                create_time=self._world.wall_clock(),
                queue_number=self._world.count("queue"),
                next_at=now + self._world.config.accept_seconds,
                hosts_boot=hosts_boot,
                backing=path,
            )
        )

    def unback(self, qr_id: str, project: str, zone: str, now: float) -> None:
        """Take a Compute slice's queued resource away as a TPU delete does (its hosts get SIGTERM,
        SIGKILL after delete_grace_seconds); one that never got capacity just goes."""
        qr = self._world.qrs.get((project, zone, qr_id))
        if qr is None or qr.state is QrState.DELETING:
            return
        nodes = self._world.nodes_of(qr)
        if not nodes and not qr.holds_capacity:
            del self._world.qrs[(project, zone, qr_id)]
            self._world.dirty = True
            return
        for node in nodes:
            self._world.put_node(settled(node, state=NodeState.DELETING, health=""))
        deleting = self._world.put_qr(
            dataclasses.replace(qr, state=QrState.DELETING, next_at=now + self._world.config.deleting_seconds)
        )
        self._world.queue_hooks(self._world.on_stopped, deleting)
        self._clockwork.admit(now)

    def held_back_by(self, qr: QueuedResourceRecord) -> tuple[str, str]:
        """Why a waiting slice has no chips: the project's quota (counted as admission counts it,
        quota_counts), a full reservation, or else the zone's capacity."""
        short = shortfall(self._world.config.quota_book, holdings(self._world.qrs.values()), qr)
        if short is not None:
            return compute_refusal(short)
        return STOCKOUT, (
            f"The zone 'projects/{qr.project}/zones/{qr.zone}' does not have enough resources available to "
            "fulfill the request. Try a different zone, or try again later."
        )


def _reservation_of(body: Mapping[str, Any]) -> str:
    """The reservation a VM's reservationAffinity names (SPECIFIC_RESERVATION), or ""."""
    affinity = body.get("reservationAffinity") or {}
    if not isinstance(affinity, Mapping) or affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION":
        return ""
    values = affinity.get("values") or []
    return str(values[0]) if isinstance(values, list) and values else ""

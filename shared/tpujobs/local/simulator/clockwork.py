"""Time in the simulator: every call first advances the world to now, applying due
transitions of queued resources and nodes in time order, and admitting waiting ones to free chips."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

from tpujobs.domain.accelerators import parse_accelerator_type
from tpujobs.domain.quotas import PoolKey
from tpujobs.local.simulator.errors import Code
from tpujobs.local.simulator.quota_counts import holdings, shortfall
from tpujobs.local.simulator.records import (
    FIRST_NODE_NUMBER,
    FIRST_WORKER_ADDRESS,
    MAINTENANCE_NONE,
    MEGASCALE_PORT,
    HostAction,
    NodeRecord,
    NodeState,
    NodeStep,
    QrState,
    QueuedResourceRecord,
    settled,
)
from tpujobs.local.simulator.world import World

# A timed step due: (when, kind, the record's number, the step to run at that time), the earliest first.
DueStep = tuple[float, int, int, Callable[[float], None]]


class Clockwork(World):
    """The timed transitions (callers hold the lock, except `advance`) and chip admission."""

    def advance(self) -> None:
        """Apply every transition due by now; the server's ticker calls this."""
        with self._transaction():
            pass

    @contextmanager
    def _transaction(self) -> Iterator[float]:
        """Hold the lock with the world advanced to now; then save, and run hooks outside the lock."""
        try:
            with self._lock:
                now = self._clock()
                self._advance(now)
                try:
                    yield now
                finally:
                    self._save_if_changed()
        finally:
            self._run_hooks()

    def _advance(self, now: float) -> None:
        """Apply every due step (`_due`) one at a time, earliest first, admitting after each:
        one event loop over all the records, so no kind of record runs ahead of another."""
        while True:
            due = self._due(now)
            if not due:
                break
            at, _, _, step = min(due, key=lambda entry: entry[:3])
            step(at)
            self._admit(at)
        self._admit(now)

    def _due(self, now: float) -> list[DueStep]:
        """The timed steps due by `now`: QRs' and nodes' (the Compute Engine model adds its own)."""
        due: list[DueStep] = [
            (qr.next_at, 0, qr.queue_number, partial(self._step, qr))
            for qr in self._qrs.values()
            if qr.next_at is not None and qr.next_at <= now
        ]
        due.extend(
            (node.next_at, 1, node.number, partial(self._step_node, node))
            for node in self._nodes.values()
            if node.next_at is not None and node.next_at <= now
        )
        return due

    def _step(self, qr: QueuedResourceRecord, at: float) -> None:
        """The timed transition of one QR, at the time it was due."""
        if qr.state is QrState.CREATING:
            accepted = self._put_qr(dataclasses.replace(qr, state=QrState.ACCEPTED, next_at=at))
            self._finish_create(accepted)
        elif qr.state is QrState.ACCEPTED:
            self._put_qr(
                dataclasses.replace(
                    qr,
                    state=QrState.WAITING_FOR_RESOURCES,
                    next_at=at + self._config.waiting_seconds,
                )
            )
        elif qr.state is QrState.WAITING_FOR_RESOURCES:
            self._put_qr(dataclasses.replace(qr, next_at=None))  # now it waits only for chips
        elif qr.state is QrState.PROVISIONING:
            for node in self._nodes_of(qr):
                self._put_node(dataclasses.replace(node, state=NodeState.READY, health="HEALTHY"))
            active = self._put_qr(dataclasses.replace(qr, state=QrState.ACTIVE, next_at=None))
            self._queue_hooks(self.on_active, active)
        elif qr.state is QrState.SUSPENDING:
            self._put_qr(dataclasses.replace(qr, state=QrState.SUSPENDED, next_at=None))
        elif qr.state is QrState.DELETING:
            self._remove(qr)
        else:  # pragma: no cover - no other state schedules a transition
            raise AssertionError(f"{qr.name} has a timed transition in state {qr.state}")

    def _step_node(self, node: NodeRecord, at: float) -> None:
        """The timed transition of one node (reboot, maintenance), at the time it was due."""
        qr = self._qrs.get((node.project, node.zone, node.qr_id))
        nodes = self._nodes_of(qr) if qr is not None else []
        if qr is None or qr.state is not QrState.ACTIVE or node not in nodes:
            self._put_node(settled(node))  # its QR moved on; the QR's own rules apply
            return
        index = nodes.index(node)
        every_host = tuple(range(len(node.host_addresses)))
        if node.step is NodeStep.REBOOTED:
            failed = tuple(w for w in node.failed_workers if w not in node.rebooting_workers)
            self._put_node(
                settled(
                    node,
                    state=NodeState.REPAIRING if failed else NodeState.READY,
                    health="UNHEALTHY_MAINTENANCE" if failed else "HEALTHY",
                    health_description=node.health_description if failed else "",
                    failed_workers=failed,
                )
            )
            self._queue_host_event(qr, index, node.rebooting_workers, HostAction.BOOT)
        elif node.step is NodeStep.MAINTENANCE_STARTS:
            announced = node.upcoming_maintenance
            self._put_node(
                dataclasses.replace(
                    node,
                    upcoming_maintenance=None if announced is None else {**announced, "maintenanceStatus": "ONGOING"},
                    state=NodeState.REPAIRING,
                    health="UNHEALTHY_MAINTENANCE",
                    health_description=(
                        "Host maintenance (simulated by tpujobs): the hosts were terminated "
                        "for it and restart when it ends"
                    ),
                    next_at=at + self._config.maintenance_seconds,
                    step=NodeStep.MAINTENANCE_ENDS,
                )
            )
            self._queue_host_event(qr, index, every_host, HostAction.SHUTDOWN)
        elif node.step is NodeStep.MAINTENANCE_ENDS:
            self._put_node(
                settled(
                    node,
                    state=NodeState.READY,
                    health="HEALTHY",
                    health_description="",
                    maintenance_event=MAINTENANCE_NONE,
                    upcoming_maintenance=None,
                    failed_workers=(),
                )
            )
            self._queue_host_event(qr, index, every_host, HostAction.BOOT)
        else:  # pragma: no cover - no other step schedules a transition
            raise AssertionError(f"{node.name} has a timed transition with no step")

    def _admit(self, at: float) -> None:
        """Start provisioning waiting QRs whose chips are free, strictly in order of arrival within
        each limit, as admission orders jobs: a QR held back by capacity or by a region's quota
        (or a reservation's size) holds back the later ones of its pool; one held back by its
        zone's quota only the later ones of that zone."""
        waiting = sorted(
            (qr for qr in self._qrs.values() if qr.state is QrState.WAITING_FOR_RESOURCES and qr.next_at is None),
            key=lambda r: r.queue_number,
        )
        if not waiting:
            return
        free = self._free_chips()
        held = holdings(self._qrs.values())
        book = self._config.quota_book
        blocked: set[str] = set()  # limited capacity pools where an earlier QR is still waiting
        blocked_quota: set[tuple[PoolKey, str]] = set()  # (pool, zone), or (pool, "") for all its zones
        for qr in waiting:
            wanted = qr.demand(self._separate_pools())
            quota_wanted = qr.quota_demand()
            if not blocked.isdisjoint(wanted) or any(
                (p, z) in blocked_quota for p in quota_wanted for z in ("", qr.zone)
            ):
                continue  # an earlier QR waits for the same chips
            if not all(pool not in free or free[pool] >= chips for pool, chips in wanted.items()):
                blocked.update(pool for pool in wanted if pool in free)
                continue
            short = shortfall(book, held, qr)
            if short is not None:
                blocked_quota.add((short.pool, qr.zone if short.scope == "zone" else ""))
                continue
            for pool, chips in wanted.items():
                if pool in free:
                    free[pool] -= chips
            for key, chips in quota_wanted.items():
                held.setdefault(key, []).append((qr.zone, chips))
            self._provision(qr, at)

    def _separate_pools(self) -> frozenset[str]:
        return frozenset(self._config.capacity)

    def _free_chips(self) -> dict[str, int]:
        """Chips free per limited capacity pool (the zone's chips on offer), less what is held."""
        free = dict(self._config.capacity)
        for qr in self._qrs.values():
            if qr.holds_capacity:
                for pool, chips in qr.demand(self._separate_pools()).items():
                    if pool in free:
                        free[pool] -= chips
        return free

    def _provision(self, qr: QueuedResourceRecord, at: float) -> None:
        wall = self._wall_clock()
        for spec in qr.request.slices:
            hosts = parse_accelerator_type(spec.accelerator_type).hosts
            coordinator = ""
            for slice_id, node_id in enumerate(spec.node_ids):
                addresses = tuple(str(FIRST_WORKER_ADDRESS + self._count("address")) for _ in range(hosts))
                if spec.multislice and slice_id == 0:
                    coordinator = f"{addresses[0]}:{MEGASCALE_PORT}"
                self._put_node(
                    NodeRecord(
                        project=qr.project,
                        zone=qr.zone,
                        node_id=node_id,
                        qr_id=qr.qr_id,
                        number=FIRST_NODE_NUMBER + self._count("node"),
                        accelerator_type=spec.accelerator_type,
                        runtime_version=spec.runtime_version,
                        template=spec.template,
                        state=NodeState.CREATING,
                        host_addresses=addresses,
                        create_time=wall,
                        multislice=spec.multislice,
                        spot=qr.request.spot,
                        slice_id=slice_id if spec.multislice else 0,
                        num_slices=spec.node_count if spec.multislice else 0,
                        coordinator_address=coordinator,
                    )
                )
        self._put_qr(
            dataclasses.replace(
                qr,
                state=QrState.PROVISIONING,
                next_at=at + self._config.provisioning_seconds,
                holds_capacity=True,
            )
        )

    def _remove(self, qr: QueuedResourceRecord) -> None:
        for node in self._nodes_of(qr):
            del self._nodes[(node.project, node.zone, node.node_id)]
        del self._qrs[(qr.project, qr.zone, qr.qr_id)]
        self._dirty = True
        self._finish_create(qr, error=(Code.ABORTED.grpc_code, f"{qr.name} was deleted before it was accepted"))
        key = (qr.project, qr.zone, qr.delete_operation)
        if key in self._operations:  # a Compute Engine slice's queued resource has no TPU operation
            self._operations[key] = dataclasses.replace(self._operations[key], done=True, end_time=self._wall_clock())

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


class Clockwork:
    """The timed transitions (callers hold the lock, except `advance`) and chip admission.

    Other parts join the event loop by registering: `add_due_source` for their own timed steps,
    `on_qr_step` to follow a queued resource's timed transition, `on_advanced` for work done
    once the world is up to date."""

    def __init__(self, world: World) -> None:
        self._world = world
        self._due_sources: list[Callable[[float], list[DueStep]]] = []
        self._qr_step_listeners: list[Callable[[QueuedResourceRecord, float], None]] = []
        self._advanced_listeners: list[Callable[[float], None]] = []

    def add_due_source(self, source: Callable[[float], list[DueStep]]) -> None:
        """*source(now)* names the part's timed steps due by now; they run in time order with the rest."""
        self._due_sources.append(source)

    def on_qr_step(self, listener: Callable[[QueuedResourceRecord, float], None]) -> None:
        """Call *listener(qr, at)* after each timed transition of a queued resource (*qr* as it was)."""
        self._qr_step_listeners.append(listener)

    def on_advanced(self, listener: Callable[[float], None]) -> None:
        """Call *listener(now)* each time the world has been advanced to *now* (the lock held)."""
        self._advanced_listeners.append(listener)

    def advance(self) -> None:
        """Apply every transition due by now; the server's ticker calls this."""
        with self.transaction():
            pass

    @contextmanager
    def transaction(self) -> Iterator[float]:
        """Hold the lock with the world advanced to now; then save, and run hooks outside the lock."""
        try:
            with self._world.lock:
                now = self._world.clock()
                self._advance(now)
                try:
                    yield now
                finally:
                    self._world.save_if_changed()
        finally:
            self._world.run_hooks()

    def _advance(self, now: float) -> None:
        """Apply every due step (`_due`) one at a time, earliest first, admitting after each:
        one event loop over all the records, so no kind of record runs ahead of another."""
        while True:
            due = self._due(now)
            if not due:
                break
            at, _, _, step = min(due, key=lambda entry: entry[:3])
            step(at)
            self.admit(at)
        self.admit(now)
        for listener in self._advanced_listeners:
            listener(now)

    def _due(self, now: float) -> list[DueStep]:
        """The timed steps due by `now`: QRs' and nodes', and those of the registered sources."""
        due: list[DueStep] = [
            (qr.next_at, 0, qr.queue_number, partial(self._step, qr))
            for qr in self._world.qrs.values()
            if qr.next_at is not None and qr.next_at <= now
        ]
        due.extend(
            (node.next_at, 1, node.number, partial(self._step_node, node))
            for node in self._world.nodes.values()
            if node.next_at is not None and node.next_at <= now
        )
        for source in self._due_sources:
            due.extend(source(now))
        return due

    def _step(self, qr: QueuedResourceRecord, at: float) -> None:
        """The timed transition of one QR, at the time it was due; then its listeners."""
        self._qr_transition(qr, at)
        for listener in self._qr_step_listeners:
            listener(qr, at)

    def _qr_transition(self, qr: QueuedResourceRecord, at: float) -> None:
        if qr.state is QrState.CREATING:
            accepted = self._world.put_qr(dataclasses.replace(qr, state=QrState.ACCEPTED, next_at=at))
            self._world.finish_create(accepted)
        elif qr.state is QrState.ACCEPTED:
            self._world.put_qr(
                dataclasses.replace(
                    qr,
                    state=QrState.WAITING_FOR_RESOURCES,
                    next_at=at + self._world.config.waiting_seconds,
                )
            )
        elif qr.state is QrState.WAITING_FOR_RESOURCES:
            self._world.put_qr(dataclasses.replace(qr, next_at=None))  # now it waits only for chips
        elif qr.state is QrState.PROVISIONING:
            for node in self._world.nodes_of(qr):
                self._world.put_node(dataclasses.replace(node, state=NodeState.READY, health="HEALTHY"))
            active = self._world.put_qr(dataclasses.replace(qr, state=QrState.ACTIVE, next_at=None))
            self._world.queue_hooks(self._world.on_active, active)
        elif qr.state is QrState.SUSPENDING:
            self._world.put_qr(dataclasses.replace(qr, state=QrState.SUSPENDED, next_at=None))
        elif qr.state is QrState.DELETING:
            self._remove(qr)
        else:  # pragma: no cover - no other state schedules a transition
            raise AssertionError(f"{qr.name} has a timed transition in state {qr.state}")

    def _step_node(self, node: NodeRecord, at: float) -> None:
        """The timed transition of one node (reboot, maintenance), at the time it was due."""
        qr = self._world.qrs.get((node.project, node.zone, node.qr_id))
        nodes = self._world.nodes_of(qr) if qr is not None else []
        if qr is None or qr.state is not QrState.ACTIVE or node not in nodes:
            self._world.put_node(settled(node))  # its QR moved on; the QR's own rules apply
            return
        index = nodes.index(node)
        every_host = tuple(range(len(node.host_addresses)))
        if node.step is NodeStep.REBOOTED:
            failed = tuple(w for w in node.failed_workers if w not in node.rebooting_workers)
            self._world.put_node(
                settled(
                    node,
                    state=NodeState.REPAIRING if failed else NodeState.READY,
                    health="UNHEALTHY_MAINTENANCE" if failed else "HEALTHY",
                    health_description=node.health_description if failed else "",
                    failed_workers=failed,
                )
            )
            self._world.queue_host_event(qr, index, node.rebooting_workers, HostAction.BOOT)
        elif node.step is NodeStep.MAINTENANCE_STARTS:
            announced = node.upcoming_maintenance
            self._world.put_node(
                dataclasses.replace(
                    node,
                    upcoming_maintenance=None if announced is None else {**announced, "maintenanceStatus": "ONGOING"},
                    state=NodeState.REPAIRING,
                    health="UNHEALTHY_MAINTENANCE",
                    health_description=(
                        "Host maintenance (simulated by tpujobs): the hosts were terminated "
                        "for it and restart when it ends"
                    ),
                    next_at=at + self._world.config.maintenance_seconds,
                    step=NodeStep.MAINTENANCE_ENDS,
                )
            )
            self._world.queue_host_event(qr, index, every_host, HostAction.SHUTDOWN)
        elif node.step is NodeStep.MAINTENANCE_ENDS:
            self._world.put_node(
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
            self._world.queue_host_event(qr, index, every_host, HostAction.BOOT)
        else:  # pragma: no cover - no other step schedules a transition
            raise AssertionError(f"{node.name} has a timed transition with no step")

    def admit(self, at: float) -> None:
        """Start provisioning waiting QRs whose chips are free, strictly in order of arrival within
        each limit, as admission orders jobs: a QR held back by capacity or by a region's quota
        (or a reservation's size) holds back the later ones of its pool; one held back by its
        zone's quota only the later ones of that zone."""
        waiting = sorted(
            (qr for qr in self._world.qrs.values() if qr.state is QrState.WAITING_FOR_RESOURCES and qr.next_at is None),
            key=lambda r: r.queue_number,
        )
        if not waiting:
            return
        free = self._free_chips()
        held = holdings(self._world.qrs.values())
        book = self._world.config.quota_book
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
        return frozenset(self._world.config.capacity)

    def _free_chips(self) -> dict[str, int]:
        """Chips free per limited capacity pool (the zone's chips on offer), less what is held."""
        free = dict(self._world.config.capacity)
        for qr in self._world.qrs.values():
            if qr.holds_capacity:
                for pool, chips in qr.demand(self._separate_pools()).items():
                    if pool in free:
                        free[pool] -= chips
        return free

    def _provision(self, qr: QueuedResourceRecord, at: float) -> None:
        wall = self._world.wall_clock()
        for spec in qr.request.slices:
            hosts = parse_accelerator_type(spec.accelerator_type).hosts
            coordinator = ""
            for slice_id, node_id in enumerate(spec.node_ids):
                addresses = tuple(str(FIRST_WORKER_ADDRESS + self._world.count("address")) for _ in range(hosts))
                if spec.multislice and slice_id == 0:
                    coordinator = f"{addresses[0]}:{MEGASCALE_PORT}"
                self._world.put_node(
                    NodeRecord(
                        project=qr.project,
                        zone=qr.zone,
                        node_id=node_id,
                        qr_id=qr.qr_id,
                        number=FIRST_NODE_NUMBER + self._world.count("node"),
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
        self._world.put_qr(
            dataclasses.replace(
                qr,
                state=QrState.PROVISIONING,
                next_at=at + self._world.config.provisioning_seconds,
                holds_capacity=True,
            )
        )

    def _remove(self, qr: QueuedResourceRecord) -> None:
        for node in self._world.nodes_of(qr):
            del self._world.nodes[(node.project, node.zone, node.node_id)]
        del self._world.qrs[(qr.project, qr.zone, qr.qr_id)]
        self._world.dirty = True
        self._world.finish_create(qr, error=(Code.ABORTED.grpc_code, f"{qr.name} was deleted before it was accepted"))
        key = (qr.project, qr.zone, qr.delete_operation)
        if key in self._world.operations:  # a Compute Engine slice's queued resource has no TPU operation
            self._world.operations[key] = dataclasses.replace(
                self._world.operations[key], done=True, end_time=self._world.wall_clock()
            )

"""The TPU API's nodes and what happens to their hosts: get and list nodes (updates in
`node_updates`); kill, reboot or maintain its hosts; change the health or state it shows
(tpujobs dev fault)."""

from __future__ import annotations

import dataclasses

from tpujobs.local.simulator.clockwork import Clockwork
from tpujobs.local.simulator.errors import Code, SimulatorError
from tpujobs.local.simulator.node_power import NodePower
from tpujobs.local.simulator.records import (
    NODE_HEALTHS,
    HostAction,
    NodeRecord,
    NodeState,
    NodeStep,
    Page,
    QrState,
    QueuedResourceRecord,
    backs_compute,
)
from tpujobs.local.simulator.world import World, in_location, paged


class Nodes:
    """Nodes, their hosts and what they show; UpdateNode is `NodeUpdates`'; stop, start and
    simulated maintenance `NodePower`'s, whose maintenance rules these verbs apply too."""

    def __init__(self, world: World, clockwork: Clockwork, power: NodePower) -> None:
        self._world = world
        self._clockwork = clockwork
        self._power = power

    def get_node(self, project: str, zone: str, node_id: str) -> NodeRecord:
        with self._clockwork.transaction():
            node = self._world.nodes.get((project, zone, node_id))
            if node is None or backs_compute(node.qr_id):
                raise SimulatorError(
                    Code.NOT_FOUND,
                    f"Resource 'projects/{project}/locations/{zone}/nodes/{node_id}' was not found",
                )
            return node

    def list_nodes(self, project: str, zone: str, page_size: int = 0, page_token: str = "") -> Page[NodeRecord]:
        with self._clockwork.transaction():
            found = [n for n in self._world.nodes.values() if in_location(n, project, zone)]
        return paged(found, page_size or self._world.config.default_page_size, page_token)

    def nodes_of(self, qr: QueuedResourceRecord) -> tuple[NodeRecord, ...]:
        """The nodes a QR has now, in the order its node specs name them; for hooks."""
        with self._world.lock:
            return tuple(self._world.nodes_of(qr))

    def kill_host(
        self,
        qr_id: str,
        slice_index: int,
        worker: int,
        *,
        zone: str | None = None,
        project: str | None = None,
    ) -> NodeRecord:
        """One worker host of an ACTIVE QR dies without notice: its node turns REPAIRING.

        The QR stays ACTIVE and the metadata says nothing; on_host_failed hooks kill the
        worker's processes. *slice_index* counts nodes in the order the node specs name them.
        """
        with self._clockwork.transaction():
            qr = self._world.resolve(qr_id, zone, project)
            if qr.state is not QrState.ACTIVE:
                raise SimulatorError(
                    Code.FAILED_PRECONDITION,
                    f"Queued resource {qr.name} is {qr.state.value}; only an ACTIVE one has hosts to kill",
                )
            nodes = self._world.nodes_of(qr)
            if not 0 <= slice_index < len(nodes):
                raise SimulatorError(
                    Code.INVALID_ARGUMENT,
                    f"{qr.name} has slices 0..{len(nodes) - 1}, not {slice_index}",
                )
            node = nodes[slice_index]
            if not 0 <= worker < len(node.host_addresses):
                raise SimulatorError(
                    Code.INVALID_ARGUMENT,
                    f"node {node.node_id} has workers 0..{len(node.host_addresses) - 1}, not {worker}",
                )
            failed = tuple(sorted({*node.failed_workers, worker}))
            workers = ", ".join(str(w) for w in failed)
            repairing = dataclasses.replace(
                node,
                state=NodeState.REPAIRING,
                failed_workers=failed,
                health="UNHEALTHY_MAINTENANCE",
                health_description=(
                    f"Worker {workers} of this node failed (hardware failure simulated by "
                    "tpujobs); the node is being repaired"
                ),
            )
            self._world.put_node(repairing)
            self._world.queue_hooks(self._world.on_host_failed, qr, slice_index, worker)
            return repairing

    def reboot(
        self,
        qr_id: str,
        slice_index: int | None = None,
        worker: int | None = None,
        *,
        zone: str | None = None,
        project: str | None = None,
    ) -> tuple[NodeRecord, ...]:
        """Reset hosts as a VM reset does: their processes die at once (on_hosts RESET), the
        node is RESTARTING for reboot_seconds, then READY and the hosts boot again from the
        same disk (on_hosts BOOT). No slice: every slice; no worker: every host of the slice."""
        with self._clockwork.transaction() as now:
            qr, chosen = self._active_nodes(qr_id, slice_index, zone, project, "reboot")
            plan = [(index, node, self._workers_of(node, worker)) for index, node in chosen]
            for _, node, _ in plan:
                if node.step in (NodeStep.MAINTENANCE_STARTS, NodeStep.MAINTENANCE_ENDS):
                    raise SimulatorError(
                        Code.FAILED_PRECONDITION,
                        f"node {node.node_id} is under host maintenance, or has one announced; it cannot reboot now",
                    )
                self._power.refuse_stopped(node, "reboot")
            changed = []
            for index, node, workers in plan:
                restarting = dataclasses.replace(
                    node,
                    state=NodeState.RESTARTING,
                    health="",
                    health_description="",
                    next_at=now + self._world.config.reboot_seconds,
                    step=NodeStep.REBOOTED,
                    rebooting_workers=tuple(sorted({*node.rebooting_workers, *workers})),
                )
                self._world.put_node(restarting)
                changed.append(restarting)
                self._world.queue_host_event(qr, index, workers, HostAction.RESET)
            return tuple(changed)

    def maintenance(
        self,
        qr_id: str,
        slice_index: int | None = None,
        notice_seconds: float | None = None,
        *,
        zone: str | None = None,
        project: str | None = None,
    ) -> tuple[NodeRecord, ...]:
        """Host maintenance as GCE announces it to a VM that terminates for it: the nodes'
        instance/maintenance-event turns TERMINATE_ON_HOST_MAINTENANCE now; after the notice
        (default maintenance_notice_seconds) the node is REPAIRING with health
        UNHEALTHY_MAINTENANCE and its hosts shut down (on_hosts SHUTDOWN); maintenance_seconds
        later it is READY, the event NONE, and the hosts boot again (on_hosts BOOT)."""
        notice = self._world.config.maintenance_notice_seconds if notice_seconds is None else notice_seconds
        with self._clockwork.transaction() as now:
            _, chosen = self._active_nodes(qr_id, slice_index, zone, project, "go into maintenance")
            return self._power.announce_maintenance(chosen, notice, now)

    def schedule_maintenance_window(
        self,
        qr_id: str,
        slice_index: int | None = None,
        notice_seconds: float = 3600.0,
        window_seconds: float = 3600.0,
        *,
        zone: str | None = None,
        project: str | None = None,
    ) -> tuple[NodeRecord, ...]:
        """Host maintenance announced ahead, as Google announces it to TPU VMs: each node's
        `upcomingMaintenance` (SCHEDULED, PENDING) and its hosts' instance/upcoming-maintenance
        name a window starting in *notice_seconds*; instance/maintenance-event stays NONE (TPU
        VMs get none). When the window starts the maintenance runs as `maintenance` runs it after
        its notice (REPAIRING, hosts shut down, READY maintenance_seconds later), the field
        ONGOING meanwhile and cleared after. No slice: every slice."""
        with self._clockwork.transaction() as now:
            _, chosen = self._active_nodes(qr_id, slice_index, zone, project, "get a maintenance window")
            return self._power.schedule_window(chosen, notice_seconds, window_seconds, now)

    def set_node_health(
        self,
        qr_id: str,
        health: str,
        description: str = "",
        slice_index: int | None = None,
        *,
        zone: str | None = None,
        project: str | None = None,
    ) -> tuple[NodeRecord, ...]:
        """Show *health* (a Node.Health name) and *description* on a QR's nodes; nothing else
        changes: processes run on, and the next transition of the node sets its own health."""
        name = str(health).strip().upper()
        if name not in NODE_HEALTHS:
            raise SimulatorError(
                Code.INVALID_ARGUMENT,
                f"health must be one of {', '.join(NODE_HEALTHS)}, got {health!r}",
            )
        with self._clockwork.transaction():
            qr = self._world.resolve(qr_id, zone, project)
            changed = []
            for _, node in self._chosen_nodes(qr, slice_index):
                shown = dataclasses.replace(
                    node,
                    health="" if name == "HEALTH_UNSPECIFIED" else name,
                    health_description=description,
                )
                self._world.put_node(shown)
                changed.append(shown)
            return tuple(changed)

    def set_node_state(
        self,
        qr_id: str,
        state: str,
        slice_index: int | None = None,
        *,
        zone: str | None = None,
        project: str | None = None,
    ) -> tuple[NodeRecord, ...]:
        """Show *state* (a Node.State name) on a QR's nodes; nothing else changes: processes
        run on, and a reboot or maintenance under way still ends as it would."""
        try:
            wanted = NodeState(str(state).strip().upper())
        except ValueError:
            names = ", ".join(member.value for member in NodeState)
            raise SimulatorError(Code.INVALID_ARGUMENT, f"state must be one of {names}, got {state!r}") from None
        with self._clockwork.transaction():
            qr = self._world.resolve(qr_id, zone, project)
            changed = []
            for _, node in self._chosen_nodes(qr, slice_index):
                shown = dataclasses.replace(node, state=wanted)
                self._world.put_node(shown)
                changed.append(shown)
            return tuple(changed)

    def _active_nodes(
        self,
        qr_id: str,
        slice_index: int | None,
        zone: str | None,
        project: str | None,
        doing: str,
    ) -> tuple[QueuedResourceRecord, list[tuple[int, NodeRecord]]]:
        qr = self._world.resolve(qr_id, zone, project)
        if qr.state is not QrState.ACTIVE:
            raise SimulatorError(
                Code.FAILED_PRECONDITION,
                f"Queued resource {qr.name} is {qr.state.value}; only an ACTIVE one has hosts to {doing}",
            )
        return qr, self._chosen_nodes(qr, slice_index)

    def _chosen_nodes(self, qr: QueuedResourceRecord, slice_index: int | None) -> list[tuple[int, NodeRecord]]:
        """(slice index, node) of one slice, or of every slice when *slice_index* is None."""
        nodes = list(enumerate(self._world.nodes_of(qr)))
        if not nodes:
            raise SimulatorError(Code.FAILED_PRECONDITION, f"Queued resource {qr.name} has no nodes")
        if slice_index is None:
            return nodes
        if not 0 <= slice_index < len(nodes):
            raise SimulatorError(
                Code.INVALID_ARGUMENT,
                f"{qr.name} has slices 0..{len(nodes) - 1}, not {slice_index}",
            )
        return [nodes[slice_index]]

    @staticmethod
    def _workers_of(node: NodeRecord, worker: int | None) -> tuple[int, ...]:
        hosts = len(node.host_addresses)
        if worker is None:
            return tuple(range(hosts))
        if not 0 <= worker < hosts:
            raise SimulatorError(
                Code.INVALID_ARGUMENT,
                f"node {node.node_id} has workers 0..{hosts - 1}, not {worker}",
            )
        return (worker,)

"""A node's own power and maintenance verbs of the TPU API: StopNode, StartNode (v2) and
SimulateMaintenanceEvent (v2alpha1), with the refusals of TPU VMs that Google documents: a Spot
or preemptible TPU cannot be stopped (it is deleted and created again), nor can a multi-host
slice (a TPU Pod). Only single-host, on-demand nodes stop and start. The rules of host
maintenance, now or announced ahead (`upcomingMaintenance`), live here too.

One divergence, on purpose: Google refuses to stop a node that a queued resource created; every
node of the simulator comes from one (it has no CreateNode), so it lets such a node stop, or gcloud's
``tpu-vm stop|start`` could never be tried against it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tpujobs.local.simulator.clockwork import Clockwork
from tpujobs.local.simulator.errors import Code, SimulatorError
from tpujobs.local.simulator.messages import timestamp
from tpujobs.local.simulator.records import (
    MAINTENANCE_TERMINATE,
    HostAction,
    NodeRecord,
    NodeState,
    NodeStep,
    OperationRecord,
    QrState,
    QueuedResourceRecord,
    backs_compute,
)
from tpujobs.local.simulator.world import World


class NodePower:
    """Stop, start and simulated maintenance of one node, by its TPU API name; the rules of
    announced maintenance and windows, which `Nodes` applies to a queued resource's nodes."""

    def __init__(self, world: World, clockwork: Clockwork) -> None:
        self._world = world
        self._clockwork = clockwork

    def stop_node(self, project: str, zone: str, node_id: str) -> OperationRecord:
        """StopNode: the hosts shut down (SIGTERM, then SIGKILL after delete_grace_seconds, as
        maintenance does) and the node is STOPPED at once; the operation is done, with the node
        as its response. Its QR stays ACTIVE and keeps the chips."""
        with self._clockwork.transaction():
            qr, index, node = self._own_node(project, zone, node_id, "stop")
            if node.preemptible:
                raise SimulatorError(
                    Code.FAILED_PRECONDITION,
                    f"Cannot stop node {node.name}: Spot and preemptible TPUs do not support stop; "
                    "delete the node and create it again.",
                )
            if len(node.host_addresses) > 1:
                raise SimulatorError(
                    Code.FAILED_PRECONDITION,
                    f"Cannot stop node {node.name}: {node.accelerator_type} is a multi-host TPU slice "
                    f"({len(node.host_addresses)} hosts); only single-host TPUs can be stopped.",
                )
            self._require(node, NodeState.READY, "stop")
            stopped = dataclasses.replace(node, state=NodeState.STOPPED, health="", health_description="")
            self._world.put_node(stopped)
            self._world.queue_host_event(qr, index, self._every_host(node), HostAction.SHUTDOWN)
            return self._done_operation(stopped, "stop")

    def start_node(self, project: str, zone: str, node_id: str) -> OperationRecord:
        """StartNode: a STOPPED node is STARTING for reboot_seconds, then READY, and its hosts
        boot again from the same disks (the startup script runs again, as after a reboot)."""
        with self._clockwork.transaction() as now:
            _, _, node = self._own_node(project, zone, node_id, "start")
            self._require(node, NodeState.STOPPED, "start")
            starting = dataclasses.replace(
                node,
                state=NodeState.STARTING,
                next_at=now + self._world.config.reboot_seconds,
                step=NodeStep.REBOOTED,  # when due: READY, and the hosts named below boot
                rebooting_workers=self._every_host(node),
                failed_workers=(),
            )
            self._world.put_node(starting)
            return self._done_operation(starting, "start")

    def simulate_maintenance_event(
        self, project: str, zone: str, node_id: str, worker_ids: Sequence[int] = ()
    ) -> OperationRecord:
        """SimulateMaintenanceEvent (v2alpha1): the maintenance `tpujobs dev fault maintenance`
        starts, on this node: instance/maintenance-event announces it, and after
        maintenance_notice_seconds the hosts go down. *worker_ids* must name hosts of the node;
        the whole node goes down, as the simulator maintains nodes, not single hosts."""
        with self._clockwork.transaction() as now:
            _, index, node = self._own_node(project, zone, node_id, "simulate maintenance on")
            hosts = len(node.host_addresses)
            wrong = sorted({w for w in worker_ids if not 0 <= w < hosts})
            if wrong:
                raise SimulatorError(
                    Code.INVALID_ARGUMENT,
                    f"node {node.node_id} has workers 0..{hosts - 1}, not {', '.join(map(str, wrong))}",
                )
            self._require(node, NodeState.READY, "simulate maintenance on")
            (announced,) = self.announce_maintenance(
                [(index, node)], self._world.config.maintenance_notice_seconds, now
            )
            return self._done_operation(announced, "simulateMaintenanceEvent")

    def announce_maintenance(
        self, chosen: list[tuple[int, NodeRecord]], notice: float, now: float
    ) -> tuple[NodeRecord, ...]:
        """Host maintenance as GCE announces it to a VM that terminates for it (see
        `Nodes.maintenance`); callers hold the lock. A node with a timed step under way is refused."""
        if notice < 0:
            raise SimulatorError(Code.INVALID_ARGUMENT, f"the notice must not be negative, got {notice}")
        self._refuse_busy(chosen, "go into maintenance")
        changed = []
        for _, node in chosen:
            announced = dataclasses.replace(
                node, maintenance_event=MAINTENANCE_TERMINATE, next_at=now + notice, step=NodeStep.MAINTENANCE_STARTS
            )
            self._world.put_node(announced)
            changed.append(announced)
        return tuple(changed)

    def schedule_window(
        self, chosen: list[tuple[int, NodeRecord]], notice: float, window: float, now: float
    ) -> tuple[NodeRecord, ...]:
        """Google's advance notice of a maintenance window (see `Nodes.schedule_maintenance_window`);
        callers hold the lock. A node with a timed step under way is refused, as `_announce_maintenance`
        refuses it."""
        if notice < 0 or window <= 0:
            raise SimulatorError(Code.INVALID_ARGUMENT, "the notice must not be negative, the window positive")
        self._refuse_busy(chosen, "get a maintenance window")
        start = self._world.wall_clock() + notice
        announced = {
            "type": "SCHEDULED",
            "canReschedule": True,
            "windowStartTime": timestamp(start),
            "windowEndTime": timestamp(start + window),
            "latestWindowStartTime": timestamp(start),
            "maintenanceStatus": "PENDING",
        }
        changed = []
        for _, node in chosen:
            scheduled = dataclasses.replace(
                node, upcoming_maintenance=announced, next_at=now + notice, step=NodeStep.MAINTENANCE_STARTS
            )
            self._world.put_node(scheduled)
            changed.append(scheduled)
        return tuple(changed)

    def _refuse_busy(self, chosen: list[tuple[int, NodeRecord]], doing: str) -> None:
        """Refuse nodes that are stopped or have a timed step (a reboot, a maintenance) under way."""
        for _, node in chosen:
            self.refuse_stopped(node, doing)
            if node.step is not NodeStep.NONE:
                raise SimulatorError(
                    Code.FAILED_PRECONDITION,
                    f"node {node.node_id} cannot {doing} now: {under_way(node)}; try again when that is over",
                )

    def _own_node(
        self, project: str, zone: str, node_id: str, doing: str
    ) -> tuple[QueuedResourceRecord, int, NodeRecord]:
        """The node by its TPU API name, its QR and its slice index; NOT_FOUND as GetNode answers,
        FAILED_PRECONDITION when its QR is not ACTIVE (the QR's own transition decides then)."""
        node = self._world.nodes.get((project, zone, node_id))
        qr = None if node is None else self._world.qrs.get((project, zone, node.qr_id))
        if node is None or qr is None or backs_compute(node.qr_id):
            raise SimulatorError(
                Code.NOT_FOUND, f"Resource 'projects/{project}/locations/{zone}/nodes/{node_id}' was not found"
            )
        if qr.state is not QrState.ACTIVE:
            raise SimulatorError(
                Code.FAILED_PRECONDITION,
                f"Cannot {doing} node {node.name}: its queued resource is {qr.state.value}",
            )
        return qr, self._world.nodes_of(qr).index(node), node

    @staticmethod
    def refuse_stopped(node: NodeRecord, doing: str) -> None:
        """A STOPPED or STARTING node has no hosts up to reset or to maintain."""
        if node.state in (NodeState.STOPPED, NodeState.STARTING):
            raise SimulatorError(
                Code.FAILED_PRECONDITION, f"node {node.node_id} is {node.state.value}; it cannot {doing} now"
            )

    @staticmethod
    def _require(node: NodeRecord, state: NodeState, doing: str) -> None:
        """FAILED_PRECONDITION naming the real reason: the node's state, or, in the right state,
        the timed step under way (a reboot, an announced maintenance, a scheduled window)."""
        if node.state is not state:
            raise SimulatorError(
                Code.FAILED_PRECONDITION,
                f"Cannot {doing} node {node.name}: it is {node.state.value}, and only a {state.value} node can be.",
            )
        if node.step is not NodeStep.NONE:
            raise SimulatorError(
                Code.FAILED_PRECONDITION,
                f"Cannot {doing} node {node.name}: {under_way(node)}; try again when that is over.",
            )

    @staticmethod
    def _every_host(node: NodeRecord) -> tuple[int, ...]:
        return tuple(range(len(node.host_addresses)))

    def _done_operation(self, node: NodeRecord, verb: str) -> OperationRecord:
        """An operation that is done at once, with *node* as its response."""
        operation = self._world.new_operation(node.project, node.zone, verb, node.name)
        finished = dataclasses.replace(operation, done=True, end_time=self._world.wall_clock(), node=node)
        self._world.operations[(node.project, node.zone, operation.operation_id)] = finished
        return finished


def under_way(node: NodeRecord) -> str:
    """What a node's timed step (`NodeRecord.step`) is, as a reason a verb cannot run now."""
    if node.step is NodeStep.REBOOTED:
        return f"it is {node.state.value}, its hosts rebooting"
    if node.step is NodeStep.MAINTENANCE_ENDS:
        return "its hosts are down for host maintenance"
    window = node.upcoming_maintenance.get("windowStartTime") if node.upcoming_maintenance else None
    if node.step is NodeStep.MAINTENANCE_STARTS and window:
        return f"a host maintenance window is scheduled for it, starting {window}"
    if node.step is NodeStep.MAINTENANCE_STARTS:
        return "a host maintenance event is announced for it and its hosts are about to go down"
    return f"it is {node.state.value} ({node.step.value} under way)"

"""UpdateNode as Google runs it: the operation takes `update_node_seconds`, a second update of
the node while one is in flight is 409 ABORTED (gcloud's `tpu-vm ssh` ignores that one), and
the new metadata reaches the hosts' metadata servers `metadata_propagation_seconds` after the
operation is done (gcloud's ssh retries while a new key propagates)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from tpujobs.local.simulator.checks import updated_template
from tpujobs.local.simulator.clockwork import Clockwork
from tpujobs.local.simulator.errors import Code, SimulatorError
from tpujobs.local.simulator.records import NodeRecord, NodeState, OperationRecord, backs_compute
from tpujobs.local.simulator.world import World


class NodeUpdates:
    """UpdateNode, its running operations, and what the hosts read meanwhile."""

    def __init__(self, world: World, clockwork: Clockwork) -> None:
        self._world = world
        self._clockwork = clockwork
        clockwork.on_advanced(self._advanced)
        # When each running update is done, by operation key, and what a node's hosts still read
        # while its last update propagates ((until, metadata) by node key), on the model's clock.
        # Neither is saved: after a restart a running update is done at once, and hosts read the node.
        self._update_due: dict[tuple[str, str, str], float] = {
            key: float("-inf") for key, op in self._world.operations.items() if op.verb == "update" and not op.done
        }
        self._served_before: dict[tuple[str, str, str], tuple[float, Mapping[str, str]]] = {}

    def update_node(
        self, project: str, zone: str, node_id: str, mask: Sequence[str], node: Mapping[str, Any]
    ) -> OperationRecord:
        """UpdateNode: the fields *mask* names (camelCase JSON paths, UPDATABLE_NODE_FIELDS) take
        *node*'s values when the operation is done, update_node_seconds later (its `node` is the
        node as it will be). A node that is not READY is FAILED_PRECONDITION, as the API refuses
        to change a node that is being created, repaired, preempted or deleted; a node with an
        update in flight is ABORTED (409)."""
        with self._clockwork.transaction() as now:
            found = self._world.nodes.get((project, zone, node_id))
            if found is not None and backs_compute(found.qr_id):
                found = None
            name = f"projects/{project}/locations/{zone}/nodes/{node_id}"
            template = updated_template(found.template if found else {}, mask, node)
            if found is None:
                raise SimulatorError(Code.NOT_FOUND, f"Resource '{name}' was not found")
            if found.state is not NodeState.READY:
                raise SimulatorError(
                    Code.FAILED_PRECONDITION,
                    f"Cannot update node {name}: it is {found.state.value}, and only a READY node can be updated.",
                )
            if any(
                self._world.operations[key].target == name for key in self._update_due if key in self._world.operations
            ):
                raise SimulatorError(
                    Code.ABORTED,
                    f"Cannot update node {name}: there is already an UpdateNode call in flight; try again later.",
                )
            operation = self._world.new_operation(project, zone, "update", name)
            running = dataclasses.replace(operation, node=dataclasses.replace(found, template=template))
            key = (project, zone, operation.operation_id)
            self._world.operations[key] = running
            self._update_due[key] = now + self._world.config.update_node_seconds
            self._land_updates(now)
            return self._world.operations[key]

    def host_node(self, project: str, zone: str, node_id: str) -> NodeRecord:
        """Any node (a Compute slice's included) as its hosts' metadata servers see it: with the
        metadata from before its last update until that update has propagated."""
        key = (project, zone, node_id)
        with self._clockwork.transaction():
            node = self._world.nodes.get(key)
            if node is None:
                raise SimulatorError(Code.NOT_FOUND, f"no node {node_id!r} in {project}/{zone}")
            before = self._served_before.get(key)
            if before is None:
                return node
            if self._world.clock() >= before[0]:
                del self._served_before[key]
                return node
        return dataclasses.replace(node, template={**node.template, "metadata": dict(before[1])})

    def _advanced(self, now: float) -> None:
        self._land_updates(now)
        self._propagate(now)

    def _propagate(self, now: float) -> None:
        """Updates whose propagation time is up reach the hosts: a change, announced, so a held
        `wait_for_change` answers at once (else it would wait out its next check, a second)."""
        for key, (until, _) in list(self._served_before.items()):
            if now >= until:
                del self._served_before[key]
                self._world.dirty = True

    def _land_updates(self, now: float) -> None:
        """Finish every update whose time is up: the node takes the template it asked for (a
        node gone meanwhile fails the operation with NOT_FOUND). Callers hold the lock."""
        wall = self._world.wall_clock()
        for key, due in list(self._update_due.items()):
            if due > now:
                continue
            del self._update_due[key]
            op = self._world.operations.get(key)
            if op is None or op.done or op.node is None:
                continue
            asked = op.node
            node = self._world.nodes.get((asked.project, asked.zone, asked.node_id))
            if node is None or node.qr_id != asked.qr_id:
                self._world.operations[key] = dataclasses.replace(
                    op,
                    done=True,
                    end_time=wall,
                    node=None,
                    error_code=Code.NOT_FOUND.grpc_code,
                    error_message=f"Resource '{op.target}' was not found",
                )
                self._world.dirty = True
                continue
            if self._world.config.metadata_propagation_seconds > 0:
                until = now + self._world.config.metadata_propagation_seconds
                self._served_before[(node.project, node.zone, node.node_id)] = (until, node.metadata)
            landed = dataclasses.replace(node, template=asked.template)
            self._world.put_node(landed)
            self._world.operations[key] = dataclasses.replace(op, done=True, end_time=wall, node=landed)

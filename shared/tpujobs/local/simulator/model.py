"""The simulated Cloud TPU service: queued resources, nodes and operations as a state machine.

The lifecycle rules (who gets capacity, when a queued resource turns ACTIVE, what a preemption does) live
here, apart from the HTTP server, so they test on a fake clock without sockets. Time moves lazily: every
public call first advances the world to ``clock()``, applying due transitions in time order. The model
starts no processes: ``workers.WorkerPool`` listens to its hooks. ``Simulator`` owns its parts (the
world's records, the clockwork, the fault plan, queued resources, nodes, Compute Engine); each part
is given the collaborators it calls and joins the clockwork's event loop by registering, so no part
reaches another through a shared ``self``. Callers use the part that answers
(``simulator.nodes.get_node(...)``); the few calls about the whole simulator stay on it.
The states and their timings: docs/local-stack.md#the-life-of-a-queued-resource.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tpujobs.local.simulator.checks import accelerator_type_of_config
from tpujobs.local.simulator.clockwork import Clockwork
from tpujobs.local.simulator.compute_engine import ComputeEngine
from tpujobs.local.simulator.errors import Code, SimulatorError, project_number
from tpujobs.local.simulator.fault_plan import FaultPlan
from tpujobs.local.simulator.node_power import NodePower
from tpujobs.local.simulator.node_updates import NodeUpdates
from tpujobs.local.simulator.nodes import Nodes
from tpujobs.local.simulator.queued_resources import QueuedResources
from tpujobs.local.simulator.records import (
    FIRST_NODE_NUMBER,
    FIRST_WORKER_ADDRESS,
    MEGASCALE_PORT,
    NODE_HEALTHS,
    WORKER_PORT,
    HostAction,
    HostEvent,
    Initiator,
    NodeRecord,
    NodeState,
    NodeStep,
    OperationRecord,
    Page,
    QrState,
    QueuedResourceRecord,
    QueuedResourceRequest,
    SimulatorConfig,
    SimulatorState,
    SliceRequest,
    compute_default_account,
    error_code,
)
from tpujobs.local.simulator.state_file import STATE_FILE_VERSION, JsonStateFile, StateStore
from tpujobs.local.simulator.world import World


class Simulator:
    """The simulated TPU service, and Compute Engine's TPU VMs on the same capacity and hosts:
    a world of records and the parts that act on it, each given the collaborators it needs.
    Thread-safe: the world's one lock guards all state.

    Hooks run outside the lock, one at a time, in the order their events happened; a call
    returns only after the hooks queued before it have run, so once a caller sees ACTIVE,
    on_active has finished. Hooks should therefore be quick (start processes, not wait on them).
    """

    def __init__(
        self,
        config: SimulatorConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        store: StateStore | None = None,
    ) -> None:
        self.world = World(config, clock=clock, wall_clock=wall_clock, store=store)
        self.clockwork = Clockwork(self.world)
        self.fault_plan = FaultPlan(self.world, self.clockwork)
        self.queued_resources = QueuedResources(self.world, self.clockwork, self.fault_plan)
        self.node_power = NodePower(self.world, self.clockwork)
        self.node_updates = NodeUpdates(self.world, self.clockwork)
        self.nodes = Nodes(self.world, self.clockwork, self.node_power)
        self.compute = ComputeEngine(self.world, self.clockwork, self.fault_plan)
        # The hooks' lists are the world's: appending here registers there.
        self.on_active = self.world.on_active
        self.on_stopped = self.world.on_stopped
        self.on_host_failed = self.world.on_host_failed
        self.on_hosts = self.world.on_hosts

    # What concerns the whole simulator, not one part: its settings, time, the TPU API's
    # state, and the change notices a held metadata request waits on (metadata.Changes).

    @property
    def config(self) -> SimulatorConfig:
        return self.world.config

    def advance(self) -> None:
        """Apply every transition due by now; the server's ticker calls this."""
        self.clockwork.advance()

    def state(self) -> SimulatorState:
        """Everything of the TPU API, sorted by name: for the state endpoint and for tests."""
        return self.queued_resources.state()

    def generation(self) -> int:
        return self.world.generation()

    def wait_for_change(self, seen: int, timeout: float) -> int:
        return self.world.wait_for_change(seen, timeout)

    def wake_waiters(self) -> None:
        self.world.wake_waiters()


__all__ = [  # what the server, the workers and the tests use, wherever it is defined
    "FIRST_NODE_NUMBER",
    "FIRST_WORKER_ADDRESS",
    "MEGASCALE_PORT",
    "NODE_HEALTHS",
    "STATE_FILE_VERSION",
    "WORKER_PORT",
    "Code",
    "HostAction",
    "HostEvent",
    "Initiator",
    "JsonStateFile",
    "NodeRecord",
    "NodeState",
    "NodeStep",
    "OperationRecord",
    "Page",
    "QrState",
    "QueuedResourceRecord",
    "QueuedResourceRequest",
    "Simulator",
    "SimulatorConfig",
    "SimulatorError",
    "SimulatorState",
    "SliceRequest",
    "StateStore",
    "accelerator_type_of_config",
    "compute_default_account",
    "error_code",
    "project_number",
]

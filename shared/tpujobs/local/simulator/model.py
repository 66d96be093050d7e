"""The simulated Cloud TPU service: queued resources, nodes and operations as a state machine.

The lifecycle rules (who gets capacity, when a queued resource turns ACTIVE, what a preemption does) live
here, apart from the HTTP server, so they test on a fake clock without sockets. Time moves lazily: every
public call first advances the world to ``clock()``, applying due transitions in time order. The model
starts no processes: ``workers.WorkerPool`` listens to its hooks. Each part (``queued_resources``,
``nodes``, ``fault_plan``, ``clockwork``) is a module over ``world.World``'s shared state.
The states and their timings: docs/local-stack.md#the-life-of-a-queued-resource.
"""

from __future__ import annotations

from tpujobs.local.simulator.checks import accelerator_type_of_config
from tpujobs.local.simulator.compute_faults import ComputeFaults
from tpujobs.local.simulator.compute_slices import ComputeSlices
from tpujobs.local.simulator.errors import Code, SimulatorError, project_number
from tpujobs.local.simulator.fault_plan import FaultPlan
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


class Simulator(QueuedResources, Nodes, FaultPlan, ComputeFaults, ComputeSlices):
    """The simulated TPU service, and Compute Engine's TPU VMs on the same capacity and hosts
    (``compute_model``). Thread-safe: one lock guards all state.

    Hooks run outside the lock, one at a time, in the order their events happened; a call
    returns only after the hooks queued before it have run, so once a caller sees ACTIVE,
    on_active has finished. Hooks should therefore be quick (start processes, not wait on them).
    """


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

"""A local Cloud TPU API: queued resources, nodes and operations, served over REST.

Why: the control plane must be tested against the real ``tpu_v2`` client without a
Google project or TPUs. The simulator speaks the v2 REST API closely enough for that client,
moves queued resources through their real states on a clock, rations chips per pool, and lets
tests preempt, fail and inject API errors. ``model`` holds the rules, ``server`` the HTTP.
"""

from tpujobs.simulator.model import (
    Code,
    Initiator,
    JsonStateFile,
    NodeRecord,
    NodeState,
    OperationRecord,
    Page,
    QrState,
    QueuedResourceRecord,
    QueuedResourceRequest,
    Simulator,
    SimulatorConfig,
    SimulatorError,
    SimulatorState,
    SliceRequest,
    StateStore,
)
from tpujobs.simulator.server import SimulatorApi, SimulatorServer

__all__ = [
    "Code",
    "Initiator",
    "JsonStateFile",
    "NodeRecord",
    "NodeState",
    "OperationRecord",
    "Page",
    "QrState",
    "QueuedResourceRecord",
    "QueuedResourceRequest",
    "Simulator",
    "SimulatorApi",
    "SimulatorConfig",
    "SimulatorError",
    "SimulatorServer",
    "SimulatorState",
    "SliceRequest",
    "StateStore",
]

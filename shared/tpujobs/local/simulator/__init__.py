"""A local Cloud TPU API: queued resources, nodes and operations, served over REST.

Why: the control plane must be tested against the real ``tpu_v2`` client without a
Google project or TPUs. The simulator speaks the v2 REST API closely enough for that client,
moves queued resources through their real states on a clock, rations chips per pool, and lets
tests preempt, fail, kill, reboot and maintain hosts, change what nodes show and inject API
errors (``tpujobs dev fault``). ``model`` holds the rules (its parts: ``queued_resources``,
``nodes``, ``fault_plan``, ``clockwork``, over ``world``; data in ``records``, request checks in
``checks``), ``server`` the HTTP (routes in ``http``, bodies read by ``messages``), ``errors``
Google's error bodies, ``fields`` its field masks, ``workers`` runs each worker host's startup
script as a local process and ``metadata`` answers those processes as GCE's metadata server
would; ``secret_manager`` is a local Secret Manager.
"""

from tpujobs.local.simulator.errors import Code, Fault
from tpujobs.local.simulator.metadata import MetadataReply, MetadataService, metadata_url
from tpujobs.local.simulator.model import (
    NODE_HEALTHS,
    HostAction,
    HostEvent,
    Initiator,
    JsonStateFile,
    NodeRecord,
    NodeState,
    NodeStep,
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
from tpujobs.local.simulator.server import SimulatorApi, SimulatorServer
from tpujobs.local.simulator.workers import StopReason, WorkerInfo, WorkerPool

__all__ = [
    "NODE_HEALTHS",
    "Code",
    "Fault",
    "HostAction",
    "HostEvent",
    "Initiator",
    "JsonStateFile",
    "MetadataReply",
    "MetadataService",
    "NodeRecord",
    "NodeState",
    "NodeStep",
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
    "StopReason",
    "WorkerInfo",
    "WorkerPool",
    "metadata_url",
]

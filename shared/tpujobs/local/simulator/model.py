"""The simulated Cloud TPU service: queued resources, nodes and operations as a state machine.

Why a model apart from the HTTP server: the lifecycle rules (who gets capacity, when a
queued resource turns ACTIVE, what preemption does) are the part worth testing, and they
test best with a fake clock and no sockets. The server only translates JSON.

Why time moves lazily: every public call first advances the world to ``clock()``, applying
due transitions in time order, so a fake clock gives exact, repeatable histories. The
server's ticker calls ``advance()`` too, so changes (and hooks) happen with nobody asking.

The life of a queued resource (QR); each arrow happens at the time shown:

    CREATING --accept_seconds--> ACCEPTED            the create operation completes
    ACCEPTED --at once--> WAITING_FOR_RESOURCES
    WAITING_FOR_RESOURCES --waiting_seconds, then chips free, first come first served-->
        PROVISIONING                                  nodes appear, CREATING
    PROVISIONING --provisioning_seconds--> ACTIVE     nodes READY; on_active hooks
    PROVISIONING, ACTIVE --preempt()--> SUSPENDING    nodes PREEMPTED, their metadata
                                                      preempted=TRUE; on_stopped hooks
    SUSPENDING --suspending_seconds--> SUSPENDED
    ACTIVE --kill_host()--> ACTIVE                    one worker host dies: its node REPAIRING;
                                                      on_host_failed hooks
    CREATING..ACTIVE --fail()--> FAILED               nodes gone; on_stopped hooks
    any state but DELETING --delete--> DELETING       on_stopped hooks
    DELETING --deleting_seconds--> gone               the delete operation completes

A QR holds the chips of its pools ("family@zone") from PROVISIONING until it is gone: a
SUSPENDED or FAILED one keeps them, as the real quota does, until someone deletes it.
Deleting without force is refused while the QR still has nodes, as the real API does.

A failed host (``kill_host``) is shown as the TPU API shows a slice under repair: the node's
state REPAIRING, its health UNHEALTHY_MAINTENANCE and a health description naming the dead
worker, while the QR stays ACTIVE (a broken host does not change the queued resource). The
simulator never finishes the repair; the control plane is expected to notice (by polling, or
by the missing worker's silence) and delete the QR.

Nodes of an ACTIVE QR have timed steps of their own (``tpujobs dev fault``):

    READY --reboot()--> RESTARTING --reboot_seconds--> READY     on_hosts RESET, then BOOT
    READY --maintenance()--> READY, instance/maintenance-event TERMINATE_ON_HOST_MAINTENANCE
          --notice--> REPAIRING, UNHEALTHY_MAINTENANCE            on_hosts SHUTDOWN
          --maintenance_seconds--> READY, event NONE              on_hosts BOOT

``update_node`` (the API's UpdateNode) replaces a READY node's description, tags, labels,
metadata or external-IP setting at once; its hosts' metadata servers answer the new values,
and every change of state wakes the metadata requests held on it (``wait_for_change``).
``set_node_health`` and ``set_node_state`` only change what the API shows. ``no_boot`` gives
QRs hosts that never run their startup script. ``inject_errors`` plans the errors the next
calls of one API method answer with (``errors.Fault``); ``api_error_rate`` rolls dice for all.

The model starts no processes: ``workers.WorkerPool`` listens to the hooks and does that.

Each part is a class of its own module, over the shared state of ``world.World``:
``queued_resources``, ``nodes``, ``fault_plan`` and ``clockwork`` (time); the records are in
``records``, a request's checks in ``checks``, the state file in ``state_file``.
"""

from __future__ import annotations

from tpujobs.local.simulator.checks import accelerator_type_of_config
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


class Simulator(QueuedResources, Nodes, FaultPlan):
    """The simulated TPU service. Thread-safe: one lock guards all state.

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

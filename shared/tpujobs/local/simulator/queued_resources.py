"""The TPU API's queued resources and operations: create, get, list, delete, and what the
service does to them (preempt, fail)."""

from __future__ import annotations

import dataclasses

from tpujobs.domain.accelerators import UnknownAcceleratorType, parse_accelerator_type
from tpujobs.domain.platforms import TPU_API, platform_refusal
from tpujobs.local.simulator.checks import check_resource_id, check_vm_options
from tpujobs.local.simulator.clockwork import Clockwork
from tpujobs.local.simulator.errors import Code, SimulatorError, bad_request
from tpujobs.local.simulator.fault_plan import FaultPlan
from tpujobs.local.simulator.records import (
    LIVE_STATES,
    PREEMPTIBLE_STATES,
    Initiator,
    NodeState,
    OperationRecord,
    Page,
    QrState,
    QueuedResourceRecord,
    QueuedResourceRequest,
    SimulatorState,
    backs_compute,
    settled,
)
from tpujobs.local.simulator.world import World, in_location, paged

# queuedResources.delete without force: "the queued resource will only be deleted if its nodes
# have already been deleted or the queued resource is in the ACCEPTED, FAILED, or SUSPENDED
# state" (tpu_v2 DeleteQueuedResourceRequest.force).
PLAIN_DELETE_STATES = frozenset({QrState.ACCEPTED, QrState.FAILED, QrState.SUSPENDED})


class QueuedResources:
    """Queued resources and their operations, as the TPU API serves them."""

    def __init__(self, world: World, clockwork: Clockwork, faults: FaultPlan) -> None:
        self._world = world
        self._clockwork = clockwork
        self._faults = faults  # the no-boot budget new queued resources draw on

    def create_queued_resource(
        self, project: str, zone: str, qr_id: str, request: QueuedResourceRequest
    ) -> OperationRecord:
        """Queue a request for TPUs; the operation completes once the QR is ACCEPTED."""
        check_resource_id("queued resource id", qr_id)
        self._check_request(request, zone)
        with self._clockwork.transaction() as now:
            name = f"projects/{project}/locations/{zone}/queuedResources/{qr_id}"
            if (project, zone, qr_id) in self._world.qrs:
                raise SimulatorError(Code.ALREADY_EXISTS, f"Resource '{name}' already exists")
            taken = {
                node_id
                for qr in self._world.qrs.values()
                if (qr.project, qr.zone) == (project, zone)
                for node_id in qr.node_ids
            }
            for node_id in (n for spec in request.slices for n in spec.node_ids):
                if node_id in taken:
                    raise SimulatorError(
                        Code.ALREADY_EXISTS,
                        f"Resource 'projects/{project}/locations/{zone}/nodes/{node_id}' already exists",
                    )
            operation = self._world.new_operation(project, zone, "create", name)
            hosts_boot = not self._faults.take_no_boot()
            self._world.put_qr(
                QueuedResourceRecord(
                    project=project,
                    zone=zone,
                    qr_id=qr_id,
                    request=request,
                    state=QrState.CREATING,
                    initiator=Initiator.USER,
                    create_time=self._world.wall_clock(),
                    queue_number=self._world.count("queue"),
                    next_at=now + self._world.config.accept_seconds,
                    create_operation=operation.operation_id,
                    hosts_boot=hosts_boot,
                )
            )
            return operation

    def get_queued_resource(self, project: str, zone: str, qr_id: str) -> QueuedResourceRecord:
        with self._clockwork.transaction():
            return self._world.find_qr(project, zone, qr_id)

    def list_queued_resources(
        self, project: str, zone: str, page_size: int = 0, page_token: str = ""
    ) -> Page[QueuedResourceRecord]:
        """Queued resources by name; zone "-" lists every zone, as the real API allows (a Compute
        Engine slice's are not listed: in_location)."""
        with self._clockwork.transaction():
            found = [qr for qr in self._world.qrs.values() if in_location(qr, project, zone)]
        return paged(found, page_size or self._world.config.default_page_size, page_token)

    def delete_queued_resource(self, project: str, zone: str, qr_id: str, force: bool = False) -> OperationRecord:
        """Start deleting. Without force, as Google's `force` says, "the queued resource will only
        be deleted if its nodes have already been deleted or the queued resource is in the
        ACCEPTED, FAILED, or SUSPENDED state": one with nodes otherwise is refused. Google says
        nothing of a delete's effect on a SUSPENDING one's hosts still in their preemption grace:
        here the delete's own grace ends theirs (the unkind reading; tpujobs never relies on
        more, `domain.grace`)."""
        with self._clockwork.transaction() as now:
            qr = self._world.find_qr(project, zone, qr_id)
            if qr.state is QrState.DELETING:
                return self._world.operations[(project, zone, qr.delete_operation)]
            if self._world.nodes_of(qr) and not force and qr.state not in PLAIN_DELETE_STATES:
                raise SimulatorError(
                    Code.FAILED_PRECONDITION,
                    f"Queued resource {qr.name} in state {qr.state.value} has nodes; "
                    "delete them first or set force to true",
                )
            operation = self._world.new_operation(project, zone, "delete", qr.name)
            for node in self._world.nodes_of(qr):
                self._world.put_node(settled(node, state=NodeState.DELETING, health=""))
            deleting = self._world.put_qr(
                dataclasses.replace(
                    qr,
                    state=QrState.DELETING,
                    initiator=Initiator.USER,
                    next_at=now + self._world.config.deleting_seconds,
                    delete_operation=operation.operation_id,
                )
            )
            self._world.queue_hooks(self._world.on_stopped, deleting)
            self._clockwork.admit(now)
            return operation

    def preempt(self, qr_id: str, *, zone: str | None = None, project: str | None = None) -> QueuedResourceRecord:
        """Take a QR's TPUs back as the service does to spot capacity: SUSPENDING, nodes PREEMPTED.

        The nodes' metadata says preempted=TRUE before on_stopped hooks run, so a worker that
        gets the SIGTERM and asks the metadata server already reads TRUE, as on GCE. The QR
        keeps its chips (they count against the quota) until it is deleted. It is SUSPENDING
        ("the resources ... are being deleted") while its hosts are in their preemption grace,
        and SUSPENDED ("the resources ... have been deleted") only once that is over.
        """
        with self._clockwork.transaction() as now:
            qr = self._world.resolve(qr_id, zone, project)
            if qr.state not in PREEMPTIBLE_STATES:
                raise SimulatorError(
                    Code.FAILED_PRECONDITION,
                    f"Queued resource {qr.name} is {qr.state.value}; only PROVISIONING or ACTIVE ones can be preempted",
                )
            for node in self._world.nodes_of(qr):
                self._world.put_node(settled(node, state=NodeState.PREEMPTED, preempted=True, health=""))
            suspending = self._world.put_qr(
                dataclasses.replace(
                    qr,
                    state=QrState.SUSPENDING,
                    initiator=Initiator.SERVICE,
                    next_at=now
                    + max(self._world.config.suspending_seconds, self._world.config.preemption_grace_seconds),
                )
            )
            self._world.queue_hooks(self._world.on_stopped, suspending)
            self._clockwork.admit(now)
            return suspending

    def fail(
        self,
        qr_id: str,
        message: str,
        *,
        zone: str | None = None,
        project: str | None = None,
        code: int = Code.INTERNAL.grpc_code,
    ) -> QueuedResourceRecord:
        """Give up on a live QR as the service does (say, a stockout): FAILED, its nodes removed;
        chips it held stay held (against the quota) until it is deleted."""
        with self._clockwork.transaction() as now:
            qr = self._world.resolve(qr_id, zone, project)
            if qr.state not in LIVE_STATES:
                raise SimulatorError(
                    Code.FAILED_PRECONDITION,
                    f"Queued resource {qr.name} is {qr.state.value}; only live ones can fail",
                )
            for node in self._world.nodes_of(qr):
                del self._world.nodes[(node.project, node.zone, node.node_id)]
            failed = self._world.put_qr(
                dataclasses.replace(
                    qr,
                    state=QrState.FAILED,
                    initiator=Initiator.SERVICE,
                    next_at=None,
                    error_code=code,
                    error_message=message,
                )
            )
            self._world.finish_create(failed, error=(code, message))
            self._world.queue_hooks(self._world.on_stopped, failed)
            self._clockwork.admit(now)
            return failed

    def get_operation(self, project: str, zone: str, operation_id: str) -> OperationRecord:
        with self._clockwork.transaction():
            operation = self._world.operations.get((project, zone, operation_id))
            if operation is None:
                raise SimulatorError(
                    Code.NOT_FOUND,
                    f"Resource 'projects/{project}/locations/{zone}/operations/{operation_id}' was not found",
                )
            return operation

    def list_operations(
        self, project: str, zone: str, page_size: int = 0, page_token: str = ""
    ) -> Page[OperationRecord]:
        with self._clockwork.transaction():
            found = [op for op in self._world.operations.values() if in_location(op, project, zone)]
        return paged(found, page_size or self._world.config.default_page_size, page_token)

    def state(self) -> SimulatorState:
        """Everything of the TPU API, sorted by name: for the state endpoint and for tests."""
        with self._clockwork.transaction():
            return SimulatorState(
                queued_resources=tuple(
                    sorted((qr for qr in self._world.qrs.values() if not backs_compute(qr.qr_id)), key=lambda r: r.name)
                ),
                nodes=tuple(
                    sorted((n for n in self._world.nodes.values() if not backs_compute(n.qr_id)), key=lambda n: n.name)
                ),
                operations=tuple(sorted(self._world.operations.values(), key=lambda o: o.name)),
            )

    def _check_request(self, request: QueuedResourceRequest, zone: str) -> None:
        """Refuse what the real API refuses before queueing: bad names, unknown shapes, VM
        options that do not fit (check_vm_options)."""
        if not request.slices:
            raise SimulatorError(Code.INVALID_ARGUMENT, "queued_resource.tpu.node_spec must name at least one node")
        seen: set[str] = set()
        for spec in request.slices:
            if spec.multislice == bool(spec.node_id):
                raise SimulatorError(
                    Code.INVALID_ARGUMENT,
                    "each node_spec needs exactly one of node_id or multislice_params",
                )
            if spec.multislice:
                check_resource_id("node_id_prefix", spec.node_id_prefix)
                if spec.node_count < 1:
                    raise SimulatorError(
                        Code.INVALID_ARGUMENT,
                        f"multislice_params.node_count must be at least 1, got {spec.node_count}",
                    )
            for node_id in spec.node_ids:
                check_resource_id("node id", node_id)
                if node_id in seen:
                    raise SimulatorError(Code.INVALID_ARGUMENT, f"node id {node_id!r} is named twice")
                seen.add(node_id)
            try:  # the generation first: a TPU7x size Compute Engine lacks is still refused for TPU7x
                refusal = platform_refusal(spec.accelerator_type, TPU_API)
            except UnknownAcceleratorType:
                refusal = None  # no generation tpujobs knows: parse_accelerator_type says so
            if refusal is not None:  # TPU7x and later: Compute Engine only
                raise bad_request("queued_resource.tpu.node_spec.node.accelerator_type", refusal)
            try:
                parse_accelerator_type(spec.accelerator_type)
            except UnknownAcceleratorType as exc:
                raise SimulatorError(Code.INVALID_ARGUMENT, str(exc)) from exc
            if not spec.runtime_version:
                raise SimulatorError(Code.INVALID_ARGUMENT, "node.runtime_version is required")
        for index, spec in enumerate(request.slices):
            check_vm_options(spec, zone, f"queued_resource.tpu.node_spec[{index}].node")

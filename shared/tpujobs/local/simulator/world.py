"""The simulator's records and plumbing: one lock, the records, the hooks queued for after it,
change notices for held metadata requests, and saving to the state file. Every part is given the
world; none inherits it."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tpujobs.local.simulator.compute_records import ComputeTables
from tpujobs.local.simulator.errors import Code, SimulatorError
from tpujobs.local.simulator.records import (
    Hook,
    HostAction,
    HostEvent,
    HostHook,
    HostsHook,
    NamedT,
    NodeRecord,
    OperationRecord,
    Page,
    QueuedResourceRecord,
    SimulatorConfig,
    backs_compute,
)
from tpujobs.local.simulator.state_file import (
    STATE_FILE_VERSION,
    StateStore,
    node_from_json,
    node_to_json,
    operation_from_json,
    operation_to_json,
    qr_from_json,
    qr_to_json,
)

_log = logging.getLogger(__name__)


class World:
    """The records every part of the simulator reads and writes (queued resources, nodes, TPU
    operations, Compute Engine's tables), the one lock that guards them, the hooks queued for
    after it, and saving. Parts hold the world; none inherits it."""

    def __init__(
        self,
        config: SimulatorConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        store: StateStore | None = None,
    ) -> None:
        self.config = config or SimulatorConfig()
        self.clock = clock
        self.wall_clock = wall_clock
        self._store = store
        self.lock = threading.Lock()
        self._dispatch_lock = threading.RLock()  # one dispatcher; a hook may call back in
        self._pending_hooks: list[tuple[list[Callable[..., None]], tuple[Any, ...]]] = []
        self.qrs: dict[tuple[str, str, str], QueuedResourceRecord] = {}
        self.nodes: dict[tuple[str, str, str], NodeRecord] = {}
        self.operations: dict[tuple[str, str, str], OperationRecord] = {}
        self._counters = {"queue": 0, "operation": 0, "node": 0, "address": 0}
        self.dirty = False
        # Bumped and announced whenever state changes, so a held metadata request
        # (wait_for_change) wakes at once instead of polling.
        self._changed = threading.Condition(threading.Lock())
        self._generation = 0
        self.on_active: list[Hook] = []  # a QR became ACTIVE: start its workers
        self.on_stopped: list[Hook] = []  # a QR was preempted, failed or is being deleted
        self.on_host_failed: list[HostHook] = []  # kill_host: one worker host died silently
        self.on_hosts: list[HostsHook] = []  # reboot and maintenance take hosts down and up
        self.compute = ComputeTables()  # Compute Engine's records (compute_model.py)
        if store is not None:
            snapshot = store.load()
            if snapshot is not None:
                self._restore(snapshot)

    def generation(self) -> int:
        """A number that grows whenever any queued resource, node or operation changes."""
        with self._changed:
            return self._generation

    def wait_for_change(self, seen: int, timeout: float) -> int:
        """Block until the generation is no longer *seen*, *timeout* passes or ``wake_waiters``
        is called; returns the generation then. Callers re-read what they watch: a wake-up
        says only that something may have changed."""
        with self._changed:
            if self._generation == seen:
                self._changed.wait(max(timeout, 0.0))
            return self._generation

    def wake_waiters(self) -> None:
        """Wake every ``wait_for_change`` (the server stopping)."""
        with self._changed:
            self._changed.notify_all()

    def finish_create(self, qr: QueuedResourceRecord, error: tuple[int, str] | None = None) -> None:
        """Complete the QR's create operation if it is still running: with the QR, or an error."""
        key = (qr.project, qr.zone, qr.create_operation)
        operation = self.operations.get(key)
        if operation is None or operation.done:
            return
        if error is None:
            finished = dataclasses.replace(operation, done=True, end_time=self.wall_clock(), result=qr)
        else:
            finished = dataclasses.replace(
                operation,
                done=True,
                end_time=self.wall_clock(),
                error_code=error[0],
                error_message=error[1],
            )
        self.operations[key] = finished
        self.dirty = True

    def new_operation(self, project: str, zone: str, verb: str, target: str) -> OperationRecord:
        wall = self.wall_clock()
        operation = OperationRecord(
            project=project,
            zone=zone,
            operation_id=f"operation-{int(wall * 1000)}-{self.count('operation'):012x}",
            verb=verb,
            target=target,
            create_time=wall,
        )
        self.operations[(project, zone, operation.operation_id)] = operation
        self.dirty = True
        return operation

    def put_qr(self, qr: QueuedResourceRecord) -> QueuedResourceRecord:
        self.qrs[(qr.project, qr.zone, qr.qr_id)] = qr
        self.dirty = True
        return qr

    def put_node(self, node: NodeRecord) -> None:
        self.nodes[(node.project, node.zone, node.node_id)] = node
        self.dirty = True

    def nodes_of(self, qr: QueuedResourceRecord) -> list[NodeRecord]:
        found = (self.nodes.get((qr.project, qr.zone, node_id)) for node_id in qr.node_ids)
        return [n for n in found if n is not None and n.qr_id == qr.qr_id]

    def find_qr(self, project: str, zone: str, qr_id: str) -> QueuedResourceRecord:
        qr = self.qrs.get((project, zone, qr_id))
        if qr is None or backs_compute(qr_id):  # a Compute Engine slice's is no TPU API resource
            raise SimulatorError(
                Code.NOT_FOUND,
                f"Resource 'projects/{project}/locations/{zone}/queuedResources/{qr_id}' was not found",
            )
        return qr

    def resolve(self, qr_id: str, zone: str | None, project: str | None) -> QueuedResourceRecord:
        """Find a QR by id for the control calls, where zone and project may be left out."""
        matches = [
            qr
            for qr in self.qrs.values()
            if qr.qr_id == qr_id
            and zone in (None, qr.zone)
            and project in (None, qr.project)
            and not backs_compute(qr.qr_id)
        ]
        if not matches:
            raise SimulatorError(Code.NOT_FOUND, f"no queued resource {qr_id!r} (zone {zone}, project {project})")
        if len(matches) > 1:
            names = ", ".join(sorted(qr.name for qr in matches))
            raise SimulatorError(Code.INVALID_ARGUMENT, f"{qr_id!r} is ambiguous: {names}; name the zone and project")
        return matches[0]

    def count(self, counter: str) -> int:
        self._counters[counter] = self._counters.get(counter, 0) + 1
        return self._counters[counter]

    def queue_hooks(self, hooks: list[Hook] | list[HostHook], qr: QueuedResourceRecord, *more: int) -> None:
        if hooks:
            self._pending_hooks.append((list(hooks), (qr, *more)))

    def queue_host_event(
        self,
        qr: QueuedResourceRecord,
        slice_index: int,
        workers: tuple[int, ...],
        action: HostAction,
    ) -> None:
        if self.on_hosts and workers:
            self._pending_hooks.append((list(self.on_hosts), (HostEvent(qr, slice_index, workers, action),)))

    def run_hooks(self) -> None:
        """Call queued hooks outside the state lock, so a hook may call the simulator."""
        with self._dispatch_lock:
            while True:
                with self.lock:
                    if not self._pending_hooks:
                        return
                    hooks, args = self._pending_hooks.pop(0)
                for hook in hooks:
                    try:
                        hook(*args)
                    except Exception:  # a broken hook must not stop the service
                        _log.exception("simulator hook %r failed for %s", hook, args[0].name)

    def save_if_changed(self) -> None:
        if not self.dirty:
            return
        if self._store is not None:
            self._store.save(self._snapshot())
        self.dirty = False
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def _snapshot(self) -> dict[str, Any]:
        """All state as JSON; clock times are saved with the clock's reading to rebase on load."""
        return {
            "version": STATE_FILE_VERSION,
            "clock": self.clock(),
            "counters": dict(self._counters),
            "queued_resources": [qr_to_json(qr) for qr in self.qrs.values()],
            "nodes": [node_to_json(node) for node in self.nodes.values()],
            "operations": [operation_to_json(op) for op in self.operations.values()],
            "compute": self.compute.to_json(),
        }

    def _restore(self, snapshot: Mapping[str, Any]) -> None:
        if snapshot.get("version") != STATE_FILE_VERSION:
            raise ValueError(f"state file version {snapshot.get('version')!r} is not {STATE_FILE_VERSION}")
        shift = self.clock() - float(snapshot["clock"])
        self._counters.update(snapshot["counters"])
        for data in snapshot["queued_resources"]:
            self.put_qr(qr_from_json(data, shift))
        for data in snapshot["nodes"]:
            self.put_node(node_from_json(data, shift))
        for data in snapshot["operations"]:
            op = operation_from_json(data, shift)
            self.operations[(op.project, op.zone, op.operation_id)] = op
        self.compute = ComputeTables.from_json(snapshot.get("compute"), shift)
        self.dirty = False


def in_location(resource: QueuedResourceRecord | NodeRecord | OperationRecord, project: str, zone: str) -> bool:
    """Whether the TPU API lists *resource* in *zone* ("-": every zone); a Compute Engine slice's
    queued resource and node are not the TPU API's."""
    owner = resource.qr_id if isinstance(resource, (QueuedResourceRecord, NodeRecord)) else ""
    return resource.project == project and zone in ("-", resource.zone) and not backs_compute(owner)


def paged(items: Iterable[NamedT], page_size: int, page_token: str) -> Page[NamedT]:
    """Pages ordered by name; the token is the last name returned, so deletions shift nothing."""
    ordered = sorted(items, key=lambda item: item.name)
    if page_size < 0:
        raise SimulatorError(Code.INVALID_ARGUMENT, f"page_size must not be negative, got {page_size}")
    if page_token:
        try:
            after = base64.b64decode(page_token, altchars=b"-_", validate=True).decode("utf-8")
            if not after.startswith("projects/"):
                raise ValueError(after)
        except (binascii.Error, UnicodeError, ValueError) as exc:
            raise SimulatorError(Code.INVALID_ARGUMENT, f"invalid page_token {page_token!r}") from exc
        ordered = [item for item in ordered if item.name > after]
    if page_size == 0 or len(ordered) <= page_size:
        return Page(tuple(ordered))
    shown = ordered[:page_size]
    token = base64.urlsafe_b64encode(shown[-1].name.encode("utf-8")).decode("ascii")
    return Page(tuple(shown), token)

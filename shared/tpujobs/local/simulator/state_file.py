"""The simulator's state on disk: a JSON file it reloads at start, its clock times rebased
so pending transitions keep their remaining delays."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from tpujobs.local.simulator.records import (
    Initiator,
    NodeRecord,
    NodeState,
    NodeStep,
    OperationRecord,
    QrState,
    QueuedResourceRecord,
    QueuedResourceRequest,
    SliceRequest,
)

STATE_FILE_VERSION = 1


class StateStore(Protocol):
    """Where the simulator keeps its state between runs."""

    def load(self) -> dict[str, Any] | None: ...

    def save(self, snapshot: dict[str, Any]) -> None: ...


class JsonStateFile:
    """A StateStore in one JSON file, replaced atomically so a crash never leaves half a file,
    and readable by its owner only: node metadata holds report keys, Secret Manager values."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def load(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        loaded: dict[str, Any] = json.loads(self.path.read_text(encoding="utf-8"))
        return loaded

    def save(self, snapshot: dict[str, Any]) -> None:
        partial = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(snapshot, out, indent=1, sort_keys=True)
        os.replace(partial, self.path)


def shifted(value: float | None, shift: float) -> float | None:
    return None if value is None else value + shift


def qr_to_json(qr: QueuedResourceRecord) -> dict[str, Any]:
    data = dataclasses.asdict(qr)
    data["state"] = qr.state.value
    data["initiator"] = qr.initiator.value
    return data


def qr_from_json(data: Mapping[str, Any], shift: float) -> QueuedResourceRecord:
    request = data["request"]
    return QueuedResourceRecord(
        **{
            **data,
            "request": QueuedResourceRequest(
                **{**request, "slices": tuple(SliceRequest(**s) for s in request["slices"])}
            ),
            "state": QrState(data["state"]),
            "initiator": Initiator(data["initiator"]),
            "next_at": shifted(data["next_at"], shift),
        }
    )


def node_to_json(node: NodeRecord) -> dict[str, Any]:
    data = dataclasses.asdict(node)
    data["state"] = node.state.value
    data["step"] = node.step.value
    return data


def node_from_json(data: Mapping[str, Any], shift: float) -> NodeRecord:
    state = NodeState(data["state"])
    if "health" not in data:  # a state file from before health was kept: as it was shown
        health = {NodeState.READY: "HEALTHY", NodeState.REPAIRING: "UNHEALTHY_MAINTENANCE"}
        data = {**data, "health": health.get(state, "")}
    return NodeRecord(
        **{
            **data,
            "state": state,
            "host_addresses": tuple(data["host_addresses"]),
            "failed_workers": tuple(data.get("failed_workers", ())),
            "rebooting_workers": tuple(data.get("rebooting_workers", ())),
            "step": NodeStep(data.get("step", "")),
            "next_at": shifted(data.get("next_at"), shift),
        }
    )


def operation_to_json(op: OperationRecord) -> dict[str, Any]:
    data = dataclasses.asdict(op)
    data["result"] = None if op.result is None else qr_to_json(op.result)
    data["node"] = None if op.node is None else node_to_json(op.node)
    return data


def operation_from_json(data: Mapping[str, Any], shift: float) -> OperationRecord:
    result, node = data["result"], data.get("node")
    return OperationRecord(
        **{
            **data,
            "result": None if result is None else qr_from_json(result, shift),
            "node": None if node is None else node_from_json(node, shift),
        }
    )

"""tell_hosts on the TPU API: read each node, merge tpujobs' keys only, UpdateNode with mask
`metadata`; a 409 (another update in flight) is read, merged and written again, then transient;
a node without tpujobs' marker of the unit is never written."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest
from google.api_core import exceptions as api_exceptions
from google.cloud import tpu_v2

from tpujobs.adapters.google_errors import transient_retry
from tpujobs.adapters.tpu import METADATA_TRIES, CloudTpu
from tpujobs.engine.errors import NotOurs, PermanentError, TransientError

ZONE = "us-central1-a"
ASSIGNMENT = {"tpujobs-assignment": '{"seq": 3}', "startup-script": "agent v2"}
UNIT_LABELS = {"tpujobs-pool": "demo", "tpujobs-unit": "0"}  # what tpujobs stamps on the unit's nodes


class Update:
    """An UpdateNode's long-running operation: done at once, or still running past any wait."""

    def __init__(self, done: bool) -> None:
        self.done = done

    def result(self, timeout: float, retry: Any = None, polling: Any = None) -> None:
        if not self.done:
            raise concurrent.futures.TimeoutError(f"Operation did not complete within {timeout} seconds.")


class Nodes:
    """Nodes' metadata behind get_node / update_node. `conflicts` updates are answered 409 first,
    each after someone else (gcloud's ssh) changed `ssh-keys` meanwhile."""

    def __init__(
        self, conflicts: int = 0, finishes: bool = True, labels: dict[str, str] | None = None, made_by: str = ""
    ) -> None:
        self.labels = UNIT_LABELS if labels is None else labels
        self.made_by = made_by  # the node's queuedResource ("": not said)
        self.metadata: dict[str, dict[str, str]] = {}
        self.conflicts = conflicts
        self.finishes = finishes
        self.updates: list[tuple[str, dict[str, str], list[str]]] = []

    def get_node(self, *, name: str, **call: Any) -> tpu_v2.Node:
        default = {"ssh-keys": "ada:ssh-ed25519 AAAA", "tpujobs-assignment": '{"seq": 2}', "startup-script": "old"}
        metadata = self.metadata.setdefault(name, default)
        return tpu_v2.Node(name=name, metadata=metadata, labels=self.labels, queued_resource=self.made_by)

    def update_node(self, *, node: tpu_v2.Node, update_mask: Any, **call: Any) -> Update:
        self.updates.append((node.name, dict(node.metadata), list(update_mask.paths)))
        if self.conflicts:
            self.conflicts -= 1
            self.metadata[node.name] = {**self.metadata[node.name], "ssh-keys": f"bob:key{self.conflicts}"}
            raise api_exceptions.Conflict("There is already an UpdateNode call in flight.")
        if self.finishes:
            self.metadata[node.name] = dict(node.metadata)  # the mask replaces the whole map
        return Update(self.finishes)


def cloud(nodes: Nodes, slept: list[float]) -> CloudTpu:
    return CloudTpu(nodes, "p", retry=transient_retry(deadline_s=0.2), sleep=slept.append)  # type: ignore[arg-type]


def test_tell_hosts_keeps_keys_tpujobs_does_not_own_on_every_node() -> None:
    """Each slice's node keeps its ssh-keys and gets tpujobs' keys, written with mask `metadata`."""
    nodes = Nodes()
    cloud(nodes, []).tell_hosts(ZONE, "demo-u0-g1", 2, ASSIGNMENT)
    assert len(nodes.updates) == 2
    for name, written, mask in nodes.updates:
        assert mask == ["metadata"]
        assert written == {"ssh-keys": "ada:ssh-ed25519 AAAA", **ASSIGNMENT}
        assert nodes.metadata[name] == written


def test_a_node_that_has_tpujobs_keys_already_is_not_written_again() -> None:
    """A tell that finds its keys landed (an earlier update finished) confirms without an update."""
    nodes = Nodes()
    tpu = cloud(nodes, [])
    tpu.tell_hosts(ZONE, "demo-u0-g1", 1, ASSIGNMENT)
    tpu.tell_hosts(ZONE, "demo-u0-g1", 1, ASSIGNMENT)
    assert len(nodes.updates) == 1


def test_a_conflict_is_read_merged_and_written_again_with_backoff() -> None:
    """A 409 (gcloud's update in flight) is retried on a fresh read: its ssh-keys are kept."""
    nodes = Nodes(conflicts=2)
    slept: list[float] = []
    cloud(nodes, slept).tell_hosts(ZONE, "demo-u0-g1", 1, ASSIGNMENT)
    assert len(nodes.updates) == 3
    assert nodes.updates[-1][1]["ssh-keys"] == "bob:key0"  # what the other writer wrote last
    assert slept == sorted(slept) and len(slept) == 2 and slept[0] < slept[1]


def test_conflicts_past_the_tries_are_transient_never_permanent() -> None:
    """A node whose metadata is always being updated is a TransientError after METADATA_TRIES."""
    nodes = Nodes(conflicts=100)
    with pytest.raises(TransientError) as raised:
        cloud(nodes, []).tell_hosts(ZONE, "demo-u0-g1", 1, ASSIGNMENT)
    assert not isinstance(raised.value, PermanentError)
    assert len(nodes.updates) == METADATA_TRIES


def test_an_update_still_running_is_not_confirmed() -> None:
    """An update not done within the brief follow-up is TransientError: the unit stays untold."""
    nodes = Nodes(finishes=False)
    with pytest.raises(TransientError, match="still running"):
        cloud(nodes, []).tell_hosts(ZONE, "demo-u0-g2", 2, ASSIGNMENT)
    assert len(nodes.updates) == 2  # both slices' updates were started, none waited for in turn


def test_a_node_not_ready_is_permanent() -> None:
    """FAILED_PRECONDITION (a node being repaired) is not a conflict: PermanentError at once."""
    nodes = Nodes()

    def refuse(**call: Any) -> None:
        raise api_exceptions.FailedPrecondition("Cannot update node: it is REPAIRING")

    nodes.update_node = refuse  # type: ignore[method-assign]
    with pytest.raises(PermanentError):
        cloud(nodes, []).tell_hosts(ZONE, "demo-u0-g1", 1, ASSIGNMENT)


@pytest.mark.parametrize(
    ("labels", "made_by"),
    [
        ({}, ""),
        ({"tpujobs-pool": "other", "tpujobs-unit": "0"}, ""),
        (UNIT_LABELS, f"projects/p/locations/{ZONE}/queuedResources/someone-elses"),
    ],
    ids=["no labels", "another pool's labels", "made by another queued resource"],
)
def test_a_node_named_like_the_unit_without_its_marker_is_never_written(labels: dict[str, str], made_by: str) -> None:
    """A node of the unit's name that tpujobs did not make for it: NotOurs, no UpdateNode sent."""
    nodes = Nodes(labels=labels, made_by=made_by)
    with pytest.raises(NotOurs, match="demo-u0-g1"):
        cloud(nodes, []).tell_hosts(ZONE, "demo-u0-g1", 1, ASSIGNMENT)
    assert nodes.updates == []


def test_a_node_made_by_the_units_own_queued_resource_is_written() -> None:
    """The marker and the node's queuedResource both naming the unit: written as usual."""
    nodes = Nodes(made_by=f"projects/p/locations/{ZONE}/queuedResources/demo-u0-g1")
    cloud(nodes, []).tell_hosts(ZONE, "demo-u0-g1", 1, ASSIGNMENT)
    assert len(nodes.updates) == 1

"""The simulated UpdateNode on a fake clock: what it changes, what it refuses, and how a held
metadata request (wait_for_change) sees the change at once, and only a real one."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from tpujobs.local.simulator import (
    Code,
    Fault,
    JsonStateFile,
    NodeState,
    QueuedResourceRequest,
    Simulator,
    SimulatorConfig,
    SimulatorError,
    SliceRequest,
    StateStore,
)
from tpujobs.local.simulator.metadata import MetadataReply, MetadataService, lookup, metadata_url
from tpujobs.local.simulator.server import SimulatorApi
from tpujobs.local.testing import SecondsClock

PROJECT = "proj"
ZONE = "us-central2-b"
RUNTIME = "tpu-ubuntu2204-base"
# Updates done at once here; their time, conflicts and propagation: test_simulator_update_timing.py.
QUICK = SimulatorConfig(
    waiting_seconds=1.0,
    provisioning_seconds=2.0,
    suspending_seconds=1.0,
    deleting_seconds=1.0,
    update_node_seconds=0.0,
    metadata_propagation_seconds=0.0,
)
BOOT_METADATA = {"startup-script": "#!/bin/bash\necho pool\n", "tpujobs-assignment": '{"seq": 1}'}
ASSIGNMENT = "instance/attributes/tpujobs-assignment"
FLAVOR = {"Metadata-Flavor": "Google"}


@pytest.fixture
def clock() -> SecondsClock:
    return SecondsClock()


def simulator(clock: SecondsClock, store: StateStore | None = None) -> Simulator:
    return Simulator(QUICK, clock=clock, wall_clock=lambda: 1_700_000_000.0, store=store)


def unit(sim: Simulator, clock: SecondsClock, qr_id: str = "demo-u0-g1", *, active: bool = True) -> None:
    """A one-slice QR with node `qr_id`, labelled and booted as a pool unit; ACTIVE unless told."""
    template = {
        "metadata": dict(BOOT_METADATA),
        "labels": {"tpujobs-pool": "demo", "tpujobs-unit": "0"},
        "description": "unit 0",
        "tags": ["tpu"],
    }
    request = QueuedResourceRequest(
        slices=(SliceRequest("v4-16", RUNTIME, node_id=qr_id, template=template),),
        spot=True,
    )
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, qr_id, request)
    clock.tick(3.0 if active else 1.5)


def refusal(call: Any) -> SimulatorError:
    with pytest.raises(SimulatorError) as raised:
        call()
    return raised.value


def test_update_with_a_metadata_mask_replaces_the_whole_map_and_leaves_the_rest(clock: SecondsClock) -> None:
    """metadata named in the mask is replaced, not merged; labels, description and tags stay."""
    sim = simulator(clock)
    unit(sim, clock)
    operation = sim.node_updates.update_node(
        PROJECT, ZONE, "demo-u0-g1", ["metadata"], {"metadata": {"tpujobs-assignment": "x"}}
    )
    node = sim.nodes.get_node(PROJECT, ZONE, "demo-u0-g1")
    assert dict(node.metadata) == {"tpujobs-assignment": "x"}
    assert node.template["labels"] == {"tpujobs-pool": "demo", "tpujobs-unit": "0"}
    assert (node.template["description"], node.template["tags"]) == ("unit 0", ["tpu"])
    assert (operation.done, operation.verb, operation.target) == (
        True,
        "update",
        f"projects/{PROJECT}/locations/{ZONE}/nodes/demo-u0-g1",
    )
    assert operation.node == node
    assert sim.queued_resources.get_operation(PROJECT, ZONE, operation.operation_id).node == node


def test_each_supported_field_is_updated_and_a_named_field_left_out_is_cleared(clock: SecondsClock) -> None:
    """labels, description, tags and network_config.enable_external_ips change as sent; a field
    the mask names but the body leaves out is cleared, as proto field masks do."""
    sim = simulator(clock)
    unit(sim, clock)
    body = {"labels": {"tpujobs-pool": "other"}, "tags": ["a", "b"], "networkConfig": {"enableExternalIps": True}}
    sim.node_updates.update_node(
        PROJECT, ZONE, "demo-u0-g1", ["labels", "tags", "description", "networkConfig.enableExternalIps"], body
    )
    template = sim.nodes.get_node(PROJECT, ZONE, "demo-u0-g1").template
    assert template["labels"] == {"tpujobs-pool": "other"}
    assert template["tags"] == ["a", "b"]
    assert "description" not in template
    assert template["networkConfig"] == {"enableExternalIps": True}
    assert dict(sim.nodes.get_node(PROJECT, ZONE, "demo-u0-g1").metadata) == BOOT_METADATA


@pytest.mark.parametrize(
    ("mask", "body", "words"),
    [
        ([], {}, "update_mask is required"),
        (["acceleratorType"], {"acceleratorType": "v4-8"}, "Field 'acceleratorType' of a node cannot be updated"),
        (["metadata"], {"metadata": {"bad key": "x"}}, "Invalid metadata key 'bad key'"),
        (["metadata"], {"metadata": {"k": 1}}, "The value of metadata key 'k' must be a string"),
        (["metadata"], {"metadata": {"k": "x" * (512 * 1024)}}, "it may hold at most 524288 bytes"),
        (["labels"], {"labels": {"Pool": "a"}}, "Invalid label key 'Pool'"),
        (["labels"], {"labels": {"pool": "A b"}}, "Invalid value 'A b' of label 'pool'"),
        (["tags"], {"tags": ["-x"]}, "Invalid network tag '-x'"),
        (["description"], {"description": 3}, "description must be a string"),
    ],
)
def test_a_mask_or_value_the_api_refuses_is_invalid_argument_with_a_sentence(
    clock: SecondsClock, mask: list[str], body: dict[str, Any], words: str
) -> None:
    """An empty mask, a field UpdateNode cannot change, or a value GCE refuses: INVALID_ARGUMENT,
    and the node keeps its metadata."""
    sim = simulator(clock)
    unit(sim, clock)
    error = refusal(lambda: sim.node_updates.update_node(PROJECT, ZONE, "demo-u0-g1", mask, body))
    assert error.code is Code.INVALID_ARGUMENT
    assert words in error.message
    assert dict(sim.nodes.get_node(PROJECT, ZONE, "demo-u0-g1").metadata) == BOOT_METADATA


def test_an_unknown_node_is_not_found(clock: SecondsClock) -> None:
    """A node that does not exist is NOT_FOUND, named as the API names resources."""
    sim = simulator(clock)
    error = refusal(lambda: sim.node_updates.update_node(PROJECT, ZONE, "nope", ["metadata"], {"metadata": {}}))
    assert error.code is Code.NOT_FOUND
    assert error.message == f"Resource 'projects/{PROJECT}/locations/{ZONE}/nodes/nope' was not found"


@pytest.mark.parametrize("how", ["provisioning", "preempted", "deleting", "repairing"])
def test_a_node_that_is_not_ready_is_failed_precondition(clock: SecondsClock, how: str) -> None:
    """A node being created, preempted, deleted or repaired cannot be updated: FAILED_PRECONDITION
    naming its state, and its metadata is unchanged."""
    sim = simulator(clock)
    unit(sim, clock, active=how != "provisioning")
    if how == "preempted":
        sim.queued_resources.preempt("demo-u0-g1")
    elif how == "deleting":
        sim.queued_resources.delete_queued_resource(PROJECT, ZONE, "demo-u0-g1", force=True)
    elif how == "repairing":
        sim.nodes.kill_host("demo-u0-g1", 0, 1)
    state = sim.nodes.get_node(PROJECT, ZONE, "demo-u0-g1").state
    assert state is not NodeState.READY
    error = refusal(lambda: sim.node_updates.update_node(PROJECT, ZONE, "demo-u0-g1", ["metadata"], {"metadata": {}}))
    assert error.code is Code.FAILED_PRECONDITION
    assert error.http_status == 400
    assert f"it is {state.value}, and only a READY node can be updated" in error.message
    assert dict(sim.nodes.get_node(PROJECT, ZONE, "demo-u0-g1").metadata) == BOOT_METADATA


def test_update_can_be_faulted_like_every_other_method(clock: SecondsClock) -> None:
    """`update` is a fault method: a planned UNAVAILABLE is what the next update call meets."""
    sim = simulator(clock)
    sim.fault_plan.inject_errors("update", Fault.parse("UNAVAILABLE"), count=2)
    assert [f["status"] for f in sim.fault_plan.faults()["errors"]["update"]] == ["UNAVAILABLE", "UNAVAILABLE"]
    fault = sim.fault_plan.next_fault("update")
    assert fault is not None and fault.code is Code.UNAVAILABLE
    assert sim.fault_plan.next_fault("get") is None


def test_the_api_answers_a_patch_with_a_done_operation_whose_response_is_the_node(clock: SecondsClock) -> None:
    """PATCH .../nodes/{id}?updateMask=metadata answers an Operation carrying the Node; snake_case
    mask paths are accepted as the REST API accepts them; an injected fault answers instead."""
    sim = simulator(clock)
    unit(sim, clock)
    api = SimulatorApi(sim)
    path = f"/v2/projects/{PROJECT}/locations/{ZONE}/nodes/demo-u0-g1"
    body = b'{"name": "ignored", "metadata": {"tpujobs-assignment": "{\\"seq\\": 2}"}, "network_config": {}}'
    status, answer = api.handle("PATCH", path, {"updateMask": ["metadata,network_config.enable_external_ips"]}, body)
    assert status == 200 and answer["done"] is True
    assert answer["metadata"]["verb"] == "update"
    assert answer["response"]["@type"] == "type.googleapis.com/google.cloud.tpu.v2.Node"
    assert answer["response"]["metadata"] == {"tpujobs-assignment": '{"seq": 2}'}
    assert answer["response"]["networkConfig"] == {"enableExternalIps": False}
    sim.fault_plan.inject_errors("update", Fault.parse(503))
    status, answer = api.handle("PATCH", path, {"updateMask": ["metadata"]}, b"{}")
    assert (status, answer["error"]["status"]) == (503, "UNAVAILABLE")
    assert dict(sim.nodes.get_node(PROJECT, ZONE, "demo-u0-g1").metadata) == {"tpujobs-assignment": '{"seq": 2}'}


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PATCH", "nodes/demo-u0-g1?metadata", b'{"metadata": {"k": "v"}, "colour": "blue"}'),
        ("PATCH", "nodes/demo-u0-g1?metadata", b'{"metadata": {"k": 1}}'),
        ("PATCH", "nodes/demo-u0-g1?metadata", b"[1, 2]"),
        ("POST", "queuedResources?qr", b'{"tpu": {"nodeSpec": [{"node": {"acceleratorTyp": "v4-8"}}]}}'),
        ("POST", "queuedResources?qr", b'{"tpu": {"nodeSpec": "v4-8"}}'),
        ("POST", "queuedResources?qr", b'{"tpu": {"nodeSpec": [SPEC]}, "spot": {}, "guaranteed": {}}'),
    ],
)
def test_a_body_with_an_unknown_field_or_a_wrong_type_is_400_invalid_argument(
    clock: SecondsClock, method: str, path: str, body: bytes
) -> None:
    """The body is read as the client library's own message (json_format): an unknown field, a
    value of the wrong type or a body that is no object is refused as Google refuses it."""
    sim = simulator(clock)
    unit(sim, clock)
    node = {"acceleratorType": "v4-8", "runtimeVersion": "r"}
    spec = {"parent": f"projects/{PROJECT}/locations/{ZONE}", "nodeId": "n1", "node": node}
    body = body.replace(b"SPEC", json.dumps(spec).encode())
    route, _, param = path.partition("?")
    query = {"updateMask": [param]} if method == "PATCH" else {"queuedResourceId": [param]}
    status, answer = SimulatorApi(sim).handle(method, f"/v2/projects/{PROJECT}/locations/{ZONE}/{route}", query, body)
    assert (status, answer["error"]["status"]) == (400, "INVALID_ARGUMENT")
    assert dict(sim.nodes.get_node(PROJECT, ZONE, "demo-u0-g1").metadata) != {"k": "v"}
    assert len(sim.state().queued_resources) == 1


def test_an_update_survives_a_restart_from_the_state_file(clock: SecondsClock, tmp_path: Path) -> None:
    """The node's new metadata and the update operation are saved and read back."""
    path = tmp_path / "state.json"
    first = simulator(clock, JsonStateFile(path))
    unit(first, clock)
    operation = first.node_updates.update_node(PROJECT, ZONE, "demo-u0-g1", ["metadata"], {"metadata": {"a": "1"}})
    second = simulator(clock, JsonStateFile(path))
    assert dict(second.nodes.get_node(PROJECT, ZONE, "demo-u0-g1").metadata) == {"a": "1"}
    restored = second.queued_resources.get_operation(PROJECT, ZONE, operation.operation_id)
    assert restored.node is not None and dict(restored.node.metadata) == {"a": "1"}


# -- the metadata server sees the change ----------------------------------------------------------


def test_the_metadata_server_answers_the_new_value_and_the_etag_is_a_hash_of_it(clock: SecondsClock) -> None:
    """After an update the key answers the new value; writing the same value keeps the ETag."""
    sim = simulator(clock)
    unit(sim, clock)
    before = lookup(sim.nodes.get_node(PROJECT, ZONE, "demo-u0-g1"), 1, ASSIGNMENT)
    assigned = {**BOOT_METADATA, "tpujobs-assignment": '{"seq": 2, "job_id": "j"}'}
    sim.node_updates.update_node(PROJECT, ZONE, "demo-u0-g1", ["metadata"], {"metadata": assigned})
    after = lookup(sim.nodes.get_node(PROJECT, ZONE, "demo-u0-g1"), 1, ASSIGNMENT)
    sim.node_updates.update_node(PROJECT, ZONE, "demo-u0-g1", ["metadata"], {"metadata": dict(assigned)})
    again = lookup(sim.nodes.get_node(PROJECT, ZONE, "demo-u0-g1"), 1, ASSIGNMENT)
    assert (before.body, after.body) == ('{"seq": 1}', '{"seq": 2, "job_id": "j"}')
    assert before.etag != after.etag == again.etag


class WatchedChanges:
    """The simulator's change notices, telling the test each time a held request sleeps."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.sleeps = threading.Semaphore(0)

    def generation(self) -> int:
        return self.sim.generation()

    def wait_for_change(self, seen: int, timeout: float) -> int:
        self.sleeps.release()
        return self.sim.wait_for_change(seen, timeout)


def hold(service: MetadataService, query: dict[str, list[str]]) -> tuple[threading.Thread, list[MetadataReply]]:
    """A wait_for_change request on the assignment of worker 0, answered in a thread."""
    replies: list[MetadataReply] = []
    path = metadata_url("", PROJECT, ZONE, "demo-u0-g1", 0) + "/" + ASSIGNMENT
    thread = threading.Thread(target=lambda: replies.append(service.answer(path, query, FLAVOR)), daemon=True)
    thread.start()
    return thread, replies


def test_a_held_wait_for_change_wakes_on_an_update_and_not_on_the_same_value(clock: SecondsClock) -> None:
    """A request held on the assignment sleeps through a write of the same value, and returns
    the new value as soon as a different one is written."""
    sim = simulator(clock)
    unit(sim, clock)
    changes = WatchedChanges(sim)
    service = MetadataService(sim.nodes.get_node, changes=changes)
    thread, replies = hold(service, {"wait_for_change": ["true"], "timeout_sec": ["60"]})
    assert changes.sleeps.acquire(timeout=30)  # it is held
    sim.node_updates.update_node(PROJECT, ZONE, "demo-u0-g1", ["metadata"], {"metadata": dict(BOOT_METADATA)})
    assert changes.sleeps.acquire(timeout=30)  # woken by the write, re-read, and held again
    assert not replies
    new = {**BOOT_METADATA, "tpujobs-assignment": '{"seq": 2}'}
    sim.node_updates.update_node(PROJECT, ZONE, "demo-u0-g1", ["metadata"], {"metadata": new})
    thread.join(timeout=30)
    assert [(reply.status, reply.body) for reply in replies] == [(200, '{"seq": 2}')]


def test_a_held_request_with_the_current_etag_returns_the_next_value(clock: SecondsClock) -> None:
    """last_etag of the value now: held until the update, then the new value and its ETag."""
    sim = simulator(clock)
    unit(sim, clock)
    now = lookup(sim.nodes.get_node(PROJECT, ZONE, "demo-u0-g1"), 0, ASSIGNMENT)
    changes = WatchedChanges(sim)
    service = MetadataService(sim.nodes.get_node, changes=changes)
    thread, replies = hold(service, {"wait_for_change": ["true"], "last_etag": [now.etag], "timeout_sec": ["60"]})
    assert changes.sleeps.acquire(timeout=30)
    sim.node_updates.update_node(
        PROJECT, ZONE, "demo-u0-g1", ["metadata"], {"metadata": {"tpujobs-assignment": '{"seq": 3}'}}
    )
    thread.join(timeout=30)
    assert [reply.body for reply in replies] == ['{"seq": 3}']
    assert replies[0].etag != now.etag


def test_a_held_request_ends_when_the_service_stops(clock: SecondsClock) -> None:
    """Stopping (the server's event and wake_waiters) ends a held request with the value it had."""
    sim = simulator(clock)
    unit(sim, clock)
    stopping = threading.Event()
    changes = WatchedChanges(sim)
    service = MetadataService(sim.nodes.get_node, stopping=stopping, changes=changes)
    thread, replies = hold(service, {"wait_for_change": ["true"], "timeout_sec": ["600"]})
    assert changes.sleeps.acquire(timeout=30)
    stopping.set()
    sim.wake_waiters()
    thread.join(timeout=30)
    assert [reply.body for reply in replies] == ['{"seq": 1}']

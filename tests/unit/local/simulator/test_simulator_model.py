"""The simulated TPU service's rules, on a fake clock: states, capacity, preemption, host
failures, persistence; and what each worker's metadata server answers."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tpujobs.local.simulator import (
    Code,
    Fault,
    Initiator,
    JsonStateFile,
    NodeRecord,
    NodeState,
    QrState,
    QueuedResourceRecord,
    QueuedResourceRequest,
    Simulator,
    SimulatorConfig,
    SimulatorError,
    SliceRequest,
    StateStore,
)
from tpujobs.local.simulator.metadata import MetadataService, lookup, metadata_url, tpu_env
from tpujobs.local.simulator.model import compute_default_account, project_number
from tpujobs.local.testing import SecondsClock

PROJECT = "proj"
ZONE = "us-central2-b"
RUNTIME = "tpu-ubuntu2204-base"
QUICK = SimulatorConfig(
    accept_seconds=0.0,
    waiting_seconds=1.0,
    provisioning_seconds=2.0,
    suspending_seconds=1.0,
    deleting_seconds=1.0,
)


def one_slice(node_id: str = "node", accelerator_type: str = "v4-8") -> QueuedResourceRequest:
    return QueuedResourceRequest(
        slices=(SliceRequest(accelerator_type=accelerator_type, runtime_version=RUNTIME, node_id=node_id),)
    )


def multislice(prefix: str, count: int, accelerator_type: str = "v4-8") -> QueuedResourceRequest:
    return QueuedResourceRequest(
        slices=(
            SliceRequest(
                accelerator_type=accelerator_type,
                runtime_version=RUNTIME,
                node_id_prefix=prefix,
                node_count=count,
            ),
        )
    )


@pytest.fixture
def clock() -> SecondsClock:
    return SecondsClock()


def simulator(clock: SecondsClock, config: SimulatorConfig = QUICK, store: StateStore | None = None) -> Simulator:
    return Simulator(config, clock=clock, wall_clock=lambda: 1_700_000_000.0, store=store)


def state_of(sim: Simulator, qr_id: str, zone: str = ZONE) -> QrState:
    return sim.queued_resources.get_queued_resource(PROJECT, zone, qr_id).state


def test_queued_resource_goes_from_accepted_through_waiting_and_provisioning_to_active(
    clock: SecondsClock,
) -> None:
    """A QR is ACCEPTED, waits waiting_seconds, provisions for provisioning_seconds, then is ACTIVE."""
    sim = simulator(clock)
    operation = sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice())
    assert not operation.done
    created = sim.queued_resources.get_operation(PROJECT, ZONE, operation.operation_id)
    assert created.done and created.result is not None
    assert created.result.state is QrState.ACCEPTED
    assert state_of(sim, "qr") is QrState.WAITING_FOR_RESOURCES
    clock.tick(0.5)
    assert state_of(sim, "qr") is QrState.WAITING_FOR_RESOURCES
    clock.tick(0.5)
    assert state_of(sim, "qr") is QrState.PROVISIONING
    clock.tick(1.5)
    assert state_of(sim, "qr") is QrState.PROVISIONING
    clock.tick(0.5)
    active = sim.queued_resources.get_queued_resource(PROJECT, ZONE, "qr")
    assert (active.state, active.initiator) == (QrState.ACTIVE, Initiator.USER)


def test_create_operation_stays_running_until_accept_seconds_pass(clock: SecondsClock) -> None:
    """The create operation completes only once the QR is accepted."""
    sim = simulator(clock, dataclasses.replace(QUICK, accept_seconds=5.0))
    operation = sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice())
    clock.tick(4.0)
    assert state_of(sim, "qr") is QrState.CREATING
    assert not sim.queued_resources.get_operation(PROJECT, ZONE, operation.operation_id).done
    clock.tick(1.0)
    assert sim.queued_resources.get_operation(PROJECT, ZONE, operation.operation_id).done


def test_nodes_appear_creating_while_provisioning_and_turn_ready_when_active(
    clock: SecondsClock,
) -> None:
    """Nodes exist from PROVISIONING on, CREATING, and are READY once the QR is ACTIVE."""
    sim = simulator(clock)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice("worker"))
    sim.advance()
    assert sim.nodes.list_nodes(PROJECT, ZONE).items == ()
    clock.tick(1.0)
    assert sim.nodes.get_node(PROJECT, ZONE, "worker").state is NodeState.CREATING
    clock.tick(2.0)
    node = sim.nodes.get_node(PROJECT, ZONE, "worker")
    assert node.state is NodeState.READY
    assert node.queued_resource == f"projects/{PROJECT}/locations/{ZONE}/queuedResources/qr"


@pytest.mark.parametrize(
    ("accelerator_type", "hosts"),
    [
        ("v4-8", 1),
        ("v4-16", 2),
        ("v4-32", 4),
        ("v5litepod-8", 1),
        ("v5litepod-16", 4),
        ("v6e-4", 1),
    ],
)
def test_a_node_has_one_network_endpoint_per_worker_host(
    clock: SecondsClock, accelerator_type: str, hosts: int
) -> None:
    """Each node gets as many distinct worker addresses as its accelerator type has hosts."""
    sim = simulator(clock)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice("n", accelerator_type))
    clock.tick(3.0)
    addresses = sim.nodes.get_node(PROJECT, ZONE, "n").host_addresses
    assert len(addresses) == hosts
    assert len(set(addresses)) == hosts


def test_multislice_makes_one_node_per_slice_named_prefix_dash_index(clock: SecondsClock) -> None:
    """multisliceParams nodeCount 3 and nodeIdPrefix p give nodes p-0, p-1, p-2."""
    sim = simulator(clock)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", multislice("p", 3, "v4-16"))
    clock.tick(3.0)
    nodes = sim.nodes.list_nodes(PROJECT, ZONE).items
    assert [n.node_id for n in nodes] == ["p-0", "p-1", "p-2"]
    assert all(n.multislice and len(n.host_addresses) == 2 for n in nodes)
    assert len({a for n in nodes for a in n.host_addresses}) == 6


def test_waiting_queued_resources_get_capacity_first_come_first_served(clock: SecondsClock) -> None:
    """With 8 v4 chips, a later small QR waits behind an earlier big one even when it would fit."""
    sim = simulator(clock, dataclasses.replace(QUICK, capacity={f"v4@{ZONE}": 8}))
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "first", one_slice("a", "v4-8"))  # 4 chips
    clock.tick(0.1)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "big", one_slice("b", "v4-16"))  # 8 chips
    clock.tick(0.1)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "small", one_slice("c", "v4-8"))  # 4 chips
    clock.tick(5.0)
    assert state_of(sim, "first") is QrState.ACTIVE
    assert state_of(sim, "big") is QrState.WAITING_FOR_RESOURCES
    assert state_of(sim, "small") is QrState.WAITING_FOR_RESOURCES

    sim.queued_resources.delete_queued_resource(PROJECT, ZONE, "first", force=True)
    clock.tick(1.0)  # deleting_seconds: the chips come back only when it is gone
    assert state_of(sim, "big") is QrState.PROVISIONING
    assert state_of(sim, "small") is QrState.WAITING_FOR_RESOURCES


def test_deleting_a_queued_resource_frees_its_chips_for_the_next_in_line(clock: SecondsClock) -> None:
    """The waiting QR starts provisioning at the moment the holder is gone, not at the next call."""
    sim = simulator(clock, dataclasses.replace(QUICK, capacity={f"v4@{ZONE}": 4}))
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "holder", one_slice("a"))
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "next", one_slice("b"))
    clock.tick(5.0)
    sim.queued_resources.delete_queued_resource(PROJECT, ZONE, "holder", force=True)
    clock.tick(1.0 + 2.0)  # gone after 1 s, then 2 s of provisioning
    assert state_of(sim, "next") is QrState.ACTIVE
    with pytest.raises(SimulatorError) as missing:
        sim.queued_resources.get_queued_resource(PROJECT, ZONE, "holder")
    assert missing.value.code is Code.NOT_FOUND


def test_capacity_pools_are_per_family_and_zone(clock: SecondsClock) -> None:
    """A full v4 pool in one zone holds back neither another zone nor another family."""
    sim = simulator(clock, dataclasses.replace(QUICK, capacity={f"v4@{ZONE}": 0}))
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "starved", one_slice("a", "v4-8"))
    sim.queued_resources.create_queued_resource(PROJECT, "us-east5-a", "elsewhere", one_slice("b", "v4-8"))
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "lite", one_slice("c", "v5litepod-8"))
    clock.tick(3.0)
    assert state_of(sim, "starved") is QrState.WAITING_FOR_RESOURCES
    assert state_of(sim, "elsewhere", "us-east5-a") is QrState.ACTIVE
    assert state_of(sim, "lite") is QrState.ACTIVE


def test_a_multislice_request_needs_the_chips_of_every_slice(clock: SecondsClock) -> None:
    """Two v4-8 slices want 8 chips, so 7 free chips are not enough and 8 are."""
    sim = simulator(clock, dataclasses.replace(QUICK, capacity={f"v4@{ZONE}": 7}))
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", multislice("s", 2))
    clock.tick(5.0)
    assert state_of(sim, "qr") is QrState.WAITING_FOR_RESOURCES
    sim.fault_plan.reconfigure(dataclasses.replace(sim.config, capacity={f"v4@{ZONE}": 8}))
    assert state_of(sim, "qr") is QrState.PROVISIONING


def test_preempt_suspends_the_queued_resource_and_preempts_its_nodes(clock: SecondsClock) -> None:
    """preempt(): QR SUSPENDING by the SERVICE, nodes PREEMPTED, then SUSPENDED; its chips
    stay held (against the quota) until it is deleted, as real SUSPENDED resources hold them."""
    sim = simulator(clock, dataclasses.replace(QUICK, capacity={f"v4@{ZONE}": 4}))
    stopped: list[QueuedResourceRecord] = []
    sim.on_stopped.append(stopped.append)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "spot", one_slice("a"))
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "next", one_slice("b"))
    clock.tick(3.0)

    suspending = sim.queued_resources.preempt("spot")
    assert (suspending.state, suspending.initiator) == (QrState.SUSPENDING, Initiator.SERVICE)
    assert sim.nodes.get_node(PROJECT, ZONE, "a").state is NodeState.PREEMPTED
    assert sim.nodes.get_node(PROJECT, ZONE, "a").preempted
    assert [r.state for r in stopped] == [QrState.SUSPENDING]
    clock.tick(60.0)
    assert state_of(sim, "spot") is QrState.SUSPENDED
    assert state_of(sim, "next") is QrState.WAITING_FOR_RESOURCES
    sim.queued_resources.delete_queued_resource(PROJECT, ZONE, "spot", force=True)
    clock.tick(0.5)
    assert state_of(sim, "spot") is QrState.DELETING  # deleting_seconds: still holding
    assert state_of(sim, "next") is QrState.WAITING_FOR_RESOURCES
    clock.tick(0.5)
    assert state_of(sim, "next") is QrState.PROVISIONING


def test_a_failed_queued_resource_holds_its_chips_until_it_is_deleted(clock: SecondsClock) -> None:
    """fail() of an ACTIVE QR keeps its chips taken; the next in line provisions only once it is gone."""
    sim = simulator(clock, dataclasses.replace(QUICK, capacity={f"v4@{ZONE}": 4}))
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "broken", one_slice("a"))
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "next", one_slice("b"))
    clock.tick(3.0)
    sim.queued_resources.fail("broken", "stockout")
    clock.tick(60.0)
    assert state_of(sim, "next") is QrState.WAITING_FOR_RESOURCES
    operation = sim.queued_resources.delete_queued_resource(PROJECT, ZONE, "broken")  # no nodes: no force needed
    assert not operation.done
    clock.tick(1.0)
    assert sim.queued_resources.get_operation(PROJECT, ZONE, operation.operation_id).done
    assert state_of(sim, "next") is QrState.PROVISIONING


def test_only_provisioning_or_active_queued_resources_can_be_preempted(clock: SecondsClock) -> None:
    """Preempting a QR that holds no TPUs yet is FAILED_PRECONDITION."""
    sim = simulator(clock)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice())
    with pytest.raises(SimulatorError) as refused:
        sim.queued_resources.preempt("qr", zone=ZONE)
    assert refused.value.code is Code.FAILED_PRECONDITION


def test_fail_marks_the_queued_resource_failed_with_the_error_and_removes_its_nodes(
    clock: SecondsClock,
) -> None:
    """fail(): FAILED by the SERVICE, failed_data carries the message, nodes gone, hooks told."""
    sim = simulator(clock)
    stopped: list[QueuedResourceRecord] = []
    sim.on_stopped.append(stopped.append)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice("n"))
    clock.tick(3.0)
    failed = sim.queued_resources.fail("qr", "stockout in us-central2-b")
    assert (failed.state, failed.initiator) == (QrState.FAILED, Initiator.SERVICE)
    assert failed.error_message == "stockout in us-central2-b"
    assert failed.error_code == Code.INTERNAL.grpc_code
    assert sim.nodes.list_nodes(PROJECT, ZONE).items == ()
    assert [r.qr_id for r in stopped] == ["qr"]


def test_failing_before_acceptance_fails_the_create_operation(clock: SecondsClock) -> None:
    """A QR that fails while CREATING ends its create operation with the error."""
    sim = simulator(clock, dataclasses.replace(QUICK, accept_seconds=10.0))
    operation = sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice())
    sim.queued_resources.fail("qr", "no", code=Code.RESOURCE_EXHAUSTED.grpc_code)
    finished = sim.queued_resources.get_operation(PROJECT, ZONE, operation.operation_id)
    assert finished.done
    assert (finished.error_code, finished.error_message) == (
        Code.RESOURCE_EXHAUSTED.grpc_code,
        "no",
    )


def test_deleting_without_force_is_refused_while_the_queued_resource_has_nodes(
    clock: SecondsClock,
) -> None:
    """An ACTIVE QR is deleted only with force, as the real API insists."""
    sim = simulator(clock)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice())
    clock.tick(3.0)
    with pytest.raises(SimulatorError) as refused:
        sim.queued_resources.delete_queued_resource(PROJECT, ZONE, "qr")
    assert refused.value.code is Code.FAILED_PRECONDITION
    assert state_of(sim, "qr") is QrState.ACTIVE


def test_deleting_goes_through_deleting_and_completes_the_operation_when_gone(
    clock: SecondsClock,
) -> None:
    """DELETING for deleting_seconds; then the QR and its nodes are gone and the operation done."""
    sim = simulator(clock)
    stopped: list[QueuedResourceRecord] = []
    sim.on_stopped.append(stopped.append)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice("n"))
    clock.tick(3.0)
    operation = sim.queued_resources.delete_queued_resource(PROJECT, ZONE, "qr", force=True)
    assert state_of(sim, "qr") is QrState.DELETING
    assert sim.nodes.get_node(PROJECT, ZONE, "n").state is NodeState.DELETING
    assert [r.state for r in stopped] == [QrState.DELETING]
    assert sim.queued_resources.delete_queued_resource(PROJECT, ZONE, "qr").operation_id == operation.operation_id
    clock.tick(1.0)
    finished = sim.queued_resources.get_operation(PROJECT, ZONE, operation.operation_id)
    assert finished.done and finished.error_code == 0 and finished.result is None
    assert sim.nodes.list_nodes(PROJECT, ZONE).items == ()
    assert sim.queued_resources.list_queued_resources(PROJECT, ZONE).items == ()


def test_a_waiting_queued_resource_can_be_deleted_without_force(clock: SecondsClock) -> None:
    """A QR with no nodes yet needs no force to delete."""
    sim = simulator(clock, dataclasses.replace(QUICK, capacity={f"v4@{ZONE}": 0}))
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice())
    clock.tick(2.0)
    sim.queued_resources.delete_queued_resource(PROJECT, ZONE, "qr")
    assert state_of(sim, "qr") is QrState.DELETING


def test_on_active_hooks_fire_once_when_time_alone_makes_a_queued_resource_active(
    clock: SecondsClock,
) -> None:
    """advance() with no API call runs on_active with the ACTIVE record, exactly once."""
    sim = simulator(clock)
    active: list[QueuedResourceRecord] = []
    sim.on_active.append(active.append)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice("n"))
    clock.tick(3.0)
    sim.advance()
    sim.advance()
    assert [(r.qr_id, r.state) for r in active] == [("qr", QrState.ACTIVE)]
    assert [n.node_id for n in sim.nodes.nodes_of(active[0])] == ["n"]


def test_a_hook_that_raises_does_not_stop_the_simulator(clock: SecondsClock) -> None:
    """A broken hook is logged; the transition stands and later hooks still run."""
    sim = simulator(clock)
    seen: list[str] = []

    def broken(record: QueuedResourceRecord) -> None:
        raise RuntimeError("boom")

    sim.on_active.extend([broken, lambda record: seen.append(record.qr_id)])
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice())
    clock.tick(3.0)
    assert state_of(sim, "qr") is QrState.ACTIVE
    assert seen == ["qr"]


def test_creating_an_existing_queued_resource_is_already_exists(clock: SecondsClock) -> None:
    """The same id twice in a zone is ALREADY_EXISTS; so is a node id another QR uses."""
    sim = simulator(clock)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice("n"))
    for qr_id, request in (("qr", one_slice("other")), ("qr2", one_slice("n"))):
        with pytest.raises(SimulatorError) as duplicate:
            sim.queued_resources.create_queued_resource(PROJECT, ZONE, qr_id, request)
        assert duplicate.value.code is Code.ALREADY_EXISTS


@pytest.mark.parametrize("bad_id", ["", "Upper", "1st", "trailing-", "under_score", "a" * 64, "nl\n"])
def test_ids_the_tpu_api_refuses_are_invalid_argument(clock: SecondsClock, bad_id: str) -> None:
    """QR and node ids must match ^[a-z]([-a-z0-9]*[a-z0-9])?$ and be at most 63 characters."""
    sim = simulator(clock)
    for qr_id, request in ((bad_id, one_slice()), ("qr", one_slice(bad_id))):
        with pytest.raises(SimulatorError) as refused:
            sim.queued_resources.create_queued_resource(PROJECT, ZONE, qr_id, request)
        assert refused.value.code is Code.INVALID_ARGUMENT


@pytest.mark.parametrize("good_id", ["a", "a" * 63, "job-1-attempt-2"])
def test_ids_the_tpu_api_accepts_are_accepted(clock: SecondsClock, good_id: str) -> None:
    """Lowercase letters, digits and inner hyphens up to 63 characters are fine."""
    sim = simulator(clock)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, good_id, one_slice(good_id))
    assert state_of(sim, good_id) is QrState.WAITING_FOR_RESOURCES


@pytest.mark.parametrize("accelerator_type", ["v4-7", "v9-8", "tpu", ""])
def test_an_unknown_accelerator_type_is_invalid_argument(clock: SecondsClock, accelerator_type: str) -> None:
    """Accelerator types the API does not offer are refused at create."""
    sim = simulator(clock)
    with pytest.raises(SimulatorError) as refused:
        sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice("n", accelerator_type))
    assert refused.value.code is Code.INVALID_ARGUMENT


def test_list_pages_by_name_with_tokens(clock: SecondsClock) -> None:
    """page_size 2 over five QRs gives pages of 2, 2 and 1, the last without a token."""
    sim = simulator(clock)
    for i in range(5):
        sim.queued_resources.create_queued_resource(PROJECT, ZONE, f"qr-{i}", one_slice(f"n-{i}"))
    names, token, pages = [], "", 0
    while True:
        page = sim.queued_resources.list_queued_resources(PROJECT, ZONE, page_size=2, page_token=token)
        names += [qr.qr_id for qr in page.items]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert (names, pages) == ([f"qr-{i}" for i in range(5)], 3)
    with pytest.raises(SimulatorError) as bad_token:
        sim.queued_resources.list_queued_resources(PROJECT, ZONE, page_size=2, page_token="%%%")
    assert bad_token.value.code is Code.INVALID_ARGUMENT


def test_listing_zone_dash_lists_every_zone(clock: SecondsClock) -> None:
    """locations/- covers all zones of the project, as in the real API."""
    sim = simulator(clock)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "a", one_slice("a"))
    sim.queued_resources.create_queued_resource(PROJECT, "europe-west4-a", "b", one_slice("b"))
    sim.queued_resources.create_queued_resource("other", ZONE, "c", one_slice("c"))
    assert [qr.qr_id for qr in sim.queued_resources.list_queued_resources(PROJECT, "-").items] == ["b", "a"]


def test_state_file_round_trip_keeps_resources_and_remaining_delays(clock: SecondsClock, tmp_path: Path) -> None:
    """A new simulator on the saved file resumes mid-provisioning, even with another clock base."""
    path = tmp_path / "state.json"
    first = simulator(clock, store=JsonStateFile(path))
    first.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice("n", "v4-16"))
    clock.tick(2.0)  # provisioning since t=1, ACTIVE at t=3
    assert state_of(first, "qr") is QrState.PROVISIONING
    addresses = first.nodes.get_node(PROJECT, ZONE, "n").host_addresses

    later = SecondsClock(50_000.0)
    second = simulator(later, store=JsonStateFile(path))
    assert state_of(second, "qr") is QrState.PROVISIONING
    assert second.nodes.get_node(PROJECT, ZONE, "n").host_addresses == addresses
    later.tick(1.0)
    assert state_of(second, "qr") is QrState.ACTIVE
    second.queued_resources.create_queued_resource(PROJECT, ZONE, "qr2", one_slice("m"))
    later.tick(3.0)
    assert not set(second.nodes.get_node(PROJECT, ZONE, "m").host_addresses) & set(addresses)


def test_api_error_rate_one_always_injects_and_zero_never(clock: SecondsClock) -> None:
    """At rate 1 every roll raises one of the configured codes; at rate 0 none does."""
    sim = simulator(clock, dataclasses.replace(QUICK, api_error_rate=1.0, seed=7))
    codes = set()
    for _ in range(40):
        with pytest.raises(SimulatorError) as injected:
            sim.fault_plan.roll_for_fault()
        codes.add(injected.value.code)
    assert codes == {Code.UNAVAILABLE, Code.RESOURCE_EXHAUSTED}
    sim.fault_plan.reconfigure(dataclasses.replace(sim.config, api_error_rate=0.0))
    for _ in range(40):
        sim.fault_plan.roll_for_fault()


def test_injected_faults_repeat_with_the_same_seed(clock: SecondsClock) -> None:
    """Two simulators with one seed inject the same faults in the same order."""

    def faults(sim: Simulator) -> list[Code | None]:
        seen: list[Code | None] = []
        for _ in range(30):
            try:
                sim.fault_plan.roll_for_fault()
                seen.append(None)
            except SimulatorError as error:
                seen.append(error.code)
        return seen

    config = dataclasses.replace(QUICK, api_error_rate=0.5, seed=3)
    first, second = faults(simulator(clock, config)), faults(simulator(clock, config))
    assert first == second
    assert None in first and Code.UNAVAILABLE in first


@pytest.mark.parametrize(
    "changes",
    [
        {"capacity": {"v4": 8}},
        {"capacity": {"v99@z": 8}},
        {"api_error_rate": 2},
        {"waiting_seconds": -1},
        {"preemption_grace_seconds": -1},
        {"delete_grace_seconds": -0.5},
        {"nope": 1},
    ],
)
def test_config_changes_that_make_no_sense_are_refused(changes: dict[str, object]) -> None:
    """Bad capacity keys, rates outside 0..1, negative delays and unknown keys raise ValueError."""
    with pytest.raises(ValueError):
        SimulatorConfig().updated(changes)


def test_kill_host_puts_the_node_in_repair_silently_and_keeps_the_queued_resource_active(
    clock: SecondsClock,
) -> None:
    """kill_host(): node REPAIRING with the worker recorded, QR ACTIVE, not preempted, hook told."""
    sim = simulator(clock)
    failed: list[tuple[str, int, int]] = []
    stopped: list[QueuedResourceRecord] = []
    sim.on_host_failed.append(lambda qr, s, w: failed.append((qr.qr_id, s, w)))
    sim.on_stopped.append(stopped.append)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", multislice("s", 2, "v4-16"))
    clock.tick(3.0)
    node = sim.nodes.kill_host("qr", 1, 1)
    assert (node.node_id, node.state, node.failed_workers) == ("s-1", NodeState.REPAIRING, (1,))
    assert not node.preempted
    assert sim.nodes.get_node(PROJECT, ZONE, "s-0").state is NodeState.READY
    assert state_of(sim, "qr") is QrState.ACTIVE
    assert (failed, stopped) == ([("qr", 1, 1)], [])
    assert sim.nodes.kill_host("qr", 1, 0).failed_workers == (0, 1)


@pytest.mark.parametrize(
    ("slice_index", "worker", "code"),
    [(2, 0, Code.INVALID_ARGUMENT), (0, 2, Code.INVALID_ARGUMENT), (-1, 0, Code.INVALID_ARGUMENT)],
)
def test_kill_host_of_a_host_that_does_not_exist_is_refused(
    clock: SecondsClock, slice_index: int, worker: int, code: Code
) -> None:
    """A slice or worker index outside the QR's nodes and hosts is INVALID_ARGUMENT."""
    sim = simulator(clock)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", multislice("s", 2, "v4-16"))
    clock.tick(3.0)
    with pytest.raises(SimulatorError) as refused:
        sim.nodes.kill_host("qr", slice_index, worker)
    assert refused.value.code is code


def test_kill_host_needs_an_active_queued_resource(clock: SecondsClock) -> None:
    """While PROVISIONING no worker runs yet, so kill_host is FAILED_PRECONDITION."""
    sim = simulator(clock)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice())
    clock.tick(1.0)
    assert state_of(sim, "qr") is QrState.PROVISIONING
    with pytest.raises(SimulatorError) as refused:
        sim.nodes.kill_host("qr", 0, 0)
    assert refused.value.code is Code.FAILED_PRECONDITION


def test_state_file_keeps_preemption_and_failed_hosts(clock: SecondsClock, tmp_path: Path) -> None:
    """A preempted node stays preempted and a repaired one keeps its failed workers after a reload."""
    path = tmp_path / "state.json"
    first = simulator(clock, store=JsonStateFile(path))
    first.queued_resources.create_queued_resource(PROJECT, ZONE, "spot", one_slice("a"))
    first.queued_resources.create_queued_resource(PROJECT, ZONE, "broken", one_slice("b", "v4-16"))
    clock.tick(3.0)
    first.queued_resources.preempt("spot")
    first.nodes.kill_host("broken", 0, 1)
    second = simulator(clock, store=JsonStateFile(path))
    assert second.nodes.get_node(PROJECT, ZONE, "a").preempted
    repaired = second.nodes.get_node(PROJECT, ZONE, "b")
    assert (repaired.state, repaired.failed_workers) == (NodeState.REPAIRING, (1,))


# -- the metadata server ------------------------------------------------------------------------

SCRIPT = "#!/bin/bash\necho hi\n"


def active_node(
    clock: SecondsClock, accelerator_type: str = "v4-16", spot: bool = False
) -> tuple[Simulator, NodeRecord]:
    """A simulator with one ACTIVE node "n" whose metadata holds a startup script."""
    sim = simulator(clock)
    request = QueuedResourceRequest(
        slices=(
            SliceRequest(
                accelerator_type=accelerator_type,
                runtime_version=RUNTIME,
                node_id="n",
                template={"metadata": {"startup-script": SCRIPT, "team": "ml"}},
            ),
        ),
        spot=spot,
    )
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", request)
    clock.tick(3.0)
    return sim, sim.nodes.get_node(PROJECT, ZONE, "n")


def test_tpu_env_names_the_accelerator_node_worker_zone_and_preemptibility(
    clock: SecondsClock,
) -> None:
    """tpu-env is sorted KEY: 'value' lines, as on a TPU VM, for the asked worker."""
    _, node = active_node(clock, spot=True)
    assert tpu_env(node, 1) == (
        "ACCELERATOR_TYPE: 'v4-16'\n"
        f"CONSUMER_PROJECT_ID: '{PROJECT}'\n"
        f"CONSUMER_PROJECT_NUMBER: '{project_number(PROJECT)}'\n"
        "NODE_ID: 'n'\n"
        "PREEMPTIBLE: 'true'\n"
        f"RUNTIME_VERSION: '{RUNTIME}'\n"
        "SERVICE_NAME: 'tpu.googleapis.com'\n"
        "WORKER_ID: '1'\n"
        f"ZONE: '{ZONE}'\n"
    )
    assert "MEGASCALE" not in tpu_env(node, 1)  # one slice: no multislice keys


@pytest.mark.parametrize(
    ("key", "body"),
    [
        ("instance/attributes/agent-worker-number", "1"),
        ("instance/attributes/accelerator-type", "v4-16"),
        ("instance/attributes/startup-script", SCRIPT),
        ("instance/attributes/team", "ml"),
        ("instance/preempted", "FALSE"),
        ("instance/maintenance-event", "NONE"),
        ("project/project-id", PROJECT),
        ("instance/zone", f"projects/{PROJECT}/zones/{ZONE}"),
    ],
)
def test_metadata_answers_each_path_for_its_worker(clock: SecondsClock, key: str, body: str) -> None:
    """Each served path answers 200 with the worker's own value as text."""
    _, node = active_node(clock)
    reply = lookup(node, 1, key)
    assert (reply.status, reply.body, reply.content_type) == (
        200,
        body,
        "text/plain; charset=utf-8",
    )


def test_metadata_says_preempted_true_once_the_node_is_preempted(clock: SecondsClock) -> None:
    """instance/preempted turns from FALSE to TRUE with preempt(), and the ETag changes with it."""
    sim, node = active_node(clock, spot=True)
    before = lookup(node, 0, "instance/preempted")
    sim.queued_resources.preempt("qr")
    after = lookup(sim.nodes.get_node(PROJECT, ZONE, "n"), 0, "instance/preempted")
    assert (before.body, after.body) == ("FALSE", "TRUE")
    assert before.etag != after.etag


def test_metadata_token_is_a_bearer_token_and_unknown_paths_are_not_found(
    clock: SecondsClock,
) -> None:
    """The default service account token is JSON naming the account; a path GCE would not serve is 404."""
    _, node = active_node(clock)
    token = lookup(node, 0, "instance/service-accounts/default/token")
    assert json.loads(token.body) == {
        "access_token": f"simulated:{compute_default_account(PROJECT)}",
        "expires_in": 3600,
        "token_type": "Bearer",
    }
    assert token.content_type == "application/json"
    assert lookup(node, 0, "instance/attributes/nothing").status == 404


def test_a_node_runs_as_the_account_its_create_request_names(clock: SecondsClock) -> None:
    """serviceAccount.email of the node template is served as the account's email and in its token."""
    sim = simulator(clock)
    account = f"team-a@{PROJECT}.iam.gserviceaccount.com"
    template = {
        "metadata": {"startup-script": SCRIPT, "tpujobs-report-key": "tpujobs-key-v1:abc"},
        "serviceAccount": {
            "email": account,
            "scope": ["https://www.googleapis.com/auth/cloud-platform"],
        },
    }
    request = QueuedResourceRequest(slices=(SliceRequest("v4-8", RUNTIME, node_id="n", template=template),))
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", request)
    clock.tick(3.0)
    node = sim.nodes.get_node(PROJECT, ZONE, "n")
    assert node.service_account == account
    for alias in ("default", account):
        assert lookup(node, 0, f"instance/service-accounts/{alias}/email").body == account
        token = json.loads(lookup(node, 0, f"instance/service-accounts/{alias}/token").body)
        assert token["access_token"] == f"simulated:{account}"
    assert lookup(node, 0, "instance/service-accounts/").body == f"default/\n{account}/\n"
    assert lookup(node, 0, "instance/attributes/tpujobs-report-key").body == "tpujobs-key-v1:abc"


@pytest.mark.parametrize("template", [{}, {"serviceAccount": {"email": "default"}}, {"serviceAccount": {}}])
def test_a_node_without_an_account_runs_as_the_compute_default_as_on_gce(
    clock: SecondsClock, template: dict[str, Any]
) -> None:
    """No email, or "default": {project number}-compute@developer.gserviceaccount.com, stable per project."""
    sim = simulator(clock)
    request = QueuedResourceRequest(slices=(SliceRequest("v4-8", RUNTIME, node_id="n", template=template),))
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", request)
    clock.tick(3.0)
    email = lookup(sim.nodes.get_node(PROJECT, ZONE, "n"), 0, "instance/service-accounts/default/email").body
    assert re.fullmatch(r"[1-9][0-9]{11}-compute@developer\.gserviceaccount\.com", email)
    assert email == compute_default_account(PROJECT) != compute_default_account("other-project")


def test_metadata_service_requires_the_flavor_header_and_an_existing_worker(
    clock: SecondsClock,
) -> None:
    """No Metadata-Flavor: Google is 403; a worker or node that does not exist is 404."""
    sim, _ = active_node(clock)
    service = MetadataService(sim.nodes.get_node)
    base = metadata_url("", PROJECT, ZONE, "n", 1)
    path = base + "/instance/attributes/agent-worker-number"
    assert service.answer(path, {}, {}).status == 403
    assert service.answer(path, {}, {"Metadata-Flavor": "Other"}).status == 403
    assert service.answer(path, {}, {"metadata-flavor": "Google"}).body == "1"
    flavor = {"Metadata-Flavor": "Google"}
    assert service.answer(path.replace("/1/", "/2/"), {}, flavor).status == 404
    assert service.answer(path.replace("/n/", "/m/"), {}, flavor).status == 404


def test_metadata_wait_for_change_returns_at_once_when_the_etag_is_stale(clock: SecondsClock) -> None:
    """wait_for_change with a last_etag other than the current value's answers without waiting."""
    sim, _ = active_node(clock)
    service = MetadataService(sim.nodes.get_node)
    path = metadata_url("", PROJECT, ZONE, "n", 0) + "/instance/preempted"
    flavor = {"Metadata-Flavor": "Google"}
    query = {"wait_for_change": ["true"], "last_etag": ["stale"], "timeout_sec": ["30"]}
    assert service.answer(path, query, flavor).body == "FALSE"
    waited = service.answer(path, {"wait_for_change": ["true"], "timeout_sec": ["0"]}, flavor)
    assert waited.body == "FALSE"


# -- faults: planned API errors, as Google renders them -----------------------------------------


@pytest.mark.parametrize(
    ("value", "status", "code"),
    [
        (503, 503, Code.UNAVAILABLE),
        ("429", 429, Code.RESOURCE_EXHAUSTED),
        (500, 500, Code.INTERNAL),
        (504, 504, Code.DEADLINE_EXCEEDED),
        (409, 409, Code.ABORTED),
        (502, 502, Code.UNAVAILABLE),
        (418, 418, Code.UNKNOWN),
        ("UNKNOWN", 500, Code.UNKNOWN),
        ("cancelled", 499, Code.CANCELLED),
        ("DEADLINE_EXCEEDED", 504, Code.DEADLINE_EXCEEDED),
        ("UNAVAILABLE", 503, Code.UNAVAILABLE),
        ("DATA_LOSS", 500, Code.DATA_LOSS),
        ("ALREADY_EXISTS", 409, Code.ALREADY_EXISTS),
        ("UNAUTHENTICATED", 401, Code.UNAUTHENTICATED),
    ],
)
def test_a_fault_is_named_by_http_status_or_by_grpc_code_with_code_protos_mapping(
    value: int | str, status: int, code: Code
) -> None:
    """An HTTP status gets the code Google's frontends send with it; a code name its HTTP status."""
    fault = Fault.parse(value)
    assert (fault.http_status, fault.code) == (status, code)
    body = fault.error(PROJECT, ZONE).to_json()["error"]
    assert (body["code"], body["status"]) == (status, code.name)
    assert body["message"].endswith("(injected by the tpujobs simulator)")


@pytest.mark.parametrize("value", [200, 302, 600, "NOPE", "OK", ""])
def test_a_fault_that_is_no_error_status_or_code_is_refused(value: int | str) -> None:
    """Statuses outside 400..599 and unknown names raise ValueError, as does a quota that is no 429."""
    with pytest.raises(ValueError):
        Fault.parse(value)
    with pytest.raises(ValueError):
        Fault.parse(503, quota=True)


def test_a_429_is_a_rate_limit_unless_it_is_a_quota_as_error_reason_proto_describes() -> None:
    """Rate limit: ErrorInfo RATE_LIMIT_EXCEEDED. Quota: ErrorInfo RESOURCE_QUOTA_EXCEEDED and a
    QuotaFailure naming the zone; both parse strictly as google.rpc detail messages."""
    from google.protobuf import json_format
    from google.rpc import error_details_pb2

    consumer = f"projects/{project_number(PROJECT)}"
    rate = Fault.parse(429).error(PROJECT, ZONE).to_json()["error"]
    (info,) = rate["details"]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
    assert (info["reason"], info["domain"]) == ("RATE_LIMIT_EXCEEDED", "googleapis.com")
    assert info["metadata"]["consumer"] == consumer
    assert info["metadata"]["service"] == "tpu.googleapis.com"

    quota = Fault.parse(429, quota=True).error(PROJECT, ZONE).to_json()["error"]
    assert (quota["code"], quota["status"]) == (429, "RESOURCE_EXHAUSTED")
    info, failure = quota["details"]
    assert info["reason"] == "RESOURCE_QUOTA_EXCEEDED"
    assert info["metadata"]["quota_location"] == ZONE
    (violation,) = failure["violations"]
    assert violation["quotaDimensions"] == {"zone": ZONE}
    parsed = [
        json_format.ParseDict({k: v for k, v in detail.items() if k != "@type"}, message, ignore_unknown_fields=False)
        for detail, message in (
            (info, error_details_pb2.ErrorInfo()),
            (failure, error_details_pb2.QuotaFailure()),
        )
    ]
    assert parsed[1].violations[0].quota_id == violation["quotaId"]


def test_planned_errors_hit_only_their_method_in_order_and_then_stop(clock: SecondsClock) -> None:
    """Two planned create errors answer the next two creates; get, list and operations are untouched."""
    sim = simulator(clock)
    sim.fault_plan.inject_errors("create", Fault.parse("UNAVAILABLE"), count=2)
    sim.fault_plan.inject_errors("create", Fault.parse(429, quota=True))
    assert [sim.fault_plan.next_fault(m) for m in ("get", "list", "delete", None)] == [None] * 4
    seen = [sim.fault_plan.next_fault("create") for _ in range(4)]
    assert [(f.code, f.quota) if f else None for f in seen] == [
        (Code.UNAVAILABLE, False),
        (Code.UNAVAILABLE, False),
        (Code.RESOURCE_EXHAUSTED, True),
        None,
    ]


def test_planned_faults_can_be_listed_and_cleared(clock: SecondsClock) -> None:
    """faults() shows what is planned; clear_faults() forgets errors and the no-boot budget."""
    sim = simulator(clock)
    sim.fault_plan.inject_errors("delete", Fault.parse(504, applied=True))
    sim.fault_plan.no_boot(2)
    planned = sim.fault_plan.faults()
    assert planned["noBoot"] == 2
    assert planned["errors"]["delete"] == [
        {"code": 504, "status": "DEADLINE_EXCEEDED", "quota": False, "applied": True, "message": ""}
    ]
    assert sim.fault_plan.clear_faults() == {
        "errors": {m: [] for m in ("create", "get", "list", "delete", "update")},
        "noBoot": 0,
    }
    assert sim.fault_plan.next_fault("delete") is None


@pytest.mark.parametrize(("method", "count"), [("patch", 1), ("get", 0)])
def test_planning_an_error_for_no_method_or_no_call_is_invalid_argument(
    clock: SecondsClock, method: str, count: int
) -> None:
    sim = simulator(clock)
    with pytest.raises(SimulatorError) as refused:
        sim.fault_plan.inject_errors(method, Fault.parse(503), count)
    assert refused.value.code is Code.INVALID_ARGUMENT


def test_random_errors_may_be_any_status_or_code(clock: SecondsClock) -> None:
    """api_error_codes takes HTTP statuses and code names alike; the dice pick only from them."""
    config = SimulatorConfig().updated({"api_error_rate": 1, "api_error_codes": ["DATA_LOSS", "504"]})
    assert config.api_error_codes == ("DATA_LOSS", 504)
    sim = simulator(clock, config)
    codes = {sim.fault_plan.next_fault("get").code for _ in range(30)}  # type: ignore[union-attr]
    assert codes == {Code.DATA_LOSS, Code.DEADLINE_EXCEEDED}
    with pytest.raises(ValueError):
        SimulatorConfig().updated({"api_error_codes": [302]})


# -- faults: hosts that never boot, reboots, maintenance, what nodes show -----------------------


def test_the_next_queued_resources_after_no_boot_get_hosts_that_never_boot(
    clock: SecondsClock,
) -> None:
    """no_boot(2): the next two QRs created have hosts_boot False, the third boots as usual; all go ACTIVE."""
    sim = simulator(clock)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "before", one_slice("a"))
    sim.fault_plan.no_boot(2)
    for qr_id in ("one", "two", "three"):
        sim.queued_resources.create_queued_resource(PROJECT, ZONE, qr_id, one_slice(f"n-{qr_id}"))
    clock.tick(3.0)
    records = {qr.qr_id: qr for qr in sim.queued_resources.list_queued_resources(PROJECT, ZONE).items}
    assert {qr_id: qr.hosts_boot for qr_id, qr in records.items()} == {
        "before": True,
        "one": False,
        "two": False,
        "three": True,
    }
    assert {qr.state for qr in records.values()} == {QrState.ACTIVE}
    assert sim.fault_plan.faults()["noBoot"] == 0


def test_no_boot_of_one_queued_resource_works_until_it_is_active(clock: SecondsClock) -> None:
    """A waiting QR can be made never to boot; an ACTIVE one already booted: FAILED_PRECONDITION."""
    sim = simulator(clock)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice())
    assert not sim.fault_plan.no_boot_queued_resource("qr").hosts_boot
    clock.tick(3.0)
    assert not sim.queued_resources.get_queued_resource(PROJECT, ZONE, "qr").hosts_boot
    with pytest.raises(SimulatorError) as refused:
        sim.fault_plan.no_boot_queued_resource("qr")
    assert refused.value.code is Code.FAILED_PRECONDITION


def host_events(sim: Simulator) -> list[tuple[str, int, tuple[int, ...], str]]:
    events: list[tuple[str, int, tuple[int, ...], str]] = []
    sim.on_hosts.append(lambda e: events.append((e.qr.qr_id, e.slice_index, e.workers, e.action.value)))
    return events


def test_reboot_resets_the_hosts_shows_restarting_then_boots_them_again(clock: SecondsClock) -> None:
    """reboot(worker=1): RESET of that host now, node RESTARTING; reboot_seconds later READY and BOOT."""
    sim = simulator(clock, dataclasses.replace(QUICK, reboot_seconds=2.0))
    events = host_events(sim)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", multislice("s", 2, "v4-16"))
    clock.tick(3.0)
    (node,) = sim.nodes.reboot("qr", 1, 1)
    assert (node.node_id, node.state, node.health) == ("s-1", NodeState.RESTARTING, "")
    assert sim.nodes.get_node(PROJECT, ZONE, "s-0").state is NodeState.READY
    assert events == [("qr", 1, (1,), "reset")]
    clock.tick(1.9)
    assert sim.nodes.get_node(PROJECT, ZONE, "s-1").state is NodeState.RESTARTING
    clock.tick(0.1)
    rebooted = sim.nodes.get_node(PROJECT, ZONE, "s-1")
    assert (rebooted.state, rebooted.health) == (NodeState.READY, "HEALTHY")
    assert events[1:] == [("qr", 1, (1,), "boot")]
    assert state_of(sim, "qr") is QrState.ACTIVE


def test_reboot_of_every_host_and_of_hosts_that_do_not_exist(clock: SecondsClock) -> None:
    """No slice and no worker: every host of every node; a worker beyond the node is INVALID_ARGUMENT."""
    sim = simulator(clock)
    events = host_events(sim)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", multislice("s", 2, "v4-16"))
    clock.tick(3.0)
    assert {n.state for n in sim.nodes.reboot("qr")} == {NodeState.RESTARTING}
    assert events == [("qr", 0, (0, 1), "reset"), ("qr", 1, (0, 1), "reset")]
    with pytest.raises(SimulatorError) as refused:
        sim.nodes.reboot("qr", 0, 2)
    assert refused.value.code is Code.INVALID_ARGUMENT


def test_a_reboot_pending_when_the_queued_resource_is_preempted_never_boots(
    clock: SecondsClock,
) -> None:
    """Preemption settles the node (PREEMPTED, no timer): nothing boots later."""
    sim = simulator(clock, dataclasses.replace(QUICK, reboot_seconds=2.0))
    events = host_events(sim)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice("n"))
    clock.tick(3.0)
    sim.nodes.reboot("qr")
    sim.queued_resources.preempt("qr")
    clock.tick(10.0)
    node = sim.nodes.get_node(PROJECT, ZONE, "n")
    assert (node.state, node.next_at) == (NodeState.PREEMPTED, None)
    assert [action for *_, action in events] == ["reset"]


def test_maintenance_is_announced_then_takes_the_hosts_down_then_brings_them_back(
    clock: SecondsClock,
) -> None:
    """The event says TERMINATE_ON_HOST_MAINTENANCE at once; after the notice the node is REPAIRING,
    UNHEALTHY_MAINTENANCE and its hosts SHUTDOWN; after maintenance_seconds READY, NONE, BOOT."""
    config = dataclasses.replace(QUICK, maintenance_notice_seconds=5.0, maintenance_seconds=7.0)
    sim = simulator(clock, config)
    events = host_events(sim)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice("n", "v4-16"))
    clock.tick(3.0)
    sim.nodes.maintenance("qr")
    node = sim.nodes.get_node(PROJECT, ZONE, "n")
    assert (node.state, node.health) == (NodeState.READY, "HEALTHY")
    assert lookup(node, 1, "instance/maintenance-event").body == "TERMINATE_ON_HOST_MAINTENANCE"
    clock.tick(5.0)
    down = sim.nodes.get_node(PROJECT, ZONE, "n")
    assert (down.state, down.health) == (NodeState.REPAIRING, "UNHEALTHY_MAINTENANCE")
    assert "maintenance" in down.health_description
    assert events == [("qr", 0, (0, 1), "shutdown")]
    with pytest.raises(SimulatorError) as busy:
        sim.nodes.reboot("qr")
    assert busy.value.code is Code.FAILED_PRECONDITION
    clock.tick(7.0)
    back = sim.nodes.get_node(PROJECT, ZONE, "n")
    assert (back.state, back.health, back.health_description) == (NodeState.READY, "HEALTHY", "")
    assert lookup(back, 0, "instance/maintenance-event").body == "NONE"
    assert events[1:] == [("qr", 0, (0, 1), "boot")]


def test_maintenance_notice_can_be_given_per_call_and_needs_an_active_queued_resource(
    clock: SecondsClock,
) -> None:
    """notice_seconds=0 takes the hosts down at the next step; a PROVISIONING QR is refused."""
    sim = simulator(clock)
    events = host_events(sim)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice("n"))
    clock.tick(1.0)
    with pytest.raises(SimulatorError) as early:
        sim.nodes.maintenance("qr")
    assert early.value.code is Code.FAILED_PRECONDITION
    clock.tick(2.0)
    sim.nodes.maintenance("qr", notice_seconds=0)
    assert sim.nodes.get_node(PROJECT, ZONE, "n").state is NodeState.REPAIRING
    assert [action for *_, action in events] == ["shutdown"]


def test_node_health_and_state_show_what_they_are_told_and_nothing_else_changes(
    clock: SecondsClock,
) -> None:
    """set_node_health(TIMEOUT) and set_node_state(UNKNOWN) on one slice; the QR stays ACTIVE, no hooks."""
    sim = simulator(clock)
    events = host_events(sim)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", multislice("s", 2))
    clock.tick(3.0)
    (sick,) = sim.nodes.set_node_health("qr", "timeout", "no heartbeat from the runtime", 1)
    assert (sick.node_id, sick.health, sick.health_description) == (
        "s-1",
        "TIMEOUT",
        "no heartbeat from the runtime",
    )
    assert [n.state for n in sim.nodes.set_node_state("qr", "UNKNOWN")] == [NodeState.UNKNOWN] * 2
    assert sim.nodes.get_node(PROJECT, ZONE, "s-0").health == "HEALTHY"
    assert state_of(sim, "qr") is QrState.ACTIVE
    assert events == []
    for call in (
        lambda: sim.nodes.set_node_health("qr", "SICK"),
        lambda: sim.nodes.set_node_state("qr", "BROKEN"),
    ):
        with pytest.raises(SimulatorError) as refused:
            call()
        assert refused.value.code is Code.INVALID_ARGUMENT


def test_lists_without_a_page_size_use_the_default_page_size(clock: SecondsClock) -> None:
    """default_page_size 2: five QRs come two to a page unless the caller names a page size."""
    sim = simulator(clock, dataclasses.replace(QUICK, default_page_size=2))
    for i in range(5):
        sim.queued_resources.create_queued_resource(PROJECT, ZONE, f"qr-{i}", one_slice(f"n-{i}"))
    first = sim.queued_resources.list_queued_resources(PROJECT, ZONE)
    assert len(first.items) == 2 and first.next_page_token
    assert len(sim.queued_resources.list_queued_resources(PROJECT, ZONE, page_size=10).items) == 5


def test_a_reboot_under_way_survives_a_reload_of_the_state_file(clock: SecondsClock, tmp_path: Path) -> None:
    """A node RESTARTING when the simulator stops is READY on time after a reload elsewhere in time."""
    path = tmp_path / "state.json"
    first = simulator(clock, dataclasses.replace(QUICK, reboot_seconds=2.0), store=JsonStateFile(path))
    first.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", one_slice("n"))
    clock.tick(3.0)
    first.nodes.reboot("qr")
    later = SecondsClock(90_000.0)
    second = simulator(later, dataclasses.replace(QUICK, reboot_seconds=2.0), store=JsonStateFile(path))
    assert second.nodes.get_node(PROJECT, ZONE, "n").state is NodeState.RESTARTING
    later.tick(2.0)
    assert second.nodes.get_node(PROJECT, ZONE, "n").state is NodeState.READY


def test_multislice_nodes_carry_megascale_keys_in_tpu_env(clock: SecondsClock) -> None:
    """Each slice of 3: MEGASCALE_SLICE_ID its index, NUM_SLICES 3, the coordinator worker 0 of slice 0."""
    sim = simulator(clock)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", multislice("s", 3, "v4-16"))
    clock.tick(3.0)
    coordinator = sim.nodes.get_node(PROJECT, ZONE, "s-0").host_addresses[0]
    for index in range(3):
        env = tpu_env(sim.nodes.get_node(PROJECT, ZONE, f"s-{index}"), 1)
        assert f"MEGASCALE_COORDINATOR_ADDRESS: '{coordinator}:8080'\n" in env
        assert "MEGASCALE_NUM_SLICES: '3'\n" in env
        assert "MEGASCALE_PORT: '8080'\n" in env
        assert f"MEGASCALE_SLICE_ID: '{index}'\n" in env


# --- VM options: what the model refuses before queueing --------------------------------------


def with_template(template: dict[str, Any], accelerator_type: str = "v4-8") -> QueuedResourceRequest:
    return QueuedResourceRequest(
        slices=(
            SliceRequest(accelerator_type=accelerator_type, runtime_version=RUNTIME, node_id="n", template=template),
        )
    )


def test_vm_options_that_fit_the_zone_are_kept_on_every_node(clock: SecondsClock) -> None:
    """A network path, a subnetwork of the zone's region, tags and a disk of the zone are queued
    and carried by the node's template."""
    template = {
        "networkConfig": {
            "network": "projects/host-proj/global/networks/training",
            "subnetwork": "projects/host-proj/regions/us-central2/subnetworks/tpu",
            "enableExternalIps": False,
        },
        "tags": ["tpu-training"],
        "dataDisks": [{"sourceDisk": f"projects/{PROJECT}/zones/{ZONE}/disks/d", "mode": "READ_ONLY"}],
        "acceleratorConfig": {"type": "V4", "topology": "2x2x1"},
    }
    sim = simulator(clock)
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", with_template(template))
    clock.tick(3.0)
    (node,) = sim.nodes.nodes_of(sim.queued_resources.get_queued_resource(PROJECT, ZONE, "qr"))
    assert node.template == template


@pytest.mark.parametrize(
    ("template", "accelerator_type", "words"),
    [
        ({"networkConfig": {"network": "global/networks/x"}}, "v4-8", "Invalid value for field 'network'"),
        (
            {"networkConfig": {"subnetwork": "projects/host-proj/regions/europe-west4/subnetworks/s"}},
            "v4-8",
            "is in region europe-west4, but the node is in zone us-central2-b",
        ),
        ({"tags": ["ok", "Not_OK"]}, "v4-8", "Invalid network tag 'Not_OK'"),
        ({"tags": [f"t{i}" for i in range(65)]}, "v4-8", "at most 64 network tags"),
        (
            {"dataDisks": [{"sourceDisk": "projects/p1234/zones/us-central2-a/disks/d", "mode": "READ_ONLY"}]},
            "v4-8",
            "is in zone us-central2-a, but the node is in zone us-central2-b",
        ),
        (
            {"dataDisks": [{"sourceDisk": f"projects/{PROJECT}/zones/{ZONE}/disks/d", "mode": "WRITE_MANY"}]},
            "v4-8",
            "Invalid disk mode 'WRITE_MANY'",
        ),
        (
            {"dataDisks": [{"sourceDisk": f"projects/{PROJECT}/zones/{ZONE}/disks/d"}]},
            "v4-32",
            "attached READ_WRITE to 4 VMs",
        ),
        ({"acceleratorConfig": {"type": "V4", "topology": "2x2x2"}}, "v4-32", "names v4-16, but the node's"),
        ({"acceleratorConfig": {"type": "V5P", "topology": "2x2"}}, "v5p-8", "v5p slices have 3"),
    ],
)
def test_vm_options_the_api_refuses_are_invalid_argument_naming_the_field(
    clock: SecondsClock, template: dict[str, Any], accelerator_type: str, words: str
) -> None:
    """Each refusal is INVALID_ARGUMENT with a BadRequest detail, and nothing is queued."""
    sim = simulator(clock)
    with pytest.raises(SimulatorError) as refused:
        sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", with_template(template, accelerator_type))
    assert refused.value.code is Code.INVALID_ARGUMENT and words in refused.value.message
    (violation,) = refused.value.details[0]["fieldViolations"]
    assert violation["field"].startswith("queued_resource.tpu.node_spec[0].node.")
    assert sim.queued_resources.list_queued_resources(PROJECT, ZONE).items == ()

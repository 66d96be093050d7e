"""TPU7x (Ironwood) slices as Google offers them: 4x4x4 cubes up to a full 9,216-chip pod, the
slices below a cube, a 1-chip VM; `tpu7x-N` as GKE and xpk name them; what Google does not offer
refused with the reason; and the 1-chip and cube-built slices made through the simulator."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

import pytest
from google.protobuf import json_format

from tpujobs.adapters import compute_requests as requests
from tpujobs.domain.accelerators import IRONWOOD_SHAPES, BadTopology, UnknownAcceleratorType, parse_accelerator_type
from tpujobs.domain.job import new_job
from tpujobs.domain.platforms import COMPUTE, compute_shape, default_platform
from tpujobs.domain.spec import SpecError, parse_spec
from tpujobs.engine.ports import HostBoot
from tpujobs.local.simulator import Simulator, SimulatorConfig
from tpujobs.local.simulator.compute_errors import ComputeError
from tpujobs.local.simulator.compute_hosts import host_overlay
from tpujobs.local.simulator.metadata import lookup
from tpujobs.local.testing import SecondsClock

P, R, Z = "p", "us-central1", "us-central1-a"
BOOT = HostBoot("tpu-vm@p.iam.gserviceaccount.com", {"startup-script": "echo hi"})
QUICK = SimulatorConfig(waiting_seconds=1.0, provisioning_seconds=2.0, compute_operation_seconds=1.0)


def spec(**fields: Any) -> Any:
    return parse_spec({"name": "train", "owner": "ada", "command": "x", **fields}, message_id="m-1")


# --- the table -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accelerator_type", "topology", "machine_type", "hosts"),
    [
        ("v7x-2", "1x1x1", "tpu7x-standard-1t", 1),  # the 1-chip VM
        ("v7x-384", "4x4x12", "tpu7x-standard-4t", 48),
        ("v7x-512", "4x4x16", "tpu7x-standard-4t", 64),
        ("v7x-1024", "8x8x8", "tpu7x-standard-4t", 128),
        ("v7x-2048", "8x8x16", "tpu7x-standard-4t", 256),
        ("v7x-8192", "16x16x16", "tpu7x-standard-4t", 1024),
        ("v7x-18432", "16x24x24", "tpu7x-standard-4t", 2304),  # a full pod: 144 cubes
        ("v7x-18432", "4x12x192", "tpu7x-standard-4t", 2304),
    ],
)
def test_every_published_tpu7x_shape_is_a_slice_of_its_machine_type_and_hosts(
    accelerator_type: str, topology: str, machine_type: str, hosts: int
) -> None:
    """Shapes Google publishes for TPU7x, beyond 256 chips up to the pod, with their VMs."""
    shape = compute_shape(accelerator_type, topology)
    assert (shape.topology, shape.machine_type, shape.hosts) == (topology, machine_type, hosts)
    assert spec(accelerator_type=accelerator_type, topology=topology).hosts_per_slice == hosts


def test_the_tpu7x_table_is_xpks_433_shapes_of_whole_cubes_up_to_the_pod() -> None:
    """1x1x1, the four shapes below a cube, and the 428 AxBxC of 4x4x4 cubes (sides multiples of
    4 up to 256, ascending, at most 144 cubes): 433 in all, as xpk counts them (432 + 1x1x1);
    nothing past the pod's 9,216 chips."""
    shapes = [t for chips, ts in IRONWOOD_SHAPES.items() for t in ts]
    assert len(shapes) == len(set(shapes)) == 433
    assert max(IRONWOOD_SHAPES) == 9216
    with pytest.raises(SpecError, match="not offered with size 20480"):  # past the pod
        spec(accelerator_type="v7x-20480")
    for topology in shapes:
        a, b, c = (int(side) for side in topology.split("x"))
        if a * b * c > 32:
            assert a % 4 == b % 4 == c % 4 == 0 and a <= b <= c <= 256, topology
            assert (a // 4) * (b // 4) * (c // 4) <= 144, topology


def test_the_usual_shape_of_a_size_is_the_most_nearly_cubic() -> None:
    """No topology given: 8x8x8 for 512 chips, 4x8x8 for 256, 16x16x16 for 4096."""
    assert compute_shape("v7x-1024").topology == "8x8x8"
    assert compute_shape("v7x-512").topology == "4x8x8"
    assert compute_shape("v7x-8192").topology == "16x16x16"


def test_tpu7x_n_is_the_same_type_as_v7x_n() -> None:
    """`tpu7x-16` (GKE's and xpk's name) is v7x-16: kept as v7x-16, on Compute Engine, 2 hosts."""
    assert parse_accelerator_type("tpu7x-16").accelerator_type == "v7x-16"
    assert compute_shape("tpu7x-256", "4x4x8").accelerator_type == "v7x-256"
    job = spec(accelerator_type="tpu7x-16")
    assert (job.accelerator_type, job.hosts_per_slice) == ("v7x-16", 2)
    assert default_platform("tpu7x-16") == COMPUTE


@pytest.mark.parametrize(
    ("accelerator_type", "topology", "reason"),
    [
        ("v7x-24", None, "nearest sizes are v7x-16 and v7x-32"),
        ("v7x-192", None, "nearest sizes are v7x-128 and v7x-256"),  # 96 chips: no whole cubes
        ("tpu7x-24", None, "'tpu7x-24' is not offered on Compute Engine"),
        ("v7x-256", "8x4x4", "sides ascending: 4x4x8"),
        ("v7x-512", "2x8x16", "4x8x8, 4x4x16"),
    ],
)
def test_a_tpu7x_shape_google_does_not_offer_is_refused_with_the_reason(
    accelerator_type: str, topology: str | None, reason: str
) -> None:
    """Sizes between Google's and shapes of no cubes (or sides out of order) say why and what is offered."""
    with pytest.raises((UnknownAcceleratorType, BadTopology), match=re.escape(reason)):
        compute_shape(accelerator_type, topology)


# --- the adapter and the simulator ------------------------------------------------------------


def holding(accelerator_type: str, **changes: Any) -> requests.Holding:
    job_spec = parse_spec(
        {"job_id": "train-1", "name": "train", "owner": "ada", "command": "x", "platform": "compute"}
        | {"accelerator_type": accelerator_type, **changes}
    )
    job, _ = new_job(job_spec, Z, datetime(2026, 1, 1, tzinfo=timezone.utc))
    return requests.job_holding(job)


def as_json(message: Any) -> dict[str, Any]:
    """A google-cloud-compute message as its REST body."""
    return json_format.MessageToDict(type(message).pb(message))


@pytest.fixture
def clock() -> SecondsClock:
    return SecondsClock()


def test_a_one_chip_tpu7x_slice_is_a_mig_of_one_tpu7x_standard_1t_without_a_policy(clock: SecondsClock) -> None:
    """v7x-2: the adapter's template (tpu7x-standard-1t) and MIG of one, no workload policy, run
    in the simulator, and its host reads accelerator-type v7x-2, topology 1x1x1."""
    h = holding("v7x-2", capacity="spot")
    template = requests.instance_template(h, BOOT, P, requests.Images())
    mig = requests.instance_group_manager(h, 0, P, template.name, BOOT)
    assert template.properties.machine_type == "tpu7x-standard-1t"
    assert mig.target_size == 1 and "resource_policies" not in mig
    sim = Simulator(QUICK, clock=clock, wall_clock=lambda: 1_700_000_000.0 + clock.now)
    sim.compute.operations.insert_template(P, R, as_json(template))
    sim.compute.groups.insert_group(P, Z, as_json(mig))
    clock.tick(10)
    view = sim.compute.groups.get_group(P, Z, "train-1-c1")
    assert [m.status for m in view.members] == ["RUNNING"] and view.stable
    node = sim.node_updates.host_node(P, Z, view.record.backing)
    host = sim.compute.vms.host_instance(node, 0)
    assert host is not None
    assert lookup(node, 0, "instance/attributes/accelerator-type", host_overlay(node, 0, host)).body == "v7x-2"
    assert "TOPOLOGY: '1x1x1'" in lookup(node, 0, "instance/attributes/tpu-env", host_overlay(node, 0, host)).body


def test_a_lone_tpu7x_standard_1t_instance_runs(clock: SecondsClock) -> None:
    """Compute Engine's 1-chip TPU7x machine type as a plain instance: RUNNING."""
    sim = Simulator(QUICK, clock=clock, wall_clock=lambda: 1_700_000_000.0 + clock.now)
    sim.compute.vms.insert_instance(
        P,
        Z,
        {
            "name": "vm",
            "machineType": f"zones/{Z}/machineTypes/tpu7x-standard-1t",
            "disks": [{"boot": True}],
            "networkInterfaces": [{"network": "global/networks/default"}],
            "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"},
        },
    )
    clock.tick(10)
    assert sim.compute.vms.get_instance(P, Z, "vm").status == "RUNNING"


def test_a_cube_built_slice_beyond_256_chips_is_made_through_the_simulator(clock: SecondsClock) -> None:
    """v7x-384 (4x4x12): the adapter's policy, template and MIG of 48 VMs are accepted."""
    h = holding("v7x-384", capacity="spot")
    sim = Simulator(QUICK, clock=clock, wall_clock=lambda: 1_700_000_000.0 + clock.now)
    policy = requests.workload_policy(h)
    assert policy.workload_policy.accelerator_topology == "4x4x12"
    sim.compute.operations.insert_policy(P, R, as_json(policy))
    template = requests.instance_template(h, BOOT, P, requests.Images())
    sim.compute.operations.insert_template(P, R, as_json(template))
    sim.compute.groups.insert_group(
        P, Z, as_json(requests.instance_group_manager(h, 0, P, template.name, BOOT, policy.name))
    )
    clock.tick(10)
    assert len(sim.compute.groups.get_group(P, Z, "train-1-c1").members) == 48


@pytest.mark.parametrize(
    ("machine_type", "size", "topology", "reason"),
    [
        ("tpu7x-standard-4t", 2, "4x4x4", "acceleratorTopology 4x4x4 holds 64 chips, but the MIG's targetSize"),
        ("tpu7x-standard-1t", 4, "2x2x1", "that slice is 1 x tpu7x-standard-4t"),
    ],
)
def test_a_mig_that_does_not_make_its_policys_slice_is_refused_with_the_reason(
    clock: SecondsClock, machine_type: str, size: int, topology: str, reason: str
) -> None:
    """The policy's chips against the MIG's, then the machine type a slice is made of."""
    sim = Simulator(QUICK, clock=clock, wall_clock=lambda: 1_700_000_000.0 + clock.now)
    sim.compute.operations.insert_policy(
        P, R, {"name": "pol", "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": topology}}
    )
    sim.compute.operations.insert_template(
        P,
        R,
        {
            "name": "tpl",
            "properties": {
                "machineType": machine_type,
                "disks": [{"boot": True}],
                "networkInterfaces": [{"network": "global/networks/default"}],
                "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"},
            },
        },
    )
    body = {
        "name": "mig",
        "baseInstanceName": "mig",
        "instanceTemplate": f"projects/{P}/regions/{R}/instanceTemplates/tpl",
        "targetSize": size,
        "resourcePolicies": {"workloadPolicy": f"projects/{P}/regions/{R}/resourcePolicies/pol"},
    }
    with pytest.raises(ComputeError, match=re.escape(reason)):
        sim.compute.groups.insert_group(P, Z, body)


def test_a_tpu_machine_type_compute_engine_lacks_is_said_not_to_exist(clock: SecondsClock) -> None:
    """tpu7x-standard-2t is no machine type: Compute Engine's 'does not exist in zone' reason."""
    sim = Simulator(QUICK, clock=clock, wall_clock=lambda: 1_700_000_000.0 + clock.now)
    vm = {
        "name": "vm",
        "machineType": f"zones/{Z}/machineTypes/tpu7x-standard-2t",
        "disks": [{"boot": True}],
        "networkInterfaces": [{"network": "global/networks/default"}],
    }
    with pytest.raises(ComputeError, match=f"Machine type with name 'tpu7x-standard-2t' does not exist in zone '{Z}'"):
        sim.compute.vms.insert_instance(P, Z, vm)

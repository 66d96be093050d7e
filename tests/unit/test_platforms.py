"""Which platform serves each TPU generation, and a slice's machine type and hosts on Compute Engine."""

from __future__ import annotations

import re

import pytest

from tpujobs.domain.accelerators import BadTopology, UnknownAcceleratorType
from tpujobs.domain.platforms import (
    COMPUTE,
    COMPUTE_FAMILIES,
    TPU_API,
    compute_shape,
    default_platform,
    platform_refusal,
)


@pytest.mark.parametrize(
    ("accelerator_type", "machine_type", "hosts", "topology"),
    [
        ("v7x-8", "tpu7x-standard-4t", 1, "2x2x1"),
        ("v7x-16", "tpu7x-standard-4t", 2, "2x2x2"),  # the example: 8 chips on 2 hosts
        ("v7x-128", "tpu7x-standard-4t", 16, "4x4x4"),
        ("v7x-512", "tpu7x-standard-4t", 64, "4x8x8"),
    ],
)
def test_tpu7x_slices_are_4_chip_vms_named_by_tensorcores(accelerator_type, machine_type, hosts, topology):
    shape = compute_shape(accelerator_type)
    assert (shape.machine_type, shape.hosts, shape.topology) == (machine_type, hosts, topology)
    assert shape.chips == int(accelerator_type.split("-")[1]) // 2
    assert shape.multi_host is (hosts > 1)


@pytest.mark.parametrize(
    ("accelerator_type", "machine_type", "hosts"),
    [
        ("v6e-1", "ct6e-standard-1t", 1),
        ("v6e-4", "ct6e-standard-4t", 1),
        ("v6e-8", "ct6e-standard-8t", 1),
        ("v6e-16", "ct6e-standard-4t", 4),
        ("v6e-256", "ct6e-standard-4t", 64),
    ],
)
def test_v6e_is_one_vm_up_to_8_chips_then_4_chip_vms_named_by_chips(accelerator_type, machine_type, hosts):
    shape = compute_shape(accelerator_type)
    assert (shape.machine_type, shape.hosts, shape.chips) == (machine_type, hosts, int(accelerator_type[4:]))


@pytest.mark.parametrize(
    ("accelerator_type", "hosts", "topology"),
    [("v5p-8", 1, "2x2x1"), ("v5p-16", 2, "2x2x2"), ("v5p-128", 16, "4x4x4"), ("v5p-1024", 128, "8x8x8")],
)
def test_v5p_slices_are_ct5p_vms_of_4_chips(accelerator_type, hosts, topology):
    shape = compute_shape(accelerator_type)
    assert (shape.machine_type, shape.hosts, shape.topology) == ("ct5p-hightpu-4t", hosts, topology)


def test_every_shape_in_the_table_holds_its_chips_and_a_whole_number_of_vms():
    """The one table is consistent: each topology's axes multiply to its chips, and a multi-host
    slice is a whole number of VMs."""
    for family in COMPUTE_FAMILIES.values():
        for chips, shapes in family.topologies.items():
            for topology in shapes:
                product = 1
                for axis in topology.split("x"):
                    product *= int(axis)
                assert product == chips, (family.name, topology)
            assert chips in family.single_host_chips or chips % family.chips_per_host == 0


def test_a_topology_that_is_not_a_shape_of_the_size_is_refused():
    with pytest.raises(BadTopology, match="not a shape of v7x-16"):
        compute_shape("v7x-16", "2x4x1")
    assert compute_shape("v7x-16", "2x2x2").hosts == 2


@pytest.mark.parametrize("accelerator_type", ["v7x-6", "v7x-9", "v6e-2", "v4-8", "v9-8", "tpu7x-16"])
def test_a_size_or_generation_compute_engine_does_not_make_is_refused_with_the_reason(accelerator_type):
    with pytest.raises(UnknownAcceleratorType, match=re.escape(repr(accelerator_type))):
        compute_shape(accelerator_type)


@pytest.mark.parametrize(
    ("accelerator_type", "tpu_api", "compute"),
    [
        ("v2-8", True, False),
        ("v3-8", True, False),
        ("v4-8", True, False),
        ("v5litepod-8", True, False),
        ("v5p-8", True, True),
        ("v6e-8", True, True),
        ("v7x-16", False, True),
    ],
)
def test_each_generation_runs_only_where_google_serves_it(accelerator_type, tpu_api, compute):
    assert (platform_refusal(accelerator_type, TPU_API) is None) is tpu_api
    assert (platform_refusal(accelerator_type, COMPUTE) is None) is compute


def test_the_refusal_says_which_platform_serves_the_generation():
    assert "only through Compute Engine" in (platform_refusal("v7x-16", TPU_API) or "")
    assert "only through the Cloud TPU API" in (platform_refusal("v4-8", COMPUTE) or "")
    assert "is not one of" in (platform_refusal("v4-8", "gke") or "")


def test_the_default_is_the_only_platform_or_the_deployments_choice_where_both_serve():
    assert default_platform("v7x-16") == COMPUTE
    assert default_platform("v4-8", frozenset({"v4"})) == TPU_API  # only the TPU API serves v4
    assert default_platform("v6e-8") == TPU_API
    assert default_platform("v6e-8", frozenset({"v6e"})) == COMPUTE
    assert default_platform("v5p-8", frozenset({"v6e"})) == TPU_API

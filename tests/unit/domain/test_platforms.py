"""Which platform serves each TPU generation, and a slice's machine type and hosts on Compute Engine."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest

from tpujobs.adapters.firestore_warm_pools import pool_from_document, pool_to_document
from tpujobs.domain.accelerators import BadTopology, UnknownAcceleratorType
from tpujobs.domain.job import new_job
from tpujobs.domain.naming import (
    host_name_refusal,
    parse_queued_resource_name,
    parse_unit_queued_resource_name,
    platform_of,
    queued_resource_name,
    unit_queued_resource_name,
)
from tpujobs.domain.platforms import (
    COMPUTE,
    COMPUTE_FAMILIES,
    TPU_API,
    compute_shape,
    default_platform,
    platform_refusal,
)
from tpujobs.domain.pools import new_pool, parse_pool_request, resized
from tpujobs.domain.spec import SpecError, parse_spec, with_deployment_defaults
from tpujobs.domain.vm_defaults import VmDefaults


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


@pytest.mark.parametrize("accelerator_type", ["v7x-6", "v7x-9", "v6e-2", "v4-8", "v9-8", "tpu7x-6"])
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


# --- the spec's platform, as `validate` and submit see it ------------------------------------

BASE = {"name": "train", "owner": "alice", "command": "python train.py"}


def spec(**fields):
    return parse_spec({**BASE, **fields}, message_id="m-1")


def test_a_generation_on_a_platform_that_does_not_serve_it_is_refused_with_the_reason():
    with pytest.raises(SpecError, match="platform tpu-api: v7x is served only through Compute Engine"):
        spec(accelerator_type="v7x-16", platform="tpu-api")
    with pytest.raises(SpecError, match="platform compute: v4 is served only through the Cloud TPU API"):
        spec(accelerator_type="v4-8", platform="compute")
    assert spec(accelerator_type="v6e-8", platform="compute").platform == COMPUTE


def test_a_shape_compute_engine_does_not_offer_is_refused_there_only():
    with pytest.raises(SpecError, match="not a shape of v7x-16"):
        spec(accelerator_type="v7x-16", topology="1x2x4")
    with pytest.raises(SpecError, match="not offered on Compute Engine"):
        spec(accelerator_type="v5p-2048", platform="compute")
    assert spec(accelerator_type="v5p-2048", platform="tpu-api").hosts_per_slice == 256


def test_flex_start_is_compute_engines_and_runs_for_the_jobs_time_limit():
    assert spec(accelerator_type="v7x-16", capacity="flex-start", time_limit="4h").capacity == "flex-start"
    with pytest.raises(SpecError, match=r"flex-start.*give platform: compute"):
        spec(accelerator_type="v4-8", capacity="flex-start", time_limit="4h")
    with pytest.raises(SpecError, match="maxRunDuration, taken from time_limit"):
        spec(accelerator_type="v7x-16", capacity="flex-start")
    with pytest.raises(SpecError, match="at least 10m"):
        spec(accelerator_type="v7x-16", capacity="flex-start", attempt_time_limit="5m")


def test_submit_fills_in_the_deployments_platform_so_the_stored_spec_says_it():
    defaults = VmDefaults()
    assert with_deployment_defaults(spec(accelerator_type="v4-8"), defaults).platform == TPU_API
    assert with_deployment_defaults(spec(accelerator_type="v7x-16"), defaults).platform == COMPUTE
    both = spec(accelerator_type="v6e-8")
    assert with_deployment_defaults(both, defaults).platform == TPU_API
    assert with_deployment_defaults(both, defaults, compute_by_default=frozenset({"v6e"})).platform == COMPUTE
    named = spec(accelerator_type="v6e-8", platform="tpu-api")
    assert with_deployment_defaults(named, defaults, compute_by_default=frozenset({"v6e"})).platform == TPU_API
    with pytest.raises(SpecError, match="give platform: compute"):  # flex-start decided only with the platform
        with_deployment_defaults(spec(accelerator_type="v6e-8", capacity="flex-start", time_limit="1h"), defaults)


# --- names that say their platform ---------------------------------------------------------


def test_a_holdings_name_says_its_platform_and_parses_back_to_its_job_or_unit():
    assert queued_resource_name("train-1", 3) == "train-1-a3"
    assert queued_resource_name("train-1", 3, COMPUTE) == "train-1-c3"
    assert unit_queued_resource_name("pool-a", 2, 7, COMPUTE) == "pool-a-c2-g7"
    for name, platform in [("train-1-a3", TPU_API), ("train-1-c3", COMPUTE), ("pool-a-u2-g7", TPU_API)]:
        assert platform_of(name) == platform
    assert platform_of("pool-a-c2-g7") == COMPUTE
    assert parse_queued_resource_name("train-1-c3") == ("train-1", 3)
    assert parse_unit_queued_resource_name("pool-a-c2-g7") == ("pool-a", 2, 7)
    assert parse_queued_resource_name("pool-a-c2-g7") is None  # a unit's is never a job's
    assert parse_unit_queued_resource_name("train-1-c3") is None
    assert platform_of("someone-elses-node") == TPU_API


def test_a_compute_jobs_attempts_are_named_on_compute_engine():
    job, _ = new_job(spec(accelerator_type="v7x-16", platform="compute"), "us-central1-c", datetime.now(timezone.utc))
    assert (job.queued_resource, job.holding_of(2), job.as_next_attempt().queued_resource) == (
        f"{job.job_id}-c1",
        f"{job.job_id}-c2",
        f"{job.job_id}-c2",
    )


def test_only_a_vm_of_the_slices_own_mig_may_be_its_host_on_compute_engine():
    assert host_name_refusal("train-1-c2", 0, 1, 1, "train-1-c2-x7k2") is None
    assert host_name_refusal("train-1-c2", 1, 2, 0, "train-1-c2-1-ab12") is None
    assert "not one of train-1-c2-1's" in (host_name_refusal("train-1-c2", 1, 2, 0, "train-1-c2-0-ab12") or "")
    assert host_name_refusal("train-1-c2", 0, 1, 0, "other-job-c1-ab12") is not None
    assert host_name_refusal("train-1-c2", 0, 1, 0, "t1v-n-0a1b2c3d-w-0") is not None  # a TPU API VM
    assert host_name_refusal("train-1-a2", 0, 1, 1, "t1v-n-0a1b2c3d-w-1") is None
    assert host_name_refusal("train-1-a2", 0, 1, 1, "t1v-n-0a1b2c3d-w-0") == "the VM is another worker of its node"


def test_a_pools_units_are_held_on_its_platform_and_named_so():
    request, shape = parse_pool_request(
        {"name": "warm", "owner": "ada", "accelerator_type": "v6e-8", "platform": "compute", "count": 2}, "us-east5-a"
    )
    assert shape.platform == COMPUTE
    pool = new_pool(request, datetime.now(timezone.utc))
    assert [u.queued_resource(pool.name) for u in pool.units] == ["warm-c0-g1", "warm-c1-g1"]
    assert pool.shape().platform == COMPUTE
    stored = pool_from_document(pool_to_document(pool))
    assert (stored.platform, stored.units[1].queued_resource("warm")) == (COMPUTE, "warm-c1-g1")
    grown = resized(stored, 3, datetime.now(timezone.utc))
    assert grown.units[-1].queued_resource("warm") == "warm-c2-g1"
    old, _ = parse_pool_request({"name": "old", "owner": "ada", "accelerator_type": "v4-8"}, "us-central2-b")
    assert new_pool(old, datetime.now(timezone.utc)).units[0].queued_resource("old") == "old-u0-g1"

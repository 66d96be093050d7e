"""PlatformCapacity hands each call to the platform that holds the slices (adapters.capacity_router)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from tpujobs.adapters.capacity_router import PlatformCapacity
from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.errors import PermanentError
from tpujobs.engine.ports import HostBoot, UnitRequest
from tpujobs.local.fakes.capacity import InMemoryCapacity

ZONE = "us-central1-c"
BOOT = HostBoot("vm@p.iam.gserviceaccount.com", {"startup-script": "#!/bin/sh"})


def a_job(job_id: str, accelerator_type: str, **changes: Any) -> Job:
    spec = parse_spec(
        {"job_id": job_id, "name": job_id, "owner": "ada", "accelerator_type": accelerator_type, "command": "x"}
        | changes
    )
    job, _ = new_job(spec, ZONE, datetime(2026, 1, 1, tzinfo=timezone.utc))
    return job


@pytest.fixture
def both() -> tuple[PlatformCapacity, InMemoryCapacity, InMemoryCapacity]:
    tpu, compute = InMemoryCapacity(), InMemoryCapacity()
    return PlatformCapacity(tpu, compute), tpu, compute


def test_a_request_goes_where_the_specs_platform_says(both) -> None:
    """A v4 job to the TPU API, a v7x job (and a v6e job on compute) to Compute Engine."""
    router, tpu, compute = both
    router.request(a_job("old", "v4-8"), BOOT)
    router.request(a_job("new", "v7x-16", platform="compute"), BOOT)
    router.request(a_job("mid", "v6e-8", platform="compute"), BOOT)
    assert tpu.requested() == ["old-a1"]
    assert compute.requested() == ["new-c1", "mid-c1"]


def test_a_unit_request_goes_where_the_pools_platform_says(both) -> None:
    """request_unit reads the unit's spec: its platform picks the backend."""
    router, tpu, compute = both
    spec = a_job("pool", "v7x-8", platform="compute").spec
    router.request_unit(UnitRequest("demo-c0-g1", ZONE, spec, {"tpujobs-pool": "demo"}), BOOT)
    router.request_unit(UnitRequest("demo-u0-g1", ZONE, a_job("p2", "v4-8").spec, {"tpujobs-pool": "demo"}), BOOT)
    assert (compute.requested(), tpu.requested()) == (["demo-c0-g1"], ["demo-u0-g1"])


def test_everything_later_goes_by_the_holdings_name(both) -> None:
    """status, release and tell_hosts follow the name's platform letter."""
    router, tpu, compute = both
    router.request(a_job("old", "v4-8"), BOOT)
    router.request(a_job("new", "v7x-16", platform="compute"), BOOT)
    tpu.set_state("old-a1", HoldingState.ACTIVE)
    compute.set_state("new-c1", HoldingState.ACTIVE)
    assert router.status(ZONE, "new-c1") == compute.status(ZONE, "new-c1")
    assert router.status(ZONE, "old-a1") == tpu.status(ZONE, "old-a1")
    router.tell_hosts(ZONE, "new-c1", 1, {"tpujobs-assignment": "x"})
    assert compute.holdings[(ZONE, "new-c1")].metadata == {"new-c1": {"tpujobs-assignment": "x"}}
    router.release(ZONE, "new-c1")
    router.release(ZONE, "old-a1")
    assert (compute.released(), tpu.released()) == (["new-c1"], ["old-a1"])


def test_a_create_error_goes_by_the_operations_form(both) -> None:
    """`zones/*/operations/*` is Compute Engine's; `projects/*/locations/*` the TPU API's."""
    router, tpu, compute = both
    compute.failed_operations["zones/us-central1-c/operations/op-1"] = "stockout"
    tpu.failed_operations["projects/p/locations/us-central1-c/operations/op-2"] = "quota"
    assert router.create_error("zones/us-central1-c/operations/op-1") == "stockout"
    assert router.create_error("projects/p/locations/us-central1-c/operations/op-2") == "quota"


def test_a_zones_listing_is_both_platforms(both) -> None:
    """list_capacity returns the TPU API's holdings and Compute Engine's."""
    router, _, _ = both
    router.request(a_job("old", "v4-8"), BOOT)
    router.request(a_job("new", "v7x-16", platform="compute"), BOOT)
    assert sorted(s.name for s in router.list_capacity(ZONE)) == ["new-c1", "old-a1"]


def test_without_compute_engine_a_compute_job_is_refused_and_listings_are_the_tpu_apis() -> None:
    """No Compute Engine backend: a compute request is a PermanentError; lists and operations still work."""
    tpu = InMemoryCapacity()
    router = PlatformCapacity(tpu)
    with pytest.raises(PermanentError, match="Compute Engine"):
        router.request(a_job("new", "v7x-16", platform="compute"), BOOT)
    router.request(a_job("old", "v4-8"), BOOT)
    assert [s.name for s in router.list_capacity(ZONE)] == ["old-a1"]
    assert router.create_error("zones/us-central1-c/operations/op-1") is None


def test_a_platform_with_no_row_is_refused_never_sent_to_another_platform(both) -> None:
    """A spec or an operation of a platform the router has no row for: PermanentError naming it;
    neither backend was asked."""
    router, tpu, compute = both
    with pytest.raises(PermanentError, match="no capacity backend for platform 'gke'"):
        router.backend("gke")
    with pytest.raises(PermanentError, match="of no platform"):
        router.create_error("regions/us-central1/operations/op-3")
    assert tpu.calls == [] and compute.calls == []


def test_a_spec_that_names_no_platform_goes_to_the_tpu_api(both) -> None:
    """A stored spec from before platforms were named (platform None) is the TPU API's."""
    router, tpu, _ = both
    assert router.backend(None) is tpu

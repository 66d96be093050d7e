"""The Compute Engine adapter (adapters.compute) through the real google-cloud-compute client,
against the simulator's Compute Engine v1 REST API: a v7x slice asked for, seen ACTIVE,
preempted, seen losing a host, and given back leaving nothing behind.

Waits use the simulator's quick provisioning (0.1 s) with generous deadlines, never a race.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tpujobs.adapters.compute import ComputeEngine, build_clients
from tpujobs.domain.holdings import HOLDING_PENDING, HoldingState
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.ports import CapacityStatus, HostBoot
from tpujobs.local.simulator import SimulatorConfig, SimulatorServer
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.emulator

PROJECT = "compute-adapter"
ZONE = "us-central1-c"
BOOT = HostBoot("vm@compute-adapter.iam.gserviceaccount.com", {"startup-script": "#!/bin/sh", "tpujobs-key": "k"})


def start(capacity: dict[str, int]) -> SimulatorServer:
    """A simulator of the test's own, quick to provision, with `capacity` chips on offer."""
    return SimulatorServer(
        SimulatorConfig(waiting_seconds=0.05, provisioning_seconds=0.1, capacity=capacity), run_workers=False
    )


@pytest.fixture
def simulator() -> Iterator[str]:
    with start({}) as server:
        yield server.url


@pytest.fixture
def compute(simulator: str) -> ComputeEngine:
    return ComputeEngine(build_clients(simulator), PROJECT, operation_wait_s=10)


def a_job(**changes: Any) -> Job:
    spec = parse_spec(
        {
            "job_id": "train-1",
            "name": "train",
            "owner": "ada",
            "accelerator_type": "v7x-16",
            "platform": "compute",
            "capacity": "spot",
            "command": "x",
            **changes,
        }
    )
    job, _ = new_job(spec, ZONE, datetime.now(timezone.utc))
    return job


def active(compute: ComputeEngine, name: str) -> CapacityStatus:
    def probe() -> CapacityStatus | None:
        """the holding ACTIVE"""
        status = compute.status(ZONE, name)
        return status if status is not None and status.state == "ACTIVE" else None

    return wait_for(probe, timeout=30)


def vms_of(simulator: str) -> list[dict[str, Any]]:
    return list(SimulatorControl(simulator).state()["compute"]["instances"])


def test_a_v7x_spot_slice_becomes_active_on_two_hosts_and_a_retried_request_adopts_it(compute, simulator):
    """v7x-16 spot: a MIG of two RUNNING VMs, labelled with the job; asking again makes nothing new."""
    job = a_job()
    first = compute.request(job, BOOT)
    assert first.state in HOLDING_PENDING and first.job_label == "train-1"
    assert first.operation.startswith(f"zones/{ZONE}/operations/")
    assert compute.create_error(first.operation) is None
    status = active(compute, job.queued_resource)
    assert (status.name, status.unhealthy_hosts) == ("train-1-c1", 0)
    again = compute.request(job, BOOT)
    assert again.state == "ACTIVE" and again.operation == ""
    assert len(vms_of(simulator)) == 2
    (listed,) = compute.list_capacity(ZONE)
    assert (listed.name, listed.state, listed.job_label) == ("train-1-c1", "ACTIVE", "train-1")


def test_a_preempted_host_is_a_lost_host_in_status_and_in_the_zones_listing(compute, simulator):
    """A Spot VM preempted: status and list_capacity count one unhealthy host, never LOSING or LOST."""
    job = a_job()
    compute.request(job, BOOT)
    active(compute, job.queued_resource)
    victim = sorted(vm["name"] for vm in vms_of(simulator))[0]
    SimulatorControl(simulator).preempt_instance(ZONE, victim, project=PROJECT)

    def lost() -> CapacityStatus | None:
        """a lost host reported"""
        status = compute.status(ZONE, job.queued_resource)
        return status if status is not None and status.unhealthy_hosts == 1 else None

    status = wait_for(lost, timeout=30)
    assert status.state not in (HoldingState.LOSING, HoldingState.LOST) and victim in status.detail
    (listed,) = compute.list_capacity(ZONE)
    assert listed.unhealthy_hosts == 1


def test_release_leaves_no_mig_or_vm_and_the_sweep_gives_back_the_idle_shared_template(compute, simulator):
    """release deletes every slice's MIG (and so its VMs); twice is fine. The shared template and
    policy stay for the next holding of the shape, until a zone listing an hour later gives them
    back: then nothing is left."""
    job = a_job(slices=2)
    compute.request(job, BOOT)
    active(compute, job.queued_resource)
    compute.release(ZONE, job.queued_resource)
    compute.release(ZONE, job.queued_resource)
    assert compute.status(ZONE, job.queued_resource) is None
    assert compute.list_capacity(ZONE) == []
    left = SimulatorControl(simulator).state()["compute"]
    assert {kind: len(items) for kind, items in left.items() if items} == {
        "resourcePolicies": 1,
        "instanceTemplates": 1,
    }
    later = ComputeEngine(
        build_clients(simulator), PROJECT, clock=lambda: datetime.now(timezone.utc) + timedelta(hours=2)
    )

    def swept() -> bool:
        """the idle shared template and policy given back"""
        assert later.list_capacity(ZONE) == []
        return not any(SimulatorControl(simulator).state()["compute"].values())

    wait_for(swept, timeout=30, interval=0.5)


def test_a_second_job_of_the_same_shape_shares_the_template_with_its_own_startup_script(compute, simulator):
    """Two v7x-16 jobs with different boot metadata: one template and one policy in all, each
    job's VMs carrying their own startup script and job label (the MIG's all-instances configuration)."""
    first, second = a_job(), a_job(job_id="eval-2")
    compute.request(first, BOOT)
    compute.request(second, HostBoot(BOOT.service_account, {"startup-script": "#!/bin/sh eval"}))
    active(compute, first.queued_resource)
    active(compute, second.queued_resource)
    state = SimulatorControl(simulator).state()["compute"]
    assert (len(state["instanceTemplates"]), len(state["resourcePolicies"]), len(state["instances"])) == (1, 1, 4)
    for vm in state["instances"]:
        items = {item["key"]: item["value"] for item in vm["metadata"]["items"]}
        job = vm["labels"]["tpujobs-job"]
        assert items["startup-script"] == ("#!/bin/sh eval" if job == "eval-2" else "#!/bin/sh")
        assert vm["name"].startswith(f"{job}-c1-")


def test_tell_hosts_sets_tpujobs_keys_and_keeps_the_others(compute, simulator):
    """setMetadata with the fingerprint: our key added, the boot's and the MIG's kept."""
    job = a_job(accelerator_type="v7x-8")
    compute.request(job, BOOT)
    active(compute, job.queued_resource)
    compute.tell_hosts(ZONE, job.queued_resource, 1, {"tpujobs-assignment": "job-9"})
    (vm,) = vms_of(simulator)
    items = {item["key"]: item["value"] for item in vm["metadata"]["items"]}
    assert items["tpujobs-assignment"] == "job-9"
    assert items["startup-script"] == "#!/bin/sh" and "created-by" in items


def test_a_stockout_waits_for_resources_with_googles_words():
    """No v7x chips in the zone: WAITING, the detail naming the stockout."""
    job = a_job()
    with start({f"v7x@{ZONE}": 0}) as server:
        compute = ComputeEngine(build_clients(server.url), PROJECT, operation_wait_s=10)
        compute.request(job, BOOT)

        def waiting() -> CapacityStatus | None:
            """the holding waiting, saying why"""
            status = compute.status(ZONE, job.queued_resource)
            return status if status is not None and "ZONE_RESOURCE_POOL_EXHAUSTED" in status.detail else None

        assert wait_for(waiting, timeout=30).state is HoldingState.WAITING


def test_a_scheduled_maintenance_is_exposed_with_its_window(compute, simulator):
    """A host's upcomingMaintenance shows in status and in the zone's listing as (VM, window start)."""
    job = a_job()
    compute.request(job, BOOT)
    active(compute, job.queued_resource)
    host = sorted(vm["name"] for vm in vms_of(simulator))[1]
    SimulatorControl(simulator).schedule_maintenance(ZONE, host, notice=3600, project=PROJECT)
    status = compute.status(ZONE, job.queued_resource)
    assert status is not None and status.state == "ACTIVE"
    ((named, start),) = status.maintenance
    assert named == host and datetime.fromisoformat(start.replace("Z", "+00:00")) > datetime.now(timezone.utc)
    (listed,) = compute.list_capacity(ZONE)
    assert listed.maintenance == status.maintenance


def test_a_release_never_waits_out_a_slow_mig_deletion_and_the_leftovers_are_listed_until_swept():
    """Deleting VMs takes minutes on Google: release starts it (no error: the next attempt is
    asked for at once), the zone's listing shows the holding, and a later release (the
    reconciler's sweep) finishes the job."""
    with SimulatorServer(
        SimulatorConfig(waiting_seconds=0.05, provisioning_seconds=0.1, compute_operation_seconds=6.0),
        run_workers=False,
    ) as server:
        compute = ComputeEngine(build_clients(server.url), PROJECT, operation_wait_s=30)
        job = a_job()
        compute.request(job, BOOT)
        active(compute, job.queued_resource)
        compute.release(ZONE, job.queued_resource)  # returns: the MIG's deletion outlasts its wait
        (leftover,) = wait_for(lambda: compute.list_capacity(ZONE) or None, timeout=30)
        assert leftover.name == job.queued_resource and leftover.job_label == "train-1"

        def swept() -> bool:
            """the leftovers released: no MIG or VM (the shared template and policy stay, for reuse)"""
            compute.release(ZONE, job.queued_resource)
            left = SimulatorControl(server.url).state()["compute"]
            return not left["instanceGroupManagers"] and not left["instances"]

        wait_for(swept, timeout=60, interval=1.0)

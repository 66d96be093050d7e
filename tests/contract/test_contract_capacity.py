"""The contract of `ports.Capacity`: `InMemoryCapacity`, and `CloudTpu` on the in-process TPU simulator.

What Google does meanwhile (a preemption) goes through one small helper per backend: the
simulator's control API for the real adapter, `set_state` for the fake; so does someone else's
resource of a holding's name (made with the TPU client, without tpujobs' labels; `plant_foreign`). Where the simulator
takes time (provisioning, a deletion's tick), the real side waits for it, with a generous
deadline; the assertions name the states both may show.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
from contract_data import ZONE, a_job

from tpujobs.domain.spec import parse_spec
from tpujobs.engine.errors import NotOurs
from tpujobs.engine.ports import CAPACITY_GONE, CAPACITY_PENDING, Capacity, CapacityStatus, HostBoot, UnitRequest
from tpujobs.local.fakes import InMemoryCapacity
from tpujobs.local.testing import wait_for

PROJECT = "contract-capacity"
BOOT = HostBoot("vm@example.iam.gserviceaccount.com", {"startup-script": "#!/bin/sh"})
GONE_OR_GOING = (None, "DELETING")  # a forced delete may show DELETING until the backend's next tick


@dataclass
class Backend:
    """A Capacity port, and how a test makes Google preempt one of its holdings."""

    port: Capacity
    preempt: Callable[[str], None]  # the holding's name, in ZONE
    plant_foreign: Callable[[str], None]  # someone else makes a resource of that name in ZONE, and it is ACTIVE


@pytest.fixture(params=["memory", "simulator"])
def capacity(request: pytest.FixtureRequest) -> Backend:
    if request.param == "memory":
        fake = InMemoryCapacity()
        return Backend(fake, lambda name: fake.set_state(name, "SUSPENDED") and None, partial(fake.plant_foreign, ZONE))
    from tpujobs.adapters.tpu import CloudTpu
    from tpujobs.local.simulator.client import SimulatorControl

    client = request.getfixturevalue("tpu_client")
    real = CloudTpu(client, PROJECT)
    control = SimulatorControl(request.getfixturevalue("simulator_url"))

    def plant_foreign(name: str) -> None:
        """A queued resource made by someone else's code: a plain node, none of tpujobs' labels."""
        from google.cloud import tpu_v2

        node = tpu_v2.Node(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base", labels={"team": "other"})
        spec = tpu_v2.QueuedResource.Tpu.NodeSpec(
            parent=f"projects/{PROJECT}/locations/{ZONE}", node_id=name, node=node
        )
        resource = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]))
        client.create_queued_resource(
            parent=f"projects/{PROJECT}/locations/{ZONE}", queued_resource=resource, queued_resource_id=name
        )
        wait_for(lambda: state_of(real, name) == "ACTIVE", timeout=30)

    def preempt(name: str) -> None:
        """Spot capacity taken back once it is provisioned (the simulator preempts nothing sooner)."""

        def provisioned() -> bool:
            """the queued resource PROVISIONING or ACTIVE"""
            status = real.status(ZONE, name)
            return status is not None and status.state in ("PROVISIONING", "ACTIVE")

        wait_for(provisioned, timeout=30)  # quick provisioning (tests/conftest.py), generous deadline
        # SUSPENDING lasts the hosts' grace (30 s); none save here: a short one
        control.configure(preemption_grace_seconds=0.2)
        control.preempt(ZONE, name, project=PROJECT)

    return Backend(real, preempt, plant_foreign)


def a_unit(name: str = "demo-u0-g1", pool: str = "demo") -> UnitRequest:
    """A warm-pool unit of one v4-8 slice, labelled for its pool."""
    spec = parse_spec(
        {"job_id": f"{pool}-unit", "name": pool, "owner": "ada@example.com", "accelerator_type": "v4-8", "command": "-"}
    )
    return UnitRequest(name, ZONE, spec, {"tpujobs-pool": pool, "tpujobs-unit": name})


def state_of(port: Any, name: str) -> str | None:
    status = port.status(ZONE, name)
    return None if status is None else status.state


def test_a_requested_job_holding_is_pending_labelled_and_its_create_did_not_fail(capacity):
    """request names the holding after the attempt, labels it with the job, and keeps its operation."""
    job, _ = a_job()
    status = capacity.port.request(job, BOOT)
    assert (status.name, status.zone, status.job_label) == (job.queued_resource, ZONE, job.job_id)
    assert status.state in CAPACITY_PENDING and status.pool_label is None
    assert status.operation and capacity.port.create_error(status.operation) is None
    read = capacity.port.status(ZONE, job.queued_resource)
    assert read is not None and read.job_label == job.job_id and read.operation == ""  # only request says it
    assert capacity.port.create_error("") is None


def test_a_second_request_adopts_the_existing_holding(capacity):
    """Names are deterministic: asking again adopts what the first request got, and holds it once."""
    job, _ = a_job()
    first = capacity.port.request(job, BOOT)
    again = capacity.port.request(job, BOOT)
    assert (again.name, again.zone, again.job_label) == (first.name, first.zone, first.job_label)
    assert again.state in CAPACITY_PENDING
    assert again.operation == ""  # the adopter made no create of its own: only the first request knows it
    assert [s.name for s in capacity.port.list_capacity(ZONE)] == [job.queued_resource]


def test_the_status_of_an_unknown_holding_is_none(capacity):
    """Nothing of that name (or nothing in that zone) reads as None, never as an error."""
    job, _ = a_job()
    capacity.port.request(job, BOOT)
    assert capacity.port.status(ZONE, "never-requested") is None
    assert capacity.port.status("europe-west4-a", job.queued_resource) is None


def test_a_release_gives_the_holding_back_and_may_be_repeated(capacity):
    """release forces the holding away; releasing it again, or a name never held, is fine."""
    job, _ = a_job()
    capacity.port.request(job, BOOT)
    capacity.port.release(ZONE, job.queued_resource)
    capacity.port.release(ZONE, job.queued_resource)
    capacity.port.release(ZONE, "never-requested")
    assert state_of(capacity.port, job.queued_resource) in GONE_OR_GOING

    def gone() -> bool:
        """the released holding gone from the zone's list"""
        return all(s.name != job.queued_resource or s.state == "DELETING" for s in capacity.port.list_capacity(ZONE))

    wait_for(gone, timeout=30)


def test_the_zone_lists_what_was_requested_with_its_labels(capacity):
    """list_capacity holds every job's and unit's holding of the zone, each labelled, hosts healthy."""
    first, _ = a_job("train-1")
    second, _ = a_job("train-2")
    for job in (first, second):
        capacity.port.request(job, BOOT)
    capacity.port.request_unit(a_unit(), BOOT)
    listed = {s.name: s for s in capacity.port.list_capacity(ZONE)}
    assert sorted(listed) == sorted([first.queued_resource, second.queued_resource, "demo-u0-g1"])
    assert listed[first.queued_resource].job_label == "train-1"
    assert (listed["demo-u0-g1"].pool_label, listed["demo-u0-g1"].job_label) == ("demo", None)
    assert all(s.zone == ZONE and s.unhealthy_hosts == 0 and not s.suspect_hosts for s in listed.values())
    assert capacity.port.list_capacity("europe-west4-a") == []


def test_a_unit_request_is_labelled_for_its_pool_and_adopted_when_asked_again(capacity):
    """request_unit holds a warm-pool unit under its own name, as request does for a job."""
    status = capacity.port.request_unit(a_unit(), BOOT)
    assert (status.name, status.pool_label, status.job_label) == ("demo-u0-g1", "demo", None)
    assert status.state in CAPACITY_PENDING
    again = capacity.port.request_unit(a_unit(), BOOT)
    assert (again.name, again.pool_label) == ("demo-u0-g1", "demo")
    assert [s.name for s in capacity.port.list_capacity(ZONE)] == ["demo-u0-g1"]


def test_a_preempted_holding_shows_its_new_state_in_status_and_list(capacity):
    """What Google did meanwhile is what status and list_capacity say: the holding is gone to SUSPENDED."""
    job, _ = a_job()
    capacity.port.request(job, BOOT)
    capacity.preempt(job.queued_resource)
    assert state_of(capacity.port, job.queued_resource) in CAPACITY_GONE

    def suspended() -> CapacityStatus | None:
        """the preempted holding SUSPENDED in the zone's list"""
        found = [s for s in capacity.port.list_capacity(ZONE) if s.name == job.queued_resource]
        return found[0] if found and found[0].state == "SUSPENDED" else None

    assert wait_for(suspended, timeout=30).job_label == job.job_id


def test_a_request_never_adopts_a_holding_someone_else_made(capacity):
    """A resource of the attempt's name without tpujobs' marker: NotOurs, and it is left as it was."""
    job, _ = a_job()
    capacity.plant_foreign(job.queued_resource)
    with pytest.raises(NotOurs, match=job.queued_resource):
        capacity.port.request(job, BOOT)
    assert state_of(capacity.port, job.queued_resource) == "ACTIVE"


def test_a_unit_request_never_adopts_a_holding_someone_else_made(capacity):
    """Pool creation over someone else's resource of the unit's name refuses (NotOurs) rather than adopt it."""
    capacity.plant_foreign("demo-u0-g1")
    with pytest.raises(NotOurs, match="demo-u0-g1"):
        capacity.port.request_unit(a_unit(), BOOT)
    status = capacity.port.status(ZONE, "demo-u0-g1")
    assert status is not None and status.pool_label is None  # never labelled as the pool's


def test_metadata_is_never_written_into_a_holding_someone_else_made(capacity):
    """write_metadata on someone else's ACTIVE resource of a unit's name: NotOurs, nothing told."""
    capacity.plant_foreign("demo-u0-g1")
    with pytest.raises(NotOurs, match="demo-u0-g1"):
        capacity.port.write_metadata(ZONE, "demo-u0-g1", 1, {"tpujobs-assignment": "{}"})


def test_a_release_never_deletes_a_holding_someone_else_made(capacity):
    """release of a name whose resource tpujobs did not make deletes nothing (it holds nothing there)."""
    job, _ = a_job()
    capacity.plant_foreign(job.queued_resource)
    capacity.port.release(ZONE, job.queued_resource)
    assert state_of(capacity.port, job.queued_resource) == "ACTIVE"
    assert [s.name for s in capacity.port.list_capacity(ZONE)] == [job.queued_resource]

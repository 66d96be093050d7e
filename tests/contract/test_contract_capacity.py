"""The contract of `ports.Capacity`: `InMemoryCapacity`, `CloudTpu`, `ComputeEngine` and the router
(`PlatformCapacity`), the last three through Google's clients on the in-process simulator.

Every backend says its states as `HoldingState`. What Google does meanwhile (a preemption) and
someone else's resource of a holding's name go through one small helper per backend
(`capacity_backends`): the simulator's control API and Google's clients for the adapters,
`set_state` and `plant_foreign` for the fake. Where a platform may answer either of two ways the
engine treats alike, the assertion names both: a preempted TPU holding is LOSING then LOST, a
preempted Compute Engine holding counts its lost hosts; the TPU API reports someone else's
queued resource unlabelled, Compute Engine does not report it at all. Where the simulator takes
time (provisioning, a deletion's tick), the test waits for it with a generous deadline.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from capacity_backends import BOOT, Backend, compute, compute_job, memory, router, simulator, tpu_api, tpu_job
from contract_data import ZONE

from tpujobs.domain.holdings import HOLDING_LOST, HOLDING_PENDING, HoldingState
from tpujobs.engine.errors import NotOurs
from tpujobs.engine.ports import Capacity, CapacityStatus
from tpujobs.local.testing import wait_for

GONE_OR_GOING = (None, HoldingState.RELEASING)  # a forced delete may show RELEASING until the backend's next tick
ON_THE_SIMULATOR = {"tpu-api": tpu_api, "compute": compute, "router": router}


@pytest.fixture(params=["memory", *ON_THE_SIMULATOR])
def capacity(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "memory":
        yield memory()
        return
    with simulator() as url:
        yield ON_THE_SIMULATOR[request.param](url)


def state_of(port: Capacity, name: str) -> HoldingState | None:
    status = port.status(ZONE, name)
    return None if status is None else status.state


def lost(status: CapacityStatus | None) -> bool:
    """What the engine takes for a loss: a lost state, or lost hosts."""
    return status is not None and (status.state in HOLDING_LOST or status.unhealthy_hosts > 0)


def test_a_requested_job_holding_is_pending_labelled_and_its_create_did_not_fail(capacity):
    """request names the holding after the attempt, labels it with the job, and keeps its operation."""
    job = capacity.job("train-1")
    status = capacity.port.request(job, BOOT)
    assert (status.name, status.zone, status.job_label) == (job.queued_resource, ZONE, job.job_id)
    assert status.state in HOLDING_PENDING and status.pool_label is None
    assert status.operation and capacity.port.create_error(status.operation) is None
    read = capacity.port.status(ZONE, job.queued_resource)
    assert read is not None and read.job_label == job.job_id and read.operation == ""  # only request says it
    assert isinstance(read.state, HoldingState)
    assert capacity.port.create_error("") is None


def test_a_second_request_adopts_the_existing_holding(capacity):
    """Names are deterministic: asking again adopts what the first request got, and holds it once."""
    job = capacity.job("train-1")
    first = capacity.port.request(job, BOOT)
    again = capacity.port.request(job, BOOT)
    assert (again.name, again.zone, again.job_label) == (first.name, first.zone, first.job_label)
    assert again.state in HOLDING_PENDING
    assert again.operation == ""  # the adopter made no create of its own: only the first request knows it
    assert [s.name for s in capacity.port.list_capacity(ZONE)] == [job.queued_resource]


def test_the_status_of_an_unknown_holding_is_none(capacity):
    """Nothing of that name (or nothing in that zone) reads as None, never as an error."""
    job = capacity.job("train-1")
    capacity.port.request(job, BOOT)
    assert capacity.port.status(ZONE, "never-requested") is None
    assert capacity.port.status("europe-west4-a", job.queued_resource) is None


def test_a_release_gives_the_holding_back_and_may_be_repeated(capacity):
    """release forces the holding away; releasing it again, or a name never held, is fine."""
    job = capacity.job("train-1")
    capacity.port.request(job, BOOT)
    capacity.port.release(ZONE, job.queued_resource)
    capacity.port.release(ZONE, job.queued_resource)
    capacity.port.release(ZONE, "never-requested")
    assert state_of(capacity.port, job.queued_resource) in GONE_OR_GOING

    def gone() -> bool:
        """the released holding gone from the zone's list"""
        listed = capacity.port.list_capacity(ZONE)
        return all(s.name != job.queued_resource or s.state is HoldingState.RELEASING for s in listed)

    wait_for(gone, timeout=30)


def test_the_zone_lists_what_was_requested_with_its_labels(capacity):
    """list_capacity holds every job's and unit's holding of the zone, each labelled, hosts healthy."""
    first, second, unit = capacity.job("train-1"), capacity.job("train-2"), capacity.unit()
    for job in (first, second):
        capacity.port.request(job, BOOT)
    capacity.port.request_unit(unit, BOOT)
    listed = {s.name: s for s in capacity.port.list_capacity(ZONE)}
    assert sorted(listed) == sorted([first.queued_resource, second.queued_resource, unit.name])
    assert listed[first.queued_resource].job_label == "train-1"
    assert (listed[unit.name].pool_label, listed[unit.name].job_label) == ("demo", None)
    assert all(s.zone == ZONE and s.unhealthy_hosts == 0 and not s.suspect_hosts for s in listed.values())
    assert all(s.state in HOLDING_PENDING for s in listed.values())
    assert capacity.port.list_capacity("europe-west4-a") == []


def test_a_unit_request_is_labelled_for_its_pool_and_adopted_when_asked_again(capacity):
    """request_unit holds a warm-pool unit under its own name, as request does for a job."""
    unit = capacity.unit()
    status = capacity.port.request_unit(unit, BOOT)
    assert (status.name, status.pool_label, status.job_label) == (unit.name, "demo", None)
    assert status.state in HOLDING_PENDING
    again = capacity.port.request_unit(unit, BOOT)
    assert (again.name, again.pool_label) == (unit.name, "demo")
    assert [s.name for s in capacity.port.list_capacity(ZONE)] == [unit.name]


def test_a_preempted_holding_shows_the_loss_in_status_and_list(capacity):
    """What Google did meanwhile is what status and list_capacity say: a lost state, or lost hosts."""
    job = capacity.job("train-1")
    capacity.port.request(job, BOOT)
    capacity.preempt(job.queued_resource)
    assert wait_for(lambda: lost(capacity.port.status(ZONE, job.queued_resource)), timeout=30)

    def listed_lost() -> CapacityStatus | None:
        """the preempted holding lost in the zone's list"""
        found = [s for s in capacity.port.list_capacity(ZONE) if s.name == job.queued_resource]
        return found[0] if found and lost(found[0]) else None

    assert wait_for(listed_lost, timeout=30).job_label == job.job_id


def test_a_request_never_adopts_a_holding_someone_else_made(capacity):
    """A resource of the attempt's name without tpujobs' marker: NotOurs, and it is left as it was."""
    job = capacity.job("train-1")
    capacity.plant_foreign(job)
    with pytest.raises(NotOurs, match=job.queued_resource):
        capacity.port.request(job, BOOT)
    assert capacity.foreign_left(job.queued_resource)


def test_a_unit_request_never_adopts_a_holding_someone_else_made(capacity):
    """Pool creation over someone else's resource of the unit's name refuses (NotOurs) rather than adopt it."""
    unit = capacity.unit()
    capacity.plant_foreign(unit)
    with pytest.raises(NotOurs, match=unit.name):
        capacity.port.request_unit(unit, BOOT)
    status = capacity.port.status(ZONE, unit.name)
    assert status is None or status.pool_label is None  # never labelled as the pool's
    assert capacity.foreign_left(unit.name)


def test_metadata_is_never_written_into_a_holding_someone_else_made(capacity):
    """tell_hosts on someone else's resource of a unit's name: NotOurs, nothing told."""
    unit = capacity.unit()
    capacity.plant_foreign(unit)
    with pytest.raises(NotOurs, match=unit.name):
        capacity.port.tell_hosts(ZONE, unit.name, 1, {"tpujobs-assignment": "{}"})


def test_a_release_never_deletes_a_holding_someone_else_made(capacity):
    """release of a name whose resource tpujobs did not make deletes nothing (it holds nothing there)."""
    job = capacity.job("train-1")
    capacity.plant_foreign(job)
    capacity.port.release(ZONE, job.queued_resource)
    assert capacity.foreign_left(job.queued_resource)
    listed = capacity.port.list_capacity(ZONE)
    assert all(s.name == job.queued_resource and s.job_label is None for s in listed)  # if listed, as no job's


def test_the_router_holds_both_platforms_in_one_zone():
    """One zone, a holding on each platform: the router lists both and releases each on its own
    platform, by its name."""
    from tpujobs.adapters.capacity_router import PlatformCapacity

    with simulator() as url:
        tpu, engine = tpu_api(url), compute(url)
        port = PlatformCapacity(tpu.port, engine.port)
        old, new = tpu_job("old"), compute_job("new")
        port.request(old, BOOT)
        port.request(new, BOOT)
        assert sorted(s.name for s in port.list_capacity(ZONE)) == ["new-c1", "old-a1"]
        assert [s.name for s in tpu.port.list_capacity(ZONE)] == ["old-a1"]
        assert [s.name for s in engine.port.list_capacity(ZONE)] == ["new-c1"]
        port.release(ZONE, "new-c1")
        assert engine.port.status(ZONE, "new-c1") is None and state_of(port, "old-a1") in HOLDING_PENDING

"""The in-memory capacity port (`local.fakes.capacity`), alone and under the engine, in milliseconds."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

import pytest

from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import JobState
from tpujobs.engine.errors import PermanentError, QuotaExhausted
from tpujobs.engine.ports import Capacity, HostBoot, UnitRequest
from tpujobs.engine.services import Engine
from tpujobs.local.fakes import InMemoryCapacity, InMemoryJobStore, InMemoryPools, RecordingPublisher
from tpujobs.local.testing import inbound, local_settings

ZONE = "us-central2-b"
SPEC = {
    "job_id": "train-1",
    "name": "train",
    "owner": "ada@example.com",
    "accelerator_type": "v4-8",
    "command": "python train.py",
    "on_preemption": "resume",
    "max_restarts": 3,
}
BOOT = HostBoot("vm@example.iam.gserviceaccount.com", {"startup-script": "#!/bin/sh"})


def engine_on(capacity: InMemoryCapacity, **settings: object) -> Engine:
    """The engine on in-memory fakes only: no emulator, no simulator."""
    store = InMemoryJobStore()
    published = RecordingPublisher()
    return Engine(
        store,
        capacity,
        local_settings(default_zone=ZONE, logs_bucket="logs", **settings),
        lambda: datetime.now(timezone.utc),
        lambda seconds: None,
        status=published,
        exports=published,
        pools=InMemoryPools(store),
    )


def test_the_fake_is_a_capacity_port() -> None:
    """InMemoryCapacity has every method of `engine.ports.Capacity` (mypy checks the signatures)."""
    port: Capacity = InMemoryCapacity()
    assert all(callable(getattr(port, name)) for name in ("request", "release", "status", "list_capacity"))


def test_a_request_holds_once_and_a_second_adopts_what_the_first_got() -> None:
    """Names are deterministic: asking twice for one holding adopts it, as the TPU adapter does."""
    capacity = InMemoryCapacity()
    unit = UnitRequest("demo-u0-g1", ZONE, parse_spec(SPEC), {"tpujobs-pool": "demo"})
    first = capacity.request_unit(unit, BOOT)
    again = capacity.request_unit(unit, BOOT)
    assert again == dataclasses.replace(first, operation="") and first.operation  # the adopter created nothing
    assert first.state is HoldingState.WAITING and first.pool_label == "demo"
    assert capacity.held(ZONE) == ["demo-u0-g1"] and capacity.requested() == ["demo-u0-g1", "demo-u0-g1"]


def test_states_are_set_by_the_test_and_a_release_gives_the_holding_back() -> None:
    """`set_state` stands for Google; `status` and `list_capacity` show it; `release` forgets it."""
    capacity = InMemoryCapacity(initial_state=HoldingState.ACTIVE)
    unit = UnitRequest("demo-u1-g1", ZONE, parse_spec(SPEC), {"tpujobs-pool": "demo"})
    capacity.request_unit(unit, BOOT)
    capacity.set_state("demo-u1-g1", HoldingState.LOST, unhealthy_hosts=1)
    status = capacity.status(ZONE, "demo-u1-g1")
    assert status is not None and (status.state, status.unhealthy_hosts) == (HoldingState.LOST, 1)
    assert [s.name for s in capacity.list_capacity(ZONE)] == ["demo-u1-g1"]
    capacity.release(ZONE, "demo-u1-g1")
    capacity.release(ZONE, "demo-u1-g1")  # absent is fine
    assert capacity.status(ZONE, "demo-u1-g1") is None and capacity.released() == ["demo-u1-g1"] * 2


def test_metadata_reaches_only_the_hosts_of_an_active_holding() -> None:
    """A unit's agents are told by metadata on every slice's node; a holding not ACTIVE refuses."""
    capacity = InMemoryCapacity()
    unit = UnitRequest("demo-u2-g1", ZONE, parse_spec(SPEC), {"tpujobs-pool": "demo"})
    capacity.request_unit(unit, BOOT)
    with pytest.raises(PermanentError, match="not READY"):
        capacity.tell_hosts(ZONE, "demo-u2-g1", 2, {"tpujobs-assignment": "{}"})
    capacity.set_state("demo-u2-g1", HoldingState.ACTIVE)
    capacity.tell_hosts(ZONE, "demo-u2-g1", 2, {"tpujobs-assignment": "{}"})
    assert sorted(capacity.holdings[(ZONE, "demo-u2-g1")].metadata) == ["demo-u2-g1-0", "demo-u2-g1-1"]


def test_a_submitted_job_holds_its_attempts_capacity_on_the_fake() -> None:
    """Submitted on the topic, the job asks the capacity port for attempt 1's slices, labelled for it."""
    capacity = InMemoryCapacity()
    service = engine_on(capacity)
    assert service.submission.submit(inbound("tpujobs-submit", SPEC)).kind == "provisioning"
    job = service.store.get("train-1")
    assert job is not None and job.state is JobState.PROVISIONING
    status = capacity.status(ZONE, job.queued_resource)
    assert status is not None and status.job_label == "train-1"


def test_a_full_quota_is_a_wait_saying_so_not_a_failure() -> None:
    """A request refused for TPU quota leaves the job PROVISIONING, quoting Google's words."""
    capacity = InMemoryCapacity()
    capacity.refuse_next(QuotaExhausted("Quota 'TPUV4PodPerProjectPerZone' exceeded. Limit: 0"))
    service = engine_on(capacity)
    service.submission.submit(inbound("tpujobs-submit", SPEC))
    job = service.store.get("train-1")
    assert job is not None and job.state is JobState.PROVISIONING and "TPUV4PodPerProjectPerZone" in job.state_reason
    assert capacity.held() == []


def test_a_preempted_holding_is_released_and_the_next_attempt_asked_for() -> None:
    """LOST, observed on tpujobs-qr-state: attempt 1's capacity goes back, attempt 2's is requested."""
    capacity = InMemoryCapacity()
    service = engine_on(capacity)
    service.submission.submit(inbound("tpujobs-submit", SPEC))
    first = service.store.get("train-1")
    assert first is not None
    capacity.set_state(first.queued_resource, HoldingState.LOST)
    report = {"queued_resource": first.queued_resource, "zone": ZONE, "state": "LOST"}
    service.capacity_events.on_qr_state(inbound("tpujobs-qr-state", report))
    job = service.store.get("train-1")
    assert job is not None and job.attempt == 2 and job.state is JobState.PROVISIONING
    assert capacity.held(ZONE) == [job.queued_resource]
    assert first.queued_resource in capacity.released()


def test_a_word_of_no_holding_state_is_refused_at_once() -> None:
    """The fake follows the port: a TPU API word (SUSPENDED) is no state of it, and says so."""
    capacity = InMemoryCapacity()
    capacity.plant_foreign(ZONE, "other-a1")
    with pytest.raises(ValueError, match="SUSPENDED"):
        capacity.set_state("other-a1", "SUSPENDED")  # type: ignore[arg-type]  # what a stale test would pass

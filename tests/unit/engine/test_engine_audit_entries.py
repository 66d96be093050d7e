"""Audit-log entries on tpujobs-qr-state move a job only as Google's own would (issue 37): an
entry from this project's admin-activity audit log, about a holding tpujobs holds now, in the zone
it was requested in. Any other entry (another zone, another project, another log, a holding that
is not the current one, a Compute Engine holding, which the TPU API never logs) reads nothing,
changes nothing, and is counted like a forged report: one record per reason and minute."""

from __future__ import annotations

from typing import Any

import pytest
from engine_harness import PROJECT, ZONE, Engine

from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.pools import UnitState
from tpujobs.domain.states import JobState
from tpujobs.engine.jobs.audit_entries import NOT_HELD, NOT_THE_AUDIT_LOG, OTHER_PROJECT, OTHER_ZONE
from tpujobs.engine.jobs.rejections import COUNT_WINDOW
from tpujobs.local.fakes.capacity import InMemoryCapacity
from tpujobs.local.testing import OffsetClock

OTHER_ZONE_NAME = "us-east5-a"
ADMIN = "root@example.com"
OWNER = "ada@example.com"
SPEC = {
    "job_id": "train-1",
    "name": "train",
    "owner": OWNER,
    "accelerator_type": "v4-8",
    "command": "python train.py",
    "on_preemption": "resume",
    "max_restarts": 3,
}


def audit_entry(holding: str, zone: str = ZONE, project: str = PROJECT, log_project: str = PROJECT) -> dict[str, Any]:
    """A TPU audit entry of a queued resource's deletion, as the sink publishes it."""
    return {
        "insertId": "abc123",
        "logName": f"projects/{log_project}/logs/cloudaudit.googleapis.com%2Factivity",
        "operation": {"id": "operations/op-1", "producer": "tpu.googleapis.com", "last": True},
        "protoPayload": {
            "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
            "serviceName": "tpu.googleapis.com",
            "methodName": "google.cloud.tpu.v2.Tpu.DeleteQueuedResource",
            "resourceName": f"projects/{project}/locations/{zone}/queuedResources/{holding}",
        },
        "severity": "NOTICE",
        "timestamp": "2026-11-22T05:00:00Z",
    }


@pytest.fixture
def clock() -> OffsetClock:
    return OffsetClock()


@pytest.fixture
def capacity() -> InMemoryCapacity:
    return InMemoryCapacity(initial_state=HoldingState.ACTIVE)


@pytest.fixture
def jobs(engine, capacity: InMemoryCapacity, clock: OffsetClock) -> Engine:
    return engine(capacity=capacity, clock=clock, admins=(ADMIN,))


def running(jobs: Engine, **changes: Any) -> str:
    """A job RUNNING on capacity of its own, attempt 1; its holding's name."""
    assert jobs.submit({**SPEC, **changes}).kind == "provisioning"
    jobs.report("started", 1)
    job = jobs.job()
    assert (job.state, job.attempt) == (JobState.RUNNING, 1)
    return job.queued_resource


def reads(capacity: InMemoryCapacity) -> list[tuple[str, ...]]:
    return [call for call in capacity.calls if call[0] == "status"]


def test_an_entry_naming_another_zone_ends_nothing_and_reads_nothing(jobs, capacity):
    """The victim's holding is live in its zone; an entry naming it in another zone, where no such
    holding is, does not end the attempt, and the capacity is not read anywhere."""
    holding = running(jobs)
    before = len(reads(capacity))
    assert jobs.qr_state(audit_entry(holding, zone=OTHER_ZONE_NAME)) is None
    job = jobs.job()
    assert (job.state, job.attempt, job.restarts) == (JobState.RUNNING, 1, 0)
    assert len(reads(capacity)) == before
    assert capacity.held() == [holding]


def test_an_entry_naming_another_project_changes_nothing(jobs, capacity):
    """The same holding in the right zone, but under another project: no read, no change, even
    when reading would have found something to record."""
    holding = running(jobs)
    capacity.set_state(holding, HoldingState.LOST)  # what a read would find, were it made
    before = len(reads(capacity))
    assert jobs.qr_state(audit_entry(holding, project="someone-else")) is None
    assert (jobs.job().state, jobs.job().attempt) == (JobState.RUNNING, 1)
    assert len(reads(capacity)) == before


def test_an_entry_from_another_log_changes_nothing(jobs, capacity):
    """An entry shaped like a TPU audit entry but from any other log (one a job may write) is refused."""
    holding = running(jobs)
    capacity.vanish(holding)
    assert jobs.qr_state(audit_entry(holding, log_project="someone-else")) is None
    assert (jobs.job().state, jobs.job().attempt) == (JobState.RUNNING, 1)
    assert jobs.rejections()[-1].reason.endswith(f"{NOT_THE_AUDIT_LOG}.")


def test_an_entry_about_an_earlier_attempt_or_no_job_changes_nothing(jobs, capacity):
    """A holding tpujobs does not hold now (attempt 2 of an attempt-1 job, a job that does not
    exist) is not read: the current attempt runs on."""
    holding = running(jobs)
    capacity.vanish(holding)
    for stranger in ("train-1-a2", "nobody-a1"):
        assert jobs.qr_state(audit_entry(stranger)) is None
    assert (jobs.job().state, jobs.job().attempt) == (JobState.RUNNING, 1)
    assert not [call for call in reads(capacity) if call[2] in ("train-1-a2", "nobody-a1")]
    assert jobs.rejections()[0].reason.endswith(f"{NOT_HELD}.")


def test_forged_entries_are_counted_one_record_per_reason_and_minute(jobs, clock):
    """Three forged entries of one kind: the first is recorded as itself, the rest counted, and the
    count written as one record when a minute has passed; no write per entry."""
    holding = running(jobs)
    for _ in range(3):
        jobs.qr_state(audit_entry(holding, zone=OTHER_ZONE_NAME))
    found = jobs.rejections()
    assert len(found) == 1 and found[0].topic == "tpujobs-qr-state"
    assert found[0].reason == f"Audit entry about {holding} in {OTHER_ZONE_NAME} refused unread: {OTHER_ZONE}."
    clock.advance(COUNT_WINDOW.total_seconds() + 1)
    jobs.qr_state(audit_entry(holding, project="someone-else"))  # another reason: recorded as itself
    counted = [d for d in jobs.store.rejection_documents() if d["message_id"].startswith("forged-")]
    assert [d["deliveries"] for d in counted] == [2]
    assert [r.reason for r in jobs.rejections() if r.reason.endswith(f"{OTHER_PROJECT}.")]


def test_an_entry_in_the_holdings_own_zone_still_moves_the_job(jobs, capacity):
    """Google's own entry of a deletion tpujobs did not make: the read, in the recorded zone, finds
    nothing, and the attempt is lost as before; nothing is refused."""
    holding = running(jobs)
    capacity.vanish(holding)
    jobs.qr_state(audit_entry(holding))
    job = jobs.job()
    assert job.attempt == 2 and job.restarts == 1
    assert ("status", ZONE, holding) in reads(capacity)
    assert jobs.rejections() == []


def test_an_entry_naming_the_project_by_its_number_moves_the_job_where_the_number_is_known(engine, capacity):
    """A resource path may name the project by number: taken when the deployment says its number
    (TPUJOBS_PROJECT_NUMBER), and still refused when it names another number."""
    jobs = engine(capacity=capacity, clock=OffsetClock(), admins=(ADMIN,), project_number="123456789")
    holding = running(jobs)
    capacity.vanish(holding)
    assert jobs.qr_state(audit_entry(holding, project="987654321")) is None
    assert jobs.job().attempt == 1
    jobs.qr_state(audit_entry(holding, project="123456789"))
    assert jobs.job().attempt == 2


def test_a_compute_engine_holding_named_by_a_tpu_audit_entry_ends_nothing(jobs, capacity):
    """A Compute Engine job's holding (`-c1`) is never in the TPU API's audit log: an entry naming it,
    in another zone or its own, reads nothing and ends nothing, and is counted."""
    holding = running(jobs, accelerator_type="v6e-8", platform="compute")
    assert holding == "train-1-c1"
    before = len(reads(capacity))
    for zone in (OTHER_ZONE_NAME, ZONE):
        assert jobs.qr_state(audit_entry(holding, zone=zone)) is None
    job = jobs.job()
    assert (job.state, job.attempt) == (JobState.RUNNING, 1)
    assert len(reads(capacity)) == before
    assert jobs.rejections()[0].reason.endswith(f"{NOT_HELD}.")


# -- warm-pool units ---------------------------------------------------------------------------


def busy_unit(jobs: Engine) -> str:
    """A pool of one unit, ACTIVE, running train-1: the unit's holding."""
    created = jobs.create_pool({"name": "demo", "accelerator_type": "v4-8", "count": 1, "users": [OWNER]}, ADMIN)
    assert created.kind == "done", created
    jobs.tick()
    refused = jobs.refusal({**SPEC, "pool": "demo"})
    assert refused is None, refused
    jobs.submit_verified({**SPEC, "pool": "demo"})
    pool = jobs.warm_pools.get("demo")
    assert pool is not None and pool.units[0].state is UnitState.BUSY
    return pool.units[0].queued_resource("demo")


def test_an_entry_naming_a_pool_units_holding_in_another_zone_ends_nothing(jobs, capacity):
    """The unit and its job stay as they are: same generation, same attempt; counted."""
    unit = busy_unit(jobs)
    before = len(reads(capacity))
    assert jobs.qr_state(audit_entry(unit, zone=OTHER_ZONE_NAME)) is None
    pool = jobs.warm_pools.get("demo")
    assert pool is not None and (pool.units[0].state, pool.units[0].generation) == (UnitState.BUSY, 1)
    assert jobs.job().attempt == 1 and jobs.job().state is not JobState.RECOVERING
    assert len(reads(capacity)) == before
    assert jobs.rejections()[-1].reason.endswith(f"{OTHER_ZONE}.")


def test_an_entry_naming_a_pool_jobs_own_attempt_name_ends_nothing(jobs, capacity):
    """A job on a unit holds nothing named `{job}-a{N}`: an entry naming that is refused unread."""
    busy_unit(jobs)
    before = len(reads(capacity))
    assert jobs.qr_state(audit_entry("train-1-a1")) is None
    assert jobs.job().attempt == 1 and jobs.job().state is not JobState.RECOVERING
    assert len(reads(capacity)) == before


def test_an_entry_about_a_pool_unit_in_its_own_zone_still_reaches_the_pool(jobs, capacity):
    """Google's entry of the unit's deletion, in its zone: the unit is lost and asked for again."""
    unit = busy_unit(jobs)
    capacity.vanish(unit)
    jobs.qr_state(audit_entry(unit))
    pool = jobs.warm_pools.get("demo")
    assert pool is not None and pool.units[0].generation == 2
    assert jobs.rejections() == []

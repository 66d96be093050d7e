"""Scheduled maintenance, announced ahead: the host's `instance/upcoming-maintenance` becomes a
`maintenance` report, and the job's timeline and the status topic say it, once per host and
window, while its state stays (a TPU VM is not migrated: the loss itself is `on_preemption`'s)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from engine_harness import Engine

from tpujobs.agent.notices import upcoming_window
from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.states import JobState
from tpujobs.local.fakes.capacity import InMemoryCapacity
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.testing import OffsetClock, inbound, signed

EVENTS = "tpujobs-worker-events"
WINDOW = {
    "can_reschedule": False,
    "maintenance_status": "PENDING",
    "type": "SCHEDULED",
    "window_start_time": "2026-12-01T04:00:00Z",
    "window_end_time": "2026-12-01T08:00:00Z",
}


@pytest.fixture
def jobs(engine) -> Engine:
    return engine()


def running(jobs: Engine, job_id: str = "train-1", **changes: object) -> str:
    spec = {"job_id": job_id, "name": "train", "owner": "ada@example.com", "accelerator_type": "v4-16", **changes}
    assert jobs.handle(inbound("tpujobs-submit", {**spec, "command": "python train.py"})).kind == "provisioning"
    started = {"kind": "started", "job_id": job_id, "attempt": 1, "slice_id": 0, "worker_id": 0}
    jobs.handle(signed(jobs, EVENTS, started))
    assert jobs.store.get(job_id).state is JobState.RUNNING
    return job_id


def maintenance(job_id: str, worker: int = 1, **window: object) -> dict:
    fields = upcoming_window(json.dumps({**WINDOW, **window}))
    assert fields is not None
    return {"kind": "maintenance", "job_id": job_id, "attempt": 1, "slice_id": 0, "worker_id": worker, **fields}


def test_the_metadata_answer_becomes_report_fields_and_nothing_scheduled_becomes_none():
    assert upcoming_window(json.dumps(WINDOW)) == {
        "window_start": "2026-12-01T04:00:00Z",
        "window_end": "2026-12-01T08:00:00Z",
        "maintenance_type": "SCHEDULED",
    }
    for nothing in ("NONE", "", "no notifications", "[]", json.dumps({"maintenance_status": "NONE"})):
        assert upcoming_window(nothing) is None


def test_a_scheduled_window_is_announced_once_and_the_job_runs_on(jobs):
    job_id = running(jobs)
    before = len(jobs.published.announced)
    jobs.handle(signed(jobs, EVENTS, maintenance(job_id)))
    job = jobs.store.get(job_id)
    assert job.state is JobState.RUNNING and job.attempt == 1
    assert [(m.host, m.kind) for m in job.maintenance] == [("worker 0-1", "SCHEDULED")]
    said = jobs.store.events(job_id)[-1].reason
    assert "Host maintenance is scheduled" in said and "2026-12-01T04:00:00" in said and "checkpoint" in said
    assert [c.reason for c in jobs.published.announced[before:]] == [said]
    for again in (maintenance(job_id), maintenance(job_id)):  # the same window from the same host: nothing new
        jobs.handle(signed(jobs, EVENTS, again))
    assert len(jobs.store.get(job_id).maintenance) == 1
    assert len(jobs.published.announced) == before + 1
    jobs.handle(signed(jobs, EVENTS, maintenance(job_id, window_start_time="2026-12-08T04:00:00Z")))
    assert len(jobs.store.get(job_id).maintenance) == 2


def test_an_unsigned_maintenance_report_changes_nothing(jobs):
    job_id = running(jobs)
    events = len(jobs.store.events(job_id))
    jobs.handle(inbound(EVENTS, maintenance(job_id)))
    assert jobs.store.get(job_id).maintenance == ()
    assert len(jobs.store.events(job_id)) == events


def test_the_reconciler_announces_maintenance_the_api_shows_once(engine):
    """Compute Engine's `upcomingMaintenance` on an instance, as the capacity listing shows it."""
    capacity = InMemoryCapacity(initial_state=HoldingState.ACTIVE)
    jobs = engine(capacity=capacity)
    job_id = running(jobs)
    queued_resource = jobs.store.get(job_id).queued_resource
    capacity.schedule_maintenance(queued_resource, "train-1-c1-ab12", "2026-12-01T04:00:00Z")
    jobs.tick()
    jobs.tick()
    job = jobs.store.get(job_id)
    assert job.state is JobState.RUNNING
    assert [(m.host, m.window_start) for m in job.maintenance] == [("train-1-c1-ab12", "2026-12-01T04:00:00Z")]
    said = [e.reason for e in jobs.store.events(job_id) if "maintenance" in e.reason]
    assert len(said) == 1 and "train-1-c1-ab12" in said[0]


# -- on_maintenance: checkpoint-and-move ------------------------------------------------------------


def rfc3339(at: datetime) -> str:
    return at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_checkpoint_and_move_leaves_the_hosts_a_lead_before_the_window_counting_no_restart(engine):
    clock = OffsetClock()
    jobs = engine(clock=clock, maintenance_lead_seconds=600)
    job_id = running(jobs, on_maintenance="checkpoint-and-move")
    first = jobs.store.get(job_id).queued_resource
    soon = rfc3339(clock() + timedelta(hours=1))
    jobs.handle(signed(jobs, EVENTS, maintenance(job_id, window_start_time=soon, window_end_time=soon)))
    jobs.tick()
    assert jobs.store.get(job_id).attempt == 1  # an hour away: the job runs on
    clock.advance(3600 - 500)  # within the 600 s lead
    jobs.tick()
    job = jobs.store.get(job_id)
    assert (job.attempt, job.restarts, job.resume_next) == (2, 0, True), job.state_reason
    assert job.maintenance == ()  # the new attempt's hosts have none announced
    moved = [e for e in jobs.store.events(job_id) if e.to_state is JobState.RECOVERING]
    assert len(moved) == 1 and "ahead of it (on_maintenance: checkpoint-and-move)" in moved[0].reason
    assert first not in held(jobs)


def test_wait_rides_the_maintenance_out(engine):
    clock = OffsetClock()
    jobs = engine(clock=clock, maintenance_lead_seconds=600)
    job_id = running(jobs)
    soon = rfc3339(clock() + timedelta(minutes=5))
    jobs.handle(signed(jobs, EVENTS, maintenance(job_id, window_start_time=soon)))
    jobs.tick()
    job = jobs.store.get(job_id)
    assert (job.state, job.attempt) == (JobState.RUNNING, 1)


def test_on_maintenance_takes_only_its_two_rules(jobs):
    answer = jobs.handle(inbound("tpujobs-submit", {"name": "x", "owner": "a", "accelerator_type": "v4-8",
                                                     "command": "c", "on_maintenance": "migrate"}))  # fmt: skip
    assert answer.kind == "rejected" and "on_maintenance" in answer.reason


def held(jobs: Engine) -> list[str]:
    """The queued resources the simulator holds now."""
    state = SimulatorControl(jobs.settings.tpu_endpoint).state()
    return [qr["name"].rsplit("/", 1)[-1] for qr in state["queuedResources"] if qr["state"]["state"] != "DELETING"]

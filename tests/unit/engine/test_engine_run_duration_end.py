"""Compute Engine's word on when a flex-start VM ends (its `terminationTimestamp`, set once a VM
with a maxRunDuration runs): the reconciler keeps it on the job, once, and hosts lost from then on
end the job by its time, never restarted as a preemption, whatever the control plane counted."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from engine_harness import Engine

from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.states import JobState
from tpujobs.local.fakes.capacity import InMemoryCapacity
from tpujobs.local.testing import OffsetClock, inbound, signed

EVENTS = "tpujobs-worker-events"
FLEX = {"accelerator_type": "v7x-16", "platform": "compute", "capacity": "flex-start", "time_limit": "2h"}


def rfc3339(at: datetime) -> str:
    return at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def flex(engine) -> tuple[Engine, InMemoryCapacity, OffsetClock, str]:
    clock = OffsetClock()
    capacity = InMemoryCapacity(initial_state=HoldingState.ACTIVE)
    jobs = engine(capacity=capacity, clock=clock)
    spec = {"job_id": "sweep-1", "name": "sweep", "owner": "ada@example.com", "command": "python train.py"}
    assert jobs.handle(inbound("tpujobs-submit", {**spec, **FLEX, "max_restarts": 5})).kind == "provisioning"
    started = {"kind": "started", "job_id": "sweep-1", "attempt": 1, "slice_id": 0, "worker_id": 0}
    jobs.handle(signed(jobs, EVENTS, started))
    assert jobs.store.get("sweep-1").state is JobState.RUNNING
    return jobs, capacity, clock, "sweep-1"


def preempted(jobs: Engine, job_id: str) -> None:
    jobs.preempt(1, job_id=job_id)


def test_the_reconciler_keeps_the_vms_termination_time_once(flex):
    """The listing's terminationTimestamp becomes `run_ends_at`, said once in the timeline."""
    jobs, capacity, clock, job_id = flex
    ends = clock() + timedelta(minutes=5)
    capacity.schedule_run_end(jobs.store.get(job_id).queued_resource, rfc3339(ends))
    jobs.tick()
    jobs.tick()
    job = jobs.store.get(job_id)
    assert job.state is JobState.RUNNING and job.run_ends_at == ends.replace(microsecond=0)
    said = [
        e for e in jobs.store.events(job_id) if "terminationTimestamp" not in e.reason and "ends attempt" in e.reason
    ]
    assert len(said) == 1 and "maxRunDuration" in said[0].reason


def test_hosts_lost_at_the_termination_time_end_the_job_by_its_time(flex):
    """Minutes after the capacity was held (the control plane's own count is far from over), the
    VMs end at Compute Engine's terminationTimestamp: FAILED by its time, no restart."""
    jobs, capacity, clock, job_id = flex
    ends = clock() + timedelta(minutes=5)
    capacity.schedule_run_end(jobs.store.get(job_id).queued_resource, rfc3339(ends))
    jobs.tick()
    clock.advance(5 * 60 + 2)
    preempted(jobs, job_id)
    job = jobs.store.get(job_id)
    assert (job.state, job.attempt, job.restarts) == (JobState.FAILED, 1, 0), job.state_reason
    assert "terminationTimestamp" in job.state_reason


def test_hosts_lost_before_the_termination_time_are_a_preemption(flex):
    """Lost a minute before Compute Engine's terminationTimestamp: preempted, restarted as before."""
    jobs, capacity, clock, job_id = flex
    ends = clock() + timedelta(minutes=5)
    capacity.schedule_run_end(jobs.store.get(job_id).queued_resource, rfc3339(ends))
    jobs.tick()
    clock.advance(4 * 60)
    preempted(jobs, job_id)
    job = jobs.store.get(job_id)
    assert job.restarts == 1 and job.state in (JobState.RECOVERING, JobState.PROVISIONING), job.state_reason

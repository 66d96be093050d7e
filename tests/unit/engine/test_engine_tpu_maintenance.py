"""Scheduled maintenance on the TPU API path, end to end below the functions (issue 28): the simulator
announces a window on a job's node, the real adapter's listing reads it through v2alpha1, the
reconciler records it in the timeline, and `checkpoint-and-move` leaves the hosts a lead before it."""

from __future__ import annotations

from engine_harness import ZONE, Engine

from tpujobs.domain.states import JobState
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.testing import OffsetClock, signed, wait_for

EVENTS = "tpujobs-worker-events"
LEAD_S = 600.0
NOTICE_S = 3600.0  # the simulator's own clock never reaches the window: the engine's clock jumps instead


def running_on_tpu_api(jobs: Engine, **changes: object) -> str:
    """Job `train-1` on a v4-8 queued resource that is ACTIVE, its worker started."""
    spec = {"job_id": "train-1", "name": "train", "owner": "ada@example.com", "accelerator_type": "v4-8", **changes}
    jobs.submit({**spec, "command": "python train.py"})
    queued_resource = jobs.store.get("train-1").queued_resource
    wait_for(lambda: (s := jobs.capacity.status(ZONE, queued_resource)) is not None and s.state == "ACTIVE")
    jobs.handle(
        signed(jobs, EVENTS, {"kind": "started", "job_id": "train-1", "attempt": 1, "slice_id": 0, "worker_id": 0})
    )
    assert jobs.store.get("train-1").state is JobState.RUNNING
    return "train-1"


def announce(jobs: Engine, queued_resource: str) -> str:
    """A window NOTICE_S ahead on the queued resource's node; its start, as the API says it."""
    control = SimulatorControl(jobs.settings.tpu_endpoint)
    answer = control.upcoming_maintenance(ZONE, queued_resource, notice=NOTICE_S, window=600)
    return str(answer["nodes"][0]["upcomingMaintenance"]["windowStartTime"])


def test_the_reconciler_announces_a_tpu_nodes_window_once_and_the_job_runs_on(engine) -> None:
    """`wait` (the default): the timeline says it once, naming the node and the window; the attempt stays."""
    jobs = engine()
    job_id = running_on_tpu_api(jobs)
    queued_resource = jobs.store.get(job_id).queued_resource
    start = announce(jobs, queued_resource)
    jobs.tick()
    jobs.tick()
    job = jobs.store.get(job_id)
    assert (job.state, job.attempt) == (JobState.RUNNING, 1)
    assert [(m.host, m.window_start) for m in job.maintenance] == [(queued_resource, start)]
    said = [e.reason for e in jobs.store.events(job_id) if "maintenance" in e.reason.lower()]
    assert len(said) == 1 and queued_resource in said[0]


def test_checkpoint_and_move_leaves_a_tpu_node_before_its_window(engine) -> None:
    """An hour ahead the job runs on; within the lead it moves to attempt 2, resuming, no restart counted,
    and its first queued resource is given back."""
    clock = OffsetClock()
    jobs = engine(clock=clock, maintenance_lead_seconds=LEAD_S)
    job_id = running_on_tpu_api(jobs, on_maintenance="checkpoint-and-move")
    first = jobs.store.get(job_id).queued_resource
    announce(jobs, first)
    jobs.tick()
    job = jobs.store.get(job_id)
    assert (job.attempt, len(job.maintenance)) == (1, 1)
    clock.advance(NOTICE_S - LEAD_S + 100)
    jobs.tick()
    job = jobs.store.get(job_id)
    assert (job.attempt, job.restarts, job.resume_next) == (2, 0, True), job.state_reason
    moved = [e for e in jobs.store.events(job_id) if e.to_state is JobState.RECOVERING]
    assert len(moved) == 1 and "ahead of it (on_maintenance: checkpoint-and-move)" in moved[0].reason
    wait_for(lambda: jobs.capacity.status(ZONE, first) is None, what=f"{first} given back")

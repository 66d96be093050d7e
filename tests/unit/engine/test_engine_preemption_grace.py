"""The preemption grace is the job's: the next attempt is requested first, and a preempted
attempt's holding is released only once its hosts are gone or Google's shutdown grace is over
(the reconciler finishes it); its chips count in the quota meanwhile. On the in-memory capacity,
with a clock the test moves."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from engine_harness import ZONE, Engine

from tpujobs.domain.grace import SPOT_SHUTDOWN_GRACE_SECONDS, held_holder, hold_over
from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.states import EventKind, JobState
from tpujobs.local.fakes.capacity import InMemoryCapacity

SPEC = {
    "job_id": "train-1",
    "name": "train",
    "owner": "ada@example.com",
    "accelerator_type": "v4-16",  # two worker hosts
    "capacity": "spot",
    "command": "python train.py",
    "on_preemption": "resume",
    "on_error": "resume",
    "max_restarts": 3,
}


class Clock:
    """The engine's time, moved by the test."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 5, 12, 0, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def capacity() -> InMemoryCapacity:
    return InMemoryCapacity(initial_state=HoldingState.ACTIVE)


@pytest.fixture
def jobs(engine, clock: Clock, capacity: InMemoryCapacity) -> Engine:
    return engine(clock=clock, capacity=capacity, stuck_after_seconds=0.0)


def running(jobs: Engine, job_id: str = "train-1", **changes: object) -> None:
    assert jobs.submit({**SPEC, "job_id": job_id, **changes}).kind == "provisioning"
    jobs.report("started", 1, job_id=job_id)
    jobs.report("started", 1, worker=1, job_id=job_id)
    assert jobs.job(job_id).state is JobState.RUNNING


def preempted(jobs: Engine, capacity: InMemoryCapacity, job_id: str = "train-1") -> None:
    """Google takes the slice back: the holding LOSING, the hosts saving in their grace."""
    capacity.set_state(f"{job_id}-a1", HoldingState.LOSING)
    jobs.qr_state({"queued_resource": f"{job_id}-a1", "zone": ZONE, "state": "LOSING"})


def test_a_preemption_requests_the_next_attempt_and_keeps_the_preempted_holding(jobs, capacity, clock):
    """Preempted: attempt 2 is requested at once, attempt 1's queued resource is not deleted
    (its hosts save within their grace), and the job says which holding waits, until when."""
    running(jobs)
    preempted(jobs, capacity)

    job = jobs.job()
    assert (job.state, job.attempt) == (JobState.PROVISIONING, 2)
    assert capacity.requested() == ["train-1-a1", "train-1-a2"]
    assert "train-1-a1" not in capacity.released()
    (held,) = job.held_over
    assert (held.holding, held.zone, held.attempt, held.chips) == ("train-1-a1", ZONE, 1, job.spec.chips)
    assert held.release_after == clock.now + timedelta(seconds=SPOT_SHUTDOWN_GRACE_SECONDS)
    assert "train-1-a1 is released once its hosts are gone" in jobs.events()[-1].reason


def test_the_reconciler_releases_a_held_over_holding_once_its_grace_is_over(jobs, capacity, clock):
    """A tick within the grace leaves the preempted holding alone (unowned sweep included); the
    first tick after it releases it, and the job forgets it, saying so in its timeline."""
    running(jobs)
    preempted(jobs, capacity)

    clock.advance(SPOT_SHUTDOWN_GRACE_SECONDS - 1)
    jobs.tick()
    assert "train-1-a1" not in capacity.released() and jobs.job().held_over

    clock.advance(2)
    report = jobs.tick()
    assert capacity.released() == ["train-1-a1"] and "train-1-a1" in report.released
    job = jobs.job()
    assert job.held_over == () and (job.state, job.attempt) == (JobState.PROVISIONING, 2)
    assert "shutdown grace is over" in jobs.events()[-1].reason
    jobs.tick()
    assert capacity.released() == ["train-1-a1"]  # once


def test_a_held_over_holding_goes_as_soon_as_its_hosts_are_gone(jobs, capacity, clock):
    """LOST (its hosts deleted) within the grace: the next tick releases it."""
    running(jobs)
    preempted(jobs, capacity)
    capacity.set_state("train-1-a1", HoldingState.LOST)
    clock.advance(1)

    jobs.tick()

    assert capacity.released() == ["train-1-a1"] and jobs.job().held_over == ()


def test_a_failed_command_releases_its_attempt_after_the_next_request(jobs, capacity):
    """No grace to keep when tpujobs itself ends the hosts: released at once, but after the
    next attempt's request."""
    running(jobs)
    jobs.report("exited", 1, worker=0, exit_code=3)

    order = [call[2] for call in capacity.calls if call[0] in ("request", "release")]
    assert order == ["train-1-a1", "train-1-a2", "train-1-a1"]
    assert jobs.job().held_over == ()


def test_an_ended_job_releases_its_held_over_holding_too(jobs, capacity):
    """Cancelled while attempt 1's holding is kept: every holding of the job goes."""
    running(jobs)
    preempted(jobs, capacity)

    jobs.cancel("train-1", "enough")

    assert set(capacity.released()) == {"train-1-a1", "train-1-a2"}


def test_a_held_over_holding_counts_in_the_quota_until_released(jobs, capacity, clock):
    """Its chips are held in its pool beside the job's own (`held:` holder), so a job waiting for
    them is admitted only once it is released."""
    chips = 8  # v4-16
    jobs.pools.set_quota(ZONE, "v4", "spot", 2 * chips)
    running(jobs)
    preempted(jobs, capacity)
    pool = jobs.job().held_over[0].pool
    assert {h.job_id for h in jobs.pools.view(pool).holders} == {"train-1", held_holder("train-1-a1")}

    assert jobs.submit({**SPEC, "job_id": "train-2"}).kind == "queued"
    clock.advance(SPOT_SHUTDOWN_GRACE_SECONDS + 1)
    jobs.tick()

    assert held_holder("train-1-a1") not in {h.job_id for h in jobs.pools.view(pool).holders}
    assert jobs.job("train-2").state is JobState.PROVISIONING


def test_only_a_slice_google_takes_back_whole_is_kept(jobs, capacity):
    """One lost host of two (the other still runs the command) or a holding already gone: no
    grace to wait for; LOSING, or every host lost (Compute Engine's STOPPING VMs): kept."""
    running(jobs)
    capacity.set_state("train-1-a1", HoldingState.ACTIVE, unhealthy_hosts=1)
    jobs.qr_state({"queued_resource": "train-1-a1", "zone": ZONE, "state": "ACTIVE", "unhealthy_hosts": 1})
    job = jobs.store.get("train-1")
    assert job is not None and job.attempt == 2 and job.held_over == ()
    lost = jobs.job().evolve(attempt=1, queued_resource="train-1-a1", usage=job.usage[:1])
    assert hold_over(lost, HoldingState.PROVISIONING, 2) is not None  # every host of the slice lost
    assert hold_over(lost, HoldingState.ACTIVE, 1) is None
    assert hold_over(lost, HoldingState.LOST) is None and hold_over(lost, None) is None
    assert hold_over(lost, HoldingState.LOSING) is not None
    assert EventKind.HELD_OVER_RELEASED.value == "held_over_released"


def test_a_preemption_that_ends_the_job_keeps_its_holding_through_the_grace(jobs, capacity, clock):
    """No restart left: the job ends FAILED at once, but its queued resource is not deleted while
    its hosts may be saving (a later `resume` starts from that save); the reconciler's sweep
    leaves it within the grace and releases it after."""
    running(jobs, max_restarts=0)
    preempted(jobs, capacity)
    assert jobs.job().state is JobState.FAILED
    assert "train-1-a1" not in capacity.released()
    jobs.tick()
    assert "train-1-a1" not in capacity.released()  # within the grace: the sweep leaves it
    clock.advance(SPOT_SHUTDOWN_GRACE_SECONDS + 1)
    jobs.tick()
    assert capacity.released() == ["train-1-a1"]

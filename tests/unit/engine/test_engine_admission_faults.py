"""Admission killed at each of its I/O steps, then repaired by redelivery or the reconciler, on
the fakes and the TPU simulator.

Two handlers that move chips: a job ending (its hold goes, the next waiting job is admitted)
and a high-priority submission that evicts. Each runs on ports that crash just before or just
after their k-th call (`tpujobs.local.testing`); then either the same message is delivered
again, or it is lost and only the reconciler's tick runs. Afterwards the pool holds no more
chips than its quota, every job holding capacity is counted in the pool, the waiting job got
in, and no queued resource leaked. The pool document's compare-and-set under contention is
tests/emulator/test_admission.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from engine_harness import ZONE, Engine

from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.states import JobState
from tpujobs.engine.inbound import InboundMessage
from tpujobs.local.testing import CrashPlan, InjectedCrash, inbound, signed

POOL = "v4@us-central2"  # the on-demand v4 chips of ZONE's region
HOLDING = (JobState.PROVISIONING, JobState.RUNNING, JobState.RECOVERING)


@pytest.fixture
def jobs(engine) -> Engine:
    return engine(stuck_after_seconds=0)


def spec(job_id: str, priority: str = "medium") -> dict:
    return {
        "job_id": job_id,
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-8",  # 4 chips: two fill the quota of 8
        "command": "python train.py",
        "priority": priority,
    }


def ending(jobs: Engine) -> tuple[InboundMessage, list[str]]:
    """ja and jb run, jc waits; the handler of ja's exit should admit jc."""
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 8)
    for job_id in ("ja", "jb", "jc"):
        jobs.submit(spec(job_id), message_id=f"submit-{job_id}")
    exited = {"kind": "exited", "job_id": "ja", "attempt": 1, "slice_id": 0, "worker_id": 0, "exit_code": 0}
    return signed(jobs, "tpujobs-worker-events", exited, message_id="exit-ja"), ["ja", "jb", "jc"]


def evicting(jobs: Engine) -> tuple[InboundMessage, list[str]]:
    """ja and jb (low) run; submitting ju (high) should evict one and admit ju."""
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 8)
    jobs.submit(spec("ja", "low"), message_id="submit-ja")
    jobs.submit(spec("jb", "low"), message_id="submit-jb")
    return inbound("tpujobs-submit", spec("ju", "high"), "submit-ju"), ["ja", "jb", "ju"]


SCENARIOS: dict[str, Callable[[Engine], tuple[InboundMessage, list[str]]]] = {"ending": ending, "evicting": evicting}
STEPS = {"ending": 16, "evicting": 18}  # I/O steps of each uncrashed handler, announcements included (checked below)
CRASH_POINTS = [(name, k) for name, steps in STEPS.items() for k in range(1, steps + 1)]


def live_resources(jobs: Engine) -> set[str]:
    """The zone's queued resources that still hold capacity (neither deleting nor suspended)."""
    return {
        s.name for s in jobs.capacity.list_capacity(ZONE) if s.state not in (HoldingState.RELEASING, HoldingState.LOST)
    }


def check(jobs: Engine, job_ids: list[str]) -> dict[str, JobState]:
    """The invariants; the jobs' states for the scenario's own checks."""
    found = {job_id: jobs.job(job_id) for job_id in job_ids}
    holders = {h.job_id: h for h in jobs.pools.view(POOL).holders}
    assert sum(h.chips for h in holders.values()) <= 8, holders
    for job in found.values():
        if job.state in HOLDING:
            assert job.job_id in holders, f"{job.job_id} holds capacity without a claim"
    holding = {j.queued_resource for j in found.values() if j.state in HOLDING}
    assert live_resources(jobs) == holding
    return {job_id: job.state for job_id, job in found.items()}


def settled(jobs: Engine, name: str, job_ids: list[str]) -> None:
    states = check(jobs, job_ids)
    if name == "ending":
        assert states == {"ja": JobState.SUCCEEDED, "jb": JobState.PROVISIONING, "jc": JobState.PROVISIONING}
    else:
        assert states["ju"] is JobState.PROVISIONING
        assert sorted(s.value for s in states.values()).count("PROVISIONING") == 2  # one low job evicted
        evicted = [j for j, s in states.items() if s is JobState.QUEUED]
        assert evicted and jobs.job(evicted[0]).attempt == 2


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_an_uncrashed_admission_makes_its_listed_io_steps_and_settles(jobs, name):
    """Each handler makes exactly its counted I/O steps (a changed handler shows up here first)."""
    delivered, job_ids = SCENARIOS[name](jobs)
    plan = CrashPlan()
    jobs.crashing_admission(plan).handle(delivered)
    assert len(plan.steps) == STEPS[name], plan.steps
    settled(jobs, name, job_ids)


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize(("name", "k"), CRASH_POINTS)
def test_a_killed_admission_is_finished_by_redelivery(jobs, name, k, when):
    """Killed at any step, then delivered again and ticked once: no chip over quota, no leak."""
    delivered, job_ids = SCENARIOS[name](jobs)
    plan = CrashPlan(at=k, when=when)
    with pytest.raises(InjectedCrash):
        jobs.crashing_admission(plan).handle(delivered)
    jobs.handle(delivered)  # Pub/Sub delivers it again
    jobs.tick()  # and the tick finishes whatever a claim left
    settled(jobs, name, job_ids)


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("k", range(6, STEPS["ending"] + 1))
def test_an_ending_killed_after_its_commit_is_finished_by_the_reconciler(jobs, k, when):
    """The exit is committed (step 5, the apply, went through, after the report was checked and
    remembered, the worker recorded and its slice counted): the ticks need no message."""
    delivered, job_ids = ending(jobs)
    plan = CrashPlan(at=k, when=when)
    with pytest.raises(InjectedCrash):
        jobs.crashing_admission(plan).handle(delivered)
    for _ in range(2):
        jobs.tick()
    settled(jobs, "ending", job_ids)

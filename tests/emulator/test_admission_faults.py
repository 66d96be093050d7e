"""Admission killed at each of its I/O steps, then repaired by redelivery or the reconciler.

Two handlers that move chips: a job ending (its hold goes, the next waiting job is
admitted) and a high-priority submission that evicts. Each runs on ports that crash just
before or just after their k-th call (`tpujobs.local.testing`); then either the same message is
delivered again, or it is lost and only `Reconciler.tick()` runs. Afterwards the pool
holds no more chips than its quota, every job holding capacity is counted in the pool,
the waiting job got in, and no queued resource leaked.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tpujobs.adapters.firestore_pools import FirestorePools
from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.adapters.tpu import CloudTpu, build_client
from tpujobs.domain.states import JobState
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.services import Engine
from tpujobs.local.testing import (
    CrashingPools,
    CrashingStore,
    CrashingTpu,
    CrashPlan,
    InjectedCrash,
    inbound,
    local_settings,
    reconciler_for,
    signed,
)

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"
POOL = f"v4@{ZONE}"
HOLDING = (JobState.PROVISIONING, JobState.RUNNING, JobState.RECOVERING)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class Harness:
    def __init__(self, firestore_client, project_id: str, simulator_url: str) -> None:
        self.project = project_id
        self.client = build_client(simulator_url)
        self.settings = local_settings(
            project=project_id, default_zone=ZONE, tpu_endpoint=simulator_url, logs_bucket="logs", stuck_after_seconds=0
        )
        self.store = FirestoreJobStore(firestore_client)
        self.pools = FirestorePools(firestore_client)
        self.tpu = CloudTpu(self.client, project_id)

    def service(self, plan: CrashPlan | None = None) -> Engine:
        if plan is None:
            return Engine(self.store, self.tpu, self.settings, utc_now, lambda _: None, pools=self.pools)
        return Engine(
            CrashingStore(self.store, plan),
            CrashingTpu(self.tpu, plan),
            self.settings,
            utc_now,
            lambda _: None,
            pools=CrashingPools(self.pools, plan),
        )

    def live_resources(self) -> set[str]:
        found = self.client.list_queued_resources(parent=f"projects/{self.project}/locations/{ZONE}")
        return {r.name.rsplit("/", 1)[-1] for r in found if r.state.state.name not in ("DELETING", "SUSPENDED")}

    def check(self, job_ids: list[str]) -> dict[str, JobState]:
        """The invariants; the jobs' states for the scenario's own checks."""
        jobs = {job_id: self.store.get(job_id) for job_id in job_ids}
        holders = {h.job_id: h for h in self.pools.view(POOL).holders}
        assert sum(h.chips for h in holders.values()) <= 8, holders
        for job in jobs.values():
            if job.state in HOLDING:
                assert job.job_id in holders, f"{job.job_id} holds capacity without a claim"
        holding = {j.queued_resource for j in jobs.values() if j.state in HOLDING}
        assert self.live_resources() == holding
        return {job_id: job.state for job_id, job in jobs.items()}


def spec(job_id: str, priority: str = "medium") -> dict:
    return {
        "job_id": job_id,
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-8",
        "command": "python train.py",
        "priority": priority,
    }


def ending(harness: Harness) -> tuple[InboundMessage, list[str]]:
    """ja and jb run, jc waits; the handler of ja's exit should admit jc."""
    harness.pools.set_quota(ZONE, "v4", 8)
    service = harness.service()
    for job_id in ("ja", "jb", "jc"):
        service.submission.submit(inbound("tpujobs-submit", message_id=f"submit-{job_id}", payload=spec(job_id)))
    exited = {"kind": "exited", "job_id": "ja", "attempt": 1, "slice_id": 0, "worker_id": 0, "exit_code": 0}
    return signed(service, "tpujobs-worker-events", exited, message_id="exit-ja"), ["ja", "jb", "jc"]


def evicting(harness: Harness) -> tuple[InboundMessage, list[str]]:
    """ja and jb (low) run; submitting ju (high) should evict one and admit ju."""
    harness.pools.set_quota(ZONE, "v4", 8)
    service = harness.service()
    service.submission.submit(inbound("tpujobs-submit", message_id="submit-ja", payload=spec("ja", "low")))
    service.submission.submit(inbound("tpujobs-submit", message_id="submit-jb", payload=spec("jb", "low")))
    return inbound("tpujobs-submit", message_id="submit-ju", payload=spec("ju", "high")), ["ja", "jb", "ju"]


def handle(service: Engine, delivered: InboundMessage) -> None:
    if delivered.topic == "tpujobs-submit":
        service.submission.submit(delivered)
    else:
        service.worker_events.on_worker_report(delivered)


SCENARIOS = {"ending": ending, "evicting": evicting}
STEPS = {"ending": 13, "evicting": 9}  # I/O steps of each uncrashed handler (checked below)
CRASH_POINTS = [(name, k) for name, steps in STEPS.items() for k in range(1, steps + 1)]


@pytest.fixture
def harness(firestore_client, project_id, simulator_url) -> Harness:
    return Harness(firestore_client, project_id, simulator_url)


def settled(harness: Harness, name: str, job_ids: list[str]) -> None:
    states = harness.check(job_ids)
    if name == "ending":
        assert states == {"ja": JobState.SUCCEEDED, "jb": JobState.PROVISIONING, "jc": JobState.PROVISIONING}
    else:
        assert states["ju"] is JobState.PROVISIONING
        assert sorted(s.value for s in states.values()).count("PROVISIONING") == 2  # one low job evicted
        evicted = [j for j, s in states.items() if s is JobState.QUEUED]
        assert evicted and harness.store.get(evicted[0]).attempt == 2


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_uncrashed_admission_settles(harness, name):
    delivered, job_ids = SCENARIOS[name](harness)
    plan = CrashPlan()
    handle(harness.service(plan), delivered)
    assert len(plan.steps) == STEPS[name], plan.steps  # a changed handler shows up here first
    settled(harness, name, job_ids)


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize(("name", "k"), CRASH_POINTS)
def test_a_killed_admission_is_finished_by_redelivery(harness, name, k, when):
    delivered, job_ids = SCENARIOS[name](harness)
    plan = CrashPlan(at=k, when=when)
    with pytest.raises(InjectedCrash):
        handle(harness.service(plan), delivered)
    handle(harness.service(), delivered)  # Pub/Sub delivers it again
    reconciler_for(harness.service()).tick()  # and the tick finishes whatever a claim left
    settled(harness, name, job_ids)


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("k", range(6, STEPS["ending"] + 1))
def test_an_ending_killed_after_its_commit_is_finished_by_the_reconciler(harness, k, when):
    """The exit is committed (step 5, the apply, went through, after the report was checked and
    remembered, the worker recorded and its slice counted): the tick needs no message."""
    delivered, job_ids = ending(harness)
    plan = CrashPlan(at=k, when=when)
    with pytest.raises(InjectedCrash):
        handle(harness.service(plan), delivered)
    for _ in range(2):
        reconciler_for(harness.service()).tick()
    settled(harness, "ending", job_ids)

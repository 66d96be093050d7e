"""The rules of a PROVISIONING job that has no queued resource to show: asked for again, waiting
for TPU quota, or refused; and the reconciler's note when a repair meets a permanent error."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import QUOTA_EXHAUSTED, REGION_QUOTA_EXHAUSTED, EventKind, JobState
from tpujobs.domain.transitions import Decision, Ignored, Observation, decide

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
QUOTA = "TPU quota exhausted in us-central2-b: Quota 'TPUS-per-project-per-zone' exhausted; waiting."


def admitted(capacity_state: str = "CREATING", reason: str = "", **spec: object) -> Job:
    data = {"job_id": "train-1", "name": "train", "owner": "ada", "accelerator_type": "v4-8", "command": "x", **spec}
    job, _ = new_job(parse_spec(data), "us-central2-b", NOW)
    seen = Observation(EventKind.ADMITTED, 1, "submit", reason, capacity_state, operation="operations/op-1")
    decision = decide(job, seen, NOW)
    assert isinstance(decision, Decision)
    return decision.job


def test_a_job_refused_for_tpu_quota_is_provisioning_and_says_so() -> None:
    """PROVISIONING with capacity_state QUOTA_EXHAUSTED, Google's words in its reason, the wait's clock started."""
    job = admitted(QUOTA_EXHAUSTED, QUOTA)
    assert (job.state, job.capacity_state, job.state_reason, job.requested_at) == (
        JobState.PROVISIONING, QUOTA_EXHAUSTED, QUOTA, NOW,
    )  # fmt: skip
    assert job.create_operation == "operations/op-1"


def test_asking_again_keeps_the_first_request_time_and_says_the_same_thing_once() -> None:
    """The zone wait counts from the first request; a tick meeting the same refusal writes nothing."""
    job = admitted(QUOTA_EXHAUSTED, QUOTA)
    later = NOW + timedelta(minutes=3)
    same = decide(job, Observation(EventKind.REQUESTED_AGAIN, 1, "reconciler", QUOTA, QUOTA_EXHAUSTED), later)
    assert isinstance(same, Ignored)
    room = decide(
        job, Observation(EventKind.REQUESTED_AGAIN, 1, "reconciler", "", "ACCEPTED", operation="operations/op-2"), later
    )
    assert isinstance(room, Decision)
    assert (room.job.state, room.job.capacity_state, room.job.requested_at) == (JobState.PROVISIONING, "ACCEPTED", NOW)
    assert room.job.create_operation == "operations/op-2"


def test_a_request_refused_for_good_while_provisioning_fails_the_job() -> None:
    """Asked for again and refused (INVALID_ARGUMENT, PERMISSION_DENIED): FAILED, as at admission."""
    job = admitted()
    refused = decide(job, Observation(EventKind.CAPACITY_REQUEST_FAILED, 1, "tpu", "TPU API refused"), NOW)
    assert isinstance(refused, Decision)
    assert (refused.job.state, refused.job.state_reason) == (JobState.FAILED, "TPU API refused")


def test_a_create_that_never_came_moves_to_the_next_zone_or_ends_by_the_rules() -> None:
    """A failed provisioning: the next of `zones` when there is one; else a restart, and FAILED once
    the restarts are used up, so a missing resource is never asked for for ever."""
    seen = Observation(EventKind.CAPACITY_LOST, 1, "reconciler", "never appeared", "FAILED")
    moving = decide(admitted(zones=["us-central2-b", "us-east5-a"]), seen, NOW)
    assert isinstance(moving, Decision)
    assert (moving.job.state, moving.job.zone, moving.job.attempt) == (JobState.QUEUED, "us-east5-a", 2)

    recovering = decide(admitted(max_restarts=1), seen, NOW)
    assert isinstance(recovering, Decision) and recovering.job.state is JobState.RECOVERING
    ending = decide(admitted(max_restarts=0), seen, NOW)
    assert isinstance(ending, Decision) and ending.job.state is JobState.FAILED


def test_a_repair_failure_is_noted_once_and_keeps_the_state() -> None:
    """The reconciler's note changes the reason, not the state; the same note again writes nothing."""
    job = admitted()
    why = "The reconciler could not repair the job: TPU API refused to read X. It tries again at every tick."
    noted = decide(job, Observation(EventKind.REPAIR_FAILED, None, "reconciler", why), NOW)
    assert isinstance(noted, Decision)
    assert (noted.job.state, noted.job.state_reason, noted.event.source) == (JobState.PROVISIONING, why, "reconciler")
    assert isinstance(decide(noted.job, Observation(EventKind.REPAIR_FAILED, None, "reconciler", why), NOW), Ignored)


# -- zone failover when a region's quota is full ------------------------------------------------

REGION_ZONES = ["us-east5-a", "us-east5-b", "us-central1-a"]


def waiting_in(zones: list[str]) -> Job:
    """A PROVISIONING job of attempt 1 in the first of `zones`, refused for quota there."""
    data = {"job_id": "train-1", "name": "train", "owner": "ada", "accelerator_type": "v4-8", "command": "x"}
    job, _ = new_job(parse_spec({**data, "zones": zones}), zones[0], NOW)
    decision = decide(job, Observation(EventKind.ADMITTED, 1, "submit", QUOTA, REGION_QUOTA_EXHAUSTED), NOW)
    assert isinstance(decision, Decision)
    return decision.job


def failover(region: str) -> Observation:
    return Observation(EventKind.ZONE_FAILOVER, 1, "reconciler", "The TPU quota had no room", quota_region=region)


def test_a_failover_from_a_full_regional_quota_skips_the_other_zones_of_that_region() -> None:
    """us-east5's quota is full: us-east5-b has no room either, so attempt 2 waits in us-central1-a
    (a zone's quota would have sent it to us-east5-b)."""
    moved = decide(waiting_in(REGION_ZONES), failover("us-east5"), NOW)
    assert isinstance(moved, Decision)
    assert (moved.job.state, moved.job.zone, moved.job.attempt) == (JobState.QUEUED, "us-central1-a", 2)
    assert "region us-east5's quota is full" in moved.job.state_reason
    zonal = decide(waiting_in(REGION_ZONES), failover(""), NOW)  # a zone's quota: the same region's next zone
    assert isinstance(zonal, Decision)
    assert (zonal.job.state, zonal.job.zone, zonal.job.attempt) == (JobState.QUEUED, "us-east5-b", 2)


def test_with_every_later_zone_in_the_full_region_the_job_waits_where_it_is_saying_why_once() -> None:
    """No pointless failover: it stays PROVISIONING in attempt 1, its reason says why, and the
    same observation at the next tick writes nothing."""
    job = waiting_in(["us-east5-a", "us-east5-b"])
    stays = decide(job, failover("us-east5"), NOW)
    assert isinstance(stays, Decision)
    assert (stays.job.state, stays.job.zone, stays.job.attempt) == (JobState.PROVISIONING, "us-east5-a", 1)
    assert stays.job.capacity_state == REGION_QUOTA_EXHAUSTED
    assert "every later zone of the job is in us-east5" in stays.job.state_reason
    assert isinstance(decide(stays.job, failover("us-east5"), NOW + timedelta(minutes=1)), Ignored)


def test_a_create_that_failed_for_a_regional_quota_moves_outside_the_region_or_ends_by_the_rules() -> None:
    """A queued resource that FAILED before it ran, the region's quota full: the next zone outside
    it; with none, the attempt ends under the job's rules rather than trying the same region."""
    failed = Observation(EventKind.CAPACITY_LOST, 1, "reconciler", "quota", "FAILED", quota_region="us-east5")
    moving = decide(waiting_in(REGION_ZONES), failed, NOW)
    assert isinstance(moving, Decision)
    assert (moving.job.state, moving.job.zone) == (JobState.QUEUED, "us-central1-a")
    ending = decide(waiting_in(["us-east5-a", "us-east5-b"]), failed, NOW)
    assert isinstance(ending, Decision) and ending.job.state is not JobState.QUEUED

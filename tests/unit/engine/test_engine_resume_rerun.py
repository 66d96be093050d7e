"""Resume and rerun of an ended job, through the jobs API and tpujobs-control, on the fakes and
the TPU simulator: who may, what may change, and one attempt per request id."""

from __future__ import annotations

from datetime import timedelta

import pytest
from engine_harness import PROJECT, ZONE, Engine

from tpujobs.domain import limits
from tpujobs.domain.access import AccessPolicies
from tpujobs.domain.naming import queued_resource_name
from tpujobs.domain.states import JobState
from tpujobs.engine.startup_script import agent_config
from tpujobs.local.testing import CrashPlan, InjectedCrash, OffsetClock, signed
from tpujobs.local.testing import inbound as message

OTHER_ZONE = "us-east5-a"
OWNER = "ada@example.com"
ADMIN = "root@example.com"
STRANGER = "eve@example.com"


@pytest.fixture
def jobs(engine) -> Engine:
    """With the deployment's access policies (none written: only admins hold privileges)."""
    return engine(admins=(ADMIN,), access=AccessPolicies())


def failed_job(jobs: Engine, job_id: str = "train-1", **changes) -> str:
    """A one-host job whose command exits 1 (on_error fail): FAILED at attempt 1."""
    spec = {
        "job_id": job_id,
        "name": "train",
        "owner": OWNER,
        "accelerator_type": "v4-8",
        "command": "python train.py",
        "max_restarts": 1,
        **changes,
    }
    assert jobs.handle(message("tpujobs-submit", spec)).kind == "provisioning"
    for kind, extra in (("started", {}), ("exited", {"exit_code": 1})):
        payload = {"kind": kind, "job_id": job_id, "attempt": 1, "slice_id": 0, "worker_id": 0, **extra}
        jobs.handle(signed(jobs, "tpujobs-worker-events", payload))
    assert jobs.store.get(job_id).state is JobState.FAILED
    return job_id


def call(jobs: Engine, body: dict, caller: str):
    return jobs.api(body, caller)


def queued_resources(tpu_client, zone: str = ZONE) -> set[str]:
    parent = f"projects/{PROJECT}/locations/{zone}"
    return {r.name.rsplit("/", 1)[-1] for r in tpu_client.list_queued_resources(parent=parent)}


def test_the_owner_resumes_a_failed_job_under_its_job_id_from_its_checkpoint(jobs, tpu_client):
    """200; attempt 2 asks for a new queued resource, resumes, restarts counted from zero, and
    the timeline says who asked."""
    failed_job(jobs)
    answer = call(jobs, {"action": "resume", "job_id": "train-1", "request_id": "r-1"}, OWNER)
    assert answer.status == 200, answer.body
    assert answer.body["outcome"] == "started" and answer.body["attempt"] == 2
    job = jobs.store.get("train-1")
    assert (job.state, job.attempt, job.restarts, job.resume_next) == (JobState.PROVISIONING, 2, 0, True)
    assert (job.ended_at, job.exit_code, job.restart_requests) == (None, None, ("r-1",))
    assert agent_config(job, jobs.settings)["resume"] is True
    assert queued_resource_name("train-1", 2) in queued_resources(tpu_client)
    resumed = [e for e in jobs.store.events("train-1") if e.from_state is JobState.FAILED]
    assert len(resumed) == 1 and resumed[0].source == "user" and OWNER in resumed[0].reason
    assert [u.attempt for u in job.usage] == [1, 2]


def test_the_same_request_twice_starts_one_attempt(jobs, tpu_client):
    """A retried request (same request id) answers `duplicate` and changes nothing."""
    failed_job(jobs)
    body = {"action": "resume", "job_id": "train-1", "request_id": "r-1"}
    first = call(jobs, body, OWNER)
    events = len(jobs.store.events("train-1"))
    again = call(jobs, body, OWNER)
    assert (first.status, again.status) == (200, 200)
    assert again.body["outcome"] == "duplicate" and again.body["attempt"] == 2
    assert len(jobs.store.events("train-1")) == events
    assert jobs.store.get("train-1").attempt == 2
    assert queued_resource_name("train-1", 3) not in queued_resources(tpu_client)


def test_a_different_resume_while_the_first_runs_is_refused_with_a_sentence(jobs):
    """The job is no longer ended: 409 saying so, and the job keeps its attempt."""
    failed_job(jobs)
    assert call(jobs, {"action": "resume", "job_id": "train-1", "request_id": "r-1"}, OWNER).status == 200
    second = call(jobs, {"action": "rerun", "job_id": "train-1", "request_id": "r-2"}, OWNER)
    assert second.status == 409 and "has not ended" in second.body["error"]
    assert jobs.store.get("train-1").attempt == 2


def test_an_admin_may_rerun_and_someone_else_may_not(jobs):
    """The rule of cancel: the owner or an admin; a stranger gets 403 and the job stays FAILED."""
    failed_job(jobs)
    refused = call(jobs, {"action": "rerun", "job_id": "train-1"}, STRANGER)
    assert refused.status == 403 and "only its owner or an admin" in refused.body["error"]
    assert jobs.store.get("train-1").state is JobState.FAILED
    answer = call(jobs, {"action": "rerun", "job_id": "train-1"}, ADMIN)
    assert answer.status == 200
    job = jobs.store.get("train-1")
    assert (job.attempt, job.resume_next) == (2, False)
    assert ADMIN in job.state_reason or ADMIN in jobs.store.events("train-1")[-2].reason


def test_a_succeeded_job_may_be_rerun_but_not_resumed(jobs):
    """resume of SUCCEEDED is 409 naming rerun; rerun starts it again from scratch."""
    spec = {"job_id": "ok-1", "name": "ok", "owner": OWNER, "accelerator_type": "v4-8", "command": "true"}
    jobs.handle(message("tpujobs-submit", spec))
    for kind, extra in (("started", {}), ("exited", {"exit_code": 0})):
        payload = {"kind": kind, "job_id": "ok-1", "attempt": 1, "slice_id": 0, "worker_id": 0, **extra}
        jobs.handle(signed(jobs, "tpujobs-worker-events", payload))
    assert jobs.store.get("ok-1").state is JobState.SUCCEEDED
    resumed = call(jobs, {"action": "resume", "job_id": "ok-1"}, OWNER)
    assert resumed.status == 409 and "rerun" in resumed.body["error"]
    assert call(jobs, {"action": "rerun", "job_id": "ok-1"}, OWNER).status == 200
    assert jobs.store.get("ok-1").attempt == 2


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"command": "rm -rf /"}, "'command' cannot be changed"),
        ({"accelerator_type": "v4-16"}, "'accelerator_type' cannot be changed"),
        ({"max_restarts": 1000}, "max_restarts"),
        ({"time_limit": "soon"}, "time_limit"),
    ],
)
def test_an_override_outside_the_allowed_fields_or_invalid_is_400_and_starts_nothing(jobs, overrides, words):
    """Refused with a sentence naming the field; the job stays FAILED at attempt 1."""
    failed_job(jobs)
    answer = call(jobs, {"action": "resume", "job_id": "train-1", "overrides": overrides}, OWNER)
    assert answer.status == 400 and words in answer.body["error"]
    job = jobs.store.get("train-1")
    assert (job.state, job.attempt) == (JobState.FAILED, 1)


def test_reserved_capacity_as_an_override_needs_what_it_needs_at_submit(jobs):
    """The owner's privileges are checked as at submit: reserved capacity without a right is 403."""
    failed_job(jobs)
    answer = call(jobs, {"action": "resume", "job_id": "train-1", "overrides": {"capacity": "reserved"}}, OWNER)
    assert answer.status == 403 and "reserved" in answer.body["error"], answer.body
    assert jobs.store.get("train-1").state is JobState.FAILED
    overrides = {"capacity": "reserved"}
    by_admin = call(jobs, {"action": "resume", "job_id": "train-1", "overrides": overrides}, ADMIN)
    assert by_admin.status == 403  # the owner's rights decide, whoever asks for the owner's job


@pytest.mark.parametrize("action", ["resume", "rerun"])
def test_a_privilege_taken_away_is_gone_for_a_restart_without_overrides(jobs, action):
    """Removed from high_priority, the owner cannot resume or rerun an old high job as it was."""
    allowed = AccessPolicies(high_priority=(OWNER,), trust_topic_owners=True)  # the setup submits on the topic
    jobs.access.allowed = allowed
    failed_job(jobs, priority="high")
    jobs.access.allowed = AccessPolicies(trust_topic_owners=True)
    answer = call(jobs, {"action": action, "job_id": "train-1"}, OWNER)
    assert answer.status == 403 and "priority" in answer.body["error"], answer.body
    assert jobs.store.get("train-1").attempt == 1
    jobs.access.allowed = allowed
    assert call(jobs, {"action": action, "job_id": "train-1"}, OWNER).status == 200


def test_accepted_overrides_are_recorded_and_used(jobs, tpu_client):
    """A new zone, restart budget and time limit: on the job's spec, in the timeline, and the
    queued resource asked for in that zone."""
    failed_job(jobs)
    overrides = {"zone": OTHER_ZONE, "max_restarts": 4, "time_limit": "2h", "capacity": "spot"}
    answer = call(jobs, {"action": "resume", "job_id": "train-1", "overrides": overrides}, OWNER)
    assert answer.status == 200, answer.body
    job = jobs.store.get("train-1")
    assert (job.zone, job.spec.max_restarts, job.spec.time_limit, job.capacity) == (OTHER_ZONE, 4, "2h", "spot")
    reason = next(e.reason for e in jobs.store.events("train-1") if e.from_state is JobState.FAILED)
    assert f"zone={OTHER_ZONE}" in reason and "max_restarts=4" in reason and "time_limit=2h" in reason
    assert queued_resource_name("train-1", 2) in queued_resources(tpu_client, OTHER_ZONE)


def test_on_the_topic_the_owner_resumes_once_per_message_and_a_stranger_is_a_rejection(jobs):
    """tpujobs-control: a redelivered message (same id) starts one attempt; a stranger's request
    is recorded in rejections and changes nothing."""
    failed_job(jobs)
    stranger = message("tpujobs-control", {"action": "resume", "job_id": "train-1", "owner": STRANGER})
    jobs.handle(stranger)
    assert jobs.store.get("train-1").state is JobState.FAILED
    rejected = [r for r in jobs.store.recent_rejections(limit=10) if r.message_id == stranger.message_id]
    assert len(rejected) == 1 and "only its owner or an admin" in rejected[0].reason
    request = message("tpujobs-control", {"action": "resume", "job_id": "train-1", "owner": OWNER})
    jobs.handle(request)
    jobs.handle(request)  # Pub/Sub delivers at least once
    job = jobs.store.get("train-1")
    assert (job.attempt, job.restart_requests) == (2, (f"message-{request.message_id}",))
    assert "via the topic" in next(e.reason for e in jobs.store.events("train-1") if e.source == "user")


def test_on_the_topic_an_explicit_request_id_makes_two_messages_one_attempt(jobs):
    """Two messages carrying one request_id (a client that published twice) start one attempt."""
    failed_job(jobs)
    body = {"action": "rerun", "job_id": "train-1", "owner": OWNER, "request_id": "cli-7"}
    jobs.handle(message("tpujobs-control", body))
    jobs.handle(message("tpujobs-control", body))
    job = jobs.store.get("train-1")
    assert (job.attempt, job.restart_requests, job.resume_next) == (2, ("cli-7",), False)


def test_a_resume_killed_at_any_io_step_and_retried_starts_exactly_one_attempt(jobs, tpu_client):
    """Killed before or after each of its I/O steps, then retried with the same request id: the job
    ends up at attempt 2, PROVISIONING, with one queued resource for it and none for attempt 3."""
    counted = CrashPlan()
    failed_job(jobs, "count-1")
    jobs.crashing(counted).restart("count-1", "resume", OWNER, "r-1", {})
    assert "store.apply" in counted.steps and "tpu.request" in counted.steps
    for k in range(1, len(counted.steps) + 1):
        for when in ("before", "after"):
            job_id = failed_job(jobs, f"crash-{k}-{when}")
            plan = CrashPlan(at=k, when=when)
            with pytest.raises(InjectedCrash):
                jobs.crashing(plan).restart(job_id, "resume", OWNER, "r-1", {})
            retried = jobs.restart(job_id, "resume", OWNER, "r-1", {})
            assert retried.kind in ("started", "duplicate"), (k, when, retried.reason)
            job = jobs.store.get(job_id)
            assert (job.state, job.attempt, job.restart_requests) == (JobState.PROVISIONING, 2, ("r-1",)), (k, when)
            names = queued_resources(tpu_client)
            assert queued_resource_name(job_id, 2) in names and queued_resource_name(job_id, 3) not in names


def test_a_job_resumed_long_after_its_start_is_not_out_of_time_at_the_next_tick(engine):
    """time_limit counts again from the resumed attempt's capacity: a day after the job's first
    start, the reconciler's tick (which reads outlines) leaves the resumed job running, and its
    limit runs out an hour after the resumed attempt's start."""
    clock = OffsetClock()
    jobs = engine(clock=clock, admins=(ADMIN,), access=AccessPolicies())
    failed_job(jobs, "late-1", time_limit="1h")
    clock.advance(24 * 3600)
    assert jobs.restart("late-1", "resume", OWNER, "r-1", {}).kind == "started"
    payload = {"kind": "started", "job_id": "late-1", "attempt": 2, "slice_id": 0, "worker_id": 0}
    jobs.handle(signed(jobs, "tpujobs-worker-events", payload))
    jobs.tick()
    job = jobs.store.get("late-1")
    assert (job.state, job.attempt, job.run_first_attempt) == (JobState.RUNNING, 2, 2), job.state_reason
    assert limits.limit_reached(job, clock() + timedelta(hours=1)) is not None  # and it still runs out

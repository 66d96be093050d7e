"""Resume and rerun of an ended job, through the jobs API and tpujobs-control, on the Firestore
emulator and the TPU simulator: who may, what may change, and one attempt per request id."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from tpujobs.adapters.firestore_config import FirestoreAccessPolicies
from tpujobs.domain import limits
from tpujobs.domain.naming import queued_resource_name
from tpujobs.domain.states import JobState
from tpujobs.engine.api import CALLER_HEADER, JobsApi
from tpujobs.engine.job_service import JobService
from tpujobs.engine.startup_script import agent_config
from tpujobs.local.testing import (
    CrashingStore,
    CrashingTpu,
    CrashPlan,
    InjectedCrash,
    OffsetClock,
    local_settings,
    reconciler_for,
    signed,
)
from tpujobs.local.testing import inbound as message

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"
OTHER_ZONE = "us-east5-a"
OWNER = "ada@example.com"
ADMIN = "root@example.com"
STRANGER = "eve@example.com"
URL = "http://127.0.0.1/jobs"


@pytest.fixture
def service(job_service, firestore_client) -> JobService:
    """With the deployment's access policies (none written: only admins hold privileges)."""
    return job_service(admins=(ADMIN,), access=FirestoreAccessPolicies(firestore_client))


@pytest.fixture
def api(service) -> JobsApi:
    """The API as the local stack runs it: the caller header says who asks."""
    return JobsApi(service, service.store, local_settings(local_stack=True, admins=(ADMIN,)))


def failed_job(service: JobService, job_id: str = "train-1", **changes) -> str:
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
    assert service.submit(message("tpujobs-submit", spec)).kind == "provisioning"
    for kind, extra in (("started", {}), ("exited", {"exit_code": 1})):
        payload = {"kind": kind, "job_id": job_id, "attempt": 1, "slice_id": 0, "worker_id": 0, **extra}
        service.on_worker_report(signed(service, "tpujobs-worker-events", payload))
    assert service.store.get(job_id).state is JobState.FAILED
    return job_id


def call(api: JobsApi, body: dict, caller: str):
    return api.handle("POST", URL, {CALLER_HEADER: caller}, json.dumps(body).encode())


def queued_resources(tpu_client, project_id: str, zone: str = ZONE) -> set[str]:
    parent = f"projects/{project_id}/locations/{zone}"
    return {r.name.rsplit("/", 1)[-1] for r in tpu_client.list_queued_resources(parent=parent)}


def test_the_owner_resumes_a_failed_job_under_its_job_id_from_its_checkpoint(api, service, tpu_client, project_id):
    """200; attempt 2 asks for a new queued resource, resumes, restarts counted from zero, and
    the timeline says who asked."""
    failed_job(service)
    answer = call(api, {"action": "resume", "job_id": "train-1", "request_id": "r-1"}, OWNER)
    assert answer.status == 200, answer.body
    assert answer.body["outcome"] == "started" and answer.body["attempt"] == 2
    job = service.store.get("train-1")
    assert (job.state, job.attempt, job.restarts, job.resume_next) == (JobState.PROVISIONING, 2, 0, True)
    assert (job.ended_at, job.exit_code, job.restart_requests) == (None, None, ("r-1",))
    assert agent_config(job, service.settings)["resume"] is True
    assert queued_resource_name("train-1", 2) in queued_resources(tpu_client, project_id)
    resumed = [e for e in service.store.events("train-1") if e.from_state is JobState.FAILED]
    assert len(resumed) == 1 and resumed[0].source == "user" and OWNER in resumed[0].reason
    assert [u.attempt for u in job.usage] == [1, 2]


def test_the_same_request_twice_starts_one_attempt(api, service, tpu_client, project_id):
    """A retried request (same request id) answers `duplicate` and changes nothing."""
    failed_job(service)
    body = {"action": "resume", "job_id": "train-1", "request_id": "r-1"}
    first = call(api, body, OWNER)
    events = len(service.store.events("train-1"))
    again = call(api, body, OWNER)
    assert (first.status, again.status) == (200, 200)
    assert again.body["outcome"] == "duplicate" and again.body["attempt"] == 2
    assert len(service.store.events("train-1")) == events
    assert service.store.get("train-1").attempt == 2
    assert queued_resource_name("train-1", 3) not in queued_resources(tpu_client, project_id)


def test_a_different_resume_while_the_first_runs_is_refused_with_a_sentence(api, service):
    """The job is no longer ended: 409 saying so, and the job keeps its attempt."""
    failed_job(service)
    assert call(api, {"action": "resume", "job_id": "train-1", "request_id": "r-1"}, OWNER).status == 200
    second = call(api, {"action": "rerun", "job_id": "train-1", "request_id": "r-2"}, OWNER)
    assert second.status == 409 and "has not ended" in second.body["error"]
    assert service.store.get("train-1").attempt == 2


def test_an_admin_may_rerun_and_someone_else_may_not(api, service):
    """The rule of cancel: the owner or an admin; a stranger gets 403 and the job stays FAILED."""
    failed_job(service)
    refused = call(api, {"action": "rerun", "job_id": "train-1"}, STRANGER)
    assert refused.status == 403 and "only its owner or an admin" in refused.body["error"]
    assert service.store.get("train-1").state is JobState.FAILED
    answer = call(api, {"action": "rerun", "job_id": "train-1"}, ADMIN)
    assert answer.status == 200
    job = service.store.get("train-1")
    assert (job.attempt, job.resume_next) == (2, False)
    assert ADMIN in job.state_reason or ADMIN in service.store.events("train-1")[-2].reason


def test_a_succeeded_job_may_be_rerun_but_not_resumed(api, service):
    """resume of SUCCEEDED is 409 naming rerun; rerun starts it again from scratch."""
    spec = {"job_id": "ok-1", "name": "ok", "owner": OWNER, "accelerator_type": "v4-8", "command": "true"}
    service.submit(message("tpujobs-submit", spec))
    for kind, extra in (("started", {}), ("exited", {"exit_code": 0})):
        payload = {"kind": kind, "job_id": "ok-1", "attempt": 1, "slice_id": 0, "worker_id": 0, **extra}
        service.on_worker_report(signed(service, "tpujobs-worker-events", payload))
    assert service.store.get("ok-1").state is JobState.SUCCEEDED
    resumed = call(api, {"action": "resume", "job_id": "ok-1"}, OWNER)
    assert resumed.status == 409 and "rerun" in resumed.body["error"]
    assert call(api, {"action": "rerun", "job_id": "ok-1"}, OWNER).status == 200
    assert service.store.get("ok-1").attempt == 2


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"command": "rm -rf /"}, "'command' cannot be changed"),
        ({"accelerator_type": "v4-16"}, "'accelerator_type' cannot be changed"),
        ({"max_restarts": 1000}, "max_restarts"),
        ({"time_limit": "soon"}, "time_limit"),
    ],
)
def test_an_override_outside_the_allowed_fields_or_invalid_is_400_and_starts_nothing(api, service, overrides, words):
    """Refused with a sentence naming the field; the job stays FAILED at attempt 1."""
    failed_job(service)
    answer = call(api, {"action": "resume", "job_id": "train-1", "overrides": overrides}, OWNER)
    assert answer.status == 400 and words in answer.body["error"]
    job = service.store.get("train-1")
    assert (job.state, job.attempt) == (JobState.FAILED, 1)


def test_reserved_capacity_as_an_override_needs_what_it_needs_at_submit(api, service):
    """The owner's privileges are checked as at submit: reserved capacity without a right is 403."""
    failed_job(service)
    answer = call(api, {"action": "resume", "job_id": "train-1", "overrides": {"capacity": "reserved"}}, OWNER)
    assert answer.status == 403 and "reserved" in answer.body["error"], answer.body
    assert service.store.get("train-1").state is JobState.FAILED
    overrides = {"capacity": "reserved"}
    by_admin = call(api, {"action": "resume", "job_id": "train-1", "overrides": overrides}, ADMIN)
    assert by_admin.status == 403  # the owner's rights decide, whoever asks for the owner's job


def test_accepted_overrides_are_recorded_and_used(api, service, tpu_client, project_id):
    """A new zone, restart budget and time limit: on the job's spec, in the timeline, and the
    queued resource asked for in that zone."""
    failed_job(service)
    overrides = {"zone": OTHER_ZONE, "max_restarts": 4, "time_limit": "2h", "capacity": "spot"}
    answer = call(api, {"action": "resume", "job_id": "train-1", "overrides": overrides}, OWNER)
    assert answer.status == 200, answer.body
    job = service.store.get("train-1")
    assert (job.zone, job.spec.max_restarts, job.spec.time_limit, job.capacity) == (OTHER_ZONE, 4, "2h", "spot")
    reason = next(e.reason for e in service.store.events("train-1") if e.from_state is JobState.FAILED)
    assert f"zone={OTHER_ZONE}" in reason and "max_restarts=4" in reason and "time_limit=2h" in reason
    assert queued_resource_name("train-1", 2) in queued_resources(tpu_client, project_id, OTHER_ZONE)


def test_on_the_topic_the_owner_resumes_once_per_message_and_a_stranger_is_a_rejection(service):
    """tpujobs-control: a redelivered message (same id) starts one attempt; a stranger's request
    is recorded in rejections and changes nothing."""
    failed_job(service)
    stranger = message("tpujobs-control", {"action": "resume", "job_id": "train-1", "owner": STRANGER})
    service.on_control(stranger)
    assert service.store.get("train-1").state is JobState.FAILED
    rejected = [r for r in service.store.recent_rejections(limit=10) if r.message_id == stranger.message_id]
    assert len(rejected) == 1 and "only its owner or an admin" in rejected[0].reason
    request = message("tpujobs-control", {"action": "resume", "job_id": "train-1", "owner": OWNER})
    service.on_control(request)
    service.on_control(request)  # Pub/Sub delivers at least once
    job = service.store.get("train-1")
    assert (job.attempt, job.restart_requests) == (2, (f"message-{request.message_id}",))
    assert "via the topic" in next(e.reason for e in service.store.events("train-1") if e.source == "user")


def test_on_the_topic_an_explicit_request_id_makes_two_messages_one_attempt(service):
    """Two messages carrying one request_id (a client that published twice) start one attempt."""
    failed_job(service)
    body = {"action": "rerun", "job_id": "train-1", "owner": OWNER, "request_id": "cli-7"}
    service.on_control(message("tpujobs-control", body))
    service.on_control(message("tpujobs-control", body))
    job = service.store.get("train-1")
    assert (job.attempt, job.restart_requests, job.resume_next) == (2, ("cli-7",), False)


def crashing(service: JobService, plan: CrashPlan) -> JobService:
    """The same service on ports that die at the plan's step (tpujobs.local.testing)."""
    return JobService(
        CrashingStore(service.store, plan),
        CrashingTpu(service.tpu, plan),
        service.settings,
        service.clock,
        service.sleep,
        access=service.access,
    )


def test_a_resume_killed_at_any_io_step_and_retried_starts_exactly_one_attempt(service, tpu_client, project_id):
    """Killed before or after each of its I/O steps, then retried with the same request id: the job
    ends up at attempt 2, PROVISIONING, with one queued resource for it and none for attempt 3."""
    counted = CrashPlan()
    failed_job(service, "count-1")
    crashing(service, counted).restart("count-1", "resume", OWNER, "r-1", {})
    assert "store.apply" in counted.steps and "tpu.request" in counted.steps
    for k in range(1, len(counted.steps) + 1):
        for when in ("before", "after"):
            job_id = failed_job(service, f"crash-{k}-{when}")
            plan = CrashPlan(at=k, when=when)
            with pytest.raises(InjectedCrash):
                crashing(service, plan).restart(job_id, "resume", OWNER, "r-1", {})
            retried = service.restart(job_id, "resume", OWNER, "r-1", {})
            assert retried.kind in ("started", "duplicate"), (k, when, retried.reason)
            job = service.store.get(job_id)
            assert (job.state, job.attempt, job.restart_requests) == (JobState.PROVISIONING, 2, ("r-1",)), (k, when)
            names = queued_resources(tpu_client, project_id)
            assert queued_resource_name(job_id, 2) in names and queued_resource_name(job_id, 3) not in names


def test_a_job_resumed_long_after_its_start_is_not_out_of_time_at_the_next_tick(job_service, firestore_client):
    """time_limit counts again from the resumed attempt's capacity: a day after the job's first
    start, the reconciler's tick (which reads outlines) leaves the resumed job running, and its
    limit runs out an hour after the resumed attempt's start."""
    clock = OffsetClock()
    service = job_service(clock=clock, admins=(ADMIN,), access=FirestoreAccessPolicies(firestore_client))
    failed_job(service, "late-1", time_limit="1h")
    clock.advance(24 * 3600)
    assert service.restart("late-1", "resume", OWNER, "r-1", {}).kind == "started"
    payload = {"kind": "started", "job_id": "late-1", "attempt": 2, "slice_id": 0, "worker_id": 0}
    service.on_worker_report(signed(service, "tpujobs-worker-events", payload))
    reconciler_for(service).tick()
    job = service.store.get("late-1")
    assert (job.state, job.attempt, job.run_first_attempt) == (JobState.RUNNING, 2, 2), job.state_reason
    assert limits.limit_reached(job, clock() + timedelta(hours=1)) is not None  # and it still runs out

"""The `jobs` HTTP function's logic (tpujobs.engine.api) on the Firestore emulator and the TPU simulator.

Requests are given to `JobsApi.handle` as functions/main.py passes them; one test goes
through functions-framework itself. Production identity is a Google ID token: here its
verifier is replaced by a fake that knows two tokens; tests/unit/engine/test_api_identity.py runs
google-auth's real verification against tokens signed in the test.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tpujobs.domain.access import AccessPolicies
from tpujobs.domain.states import JobState
from tpujobs.engine.api import CALLER_HEADER, InvalidToken, JobsApi
from tpujobs.engine.errors import TransientError
from tpujobs.engine.services import Engine
from tpujobs.engine.settings import Settings
from tpujobs.local.fakes import InMemoryAccessPolicies
from tpujobs.local.testing import inbound as message
from tpujobs.local.testing import local_settings, signed
from tpujobs.runtime import instances

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"
OWNER = "ada@example.com"
ADMIN = "root@example.com"
STRANGER = "eve@example.com"
URL = "https://us-central1-p.cloudfunctions.net/jobs"
TOKENS = {  # the fake verifier's world: token -> claims
    "ada-token": {"email": OWNER, "email_verified": True},
    "unverified-token": {"email": OWNER, "email_verified": False},
}
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
FUNCTIONS = Path(__file__).resolve().parents[2] / "functions" / "main.py"


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class FakeVerifier:
    """Verifies the tokens of TOKENS, refuses any other; remembers the audiences it was asked for."""

    def __init__(self) -> None:
        self.audiences: list[list[str]] = []

    def __call__(self, token: str, audiences):
        self.audiences.append(list(audiences))
        if token not in TOKENS:
            raise InvalidToken("Could not verify token signature.")
        return TOKENS[token]


@pytest.fixture
def service(job_service) -> Engine:
    return job_service(admins=(ADMIN,))


@pytest.fixture
def local(service) -> JobsApi:
    """The API as the local stack runs it: the caller header is trusted."""
    return JobsApi(
        service, service.store, local_settings(local_stack=True, admins=(ADMIN,)), verify_token=FakeVerifier()
    )


@pytest.fixture
def verifier() -> FakeVerifier:
    return FakeVerifier()


@pytest.fixture
def production(service, verifier) -> JobsApi:
    """The API as deployed: only a verified ID token says who calls."""
    return JobsApi(service, service.store, local_settings(local_stack=False, admins=(ADMIN,)), verify_token=verifier)


def submit(service: Engine, job_id: str, owner: str = OWNER, **changes) -> str:
    spec = {
        "job_id": job_id,
        "name": "train",
        "owner": owner,
        "accelerator_type": "v4-8",  # one worker host
        "command": "python train.py",
        **changes,
    }
    assert service.submission.submit(message("tpujobs-submit", spec)).kind == "provisioning"
    return job_id


def fail(service: Engine, job_id: str) -> None:
    """The job's only worker starts and exits 1: FAILED (on_error defaults to fail)."""
    for kind, extra in (("started", {}), ("exited", {"exit_code": 1})):
        payload = {"kind": kind, "job_id": job_id, "attempt": 1, "slice_id": 0, "worker_id": 0, **extra}
        service.worker_events.on_worker_report(signed(service, "tpujobs-worker-events", payload))
    assert service.store.get(job_id).state is JobState.FAILED


def call(app: JobsApi, body, caller: str | None = None, token: str | None = None, method: str = "POST"):
    headers = {}
    if caller is not None:
        headers[CALLER_HEADER] = caller
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return app.handle(method, URL, headers, raw)


def state_of(service: Engine, job_id: str) -> JobState:
    return service.store.get(job_id).state


# --- identity ------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["list", "describe", "cancel"])
def test_no_caller_header_in_the_local_stack_is_401(local, service, action):
    """Every action needs an identity: without the header, 401 and nothing done."""
    submit(service, "train-1")
    answer = call(local, {"action": action, "job_id": "train-1"} if action != "list" else {"action": "list"})
    assert answer.status == 401 and CALLER_HEADER in answer.body["error"]
    assert state_of(service, "train-1") is JobState.PROVISIONING


def test_no_bearer_token_in_production_is_401(production, service):
    """Deployed, a request without 'Authorization: Bearer' is 401."""
    submit(service, "train-1")
    answer = call(production, {"action": "cancel", "job_id": "train-1"})
    assert answer.status == 401 and "Bearer" in answer.body["error"]
    assert state_of(service, "train-1") is JobState.PROVISIONING


def test_a_token_that_does_not_verify_is_401_and_is_not_echoed(production, service):
    """A forged or expired token: 401, the job untouched, the token not in the answer."""
    submit(service, "train-1")
    answer = call(production, {"action": "cancel", "job_id": "train-1"}, token="forged-by-eve")
    assert answer.status == 401 and "does not verify" in answer.body["error"]
    assert "forged-by-eve" not in json.dumps(answer.body)
    assert state_of(service, "train-1") is JobState.PROVISIONING


def test_a_token_without_a_verified_email_is_401(production, service):
    """email_verified false: the email is not an identity."""
    submit(service, "train-1")
    answer = call(production, {"action": "cancel", "job_id": "train-1"}, token="unverified-token")
    assert answer.status == 401 and "verified email" in answer.body["error"]
    assert state_of(service, "train-1") is JobState.PROVISIONING


def test_the_caller_header_is_ignored_outside_the_local_stack(production, service):
    """Deployed, X-Tpujobs-Caller naming the owner proves nothing: 401, the job keeps running."""
    submit(service, "train-1")
    answer = call(production, {"action": "cancel", "job_id": "train-1"}, caller=OWNER)
    assert answer.status == 401
    assert state_of(service, "train-1") is JobState.PROVISIONING


def test_a_verified_token_of_the_owner_cancels_checked_against_the_function_url(production, service, verifier):
    """The token's email is the caller; by default its audience must be the function's own URL."""
    submit(service, "train-1")
    answer = call(production, {"action": "cancel", "job_id": "train-1"}, token="ada-token")
    assert answer.status == 200, answer.body
    assert state_of(service, "train-1") is JobState.CANCELLED
    assert URL in verifier.audiences[-1]
    assert "https://us-central1-p.cloudfunctions.net" in verifier.audiences[-1]


def test_configured_audiences_replace_the_derived_url(service, verifier):
    """TPUJOBS_API_AUDIENCE set: those audiences, and only those, are accepted."""
    configured = Settings.from_env({"TPUJOBS_API_AUDIENCE": "https://jobs.example.com, client-id"})
    assert configured.api_audiences == ("https://jobs.example.com", "client-id")
    app = JobsApi(service, service.store, configured, verify_token=verifier)
    assert call(app, {"action": "list"}, token="ada-token").status == 200
    assert verifier.audiences[-1] == ["https://jobs.example.com", "client-id"]


def test_the_owner_is_never_taken_from_the_body(local, service):
    """A stranger naming the owner in the body gets 400, and without it 403: the body proves nothing."""
    submit(service, "train-1")
    forged = call(local, {"action": "cancel", "job_id": "train-1", "owner": OWNER}, caller=STRANGER)
    assert forged.status == 400 and "never taken from the body" in forged.body["error"]
    plain = call(local, {"action": "cancel", "job_id": "train-1"}, caller=STRANGER)
    assert plain.status == 403
    assert state_of(service, "train-1") is JobState.PROVISIONING


def test_certificates_out_of_reach_is_503_not_401(service):
    """Google's keys unreachable: 503, try again; the caller is not told their token is bad."""

    def unreachable(token, audiences):
        raise TransientError("could not fetch Google's token certificates")

    app = JobsApi(service, service.store, local_settings(), verify_token=unreachable)
    answer = call(app, {"action": "list"}, token="ada-token")
    assert answer.status == 503 and "try again" in answer.body["error"]


# --- cancel ----------------------------------------------------------------------------------


def test_the_owner_cancels_and_gets_the_new_state(local, service, tpu_client, project_id):
    """200 with CANCELLED, a timeline entry naming who, and the capacity released at once."""
    submit(service, "train-1")
    answer = call(local, {"action": "cancel", "job_id": "train-1"}, caller=OWNER)
    assert answer.status == 200
    assert answer.body == {"job_id": "train-1", "state": "CANCELLED", "previous_state": "PROVISIONING"}
    job = service.store.get("train-1")
    assert job.state is JobState.CANCELLED
    assert service.store.events("train-1")[-1].reason == f"Cancelled by {OWNER}."
    parent = f"projects/{project_id}/locations/{ZONE}"
    states = {r.name.rsplit("/", 1)[-1]: r.state.state.name for r in tpu_client.list_queued_resources(parent=parent)}
    assert states.get(job.queued_resource) in (None, "DELETING")


def test_someone_else_gets_403_and_the_job_keeps_running(local, service):
    """Neither owner nor admin: 403 naming the rule, and the job is untouched."""
    submit(service, "train-1")
    answer = call(local, {"action": "cancel", "job_id": "train-1"}, caller=STRANGER)
    assert answer.status == 403 and "only its owner or an admin" in answer.body["error"]
    assert state_of(service, "train-1") is JobState.PROVISIONING
    assert len(service.store.events("train-1")) == 2  # queued, provisioning: nothing more


def test_an_admin_may_cancel_anyones_job(local, service):
    """A configured admin cancels a job of another owner."""
    submit(service, "train-1")
    answer = call(local, {"action": "cancel", "job_id": "train-1"}, caller=ADMIN)
    assert answer.status == 200 and answer.body["state"] == "CANCELLED"
    assert service.store.events("train-1")[-1].reason == f"Cancelled by {ADMIN}."


def test_an_admin_of_the_service_but_not_of_the_api_settings_is_not_an_admin(service):
    """The API's own settings name its admins: an empty list means owners only."""
    submit(service, "train-1")
    app = JobsApi(service, service.store, local_settings(local_stack=True), verify_token=FakeVerifier())
    assert call(app, {"action": "cancel", "job_id": "train-1"}, caller=ADMIN).status == 403


def test_a_missing_job_is_404(local):
    """An unknown job id, or one no job could have, is 404 for cancel and describe."""
    for job_id in ("no-such-job", "Not/An/Id"):
        for action in ("cancel", "describe"):
            answer = call(local, {"action": action, "job_id": job_id}, caller=OWNER)
            assert answer.status == 404 and job_id in answer.body["error"]


def test_a_missing_job_is_404_only_after_authentication(local):
    """Without an identity, even a missing job is 401: nothing is told to strangers."""
    assert call(local, {"action": "cancel", "job_id": "no-such-job"}).status == 401


def test_cancelling_a_cancelled_job_again_is_200_and_changes_nothing(local, service):
    """A retried cancel is safe: 200, still CANCELLED, no second timeline entry."""
    submit(service, "train-1")
    assert call(local, {"action": "cancel", "job_id": "train-1"}, caller=OWNER).status == 200
    events = len(service.store.events("train-1"))
    again = call(local, {"action": "cancel", "job_id": "train-1"}, caller=OWNER)
    assert again.status == 200
    assert again.body == {"job_id": "train-1", "state": "CANCELLED", "previous_state": "CANCELLED"}
    assert len(service.store.events("train-1")) == events


def test_cancelling_a_job_that_ended_otherwise_is_409(local, service):
    """A FAILED job cannot be cancelled: 409 saying how it ended, and it stays FAILED."""
    submit(service, "train-1")
    fail(service, "train-1")
    answer = call(local, {"action": "cancel", "job_id": "train-1"}, caller=OWNER)
    assert answer.status == 409 and "already ended FAILED" in answer.body["error"]
    assert state_of(service, "train-1") is JobState.FAILED


def test_the_control_topic_applies_the_same_rule_when_claims_are_trusted(job_service, firestore_client):
    """tpujobs-control with trust_topic_owners: a stranger is rejected, an admin cancels
    (domain.access.may_cancel). Without it a claimed admin is only a claim (test_engine_topic_claims)."""
    service = job_service(admins=(ADMIN,), access=InMemoryAccessPolicies(AccessPolicies(trust_topic_owners=True)))
    submit(service, "train-1")
    refused = message("tpujobs-control", {"action": "cancel", "job_id": "train-1", "owner": STRANGER})
    assert service.controls.on_control(refused) is None
    assert firestore_client.collection("rejections").document(refused.message_id).get().exists
    assert state_of(service, "train-1") is JobState.PROVISIONING
    service.controls.on_control(message("tpujobs-control", {"action": "cancel", "job_id": "train-1", "owner": ADMIN}))
    assert state_of(service, "train-1") is JobState.CANCELLED


# --- list and describe ----------------------------------------------------------------------


def test_list_filters_by_state_and_owner_newest_first(local, service):
    """state and owner narrow the list; jobs come newest first, as their Firestore documents."""
    submit(service, "first")
    submit(service, "second", owner="bob@example.com")
    submit(service, "third")
    call(local, {"action": "cancel", "job_id": "third"}, caller=OWNER)

    every = call(local, {"action": "list"}, caller=STRANGER)
    assert every.status == 200
    assert [j["job_id"] for j in every.body["jobs"]] == ["third", "second", "first"]
    mine = call(local, {"action": "list", "owner": OWNER}, caller=STRANGER).body["jobs"]
    assert [j["job_id"] for j in mine] == ["third", "first"]
    live = call(local, {"action": "list", "owner": OWNER, "state": "provisioning"}, caller=OWNER).body["jobs"]
    assert [j["job_id"] for j in live] == ["first"]
    assert [
        j["job_id"]
        for j in call(local, {"action": "list", "limit": 1, "state": "CANCELLED"}, caller=OWNER).body["jobs"]
    ] == ["third"]

    document = live[0]
    assert document["state"] == "PROVISIONING" and document["owner"] == OWNER
    assert document["queued_resource"] == "first-a1" and document["spec"]["command"] == "python train.py"
    assert RFC3339.match(document["created_at"]) and document["ended_at"] is None


@pytest.mark.parametrize(
    "body, words",
    [
        ({"action": "list", "state": "DONE"}, "'state' must be one of"),
        ({"action": "list", "limit": 0}, "'limit'"),
        ({"action": "list", "limit": True}, "'limit'"),
        ({"action": "list", "limit": "5"}, "'limit'"),
        ({"action": "list", "owner": ""}, "'owner'"),
        ({"action": "list", "sort": "age"}, "Unknown field 'sort'"),
    ],
)
def test_list_refuses_bad_filters_with_400(local, body, words):
    """A state that is not a JobState, a limit out of 1..1000, an unknown filter: 400 saying which."""
    answer = call(local, body, caller=OWNER)
    assert answer.status == 400 and words in answer.body["error"]


def test_describe_returns_the_document_its_timeline_and_attempts(local, service, firestore_client):
    """The job as stored, every event in order with RFC 3339 times, and exported attempts."""
    submit(service, "train-1")
    call(local, {"action": "cancel", "job_id": "train-1"}, caller=OWNER)
    firestore_client.collection("jobs").document("train-1").collection("attempts").document("1").set(
        {"attempt": 1, "log_uri": "gs://logs/jobs/train-1/attempt-1/attempt.log", "exported_at": utc_now()}
    )
    answer = call(local, {"action": "describe", "job_id": "train-1"}, caller=STRANGER)
    assert answer.status == 200
    assert answer.body["job"]["job_id"] == "train-1" and answer.body["job"]["state"] == "CANCELLED"
    events = answer.body["events"]
    assert [e["to_state"] for e in events] == ["QUEUED", "PROVISIONING", "CANCELLED"]
    assert [e["seq"] for e in events] == [1, 2, 3] and events[0]["id"] == "0001-queued"
    assert all(RFC3339.match(e["at"]) for e in events)
    assert events[-1]["source"] == "user" and events[-1]["reason"] == f"Cancelled by {OWNER}."
    [attempt] = answer.body["attempts"]
    assert attempt["log_uri"].endswith("attempt-1/attempt.log") and RFC3339.match(attempt["exported_at"])


def test_env_values_are_shown_only_to_the_owner_or_an_admin(local, service):
    """list and describe: the owner and an admin see env values; anyone else sees the names, each
    value <hidden>, and no value anywhere in the answer (job, events, attempts)."""
    env = {"WANDB_PROJECT": "value-of-the-project-7f3a", "SEED": "value-of-the-seed-91c2"}
    submit(service, "train-1", env=env)
    call(local, {"action": "cancel", "job_id": "train-1"}, caller=OWNER)
    for caller in (OWNER, ADMIN):
        described = call(local, {"action": "describe", "job_id": "train-1"}, caller=caller).body
        assert described["job"]["spec"]["env"] == env
        [listed] = call(local, {"action": "list"}, caller=caller).body["jobs"]
        assert listed["spec"]["env"] == env
    described = call(local, {"action": "describe", "job_id": "train-1"}, caller=STRANGER)
    listed = call(local, {"action": "list"}, caller=STRANGER)
    assert described.status == 200 and listed.status == 200
    assert described.body["job"]["spec"]["env"] == {"WANDB_PROJECT": "<hidden>", "SEED": "<hidden>"}
    assert listed.body["jobs"][0]["spec"]["env"] == {"WANDB_PROJECT": "<hidden>", "SEED": "<hidden>"}
    assert described.body["events"] and described.body["job"]["state"] == "CANCELLED"
    for answer in (described, listed):
        text = json.dumps(answer.body)
        assert not [value for value in env.values() if value in text]


# --- malformed requests -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, words",
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (b"{}", "'action' must be one of"),
        (b'{"action": "delete", "job_id": "train-1"}', "'action' must be one of"),
        (b'{"action": "describe"}', "'job_id' is required"),
        (b'{"action": "cancel", "job_id": 7}', "'job_id' is required"),
        (b'{"action": "describe", "job_id": "train-1", "verbose": true}', "Unknown field 'verbose'"),
        (b"9" * 5000, "not JSON"),
        (b" " * (70 * 1024), "over 64 KiB"),
    ],
)
def test_bad_bodies_are_400_with_a_sentence(local, raw, words):
    """Not JSON, not an object, an unknown action or field, a missing job id: 400 saying what."""
    answer = call(local, raw, caller=OWNER)
    assert answer.status == 400 and words in answer.body["error"], answer.body


def test_other_methods_are_405(local):
    """GET is not an action: 405 with Allow: POST."""
    answer = call(local, b"", caller=OWNER, method="GET")
    assert answer.status == 405 and answer.headers == {"Allow": "POST"}


def test_firestore_unavailable_is_503(local, service, monkeypatch):
    """A transient store failure: 503 and a sentence to try again, not a crash."""

    def down(*args, **kwargs):
        raise TransientError("Firestore failed to read job: unavailable")

    monkeypatch.setattr(service.store, "get", down)
    answer = call(local, {"action": "describe", "job_id": "train-1"}, caller=OWNER)
    assert answer.status == 503 and "try again" in answer.body["error"]


def test_an_unexpected_failure_is_a_json_500_without_details(local, service, monkeypatch):
    """A bug answers 500 as JSON; what went wrong goes to the log, not to the caller."""

    def broken(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(service.store, "get", broken)
    answer = call(local, {"action": "describe", "job_id": "train-1"}, caller=OWNER)
    assert answer.status == 500 and "secret" not in answer.body["error"]


def test_the_http_target_answers_json_through_functions_framework(local, service, monkeypatch):
    """functions/main.py's `jobs`: the status, a JSON body, its Content-Type, and Allow on 405."""
    from functions_framework import create_app

    submit(service, "train-1")
    monkeypatch.setattr(instances, "jobs_api", lambda: local)
    client = create_app("jobs", str(FUNCTIONS), "http").test_client()
    answer = client.post("/", json={"action": "cancel", "job_id": "train-1"}, headers={CALLER_HEADER: STRANGER})
    assert answer.status_code == 403 and answer.content_type == "application/json"
    assert "only its owner or an admin" in answer.get_json()["error"]
    answer = client.post("/", json={"action": "describe", "job_id": "train-1"}, headers={CALLER_HEADER: OWNER})
    assert answer.status_code == 200 and answer.get_json()["job"]["state"] == "PROVISIONING"
    answer = client.get("/")
    assert answer.status_code == 405 and answer.headers["Allow"] == "POST"

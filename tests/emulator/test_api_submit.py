"""The jobs API's `submit` action: the owner is the verified caller, privileges checked against it.

On the Firestore emulator and the TPU simulator, with the access policies read from
Firestore as production reads them (`FirestoreAccessPolicies`).
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tpujobs.adapters.firestore_config import FirestoreAccessPolicies
from tpujobs.adapters.firestore_pools import FirestorePools
from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.adapters.tpu import CloudTpu
from tpujobs.engine.api import CALLER_HEADER, JobsApi
from tpujobs.engine.services import Engine
from tpujobs.local.testing import local_settings

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"
ADA = "ada@example.com"
EVE = "eve@example.com"
ADMIN = "root@example.com"


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@pytest.fixture
def api(firestore_client, tpu_client, project_id, simulator_url) -> JobsApi:
    settings = local_settings(
        project=project_id, default_zone=ZONE, tpu_endpoint=simulator_url, logs_bucket="logs", admins=(ADMIN,),
        local_stack=True,
    )  # fmt: skip
    service = Engine(
        FirestoreJobStore(firestore_client),
        CloudTpu(tpu_client, project_id),
        settings,
        utc_now,
        lambda _: None,
        pools=FirestorePools(firestore_client),
        access=FirestoreAccessPolicies(firestore_client),
    )
    return JobsApi(service, service.store, settings)


def submit(api: JobsApi, caller: str, **spec):
    body = {
        "action": "submit",
        "name": "train",
        "accelerator_type": "v4-8",
        "command": "python train.py",
        **spec,
    }
    import json

    answer = api.handle("POST", "http://localhost/", {CALLER_HEADER: caller}, json.dumps(body).encode())
    return answer.status, answer.body


def test_the_owner_of_a_job_submitted_through_the_api_is_the_caller_and_is_verified(api) -> None:
    """No owner in the body: the caller owns the job, which records submitted_via api and owner_verified."""
    status, body = submit(api, ADA, request_id="r-1")
    assert status == 200, body
    job = api.store.get(body["job_id"])
    assert job.owner == ADA and job.owner_verified is True and job.submitted_via == "api"
    assert body["state"] == "PROVISIONING"


def test_a_body_owner_other_than_the_caller_is_refused_and_nothing_is_written(api) -> None:
    """Eve cannot submit as Ada."""
    status, body = submit(api, EVE, owner=ADA, job_id="as-ada")
    assert status == 403 and "may not submit a job as 'ada@example.com'" in body["error"]
    assert api.store.get("as-ada") is None


def test_the_same_request_id_is_the_same_job_and_another_is_a_new_one(api) -> None:
    """A retried call (same request_id) does not make a second job."""
    first = submit(api, ADA, request_id="again")[1]["job_id"]
    again = submit(api, ADA, request_id="again")[1]["job_id"]
    other = submit(api, ADA, request_id="other")[1]["job_id"]
    assert first == again != other


def test_very_high_priority_needs_a_policy_that_lists_the_verified_caller(api, firestore_client) -> None:
    """Refused (403) until config/policies lists the caller's group; then accepted."""
    status, body = submit(api, ADA, job_id="urgent", priority="very-high")
    assert status == 403 and "high_priority" in body["error"]
    firestore_client.collection("config").document("groups").set({"leads": [ADA]})
    firestore_client.collection("config").document("policies").set({"high_priority": ["group:leads"]})
    status, body = submit(api, ADA, job_id="urgent", priority="very-high")
    assert status == 200, body


def test_an_admin_may_use_reserved_capacity_without_any_policy(api) -> None:
    """Admins need no policy entry."""
    status, body = submit(api, ADMIN, job_id="resv", capacity="reserved", reservation="r1")
    assert status == 200, body


def test_a_job_bigger_than_every_quota_is_refused_before_anything_is_written(api, firestore_client) -> None:
    """A 400 with the sentence; no job document."""
    firestore_client.collection("config").document("quotas").set({ZONE: {"v4": 4}})
    status, body = submit(api, ADA, job_id="huge", accelerator_type="v4-32")
    assert status == 400 and "quota" in body["error"]
    assert api.store.get("huge") is None


def test_an_invalid_spec_or_a_duplicate_key_is_a_400_naming_it(api) -> None:
    """The spec's own sentence comes back; a key named twice is refused."""
    status, body = submit(api, ADA, slices=0)
    assert status == 400 and "slices" in body["error"]
    raw = b'{"action": "submit", "name": "a", "name": "b"}'
    answer = api.handle("POST", "http://localhost/", {CALLER_HEADER: ADA}, raw)
    assert answer.status == 400 and "names 'name' twice" in answer.body["error"]

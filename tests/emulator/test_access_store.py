"""Access policies on the real Firestore emulator: FirestoreAccessPolicies reads config/policies,
config/groups and config/service_accounts, and the submit use case (with the TPU simulator and
the real TPU client) refuses or accepts what they say."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

import pytest

from tpujobs.adapters.firestore_config import FirestoreAccessPolicies
from tpujobs.adapters.firestore_store import JOBS, REJECTIONS, FirestoreJobStore
from tpujobs.adapters.tpu import CloudTpu
from tpujobs.domain.access import AccessPolicies, submission_refusal
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.services import Engine
from tpujobs.local.testing import inbound, local_settings

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"
BUCKET = "tpujobs-logs-test"
OWNER = "ada@example.com"
ACCOUNT = "ada-train@research-project.iam.gserviceaccount.com"
OTHER_ACCOUNT = "bob-train@research-project.iam.gserviceaccount.com"


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def a_spec(**changes: Any) -> dict[str, Any]:
    spec = {
        "job_id": "train-1",
        "name": "train",
        "owner": OWNER,
        "accelerator_type": "v4-16",
        "command": "python train.py --steps 100",
    }
    spec.update(changes)
    return spec


def configure(client, name: str, document: dict[str, Any]) -> None:
    """Write config/{name} as an admin does in the console."""
    client.collection("config").document(name).set(document)


@pytest.fixture
def service(job_service, firestore_client) -> Engine:
    return job_service(logs_bucket=BUCKET, sleep=time.sleep, access=FirestoreAccessPolicies(firestore_client))


def rejections(client) -> list[dict[str, Any]]:
    return [doc.to_dict() for doc in client.collection(REJECTIONS).stream()]


def job_document(client, job_id: str) -> dict[str, Any] | None:
    return client.collection(JOBS).document(job_id).get().to_dict()


def queued_resources(tpu_client, project_id: str) -> list[Any]:
    return list(tpu_client.list_queued_resources(parent=f"projects/{project_id}/locations/{ZONE}"))


# -- FirestoreAccessPolicies -------------------------------------------------------------


def test_the_three_documents_become_one_access_policies(firestore_client):
    """config/policies, config/groups and config/service_accounts are read field by field."""
    configure(
        firestore_client,
        "policies",
        {
            "high_priority": [OWNER, "group:research"],
            "reserved_capacity": ["bob@example.com"],
            "trust_topic_owners": True,
        },
    )
    configure(firestore_client, "groups", {"research": ["cy@example.com", "di@example.com"]})
    configure(
        firestore_client,
        "service_accounts",
        {OWNER: [ACCOUNT], "group:research": [ACCOUNT, OTHER_ACCOUNT]},
    )
    assert FirestoreAccessPolicies(firestore_client).policies() == AccessPolicies(
        high_priority=(OWNER, "group:research"),
        reserved_capacity=("bob@example.com",),
        trust_topic_owners=True,
        groups={"research": ("cy@example.com", "di@example.com")},
        service_accounts={OWNER: (ACCOUNT,), "group:research": (ACCOUNT, OTHER_ACCOUNT)},
    )


def test_absent_documents_are_empty_policies(firestore_client):
    """A deployment where no admin wrote anything allows nobody anything, and trusts no topic."""
    assert FirestoreAccessPolicies(firestore_client).policies() == AccessPolicies()


def test_one_document_present_leaves_the_others_empty(firestore_client):
    """Only config/groups written: its groups are read, the lists and accounts are empty."""
    configure(firestore_client, "groups", {"research": [OWNER]})
    assert FirestoreAccessPolicies(firestore_client).policies() == AccessPolicies(groups={"research": (OWNER,)})


def test_fields_of_the_wrong_type_allow_nothing_more(firestore_client):
    """A string for a list, "yes" for true, a list with a number: each ignored, the valid rest kept."""
    configure(
        firestore_client,
        "policies",
        {
            "high_priority": OWNER,  # a string, not a list: no substring or character matches
            "reserved_capacity": ["bob@example.com"],
            "trust_topic_owners": "yes",
        },
    )
    configure(firestore_client, "groups", {"research": OWNER, "ops": ["bob@example.com", 7]})
    configure(
        firestore_client,
        "service_accounts",
        {OWNER: ACCOUNT, "bob@example.com": [OTHER_ACCOUNT]},
    )
    policies = FirestoreAccessPolicies(firestore_client).policies()
    assert policies == AccessPolicies(
        reserved_capacity=("bob@example.com",),
        groups={"research": (), "ops": ()},
        service_accounts={OWNER: (), "bob@example.com": (OTHER_ACCOUNT,)},
    )
    for fields in (
        {"priority": "very-high"},
        {"service_account": ACCOUNT},
        {"capacity": "reserved", "reservation": "research-v4"},
    ):
        spec = parse_spec(a_spec(**fields))
        for verified in (False, True):
            assert submission_refusal(spec, owner_verified=verified, admins=(), policies=policies)


@pytest.mark.parametrize("trust", [1, "true", [True], {"on": True}])
def test_only_the_boolean_true_trusts_topic_owners(firestore_client, trust):
    """Truthy values that are not `true` (a number, a string, a list, a map) leave trust off."""
    configure(firestore_client, "policies", {"trust_topic_owners": trust, "high_priority": [OWNER]})
    policies = FirestoreAccessPolicies(firestore_client).policies()
    assert policies.trust_topic_owners is False
    spec = parse_spec(a_spec(priority="high"))
    reason = submission_refusal(spec, owner_verified=False, admins=(), policies=policies)
    assert reason is not None and "verified owner" in reason


# -- through JobService ---------------------------------------------------------------------


def test_a_very_high_topic_submission_is_a_rejection_and_no_job(service, firestore_client, tpu_client, project_id):
    """By default the topic's owner is a claim: very-high is refused, recorded, and nothing is created."""
    configure(firestore_client, "policies", {"high_priority": [OWNER]})
    outcome = service.submission.submit(inbound("tpujobs-submit", a_spec(priority="very-high"), "301"))
    assert outcome.kind == "rejected" and outcome.job_id == "train-1"
    docs = rejections(firestore_client)
    assert len(docs) == 1
    assert docs[0]["reason"] == outcome.reason
    assert "priority 'very-high' needs a verified owner" in docs[0]["reason"]
    assert "trust_topic_owners" in docs[0]["reason"]
    assert docs[0]["topic"] == "tpujobs-submit" and docs[0]["message_id"] == "301"
    assert service.store.get("train-1") is None
    assert job_document(firestore_client, "train-1") is None
    assert queued_resources(tpu_client, project_id) == []


def test_a_trusted_topic_and_a_listed_owner_accept_very_high_unverified(service, firestore_client):
    """With trust_topic_owners and the owner listed, the job is made, marked as the topic's claim."""
    configure(firestore_client, "policies", {"trust_topic_owners": True, "high_priority": [OWNER]})
    outcome = service.submission.submit(inbound("tpujobs-submit", a_spec(priority="very-high")))
    assert outcome.kind in {"provisioning", "queued"}
    document = job_document(firestore_client, "train-1")
    assert document is not None
    assert document["submitted_via"] == "topic"
    assert document["owner_verified"] is False
    assert rejections(firestore_client) == []


def test_a_trusted_topic_still_refuses_an_unlisted_owner(service, firestore_client):
    """Trust makes the claim count; it lists nobody: an owner in no list is refused."""
    configure(
        firestore_client,
        "policies",
        {"trust_topic_owners": True, "high_priority": ["bob@example.com"]},
    )
    outcome = service.submission.submit(inbound("tpujobs-submit", a_spec(priority="high")))
    assert outcome.kind == "rejected"
    assert rejections(firestore_client)[0]["reason"] == (
        f"{OWNER} may not use priority 'high': an admin allows it in high_priority"
    )
    assert job_document(firestore_client, "train-1") is None


def test_submit_verified_records_the_api_and_a_verified_owner(service, firestore_client):
    """A spec from the jobs API becomes a job with submitted_via "api" and owner_verified true."""
    outcome = service.submission.submit_verified(parse_spec(a_spec()))
    assert outcome.kind in {"provisioning", "queued"}
    document = job_document(firestore_client, "train-1")
    assert document is not None
    assert document["submitted_via"] == "api"
    assert document["owner_verified"] is True
    assert service.store.get("train-1").owner_verified is True


def test_a_service_account_allowed_only_to_someone_else_is_refused(service, firestore_client):
    """Bob's account, asked for by Ada: refused on the API (a sentence) and on a trusted topic."""
    configure(firestore_client, "policies", {"trust_topic_owners": True})
    configure(
        firestore_client,
        "service_accounts",
        {"bob@example.com": [OTHER_ACCOUNT], OWNER: [ACCOUNT]},
    )
    spec = parse_spec(a_spec(service_account=OTHER_ACCOUNT))
    expected = f"{OWNER} may not use service account {OTHER_ACCOUNT}: an admin allows it in config/service_accounts"
    assert service.vetting.refusal(spec, owner_verified=True) == expected
    outcome = service.submission.submit(inbound("tpujobs-submit", a_spec(service_account=OTHER_ACCOUNT)))
    assert outcome.kind == "rejected"
    assert [doc["reason"] for doc in rejections(firestore_client)] == [expected]
    assert job_document(firestore_client, "train-1") is None


def test_an_allowed_service_account_keeps_the_job_under_its_own_prefix(
    service, firestore_client, tpu_client, project_id
):
    """Allowed through a group: accepted, log_uri under logs/accounts/{email}/jobs/{id}/, VMs run as it."""
    configure(firestore_client, "groups", {"research": ["bob@example.com", OWNER]})
    configure(firestore_client, "service_accounts", {"group:research": [ACCOUNT]})
    spec = parse_spec(a_spec(service_account=ACCOUNT))
    assert service.vetting.refusal(spec, owner_verified=True) is None
    outcome = service.submission.submit_verified(spec)
    assert outcome.kind in {"provisioning", "queued"}
    document = job_document(firestore_client, "train-1")
    assert document["log_uri"] == f"gs://{BUCKET}/logs/accounts/{ACCOUNT}/jobs/train-1/"
    assert document["submitted_via"] == "api" and document["owner_verified"] is True
    [resource] = queued_resources(tpu_client, project_id)
    assert resource.tpu.node_spec[0].node.service_account.email == ACCOUNT


def test_a_job_without_a_service_account_keeps_the_shared_prefix(service, firestore_client):
    """No service_account: the deployment's account, and the shared logs/jobs/{id}/ prefix."""
    service.submission.submit_verified(parse_spec(a_spec()))
    document = job_document(firestore_client, "train-1")
    assert document["log_uri"] == f"gs://{BUCKET}/logs/jobs/train-1/"


def test_a_topic_message_claiming_an_admin_owner_is_refused_while_the_topic_is_untrusted(
    firestore_client, tpu_client, project_id, simulator_url
):
    """Anyone may publish to tpujobs-submit: naming an admin as owner must not buy very-high."""
    admin = "root@example.com"
    settings = local_settings(
        project=project_id,
        default_zone=ZONE,
        tpu_endpoint=simulator_url,
        logs_bucket=BUCKET,
        admins=(admin,),
    )
    service = Engine(
        FirestoreJobStore(firestore_client),
        CloudTpu(tpu_client, project_id),
        settings,
        utc_now,
        access=FirestoreAccessPolicies(firestore_client),
    )
    outcome = service.submission.submit(inbound("tpujobs-submit", a_spec(owner=admin, priority="very-high")))
    assert outcome.kind == "rejected"
    assert job_document(firestore_client, "train-1") is None

"""Warm pools on tpujobs-control (`JobService.on_control`), on the Firestore emulator and the TPU
simulator: the message's `owner` is a claim, so creating needs config/policies to trust topic
owners; a refusal is a rejection with the reason; a redelivered message changes nothing.
"""

from __future__ import annotations

import pytest

from tpujobs.adapters.firestore_config import FirestoreAccessPolicies
from tpujobs.domain.warm_pools import PoolState
from tpujobs.service import JobService
from tpujobs.testing import inbound

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"
ADA = "ada@example.com"
EVE = "eve@example.com"
ADMIN = "root@example.com"
POOL = {"name": "demo", "accelerator_type": "v4-8", "count": 1}


@pytest.fixture
def service(job_service, firestore_client) -> JobService:
    return job_service(admins=(ADMIN,), access=FirestoreAccessPolicies(firestore_client))


def policies(firestore_client, **fields) -> None:
    firestore_client.collection("config").document("policies").set({"pools": [ADA], **fields})


def control(service: JobService, payload: dict, message_id: str | None = None):
    """Deliver one tpujobs-control message; the message and what on_control returned."""
    message = inbound("tpujobs-control", payload, message_id)
    return message, service.on_control(message)


def rejection(service: JobService, message) -> str | None:
    found = service.store.rejection(message.message_id)
    return None if found is None else found.reason


def queued_resources(service: JobService) -> set[str]:
    return {status.name for status in service.tpu.list_capacity(ZONE) if status.state != "DELETING"}


def test_an_unverified_owner_may_not_create_a_pool_on_the_topic(service, firestore_client):
    """Even an owner the policy allows (or an admin): the topic's owner is a claim, so the
    message is rejected saying to use the jobs API, and nothing is made."""
    policies(firestore_client)
    for owner in (ADA, ADMIN):
        message, _ = control(service, {"action": "pool-create", "owner": owner, "pool": POOL})
        assert "needs a verified caller" in rejection(service, message)
    assert service.warm.store.get("demo") is None and queued_resources(service) == set()


def test_with_trusted_topic_owners_an_allowed_owner_creates_and_a_redelivery_changes_nothing(service, firestore_client):
    """trust_topic_owners on: Ada's pool is made and its unit asked for; the same message
    delivered again makes no second pool and records no rejection."""
    policies(firestore_client, trust_topic_owners=True)
    message, _ = control(service, {"action": "pool-create", "owner": ADA, "pool": POOL}, "m-1")
    assert rejection(service, message) is None
    pool = service.warm.store.get("demo")
    assert pool.owner == ADA and pool.count == 1
    assert queued_resources(service) == {"demo-u0-g1"}
    again, outcome = control(service, {"action": "pool-create", "owner": ADA, "pool": POOL}, "m-1")
    assert rejection(service, again) is None and "already exists" in outcome.reason
    assert queued_resources(service) == {"demo-u0-g1"}


def test_a_taken_name_claimed_by_someone_else_is_rejected(service, firestore_client):
    """Eve (allowed too) asking for Ada's pool name: rejected, Ada's pool untouched."""
    policies(firestore_client, trust_topic_owners=True, pools=[ADA, EVE])
    control(service, {"action": "pool-create", "owner": ADA, "pool": POOL})
    message, _ = control(service, {"action": "pool-create", "owner": EVE, "pool": {**POOL, "count": 3}})
    assert "already exists" in rejection(service, message)
    assert service.warm.store.get("demo").owner == ADA and service.warm.store.get("demo").count == 1


def test_an_owner_the_policy_does_not_allow_is_rejected_even_when_trusted(service, firestore_client):
    policies(firestore_client, trust_topic_owners=True)
    message, _ = control(service, {"action": "pool-create", "owner": EVE, "pool": POOL})
    assert "may not create pools" in rejection(service, message)
    assert service.warm.store.get("demo") is None


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ({"action": "pool-create", "owner": ADA}, "field 'pool': Field required"),
        ({"action": "pool-create", "owner": ADA, "pool": {**POOL, "owner": EVE}}, "the message's owner owns"),
        ({"action": "pool-create", "owner": ADA, "pool": POOL, "count": 2}, "field 'count': Extra inputs"),
        ({"action": "pool-create", "owner": ADA, "pool": {**POOL, "colour": "red"}}, "unknown pool field 'colour'"),
        ({"action": "pool-create", "owner": ADA, "pool": {**POOL, "slices": 0}}, "slices"),
        ({"action": "pool-resize", "owner": ADA, "name": "demo"}, "field 'count': Field required"),
        ({"action": "pool-resize", "owner": ADA, "name": "demo", "count": "2"}, "field 'count'"),
        ({"action": "pool-resize", "owner": ADA, "name": "demo", "count": 65}, "field 'count'"),
        ({"action": "pool-delete", "owner": ADA, "name": "Demo!"}, "field 'name'"),
        ({"action": "pool-delete", "name": "demo"}, "field 'owner': Field required"),
        ({"action": "pool-rename", "owner": ADA, "name": "demo"}, "field 'action'"),
    ],
)
def test_a_malformed_pool_message_is_rejected_naming_the_field(service, firestore_client, payload, words):
    """Unknown fields are refused too: a misspelt field must not be silently ignored."""
    policies(firestore_client, trust_topic_owners=True)
    message, outcome = control(service, payload)
    assert outcome is None
    assert words in rejection(service, message)
    assert service.warm.store.list_pools() == []


def test_resize_and_delete_by_the_owner_or_an_admin_only(service, firestore_client):
    """Eve's resize and delete are rejected; Ada's resize asks for a second unit; an admin's
    delete releases the capacity and removes the pool; a redelivered delete is no rejection."""
    policies(firestore_client, trust_topic_owners=True)
    control(service, {"action": "pool-create", "owner": ADA, "pool": POOL})
    message, _ = control(service, {"action": "pool-resize", "owner": EVE, "name": "demo", "count": 2})
    assert "may not resize pool demo" in rejection(service, message)
    message, _ = control(service, {"action": "pool-delete", "owner": EVE, "name": "demo"})
    assert "may not delete pool demo" in rejection(service, message)
    assert service.warm.store.get("demo").state is PoolState.ACTIVE
    message, _ = control(service, {"action": "pool-resize", "owner": ADA, "name": "demo", "count": 2})
    assert rejection(service, message) is None
    assert service.warm.store.get("demo").count == 2
    assert queued_resources(service) == {"demo-u0-g1", "demo-u1-g1"}
    message, _ = control(service, {"action": "pool-delete", "owner": ADMIN, "name": "demo"}, "d-1")
    assert rejection(service, message) is None
    assert service.warm.store.get("demo") is None and queued_resources(service) == set()
    again, _ = control(service, {"action": "pool-delete", "owner": ADMIN, "name": "demo"}, "d-1")
    assert rejection(service, again) is None


def test_resizing_a_missing_pool_is_rejected(service):
    message, _ = control(service, {"action": "pool-resize", "owner": ADA, "name": "nothing", "count": 2})
    assert "no pool named nothing" in rejection(service, message)


def test_job_actions_still_go_to_the_job_rules(service):
    """A cancel of a missing job is rejected as before: the pool models take only pool actions."""
    message, _ = control(service, {"action": "cancel", "owner": ADA, "job_id": "no-such-job"})
    assert "no such job" in rejection(service, message)

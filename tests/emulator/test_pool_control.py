"""Warm pools on tpujobs-control (`JobService.on_control`), on the Firestore emulator and the TPU
simulator: the message's `owner` is a claim, so creating needs config/policies to trust topic
owners; a refusal is a rejection with the reason; a redelivered message changes nothing.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator

import pytest
from google.api_core.exceptions import DeadlineExceeded
from typer.testing import CliRunner

from tpujobs.adapters.firestore_config import FirestoreAccessPolicies
from tpujobs.cli import app
from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.pools import PoolState
from tpujobs.engine import topology
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.services import Engine
from tpujobs.local import wiring
from tpujobs.local.testing import inbound

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"
ADA = "ada@example.com"
EVE = "eve@example.com"
ADMIN = "root@example.com"
POOL = {"name": "demo", "accelerator_type": "v4-8", "count": 1}


@pytest.fixture
def service(job_service, firestore_client) -> Engine:
    return job_service(admins=(ADMIN,), access=FirestoreAccessPolicies(firestore_client))


def policies(firestore_client, **fields) -> None:
    firestore_client.collection("config").document("policies").set({"pools": [ADA], **fields})


def control(service: Engine, payload: dict, message_id: str | None = None):
    """Deliver one tpujobs-control message; the message and what on_control returned."""
    message = inbound("tpujobs-control", payload, message_id)
    return message, service.controls.on_control(message)


def rejection(service: Engine, message) -> str | None:
    found = service.store.rejection(message.message_id)
    return None if found is None else found.reason


def queued_resources(service: Engine) -> set[str]:
    return {
        status.name for status in service.capacity.list_capacity(ZONE) if status.state is not HoldingState.RELEASING
    }


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


# --- `tpujobs pool` without an API: published to tpujobs-control, followed in Firestore ---------


@pytest.fixture
def relay(emulators, project_id, service) -> Iterator[None]:
    """tpujobs-control on the Pub/Sub emulator, each message handed to `service.on_control` as
    the deployed function is: what the CLI publishes takes effect while it follows it."""
    host = emulators["PUBSUB_EMULATOR_HOST"]
    publisher, subscriber = wiring.publisher_client(host), wiring.subscriber_client(host)
    topic = publisher.create_topic(name=publisher.topic_path(project_id, topology.topic_name(topology.CONTROL, "")))
    subscription = subscriber.subscription_path(project_id, "control-relay")
    subscriber.create_subscription(name=subscription, topic=topic.name, ack_deadline_seconds=10)
    stop = threading.Event()

    def deliver() -> None:
        while not stop.is_set():
            try:
                answer = subscriber.pull(subscription=subscription, max_messages=10, timeout=1.0)
            except DeadlineExceeded:
                continue
            for received in answer.received_messages:
                message = received.message
                service.controls.on_control(InboundMessage(message.message_id, topic.name, message.data))
                subscriber.acknowledge(subscription=subscription, ack_ids=[received.ack_id])

    thread = threading.Thread(target=deliver, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
        publisher.transport.close()
        subscriber.transport.close()


def tpujobs(monkeypatch, tmp_path, project_id, *args: str):
    """The CLI with no jobs API: writes go to tpujobs-control, reads to Firestore."""
    monkeypatch.setenv("TPUJOBS_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", project_id)
    monkeypatch.delenv("TPUJOBS_API_URL", raising=False)
    monkeypatch.delenv("TPUJOBS_PREFIX", raising=False)
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "160"})


def test_the_cli_creates_resizes_and_deletes_a_pool_through_the_topic(
    service, firestore_client, relay, monkeypatch, tmp_path, project_id
):
    """With trusted topic owners, each verb is published, acted on, and its outcome printed."""
    policies(firestore_client, trust_topic_owners=True)
    run = functools.partial(tpujobs, monkeypatch, tmp_path, project_id)
    created = run("pool", "create", "demo", "--accelerator", "v4-8", "--owner", ADA, "--user", EVE)
    assert created.exit_code == 0, created.output
    assert "Created pool demo: 1 x 1 x v4-8" in created.output
    assert service.warm.store.get("demo").users == (EVE,)
    listed = run("pool", "list")
    assert listed.exit_code == 0 and "demo" in listed.output and "1 x 1 x v4-8" in listed.output
    resized = run("pool", "resize", "demo", "--count", "2", "--owner", ADA)
    assert resized.exit_code == 0, resized.output
    assert service.warm.store.get("demo").count == 2
    described = run("pool", "describe", "demo")
    assert described.exit_code == 0 and "demo-u1-g1" in described.output
    deleted = run("pool", "delete", "demo", "--owner", ADA)
    assert deleted.exit_code == 0, deleted.output
    assert service.warm.store.get("demo") is None and queued_resources(service) == set()


def test_the_cli_says_why_the_topic_refused(service, firestore_client, relay, monkeypatch, tmp_path, project_id):
    """Without trusted topic owners: exit 1 with the rejection's reason; a resize by someone
    else likewise; a missing pool is said at once, before anything is published."""
    policies(firestore_client)
    run = functools.partial(tpujobs, monkeypatch, tmp_path, project_id)
    refused = run("pool", "create", "demo", "--accelerator", "v4-8", "--owner", ADA)
    assert refused.exit_code == 1 and "Refused: creating a pool needs a verified caller" in refused.output
    policies(firestore_client, trust_topic_owners=True)
    assert run("pool", "create", "demo", "--accelerator", "v4-8", "--owner", ADA).exit_code == 0
    refused = run("pool", "resize", "demo", "--count", "3", "--owner", EVE)
    assert refused.exit_code == 1 and "may not resize pool demo" in refused.output
    assert service.warm.store.get("demo").count == 1
    missing = run("pool", "delete", "nothing", "--owner", ADA)
    assert missing.exit_code == 1 and "No pool 'nothing'" in missing.output
    taken = run("pool", "create", "demo", "--accelerator", "v4-8", "--owner", ADA)
    assert taken.exit_code == 1 and "already exists" in taken.output

"""TPU audit-log entries from the log sink: which queued resource they name, or None."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpujobs.engine.inbound import from_cloud_event
from tpujobs.engine.qr_state_reports import AuditTarget, activity_log, audit_log_target

NAME = "projects/p/locations/us-central2-b/queuedResources/train-1-a2"
TARGET = AuditTarget("us-central2-b", "train-1-a2", "p", "")  # the entries below name no log
# What the golden entries (tests/data) name: their project's admin-activity audit log.
GOLDEN_TARGET = AuditTarget("us-central2-b", "train-1-a2", "my-project", activity_log("my-project"))


def entry(**payload) -> bytes:
    return json.dumps({"protoPayload": {"serviceName": "tpu.googleapis.com", **payload}}).encode()


def test_the_resource_name_the_response_or_the_create_request_names_the_queued_resource() -> None:
    assert audit_log_target(entry(resourceName=NAME)) == TARGET
    assert audit_log_target(entry(resourceName="projects/p", response={"name": NAME})) == TARGET
    request = {"parent": "projects/p/locations/us-central2-b", "queuedResourceId": "train-1-a2"}
    assert audit_log_target(entry(request=request)) == TARGET


def test_other_services_resources_and_our_own_reports_are_not_audit_entries() -> None:
    assert (
        audit_log_target(
            json.dumps({"protoPayload": {"serviceName": "compute.googleapis.com", "resourceName": NAME}}).encode()
        )
        is None
    )
    assert audit_log_target(entry(resourceName="projects/p/locations/us-central2-b/nodes/n")) is None
    assert audit_log_target(entry(resourceName=NAME + "/../evil")) is None
    own = {"queued_resource": "train-1-a2", "zone": "us-central2-b", "state": "ACTIVE"}
    assert audit_log_target(json.dumps(own).encode()) is None
    assert audit_log_target(None) is None
    assert audit_log_target(b"\xff\xfe") is None


@given(
    st.binary(max_size=512)
    | st.recursive(st.none() | st.text(), lambda c: st.dictionaries(st.text(), c)).map(
        lambda v: json.dumps({"protoPayload": v}).encode()
    )
)
def test_any_bytes_give_a_target_or_none_never_an_error(raw: bytes) -> None:
    target = audit_log_target(raw)
    assert target is None or isinstance(target, AuditTarget)


# --- the entries as the log sink delivers them (tests/data, shapes from Google's docs) ----------

DATA = Path(__file__).resolve().parents[2] / "data"
GOLDEN = ["tpu_audit_create_queued_resource_v2.json", "tpu_audit_delete_queued_resource_v2alpha1.json"]
QR_STATE_SUBSCRIPTION = "projects/my-project/subscriptions/tpujobs-qr-state--on_qr_state"


def golden(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def sink_delivery(entry: dict) -> dict:
    """The push envelope on_qr_state gets: the sink publishes the LogEntry as JSON, with the
    entry's time as the attribute logging.googleapis.com/timestamp."""
    return {
        "message": {
            "data": base64.b64encode(json.dumps(entry).encode()).decode(),
            "attributes": {"logging.googleapis.com/timestamp": entry["timestamp"]},
            "messageId": "15286937428734211",
            "publishTime": entry["receiveTimestamp"],
        },
        "subscription": QR_STATE_SUBSCRIPTION,
    }


@pytest.mark.parametrize("name", GOLDEN)
def test_a_tpu_audit_entry_names_its_queued_resource_and_zone(name: str) -> None:
    """v2 create and v2alpha1 delete, each the closing entry of its operation: the target is read."""
    entry = golden(name)
    assert entry["protoPayload"]["methodName"].endswith("QueuedResource")
    assert entry["operation"]["last"] is True  # what the sink (infra/logging.tf) lets through
    assert audit_log_target(json.dumps(entry).encode()) == GOLDEN_TARGET


@pytest.mark.parametrize("name", GOLDEN)
def test_a_tpu_audit_entry_pushed_by_the_sink_decodes_on_its_topic(name: str) -> None:
    """Through the production push path: the bare-URL envelope gives the topic from its
    subscription, the bytes are the entry, and the entry names the queued resource."""
    message = from_cloud_event(
        "15286937428734211", "//pubsub.googleapis.com/", sink_delivery(golden(name)), target="on_qr_state"
    )
    assert (message.topic, message.undecodable) == ("tpujobs-qr-state", "")
    assert audit_log_target(message.data) == GOLDEN_TARGET


def test_only_the_resource_name_of_a_real_entry_is_needed() -> None:
    """The closing entry of a delete has no response and no request: resourceName is enough."""
    entry = golden("tpu_audit_delete_queued_resource_v2alpha1.json")
    assert "response" not in entry["protoPayload"] and "request" not in entry["protoPayload"]
    assert audit_log_target(json.dumps(entry).encode()) == GOLDEN_TARGET


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda p: p.update(serviceName="compute.googleapis.com"), "another service"),
        (
            lambda p: p.update(
                resourceName="projects/my-project/locations/us-central2-b/nodes/train-1-a2", response={}
            ),
            "a node",
        ),
        (
            lambda p: p.update(
                resourceName="projects/my-project/locations/us-central2-b/queuedResources/Train_1", response={}
            ),
            "not a queued resource id",
        ),
    ],
    ids=["other_service", "node", "bad_id"],
)
def test_a_real_entry_about_something_else_is_not_a_target(change, why: str) -> None:
    """The same entry, edited to concern something tpujobs does not own, gives None."""
    entry = golden("tpu_audit_create_queued_resource_v2.json")
    change(entry["protoPayload"])
    assert audit_log_target(json.dumps(entry).encode()) is None, why

"""TPU audit-log entries from the log sink: which queued resource they name, or None."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from tpujobs.reports import audit_log_target

NAME = "projects/p/locations/us-central2-b/queuedResources/train-1-a2"


def entry(**payload) -> bytes:
    return json.dumps({"protoPayload": {"serviceName": "tpu.googleapis.com", **payload}}).encode()


def test_the_resource_name_the_response_or_the_create_request_names_the_queued_resource() -> None:
    assert audit_log_target(entry(resourceName=NAME)) == ("us-central2-b", "train-1-a2")
    assert audit_log_target(entry(resourceName="projects/p", response={"name": NAME})) == (
        "us-central2-b",
        "train-1-a2",
    )
    request = {"parent": "projects/p/locations/us-central2-b", "queuedResourceId": "train-1-a2"}
    assert audit_log_target(entry(request=request)) == ("us-central2-b", "train-1-a2")


def test_other_services_resources_and_our_own_reports_are_not_audit_entries() -> None:
    assert audit_log_target(json.dumps({"protoPayload": {"serviceName": "compute.googleapis.com",
                                                         "resourceName": NAME}}).encode()) is None
    assert audit_log_target(entry(resourceName="projects/p/locations/us-central2-b/nodes/n")) is None
    assert audit_log_target(entry(resourceName=NAME + "/../evil")) is None
    own = {"queued_resource": "train-1-a2", "zone": "us-central2-b", "state": "ACTIVE"}
    assert audit_log_target(json.dumps(own).encode()) is None
    assert audit_log_target(None) is None
    assert audit_log_target(b"\xff\xfe") is None


@given(st.binary(max_size=512) | st.recursive(st.none() | st.text(), lambda c: st.dictionaries(st.text(), c)).map(
    lambda v: json.dumps({"protoPayload": v}).encode()
))
def test_any_bytes_give_a_target_or_none_never_an_error(raw: bytes) -> None:
    target = audit_log_target(raw)
    assert target is None or (isinstance(target, tuple) and len(target) == 2)

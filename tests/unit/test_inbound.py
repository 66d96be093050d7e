"""Pub/Sub messages as they reach a function: Eventarc CloudEvents and local push envelopes.

The golden payloads in tests/data/ are the shapes Google delivers. The push envelope is
also run through functions-framework's own conversion, in-process, so the test sees
exactly what our decoder gets in the local stack.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tpujobs.domain.spec import decode_spec
from tpujobs.inbound import InboundMessage, from_cloud_event

DATA = Path(__file__).resolve().parent.parent / "data"
SUBMIT_SOURCE = "//pubsub.googleapis.com/projects/p/topics/tpujobs-submit"

PUSH_SPEC = {
    "name": "resnet-50",
    "owner": "alice@example.com",
    "accelerator_type": "v5litepod-16",
    "zone": "us-west4-a",
    "capacity": "spot",
    "command": "python train.py --epochs 3",
    "env": {"EPOCHS": "3"},
    "labels": {"team": "vision"},
}
EVENTARC_SPEC = {
    "job_id": "bert-run-2",
    "name": "bert",
    "owner": "bob",
    "accelerator_type": "v6e-8",
    "command": "python pretrain.py",
    "on_preemption": "resume",
}


def golden(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


@pytest.fixture
def push_envelope() -> dict[str, Any]:
    return golden("pubsub_push_envelope.json")


@pytest.fixture
def eventarc_event() -> dict[str, Any]:
    return golden("eventarc_pubsub_cloudevent.json")


def b64(text: bytes) -> str:
    return base64.b64encode(text).decode()


# --- the golden payloads, decoded directly --------------------------------------------


def test_an_eventarc_cloudevent_decodes_to_its_topic_message_id_and_bytes(
    eventarc_event: dict[str, Any],
) -> None:
    """The topic comes from the event's source, the id from messageId, the bytes from base64."""
    message = from_cloud_event(
        eventarc_event["id"], eventarc_event["source"], eventarc_event["data"]
    )
    assert message.topic == "tpujobs-submit"
    assert message.message_id == "13792457813425622"
    assert message.data is not None and json.loads(message.data) == EVENTARC_SPEC
    assert message.attributes == {"submitted-by": "tpujobs-cli"}
    assert message.undecodable == ""


def test_an_eventarc_cloudevent_carries_a_spec_that_decodes() -> None:
    """The golden Eventarc message is a valid job spec with its own job_id."""
    event = golden("eventarc_pubsub_cloudevent.json")
    message = from_cloud_event(event["id"], event["source"], event["data"])
    assert message.data is not None
    spec = decode_spec(message.data, message_id=message.message_id)
    assert spec.job_id == "bert-run-2"
    assert spec.accelerator_type == "v6e-8"


def test_a_push_envelope_decodes_to_its_message_id_and_bytes(push_envelope: dict[str, Any]) -> None:
    """A push envelope given as event data decodes like Eventarc's: same message, same bytes."""
    message = from_cloud_event("event-1", SUBMIT_SOURCE, push_envelope)
    assert message.topic == "tpujobs-submit"
    assert message.message_id == "13792457813425621"
    assert message.data is not None and json.loads(message.data) == PUSH_SPEC
    assert message.attributes == {"submitted-by": "tpujobs-cli"}


def test_a_push_envelope_carries_a_spec_that_decodes_with_a_derived_job_id(
    push_envelope: dict[str, Any],
) -> None:
    """The golden push message has no job_id; it is derived from the message id."""
    message = from_cloud_event("event-1", SUBMIT_SOURCE, push_envelope)
    assert message.data is not None
    spec = decode_spec(message.data, message_id=message.message_id)
    assert spec.job_id is not None and spec.job_id.startswith("resnet-50-")
    assert spec.job_id == decode_spec(message.data, message_id="13792457813425621").job_id


# --- message ids and topics -----------------------------------------------------------


def test_the_snake_case_message_id_is_used_when_messageid_is_absent() -> None:
    """Some deliveries carry only `message_id`."""
    data = {"message": {"data": b64(b"{}"), "message_id": "snake-1"}}
    assert from_cloud_event("event-1", SUBMIT_SOURCE, data).message_id == "snake-1"


def test_the_event_id_is_the_message_id_when_the_message_has_none() -> None:
    """Without messageId or message_id, the CloudEvent id identifies the message."""
    data = {"message": {"data": b64(b"{}")}}
    assert from_cloud_event("event-1", SUBMIT_SOURCE, data).message_id == "event-1"


@pytest.mark.parametrize(
    ("source", "topic"),
    [
        (SUBMIT_SOURCE, "tpujobs-submit"),
        ("//pubsub.googleapis.com/projects/p/topics/dev-tpujobs-control", "dev-tpujobs-control"),
        ("//pubsub.googleapis.com/", ""),
        ("", ""),
    ],
)
def test_the_topic_is_the_last_segment_of_the_source(source: str, topic: str) -> None:
    """A source without topics/NAME gives an empty topic, not an error."""
    data = {"message": {"data": b64(b"{}"), "messageId": "m"}}
    assert from_cloud_event("event-1", source, data).topic == topic


# --- what cannot be decoded -----------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"subscription": "projects/p/subscriptions/s"},
        {"message": "text"},
        {"message": None},
        None,
        "a string",
        ["message"],
        42,
    ],
    ids=[
        "empty",
        "subscription_only",
        "message_is_text",
        "message_is_null",
        "none",
        "string",
        "list",
        "number",
    ],
)
def test_an_event_without_a_message_is_undecodable_not_an_exception(data: Any) -> None:
    """No Pub/Sub message: data None, the reason said, the event id kept."""
    message = from_cloud_event("event-1", SUBMIT_SOURCE, data)
    assert message.data is None
    assert "no Pub/Sub message" in message.undecodable
    assert message.message_id == "event-1"
    assert message.topic == "tpujobs-submit"


@pytest.mark.parametrize(
    "encoded",
    ["not base64!", "abc", "eyJ9\n", "e30=e30=", "ëyJ9"],
    ids=["punctuation", "bad_padding", "newline", "padding_inside", "non_ascii"],
)
def test_message_data_that_is_not_valid_base64_is_undecodable(encoded: str) -> None:
    """Bad base64 is reported with the message id and attributes, not raised."""
    data = {"message": {"data": encoded, "messageId": "m-1", "attributes": {"a": "b"}}}
    message = from_cloud_event("event-1", SUBMIT_SOURCE, data)
    assert message.data is None
    assert "not valid base64" in message.undecodable
    assert message.message_id == "m-1"
    assert message.attributes == {"a": "b"}


@pytest.mark.parametrize("encoded", [123, None, {"a": 1}, ["e30="], b"e30="])
def test_message_data_that_is_not_a_string_is_undecodable(encoded: Any) -> None:
    """Data must be base64 text; a number, null, object, list or bytes is reported."""
    data = {"message": {"data": encoded, "messageId": "m-1"}}
    message = from_cloud_event("event-1", SUBMIT_SOURCE, data)
    assert message.data is None
    assert "not base64 text" in message.undecodable
    assert message.message_id == "m-1"


def test_a_message_without_data_decodes_to_empty_bytes() -> None:
    """A Pub/Sub message may carry only attributes; its data is then empty."""
    data = {"message": {"messageId": "m-1", "attributes": {"a": "b"}}}
    message = from_cloud_event("event-1", SUBMIT_SOURCE, data)
    assert message.data == b""
    assert message.undecodable == ""


@pytest.mark.parametrize("attributes", [None, "a=b", ["a", "b"]])
def test_attributes_that_are_not_a_map_become_empty(attributes: Any) -> None:
    """Odd attributes never stop the message from being read."""
    data = {"message": {"data": b64(b"{}"), "messageId": "m-1", "attributes": attributes}}
    message = from_cloud_event("event-1", SUBMIT_SOURCE, data)
    assert message.attributes == {}
    assert message.data == b"{}"


# --- payload text for rejections ------------------------------------------------------


def test_payload_text_escapes_bytes_that_are_not_utf8() -> None:
    """A rejection record shows bad bytes as escapes instead of failing."""
    message = InboundMessage("m", "t", b"ok \xff\xfe done")
    assert message.payload_text() == "ok \\xff\\xfe done"


def test_payload_text_is_cut_at_the_limit() -> None:
    """At most `limit` characters (4 KiB by default) are kept."""
    message = InboundMessage("m", "t", "é".encode() * 5000)
    assert message.payload_text() == "é" * 4096
    assert message.payload_text(limit=10) == "é" * 10


def test_payload_text_of_an_undecodable_message_is_empty() -> None:
    """Nothing was decoded, so there is nothing to show."""
    assert InboundMessage("m", "t", None, undecodable="why").payload_text() == ""


# --- through functions-framework ------------------------------------------------------

PROBE_MODULE = "tpujobs_inbound_probe"
PROBE_SOURCE = '''
"""A cloud_event function that records what tpujobs.inbound decodes from each event."""
from tpujobs.inbound import from_cloud_event

RECEIVED = []


def record_submission(event):
    RECEIVED.append(from_cloud_event(event["id"], event["source"], event.data))
'''


@pytest.fixture
def framework(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, list[Any]]]:
    """A functions-framework test client for a probe function, and the list it records into."""
    from functions_framework import create_app

    source = tmp_path / f"{PROBE_MODULE}.py"
    source.write_text(PROBE_SOURCE)
    # create_app writes these variables and appends to sys.path; undo both afterwards.
    for variable in ("FUNCTION_TARGET", "FUNCTION_SIGNATURE_TYPE"):
        monkeypatch.setitem(os.environ, variable, "")
    monkeypatch.setattr(sys, "path", list(sys.path))
    app = create_app(target="record_submission", source=str(source), signature_type="cloudevent")
    try:
        yield app.test_client(), sys.modules[PROBE_MODULE].RECEIVED
    finally:
        sys.modules.pop(PROBE_MODULE, None)


def test_a_push_envelope_through_functions_framework_decodes_with_the_topic_from_the_path(
    framework: tuple[Any, list[Any]], push_envelope: dict[str, Any]
) -> None:
    """functions-framework turns the push envelope into a CloudEvent; the topic comes from the URL."""
    client, received = framework
    response = client.post("/projects/p/topics/tpujobs-submit", json=push_envelope)
    assert response.status_code == 200, response.get_data(as_text=True)
    (message,) = received
    assert message.topic == "tpujobs-submit"
    assert message.message_id == "13792457813425621"
    assert message.data is not None and json.loads(message.data) == PUSH_SPEC
    assert message.attributes == {"submitted-by": "tpujobs-cli"}
    assert message.undecodable == ""


def test_a_push_envelope_to_a_path_without_a_topic_decodes_with_an_empty_topic(
    framework: tuple[Any, list[Any]], push_envelope: dict[str, Any]
) -> None:
    """A push subscription that does not name the topic in its URL still delivers the bytes."""
    client, received = framework
    response = client.post("/", json=push_envelope)
    assert response.status_code == 200, response.get_data(as_text=True)
    (message,) = received
    assert message.topic == ""
    assert message.message_id == "13792457813425621"
    assert message.data is not None and json.loads(message.data) == PUSH_SPEC


def test_a_structured_eventarc_cloudevent_through_functions_framework_decodes(
    framework: tuple[Any, list[Any]], eventarc_event: dict[str, Any]
) -> None:
    """A CloudEvent in structured mode reaches the decoder with its source and data intact."""
    client, received = framework
    response = client.post(
        "/",
        data=json.dumps(eventarc_event),
        headers={"Content-Type": "application/cloudevents+json"},
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    (message,) = received
    assert (message.topic, message.message_id) == ("tpujobs-submit", "13792457813425622")
    assert message.data is not None and json.loads(message.data) == EVENTARC_SPEC


def test_a_binary_eventarc_cloudevent_through_functions_framework_decodes(
    framework: tuple[Any, list[Any]], eventarc_event: dict[str, Any]
) -> None:
    """Eventarc's binary mode (ce-* headers, data as the body) decodes the same way."""
    client, received = framework
    headers = {
        "ce-specversion": eventarc_event["specversion"],
        "ce-id": eventarc_event["id"],
        "ce-source": eventarc_event["source"],
        "ce-type": eventarc_event["type"],
        "ce-time": eventarc_event["time"],
        "Content-Type": "application/json",
    }
    response = client.post("/", data=json.dumps(eventarc_event["data"]), headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    (message,) = received
    assert (message.topic, message.message_id) == ("tpujobs-submit", "13792457813425622")
    assert message.data is not None and json.loads(message.data) == EVENTARC_SPEC

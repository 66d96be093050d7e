"""Pub/Sub messages as they reach a function: push envelopes and Eventarc CloudEvents.

The golden payloads in tests/data/ follow the formats Google documents (tests/data/README.md).
A push envelope is also run through functions-framework's own conversion, in-process, to
the bare URL production and the local stack push to, so the test sees exactly what our
decoder gets: a CloudEvent without a topic, the subscription only in the request body.
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
from tpujobs.engine import topology
from tpujobs.engine.inbound import InboundMessage, from_cloud_event, subscription_of

DATA = Path(__file__).resolve().parents[2] / "data"
SUBMIT_SOURCE = "//pubsub.googleapis.com/projects/p/topics/tpujobs-submit"
BARE_SOURCE = "//pubsub.googleapis.com/"  # what functions-framework makes of a push to "/"
ROUTES = {route.target: route for route in topology.FUNCTIONS}


def subscription(target: str, prefix: str = "", project: str = "p") -> str:
    """The full name of a route's push subscription in a deployment with `prefix`."""
    return f"projects/{project}/subscriptions/{topology.push_subscription_name(ROUTES[target], prefix)}"


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
    message = from_cloud_event(eventarc_event["id"], eventarc_event["source"], eventarc_event["data"])
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
    """A push envelope given as event data decodes like Eventarc's: same message, same bytes,
    the topic read from its subscription's name."""
    message = from_cloud_event("event-1", BARE_SOURCE, push_envelope)
    assert message.topic == "tpujobs-submit"
    assert message.message_id == "13792457813425621"
    assert message.data is not None and json.loads(message.data) == PUSH_SPEC
    assert message.attributes == {"submitted-by": "tpujobs-cli"}


def test_a_push_envelope_carries_a_spec_that_decodes_with_a_derived_job_id(
    push_envelope: dict[str, Any],
) -> None:
    """The golden push message has no job_id; it is derived from the message id."""
    message = from_cloud_event("event-1", BARE_SOURCE, push_envelope)
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
    ],
)
def test_an_eventarc_source_names_the_topic(source: str, topic: str) -> None:
    """Eventarc's source ends in topics/NAME: that is the topic, whatever its subscription."""
    data = {"message": {"data": b64(b"{}"), "messageId": "m"}, "subscription": "projects/p/subscriptions/x"}
    message = from_cloud_event("event-1", source, data)
    assert (message.topic, message.data, message.undecodable) == (topic, b"{}", "")


@pytest.mark.parametrize(
    ("prefix", "target", "topic"),
    [
        ("", "submit_job", "tpujobs-submit"),
        ("", "on_control", "tpujobs-control"),
        ("", "record_dead_letter", "tpujobs-dead-letter"),
        ("t1-", "on_control", "t1-tpujobs-control"),
        ("team-a-", "on_worker_event", "team-a-tpujobs-worker-events"),
    ],
)
def test_a_bare_push_takes_its_topic_from_the_subscription_name(prefix: str, target: str, topic: str) -> None:
    """Production's push names no topic: `{prefix}{topic}--{target}` gives it back, prefixed
    as the deployment names its topics, from the envelope or from the request body."""
    message = {"data": b64(b"{}"), "messageId": "m"}
    in_data = from_cloud_event(
        "e", BARE_SOURCE, {"message": message, "subscription": subscription(target, prefix)}, prefix=prefix
    )
    from_body = from_cloud_event(
        "e",
        BARE_SOURCE,
        {"message": message},
        push_subscription=subscription(target, prefix),
        prefix=prefix,
        target=target,
    )
    for decoded in (in_data, from_body):
        assert (decoded.topic, decoded.data, decoded.undecodable) == (topic, b"{}", "")


@pytest.mark.parametrize(
    ("name", "prefix"),
    [
        ("projects/p/subscriptions/s", ""),
        ("projects/p/subscriptions/tpujobs-submit--submit_job", "t1-"),  # another deployment's
        ("projects/p/subscriptions/t1-tpujobs-submit--submit_job", ""),  # a prefixed one, unprefixed here
        ("projects/p/subscriptions/tpujobs-submit--unwrapped_1234", ""),  # named like ours, not ours
        ("projects/p/subscriptions/tpujobs-status--submit_job", ""),  # no function reads the status topic
        ("tpujobs-submit--submit_job/extra", ""),
        ("", ""),
        ("x" * 5000, ""),
    ],
)
def test_an_unknown_subscription_is_refused_with_its_name_and_the_payload_kept(name: str, prefix: str) -> None:
    """A push from a subscription this deployment did not make says so: no topic, data None,
    the reason quoting the subscription (cut short), the bytes kept for the rejection."""
    data = {"message": {"data": b64(b'{"name": "x"}'), "messageId": "m-7"}, "subscription": name}
    message = from_cloud_event("e", BARE_SOURCE, data, prefix=prefix, target="submit_job")
    assert message.data is None
    assert message.topic == ""
    assert message.message_id == "m-7"
    assert "push subscription" in message.undecodable and f"{prefix}TOPIC--FUNCTION" in message.undecodable
    assert (name[:200] if name else "none") in message.undecodable and len(message.undecodable) < 400
    assert message.payload_text() == '{"name": "x"}'


def test_no_topic_and_no_subscription_is_refused() -> None:
    """An event that names neither (a hand-made request to the bare URL) cannot be placed."""
    message = from_cloud_event("e", "", {"message": {"data": b64(b"{}"), "messageId": "m"}})
    assert message.data is None and message.topic == ""
    assert "names no topic" in message.undecodable


@pytest.mark.parametrize(
    ("source", "data", "topic"),
    [
        (
            BARE_SOURCE,
            {"message": {"data": "e30=", "messageId": "m"}, "subscription": subscription("on_control")},
            "tpujobs-control",
        ),
        (
            "//pubsub.googleapis.com/projects/p/topics/tpujobs-control",
            {"message": {"data": "e30=", "messageId": "m"}},
            "tpujobs-control",
        ),
        (
            "//pubsub.googleapis.com/projects/p/topics/tpujobs-submit",
            {"message": {"data": "e30=", "messageId": "m"}},
            "tpujobs-submit",
        ),
    ],
    ids=["our_subscription", "eventarc_source", "unprefixed_topic_in_a_prefixed_deployment"],
)
def test_a_message_for_another_function_is_refused_with_both_topics(source: str, data: Any, topic: str) -> None:
    """on_worker_event reads only worker events: a control message (or any other topic) that
    reached it is a rejection naming the topic it came on and the one the function reads."""
    message = from_cloud_event("e", source, data, prefix="", target="on_worker_event")
    assert message.data is None and message.refused_data == b"{}"
    assert message.topic == topic
    assert (
        f"a message on {topic} reached on_worker_event, which reads only tpujobs-worker-events" == message.undecodable
    )


def test_an_undecodable_message_keeps_its_own_reason_and_the_topic() -> None:
    """Bad base64 from our own subscription is reported as bad base64, on its topic."""
    data = {"message": {"data": "not base64!", "messageId": "m"}, "subscription": subscription("on_preemption", "t1-")}
    message = from_cloud_event("e", BARE_SOURCE, data, prefix="t1-", target="on_preemption")
    assert (message.topic, message.data) == ("t1-tpujobs-preemption", None)
    assert "not valid base64" in message.undecodable


@pytest.mark.parametrize(
    ("body", "found"),
    [
        ({"subscription": "projects/p/subscriptions/s", "message": {}}, "projects/p/subscriptions/s"),
        ({"message": {}}, ""),
        ({"subscription": 7}, ""),
        (None, ""),
        ("text", ""),
        ([1], ""),
    ],
)
def test_subscription_of_reads_only_a_string_subscription(body: Any, found: str) -> None:
    """The request body may be anything a caller sent; only a string subscription counts."""
    assert subscription_of(body) == found


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
"""A cloud_event function that decodes each event as functions/main.py does, and records it."""
import os

import flask

from tpujobs.engine.inbound import from_cloud_event, subscription_of

EVENTS = []
RECEIVED = []


def submit_job(event):
    EVENTS.append(event)
    body = flask.request.get_json(silent=True)
    RECEIVED.append(
        from_cloud_event(
            event["id"],
            event["source"],
            event.data,
            push_subscription=subscription_of(body),
            prefix=os.environ.get("TPUJOBS_PREFIX", ""),
            target="submit_job",
        )
    )
'''


@pytest.fixture
def framework(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, list[Any], list[Any]]]:
    """A functions-framework test client for the probe, the CloudEvents it got and what it decoded."""
    from functions_framework import create_app

    source = tmp_path / f"{PROBE_MODULE}.py"
    source.write_text(PROBE_SOURCE)
    # create_app writes these variables and appends to sys.path; undo both afterwards.
    for variable in ("FUNCTION_TARGET", "FUNCTION_SIGNATURE_TYPE"):
        monkeypatch.setitem(os.environ, variable, "")
    monkeypatch.setattr(sys, "path", list(sys.path))
    app = create_app(target="submit_job", source=str(source), signature_type="cloudevent")
    try:
        module = sys.modules[PROBE_MODULE]
        yield app.test_client(), module.EVENTS, module.RECEIVED
    finally:
        sys.modules.pop(PROBE_MODULE, None)


def test_functions_framework_drops_the_subscription_of_a_push_to_the_bare_url(
    framework: tuple[Any, list[Any], list[Any]], push_envelope: dict[str, Any]
) -> None:
    """Why the function reads the request body: the CloudEvent built from a push to "/" has
    the source //pubsub.googleapis.com/ and the message alone as data (functions_framework
    event_conversion.marshal_background_event_data)."""
    client, events, _ = framework
    assert client.post("/", json=push_envelope).status_code == 200
    (event,) = events
    assert event["source"] == BARE_SOURCE
    assert event["id"] == "13792457813425621"
    assert "subscription" not in event.data and set(event.data) == {"message"}


def test_a_push_to_the_bare_url_decodes_with_the_topic_from_its_subscription(
    framework: tuple[Any, list[Any], list[Any]], push_envelope: dict[str, Any]
) -> None:
    """Production's shape end to end in-process: the topic, id, bytes and attributes all arrive."""
    client, _, received = framework
    response = client.post("/", json=push_envelope)
    assert response.status_code == 200, response.get_data(as_text=True)
    (message,) = received
    assert message.topic == "tpujobs-submit"
    assert message.message_id == "13792457813425621"
    assert message.data is not None and json.loads(message.data) == PUSH_SPEC
    assert message.attributes == {"submitted-by": "tpujobs-cli"}
    assert message.undecodable == ""


def test_a_prefixed_deployment_reads_its_prefixed_subscription(
    framework: tuple[Any, list[Any], list[Any]], push_envelope: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With TPUJOBS_PREFIX=t1- the subscription t1-tpujobs-submit--submit_job is ours, and
    the unprefixed one is another deployment's: refused, payload kept."""
    monkeypatch.setenv("TPUJOBS_PREFIX", "t1-")
    client, _, received = framework
    ours = {**push_envelope, "subscription": subscription("submit_job", "t1-")}
    assert client.post("/", json=ours).status_code == 200
    assert client.post("/", json=push_envelope).status_code == 200
    prefixed, unprefixed = received
    assert (prefixed.topic, prefixed.undecodable) == ("t1-tpujobs-submit", "")
    assert unprefixed.data is None and unprefixed.topic == ""
    assert "'projects/p/subscriptions/tpujobs-submit--submit_job'" in unprefixed.undecodable
    assert json.loads(unprefixed.payload_text()) == PUSH_SPEC


def test_a_push_to_a_topic_path_still_decodes(
    framework: tuple[Any, list[Any], list[Any]], push_envelope: dict[str, Any]
) -> None:
    """A subscription wired the old local way (topic in the URL path) keeps working."""
    client, events, received = framework
    assert client.post("/projects/p/topics/tpujobs-submit", json=push_envelope).status_code == 200
    assert events[0]["source"] == SUBMIT_SOURCE
    assert (received[0].topic, received[0].undecodable) == ("tpujobs-submit", "")


def test_a_structured_eventarc_cloudevent_through_functions_framework_decodes(
    framework: tuple[Any, list[Any], list[Any]], eventarc_event: dict[str, Any]
) -> None:
    """A CloudEvent in structured mode reaches the decoder with its source and data intact."""
    client, _, received = framework
    response = client.post(
        "/",
        data=json.dumps(eventarc_event),
        headers={"Content-Type": "application/cloudevents+json"},
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    (message,) = received
    assert (message.topic, message.message_id) == ("tpujobs-submit", "13792457813425622")
    assert message.data is not None and json.loads(message.data) == EVENTARC_SPEC
    assert message.undecodable == ""


def test_a_binary_eventarc_cloudevent_through_functions_framework_decodes(
    framework: tuple[Any, list[Any], list[Any]], eventarc_event: dict[str, Any]
) -> None:
    """Eventarc's binary mode (ce-* headers, data as the body) decodes the same way."""
    client, _, received = framework
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


def test_an_eventarc_event_for_another_topic_is_refused_by_the_function(
    framework: tuple[Any, list[Any], list[Any]], eventarc_event: dict[str, Any]
) -> None:
    """submit_job reads tpujobs-submit only: an event from another topic is a rejection."""
    client, _, received = framework
    event = {**eventarc_event, "source": "//pubsub.googleapis.com/projects/p/topics/tpujobs-control"}
    response = client.post("/", data=json.dumps(event), headers={"Content-Type": "application/cloudevents+json"})
    assert response.status_code == 200
    (message,) = received
    assert message.data is None and message.topic == "tpujobs-control"
    assert "reached submit_job, which reads only tpujobs-submit" in message.undecodable


def test_every_function_in_main_decodes_as_itself() -> None:
    """functions/main.py passes each function's own target to the decoder, so a message is
    refused only when it came on another function's topic, never because of a typo."""
    import ast

    main = Path(__file__).resolve().parents[3] / "functions" / "main.py"
    calls = {
        function.name: call.args[1].value
        for function in ast.parse(main.read_text(encoding="utf-8")).body
        if isinstance(function, ast.FunctionDef)
        for call in ast.walk(function)
        if isinstance(call, ast.Call)
        and getattr(call.func, "id", None) == "_handle"
        and isinstance(call.args[1], ast.Constant)
    }
    cloudevent_decoders = {r.target for r in topology.FUNCTIONS if r.topic is not None}
    assert calls == {target: target for target in cloudevent_decoders}

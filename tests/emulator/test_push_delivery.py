"""The production push path on loopback: the Pub/Sub emulator, wired by `wire_pubsub` as
infra/pubsub.tf wires production, pushes to functions/main.py served by functions-framework
at its bare URL, and every rejection names its topic, read from the subscription's name.

The function runs in this process (a werkzeug server in a thread) on the session's Firestore
emulator and the TPU simulator, in a deployment with a topic prefix.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tpujobs.engine import topology
from tpujobs.local import wiring
from tpujobs.local.testing import wait_for
from tpujobs.runtime import instances

pytestmark = pytest.mark.emulator

MAIN = Path(__file__).resolve().parents[2] / "functions" / "main.py"
PREFIX = "t1-"
SERVED = ("on_control", "on_qr_state")  # the functions this test runs; other routes point nowhere
ROUTES = {route.target: route for route in topology.FUNCTIONS}
ANSWERS: dict[str, list[tuple[str, str]]] = {}  # target -> (message id, HTTP status) per push


def _serve(target: str, answers: list[tuple[str, str]]) -> tuple[Any, str]:
    """functions/main.py's `target` under functions-framework, on a free loopback port;
    each request's message id and HTTP status are appended to `answers`."""
    from functions_framework import create_app
    from werkzeug.serving import make_server

    app = create_app(target=target, source=str(MAIN), signature_type="cloudevent")

    def answering(environ, start_response):
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(body)
        message_id = subscription_message_id(body)

        def start(status, headers, exc_info=None):
            answers.append((message_id, status))
            return start_response(status, headers, exc_info)

        return app(environ, start)

    server = make_server("127.0.0.1", 0, answering, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}/"


def subscription_message_id(body: bytes) -> str:
    """The message id of a push envelope, or "" for any other body."""
    try:
        return str(json.loads(body)["message"]["messageId"])
    except (ValueError, KeyError, TypeError):
        return ""


def clear_runtime() -> None:
    """Forget every client and service runtime built once per process: the next test has its own."""
    for built_once in vars(instances).values():
        if callable(getattr(built_once, "cache_clear", None)):
            built_once.cache_clear()


@pytest.fixture
def functions(
    emulators: dict[str, str], project_id: str, simulator_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    """The served functions' URLs by target, in a deployment of `project_id` with PREFIX."""
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", project_id)
    monkeypatch.setenv("TPUJOBS_PREFIX", PREFIX)
    monkeypatch.setenv("TPUJOBS_TPU_ENDPOINT", simulator_url)
    monkeypatch.setenv("TPUJOBS_LOCAL_STACK", "1")  # readable log lines, not Cloud Logging JSON
    # create_app sets these and extends sys.path; main.py installs a log handler: all undone below.
    for variable in ("FUNCTION_TARGET", "FUNCTION_SIGNATURE_TYPE", "FUNCTION_NAME"):
        monkeypatch.setitem(os.environ, variable, "")
    monkeypatch.setattr(sys, "path", list(sys.path))
    handlers = list(logging.getLogger().handlers)
    clear_runtime()  # built on this test's project and simulator
    servers = {}
    try:
        for target in SERVED:
            servers[target] = _serve(target, ANSWERS.setdefault(target, []))
        yield {target: url for target, (_, url) in servers.items()}
    finally:
        for server, _ in servers.values():
            server.shutdown()
        clear_runtime()
        ANSWERS.clear()
        sys.modules.pop("main", None)
        logging.getLogger().handlers[:] = handlers


@pytest.fixture
def wired(emulators: dict[str, str], project_id: str, functions: dict[str, str]):
    """The emulator wired for the deployment; an admin publisher and subscriber on it."""
    urls = {route.target: functions.get(route.target, "http://127.0.0.1:9/") for route in topology.FUNCTIONS}
    host = emulators["PUBSUB_EMULATOR_HOST"]
    wired = wiring.wire_pubsub(host, project_id, PREFIX, urls)
    publisher, subscriber = wiring.publisher_client(host), wiring.subscriber_client(host)
    try:
        yield wired, urls, publisher, subscriber
    finally:
        publisher.transport.close()
        subscriber.transport.close()


def rejection(firestore_client, message_id: str) -> dict[str, Any]:
    """rejections/{message_id}, once a function has written it."""

    def written():
        """the rejection document"""
        snapshot = firestore_client.collection("rejections").document(message_id).get()
        return snapshot.to_dict() if snapshot.exists else None

    return wait_for(written, timeout=30)


def test_the_emulator_holds_each_subscription_as_production_declares_it(wired, project_id) -> None:
    """What wire_pubsub made is route_subscription's Subscription, read back field for field:
    bare URL, OIDC token for it, the function's ack deadline, retry and dead-letter policies."""
    result, urls, _, subscriber = wired
    for route in topology.FUNCTIONS:
        if route.topic is None:
            continue
        wanted = wiring.route_subscription(route, project_id, PREFIX, urls[route.target])
        got = subscriber.get_subscription(subscription=wanted.name)
        assert got == wanted, route.target
        assert got.push_config.oidc_token.audience == got.push_config.push_endpoint == urls[route.target]
        assert result.subscriptions[wanted.name] == urls[route.target]


def test_a_bad_control_message_is_rejected_on_its_prefixed_topic(wired, project_id, firestore_client) -> None:
    """Published to t1-tpujobs-control, pushed to on_control's bare URL: the rejection names
    t1-tpujobs-control, which only the subscription's name carried."""
    _, _, publisher, _ = wired
    topic = publisher.topic_path(project_id, topology.topic_name(topology.CONTROL, PREFIX))
    message_id = publisher.publish(topic=topic, messages=[{"data": b'{"action": "explode"}'}]).message_ids[0]
    found = rejection(firestore_client, message_id)
    assert found["topic"] == f"{PREFIX}{topology.CONTROL}"
    assert found["payload"] == '{"action": "explode"}'
    assert "action" in found["reason"]


def test_a_tpu_audit_entry_from_the_sink_reaches_on_qr_state_on_its_topic(wired, project_id, firestore_client) -> None:
    """The golden audit entry (tests/data) as the sink publishes it: on_qr_state reads it as
    an audit entry (not as a malformed report), finds that it names no holding of this
    deployment's (another project's log, no such job), reads no capacity, and answers 200:
    acknowledged, counted like a forgery (the first of its minute recorded as itself), nothing
    to redeliver."""
    _, _, publisher, _ = wired
    entry = (Path(__file__).resolve().parents[1] / "data" / "tpu_audit_create_queued_resource_v2.json").read_bytes()
    topic = publisher.topic_path(project_id, topology.topic_name(topology.QR_STATE, PREFIX))
    message_id = publisher.publish(
        topic=topic,
        messages=[{"data": entry, "attributes": {"logging.googleapis.com/timestamp": "2025-06-30T08:14:47Z"}}],
    ).message_ids[0]

    def answered():
        """on_qr_state's answer to the pushed audit entry"""
        return [status for got, status in ANSWERS["on_qr_state"] if got == message_id]

    assert wait_for(answered, timeout=30)[0] == "200 OK"
    found = rejection(firestore_client, message_id)
    assert found["reason"].startswith("Audit entry about train-1-a2 in us-central2-b refused unread: ")


def test_a_push_from_a_subscription_that_is_not_the_deployments_is_rejected_by_name(
    wired, project_id, firestore_client
) -> None:
    """Someone pushes another topic to on_control's URL: a rejection naming that subscription,
    no topic, the payload kept, and the delivery acknowledged (it would never get better)."""
    _, urls, publisher, subscriber = wired
    stray_topic = publisher.create_topic(name=publisher.topic_path(project_id, f"{PREFIX}stray")).name
    stray = subscriber.subscription_path(project_id, f"{PREFIX}stray--on_control")
    subscriber.create_subscription(
        request=wiring.push_subscription(
            stray, stray_topic, wiring.push_endpoint(urls["on_control"]), dead_letter_topic=None
        )
    )
    payload = json.dumps({"action": "cancel", "job_id": "abc", "owner": "ada"}).encode()
    message_id = publisher.publish(topic=stray_topic, messages=[{"data": payload}]).message_ids[0]
    found = rejection(firestore_client, message_id)
    assert found["topic"] == ""
    assert repr(stray) in found["reason"] and "t1-TOPIC--FUNCTION" in found["reason"]
    assert found["payload"] == payload.decode()


def test_an_eventarc_cloudevent_to_the_same_function_takes_its_topic_from_the_source(
    functions, project_id, firestore_client
) -> None:
    """The other shape Google delivers, posted in binary mode: the topic is the source's."""
    import urllib.request

    source = f"//pubsub.googleapis.com/projects/{project_id}/topics/{PREFIX}{topology.CONTROL}"
    body = {
        "subscription": f"projects/{project_id}/subscriptions/eventarc-us-central1-x-sub-1",
        "message": {"data": base64.b64encode(b"[]").decode(), "messageId": "880011"},
    }
    request = urllib.request.Request(
        functions["on_control"],
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "ce-specversion": "1.0",
            "ce-id": "880011",
            "ce-source": source,
            "ce-type": "google.cloud.pubsub.topic.v1.messagePublished",
        },
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200
    assert rejection(firestore_client, "880011")["topic"] == f"{PREFIX}{topology.CONTROL}"

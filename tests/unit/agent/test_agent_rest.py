"""Google's REST APIs as the agent calls them: publish, retries, tokens, storage (`agent/rest.py`)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from agent_stubs import (
    BUCKET,
    KEY,
    PROJECT,
    WORKER_EVENTS,
    FakeMetadata,
    GoogleStub,
)

from tpujobs.agent.basics import HttpError
from tpujobs.agent.rest import PUBSUB_API, GoogleApi, Metadata, Publisher, Storage, TokenSource, with_retries
from tpujobs.domain import signing

# --- the HTTP protocol ----------------------------------------------------------------


def test_a_report_is_a_pubsub_rest_publish_of_base64_json_with_attributes(
    google: GoogleStub,
) -> None:
    """POST /v1/projects/P/topics/T:publish with messages[0].data = base64(JSON) and attributes."""
    publisher = Publisher(GoogleApi(google.url, None), PROJECT, KEY)
    publisher.publish(WORKER_EVENTS, {"kind": "started", "job_id": "j"}, {"job_id": "j", "kind": "started"})
    method, path, headers, body = google.requests[0]
    assert (method, path) == ("POST", f"/v1/projects/{PROJECT}/topics/{WORKER_EVENTS}:publish")
    assert headers["Content-Type"] == "application/json"
    assert "Authorization" not in headers  # an emulator takes no credentials
    message = json.loads(body)["messages"][0]
    data = base64.b64decode(message["data"])
    assert json.loads(data) == {"kind": "started", "job_id": "j"}
    assert message["attributes"] == {
        "job_id": "j",
        "kind": "started",
        "tpujobs-signature": signing.sign(KEY, data),
    }


def test_a_publish_is_retried_through_server_errors_and_rate_limits(google: GoogleStub) -> None:
    """503, 429 and 500 answers are retried; the message then goes through once."""
    google.failures[":publish"] = [503, 429, 500]
    publisher = Publisher(GoogleApi(google.url, None), PROJECT, KEY)
    publisher.publish(WORKER_EVENTS, {"kind": "heartbeat"}, {})
    assert google.kinds(WORKER_EVENTS) == ["heartbeat"]
    assert len(google.requests) == 4


def test_a_client_error_is_not_retried(google: GoogleStub) -> None:
    """A 400 or 404 fails at once: retrying cannot help."""
    google.failures[":publish"] = [404]
    publisher = Publisher(GoogleApi(google.url, None), PROJECT, KEY)
    with pytest.raises(HttpError, match="404"):
        publisher.publish(WORKER_EVENTS, {"kind": "heartbeat"}, {})
    assert len(google.requests) == 1


def test_retries_are_bounded_when_the_server_never_recovers(google: GoogleStub) -> None:
    """After the last attempt the error is raised instead of looping forever."""
    google.failures[":publish"] = [503] * 20
    api = GoogleApi(google.url, None)
    with pytest.raises(HttpError, match="503"):
        with_retries(
            lambda: api.call("POST", "/v1/projects/p/topics/t:publish", b"{}", attempts=1),
            attempts=3,
            sleep=lambda s: None,
        )
    assert len(google.requests) == 3


def test_a_connection_error_is_retried() -> None:
    """Nothing listening is a transient error: retried a bounded number of times."""
    calls = []

    def call() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError("nobody home")
        return "ok"

    assert with_retries(call, sleep=lambda s: None) == "ok"
    assert len(calls) == 3


def test_without_an_emulator_the_real_api_is_called_with_the_metadata_token() -> None:
    """No PUBSUB_EMULATOR_HOST: https://pubsub.googleapis.com with the VM's bearer token."""
    with FakeMetadata(token="tok-123") as server:
        tokens = TokenSource(Metadata(server.base))
        api = GoogleApi.from_env("PUBSUB_EMULATOR_HOST", PUBSUB_API, {}, tokens)
        assert api.base_url == "https://pubsub.googleapis.com"
        assert api.tokens is tokens
        assert tokens.token() == "tok-123"
    emulated = GoogleApi.from_env(
        "PUBSUB_EMULATOR_HOST",
        PUBSUB_API,
        {"PUBSUB_EMULATOR_HOST": "127.0.0.1:8085"},
        tokens,
    )
    assert (emulated.base_url, emulated.tokens) == ("http://127.0.0.1:8085", None)


def test_the_token_goes_in_the_authorization_header_and_is_refreshed_after_a_401(
    google: GoogleStub,
) -> None:
    """Bearer <token> on every call; a 401 drops the cached token, fetches a new one and retries."""
    with FakeMetadata(token="first") as server:
        tokens = TokenSource(Metadata(server.base))
        api = GoogleApi(google.url, tokens)
        Publisher(api, PROJECT, KEY).publish(WORKER_EVENTS, {"kind": "started"}, {})
        assert google.requests[-1][2]["Authorization"] == "Bearer first"
        server.token = "second"
        google.failures[":publish"] = [401]
        Publisher(api, PROJECT, KEY).publish(WORKER_EVENTS, {"kind": "heartbeat"}, {})
        assert google.requests[-1][2]["Authorization"] == "Bearer second"
        token_reads = [p for p in server.requests if p.endswith("/token")]
    assert len(token_reads) == 2


def test_storage_uploads_downloads_and_lists_with_the_json_api(google: GoogleStub, tmp_path: Path) -> None:
    """Media upload by ?name=, alt=media download by quoted name, and ?prefix= listing."""
    storage = Storage(GoogleApi(google.url, None))
    storage.upload(BUCKET, "jobs/a b/x#1.log", b"data", "text/plain")
    method, path, headers, body = google.requests[-1]
    assert (method, headers["Content-Type"]) == ("POST", "text/plain")
    assert path == f"/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name=jobs%2Fa%20b%2Fx%231.log"
    assert body == b"data"
    storage.download(BUCKET, "jobs/a b/x#1.log", str(tmp_path / "out"))
    assert google.requests[-1][1] == f"/storage/v1/b/{BUCKET}/o/jobs%2Fa%20b%2Fx%231.log?alt=media"
    assert (tmp_path / "out").read_bytes() == b"data"
    assert storage.list_names(BUCKET, "jobs/") == ["jobs/a b/x#1.log"]

"""Signed reports: the key the metadata hands out, the signature the control plane checks (`agent/wire.py`)."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import pytest
from agent_stubs import (
    FAST,
    KEY,
    NOW,
    PREEMPTION,
    PROJECT,
    SETTINGS,
    WORKER_EVENTS,
    FakeMetadata,
    GoogleStub,
    a_job,
    assert_all_signed,
    run_script,
)

from tpujobs.agent import wire
from tpujobs.agent.basics import AGENT_CANNOT_START, AgentError
from tpujobs.agent.reports import Preemption, Reporter
from tpujobs.agent.rest import GoogleApi, Publisher, parse_report_key
from tpujobs.agent.wire import KEY_PREFIX, SIGNATURE_ATTRIBUTE, encode_payload, sign
from tpujobs.domain import signing
from tpujobs.engine.messages import ReportError, decode_report
from tpujobs.engine.startup_script import render_startup_script
from tpujobs.engine.worker_reports import WorkerReport

# --- signing --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_the_report_key_is_read_back_from_what_signing_key_text_writes(seed: int) -> None:
    """parse_report_key inverts tpujobs.domain.signing.key_text, a trailing newline or not."""
    key = hashlib.sha256(f"key {seed}".encode()).digest()
    assert parse_report_key(signing.key_text(key)) == key
    assert parse_report_key(signing.key_text(key) + "\n") == key
    assert KEY_PREFIX == signing.KEY_PREFIX
    assert SIGNATURE_ATTRIBUTE == signing.SIGNATURE_ATTRIBUTE


MALFORMED_KEYS = {
    "empty": "",
    "no_prefix": base64.urlsafe_b64encode(KEY).decode().rstrip("="),
    "other_version": "tpujobs-key-v2:" + base64.urlsafe_b64encode(KEY).decode().rstrip("="),
    "padded": signing.KEY_PREFIX + base64.urlsafe_b64encode(KEY).decode(),
    "standard_alphabet": signing.KEY_PREFIX + "+/" + "A" * 41,
    "short": signing.key_text(KEY[:16]),
    "long": signing.key_text(KEY + b"x"),
    "not_canonical": signing.key_text(KEY)[:-1] + "B",
}


@pytest.mark.parametrize("text", MALFORMED_KEYS.values(), ids=MALFORMED_KEYS.keys())
def test_a_malformed_report_key_is_refused_without_quoting_it(text: str) -> None:
    """Anything but `tpujobs-key-v1:` + canonical unpadded base64url of 32 bytes is an AgentError."""
    with pytest.raises(AgentError) as refused:
        parse_report_key(text)
    body = text.partition(":")[2] or text
    assert not body or body not in str(refused.value)


def test_the_agents_signature_is_what_the_control_plane_verifies() -> None:
    """sign equals signing.sign; signature_problem accepts it and refuses other bytes or keys."""
    data = encode_payload({"kind": "exited", "exit_code": 0, "nonce": "ab" * 16})
    signature = sign(KEY, data)
    assert signature == signing.sign(KEY, data)
    assert signing.signature_problem(KEY, data, signature) is None
    assert signing.signature_problem(KEY, data.replace(b":0", b":1"), signature) is not None
    assert signing.signature_problem(bytes(32), data, signature) is not None


def test_a_publisher_refuses_a_key_that_is_not_32_bytes(google: GoogleStub) -> None:
    """No publisher exists without a usable key, so nothing is ever published unsigned."""
    with pytest.raises(AgentError):
        Publisher(GoogleApi(google.url, None), PROJECT, b"short")


def test_a_retried_publish_sends_the_same_bytes_and_signature(google: GoogleStub) -> None:
    """Two 503s then success: three identical request bodies, one signature over their data."""
    google.failures[":publish"] = [503, 503]
    publisher = Publisher(GoogleApi(google.url, None), PROJECT, KEY)
    identity = {"job_id": "train-1", "attempt": 1, "slice_id": 0, "worker_id": 0}
    reporter = Reporter(publisher, WORKER_EVENTS, identity)
    reporter.report("heartbeat")
    reporter.close(timeout=10.0)
    bodies = [body for _, path, _, body in google.requests if path.endswith(":publish")]
    assert len(bodies) == 3 and len(set(bodies)) == 1
    assert_all_signed(google, WORKER_EVENTS)


def test_a_preemption_notice_published_again_after_a_failure_keeps_its_bytes(
    google: GoogleStub,
) -> None:
    """The quick first try fails; the retry thread sends the same data, nonce and signature."""
    google.failures[":publish"] = [503]
    publisher = Publisher(GoogleApi(google.url, None), PROJECT, KEY)
    stopped: list[str] = []
    identity = {"job_id": "train-1", "attempt": 1, "slice_id": 0, "worker_id": 0}
    preemption = Preemption(publisher, PREEMPTION, identity, stopped.append)
    preemption.trigger("SIGTERM")
    preemption.wait(10.0)
    bodies = [body for _, path, _, body in google.requests if path.endswith(":publish")]
    assert len(bodies) == 2 and bodies[0] == bodies[1]
    assert stopped == ["SIGTERM"]
    assert_all_signed(google, PREEMPTION)


@pytest.mark.parametrize(
    "answer",
    [None, {"key": MALFORMED_KEYS["short"], "key_version": "1", "job_created": "1"}, {"key_version": "1"}],
    ids=["refused", "short", "no_key"],
)
def test_without_a_valid_report_key_the_agent_does_not_start(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub, answer: dict[str, str] | None
) -> None:
    """The control plane refuses the key, or answers an unusable one: exit AGENT_CANNOT_START,
    nothing published, the key never logged."""
    google.key_answer = answer
    code, stdout, stderr = run_script(
        render_startup_script(a_job(command="touch ran"), SETTINGS, timings=FAST),
        tmp_path / "w",
        metadata,
        google,
    )
    assert code == AGENT_CANNOT_START
    assert "key" in stderr and "cannot start" in stderr
    assert google.published == []
    assert not (tmp_path / "w" / "code" / "ran").exists()
    if answer and "key" in answer:
        assert answer["key"].partition(":")[2] not in stdout + stderr


def test_the_agent_trades_its_identity_token_for_its_key_and_names_it_in_every_report(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """One `attempt-key` request with the VM's identity token, for its own host; every report then
    carries the key's version and the job's creation time beside the signature."""
    google.key_answer = {"key": signing.key_text(KEY), "key_version": "7", "job_created": "123456"}
    job = a_job(command="true")
    code, _, stderr = run_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google)
    assert code == 0, stderr
    [asked] = google.key_requests
    assert asked == {
        "action": "attempt-key",
        "identity": f"identity-of-{metadata.node_id}-w0",
        "job_id": job.job_id,
        "attempt": job.attempt,
        "slice_id": 0,
        "worker_id": 0,
    }
    identity = [r for r in metadata.requests if "service-accounts/default/identity" in r]
    assert identity and "format=full" in identity[0] and "audience=" in identity[0]
    for _, attributes in google.signed(WORKER_EVENTS):
        assert attributes[signing.KEY_VERSION_ATTRIBUTE] == "7"
        assert attributes[signing.JOB_CREATED_ATTRIBUTE] == "123456"


def test_every_report_of_a_run_is_signed_with_a_fresh_nonce(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """started, heartbeats, a checkpoint and exited all verify, each with its own nonce."""
    job = a_job(command="sleep 0.7; echo TPUJOBS_CHECKPOINT step=3; exit 1")
    code, _, stderr = run_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google)
    assert code == 1, stderr
    kinds = google.kinds(WORKER_EVENTS)
    assert {"started", "heartbeat", "checkpoint", "exited"} <= set(kinds)
    assert_all_signed(google, WORKER_EVENTS)


def a_report(**fields: Any) -> bytes:
    payload = {"kind": "exited", "job_id": "train-1", "attempt": 1, "slice_id": 0, "worker_id": 0}
    payload.update(at="2025-03-01T12:00:00.000Z", nonce="ab" * 16, exit_code=1, **fields)
    return wire.encode_payload(payload)


def test_the_limits_the_agent_cuts_to_are_the_ones_the_control_plane_accepts() -> None:
    """One wire module for both sides: a detail, last lines and a retry line at the limit pass; one more is refused."""
    at_limit = a_report(
        detail="d" * wire.MAX_DETAIL_CHARS,
        last_lines=["l" * (wire.MAX_LAST_LINES_CHARS // wire.MAX_LAST_LINES)] * wire.MAX_LAST_LINES,
        retry_pattern=0,
        retry_line="r" * wire.MAX_RETRY_LINE_CHARS,
    )
    assert len(at_limit) <= wire.MAX_REPORT_BYTES
    assert decode_report(WorkerReport, at_limit).detail == "d" * wire.MAX_DETAIL_CHARS
    for over in (
        {"detail": "d" * (wire.MAX_DETAIL_CHARS + 1)},
        {"last_lines": ["l"] * (wire.MAX_LAST_LINES + 1)},
        {"last_lines": ["l" * (wire.MAX_LAST_LINES_CHARS + 1)]},
        {"retry_pattern": 0, "retry_line": "r" * (wire.MAX_RETRY_LINE_CHARS + 1)},
    ):
        with pytest.raises(ReportError):
            decode_report(WorkerReport, a_report(**over))


def test_a_key_the_control_plane_derives_is_one_the_agent_reads() -> None:
    """domain.signing derives and writes the key with the wire's functions; the agent's parser reads it back."""
    key = signing.attempt_key("m" * 32, "train-1", NOW, 2)
    assert key == wire.derive_key("m" * 32, "train-1", int(NOW.timestamp() * 1_000_000), 2)
    assert parse_report_key(signing.key_text(key)) == key

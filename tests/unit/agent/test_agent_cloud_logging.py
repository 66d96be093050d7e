"""The job's output as Cloud Logging entries (`agent/cloud_logging.py`): batches, labels,
severity, masking, the rate limit, signatures, and an endpoint that fails or hangs."""

from __future__ import annotations

import json
import threading
from datetime import datetime

from tpujobs.agent.cloud_logging import CloudLogSink, EntryIdentity
from tpujobs.agent.last_output import LastOutput
from tpujobs.agent.output import LogShipper, Tee
from tpujobs.agent.rest import GoogleApi, Storage
from tpujobs.agent.wire import JOB_CREATED_ATTRIBUTE, KEY_VERSION_ATTRIBUTE
from tpujobs.domain import job_output

KEY = bytes(range(32))
NAMES = {KEY_VERSION_ATTRIBUTE: "1", JOB_CREATED_ATTRIBUTE: "1700000000000000"}
LOG = "projects/p/logs/tpujobs-job-output"
RESOURCE: dict[str, object] = {"type": "gce_instance", "labels": {"project_id": "p", "instance_id": "1", "zone": "z"}}


class RecordingApi(GoogleApi):
    """Cloud Logging that records each `entries:write` body; it may fail, or hang until released."""

    def __init__(self, fail: bool = False, hang: threading.Event | None = None) -> None:
        super().__init__("http://logging.invalid", None)
        self.bodies: list[dict[str, object]] = []
        self.fail = fail
        self.hang = hang

    def call(self, method: str, path: str, body: bytes | None = None, *args: object, **kwargs: object) -> bytes:
        assert (method, path) == ("POST", "/v2/entries:write")
        if self.hang is not None:
            self.hang.wait(60)  # released by the test: nothing here depends on the machine's speed
        if self.fail:
            raise OSError("connection refused")
        self.bodies.append(json.loads(body or b"{}"))
        return b"{}"

    def entries(self) -> list[dict[str, object]]:
        return [entry for body in self.bodies for entry in body["entries"]]  # type: ignore[attr-defined]


def sink(api: RecordingApi, rate: int = 100_000, clock: float | None = None, max_queued: int = 20_000) -> CloudLogSink:
    identity = EntryIdentity("train-1", 2, 1, 3, KEY, NAMES)
    times = (lambda: clock) if clock is not None else None
    kwargs = {"clock": times} if times is not None else {}
    return CloudLogSink(api, LOG, RESOURCE, identity, rate, batch_seconds=0.05, max_queued=max_queued, **kwargs)  # type: ignore[arg-type]


def test_each_line_is_an_entry_with_the_job_labels_and_the_deployments_log() -> None:
    """Every whole line becomes one INFO entry naming job, attempt, slice, worker and its number."""
    api = RecordingApi()
    shipper = sink(api)
    shipper.write(b"one\ntwo\nthr")
    shipper.write(b"ee\n")
    shipper.close()
    assert all(body["logName"] == LOG and body["resource"] == RESOURCE for body in api.bodies)
    entries = api.entries()
    assert [e["textPayload"] for e in entries] == ["one", "two", "three"]
    labels = entries[2]["labels"]
    assert isinstance(labels, dict)
    assert {k: labels[k] for k in ("tpujobs_job", "tpujobs_attempt", "tpujobs_slice", "tpujobs_worker")} == {
        "tpujobs_job": "train-1",
        "tpujobs_attempt": "2",
        "tpujobs_slice": "1",
        "tpujobs_worker": "3",
    }
    assert [e["labels"]["tpujobs_seq"] for e in entries] == ["0", "1", "2"]  # type: ignore[index]
    assert {e["severity"] for e in entries} == {"INFO"}


def test_many_lines_go_in_few_batches() -> None:
    """Lines queued together are sent together: 1,200 lines in at most 500 a batch.

    The endpoint holds its first call until every line is queued, so the count of batches does not
    depend on how fast this machine signs lines: at most one early batch, then full ones."""
    released = threading.Event()
    api = RecordingApi(hang=released)
    shipper = sink(api)
    shipper.write(b"".join(b"line %d\n" % n for n in range(1200)))
    released.set()
    shipper.close()
    assert len(api.entries()) == 1200
    assert 3 <= len(api.bodies) <= 4
    assert all(len(body["entries"]) <= 500 for body in api.bodies)  # type: ignore[arg-type]


def test_stderr_lines_are_errors_and_a_last_line_without_newline_is_sent() -> None:
    """stderr's lines carry severity ERROR; what a stream leaves unterminated goes at close."""
    api = RecordingApi()
    shipper = sink(api)
    shipper.write(b"fine\n", "stdout")
    shipper.write(b"Traceback (most recent call last)", "stderr")
    shipper.close()
    severities = {e["textPayload"]: e["severity"] for e in api.entries()}
    assert severities == {"fine": "INFO", "Traceback (most recent call last)": "ERROR"}


def test_secrets_are_masked_before_any_line_is_sent() -> None:
    """Through the Tee and the shipper it mirrors, a secret value (raw or base64, split across
    reads) never reaches Cloud Logging; the agent's own lines are WARNING."""
    api = RecordingApi()
    mirror = sink(api)

    class Nowhere(Storage):
        def upload(self, *args: object, **kwargs: object) -> None:
            pass

    shipper = LogShipper(Nowhere(GoogleApi("http://storage.invalid", None)), "b", "p/", 60.0, mirror=mirror)
    tee = Tee(shipper, LastOutput(), {"TOKEN": "hunter2-very-secret"})
    tee.write(b"token is hunter2-ve")
    tee.write(b"ry-secret\nb64 aHVudGVyMi12ZXJ5LXNlY3JldA==\n")
    tee.flush()
    shipper.write(b"[tpujobs-agent] the command exited with 0\n")
    shipper.close(0)
    sent = json.dumps(api.bodies)
    assert "hunter2" not in sent and "aHVudGVyMi12ZXJ5LXNlY3JldA" not in sent
    entries = api.entries()
    assert [e["textPayload"] for e in entries][:2] == ["token is [secret TOKEN]", "b64 [secret TOKEN]"]
    assert [e["severity"] for e in entries] == ["INFO", "INFO", "WARNING"]


def test_lines_over_the_rate_are_counted_and_the_count_is_one_entry() -> None:
    """At 3 lines a second (a fixed clock: one second), 10 lines send 3 and one entry counting 7."""
    api = RecordingApi()
    shipper = sink(api, rate=3, clock=1_700_000_000.0)
    shipper.write(b"".join(b"%d\n" % n for n in range(10)))
    shipper.close()
    texts = [e["textPayload"] for e in api.entries()]
    assert texts[:3] == ["0", "1", "2"]
    assert len(texts) == 4 and "7 lines in all were not sent" in str(texts[3])
    assert shipper.counts.over_rate == 7


def test_each_entry_is_signed_and_a_changed_one_fails() -> None:
    """The reader's check passes each entry as sent, and fails one whose text was changed."""
    api = RecordingApi()
    shipper = sink(api)
    shipper.write(b"loss=0.1\nloss=0.2\n")
    shipper.close()
    raw = [
        job_output.RawEntry(
            e["labels"],  # type: ignore[arg-type]
            datetime.fromisoformat(str(e["timestamp"]).replace("Z", "+00:00")),
            str(e["textPayload"]),
        )
        for e in api.entries()
    ]
    raw.append(job_output.RawEntry(raw[0].labels, raw[0].timestamp, "loss=0.0 (forged)"))
    raw.append(raw[1])  # a replayed (or retried) copy: the same line, shown once
    verified = job_output.verify("train-1", raw, lambda attempt, created, version: KEY)
    assert [line.text for line in verified.lines] == ["loss=0.1", "loss=0.2"]
    assert verified.forged == 1
    assert verified.lines[0].slice_id == 1 and verified.lines[0].worker_id == 3


def test_a_failing_endpoint_never_blocks_and_its_losses_are_counted() -> None:
    """Writes return while Cloud Logging hangs; past the queue's bound lines are dropped and counted."""
    release = threading.Event()
    api = RecordingApi(hang=release)
    shipper = sink(api, max_queued=10)
    shipper.write(b"first\n")  # taken by the sender, which then hangs on it
    for n in range(200):  # each write returns at once: the queue is bounded, the rest dropped
        shipper.write(b"%d\n" % n)
    assert shipper.counts.queue_full >= 181  # at most one batch (10) taken before the hang, 10 queued
    release.set()
    shipper.close()
    texts = [str(e["textPayload"]) for e in api.entries()]
    assert any("while the queue to Cloud Logging was full" in text for text in texts)


def test_an_endpoint_that_refuses_costs_the_lines_only() -> None:
    """Every batch refused: the lines are counted as lost and close still returns."""
    api = RecordingApi(fail=True)
    shipper = sink(api)
    shipper.write(b"a\nb\n")
    shipper.close()
    assert shipper.counts.send_failed >= 2
    assert api.bodies == []

"""The job's output as Cloud Logging entries: one per line, written in batches with `entries:write`.

Alongside the Cloud Storage export, never instead of it, and never in the command's way: `write`
only appends to a bounded queue (what does not fit is dropped and counted), a sender thread ships
batches by size and time, a batch that still fails after a few quick tries is dropped and counted,
and lines over the deployment's rate are counted, not sent. The counts go out as one entry each.
Every entry carries its job's labels and an HMAC under the attempt's key (`log_wire`).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .basics import log
from .rest import GoogleApi, Metadata, Publisher, TokenSource
from .wire import (
    ATTEMPT_LABEL,
    JOB_CREATED_ATTRIBUTE,
    JOB_CREATED_LABEL,
    JOB_LABEL,
    KEY_VERSION_ATTRIBUTE,
    KEY_VERSION_LABEL,
    SEQ_LABEL,
    SIGNATURE_LABEL,
    SLICE_LABEL,
    STREAM_LABEL,
    WORKER_LABEL,
    micros,
    sign_entry,
)

LOGGING_API = "https://logging.googleapis.com"
LOGGING_ENDPOINT_VARIABLE = "TPUJOBS_LOGGING_ENDPOINT"  # the local stack's stand-in
MAX_BATCH_ENTRIES = 500
MAX_BATCH_BYTES = 512 * 1024  # well under entries:write's 10 MB
MAX_LINE_CHARS = 64 * 1024  # longer lines are cut: an entry is at most 256 KB
MAX_QUEUED_LINES = 20_000  # beyond this, lines wait for nobody: dropped and counted
BATCH_SECONDS = 1.0
AGENT_PREFIX = "[tpujobs-agent] "  # the agent's own lines in the output: WARNING
SEND_ATTEMPTS = 2
SEND_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class EntryIdentity:
    """Whose output this is, and what signs it."""

    job_id: str
    attempt: int
    slice_id: int
    worker_id: int
    key: bytes = field(repr=False)
    key_names: dict[str, str] = field(default_factory=dict)  # key version, job creation time

    @property
    def worker(self) -> str:
        return f"{self.slice_id}-{self.worker_id}"


@dataclass
class Counts:
    """What did not reach Cloud Logging, by why."""

    over_rate: int = 0
    queue_full: int = 0
    send_failed: int = 0


def timestamp(now: float) -> tuple[str, int]:
    """RFC 3339 with microseconds in UTC, and the same instant as signed (`log_wire.micros`)."""
    at = datetime.fromtimestamp(now, timezone.utc)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), micros(at)


class CloudLogSink:
    """`write(data, stream)` from the output pumps; `close()` at the end sends what is left."""

    def __init__(
        self,
        api: GoogleApi,
        log_name: str,
        resource: dict[str, object],
        identity: EntryIdentity,
        lines_per_second: int,
        clock: Callable[[], float] = time.time,
        batch_seconds: float = BATCH_SECONDS,
        max_queued: int = MAX_QUEUED_LINES,
    ) -> None:
        self.api = api
        self.log_name = log_name
        self.resource = resource
        self.identity = identity
        self.lines_per_second = max(1, int(lines_per_second))
        self.clock = clock
        self.batch_seconds = batch_seconds
        self.max_queued = max_queued
        self.counts = Counts()
        self.sent = 0
        self._reported = Counts()  # what the count entries told already
        self._queue: deque[dict[str, object]] = deque()
        self._partial: dict[str, bytes] = {}
        self._second = -1
        self._in_second = 0
        self._seq = 0
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="cloud-logging", daemon=True)
        self._thread.start()

    # --- the pumps' side: never blocks on the network --------------------------------------

    def write(self, data: bytes, stream: str = "stdout") -> None:
        """Masked output of one stream; each whole line becomes an entry."""
        lines = (self._partial.pop(stream, b"") + data).split(b"\n")
        rest = lines.pop()
        if rest:
            self._partial[stream] = rest[: MAX_LINE_CHARS * 4]
        for line in lines:
            text = line.rstrip(b"\r").decode("utf-8", "replace")
            self.line(text, "agent" if text.startswith(AGENT_PREFIX) else stream)

    def flush(self, stream: str = "stdout") -> None:
        """The stream ended: a last line without a newline goes too."""
        rest = self._partial.pop(stream, b"")
        if rest:
            self.line(rest.decode("utf-8", "replace"), stream)

    def line(self, text: str, stream: str = "stdout") -> None:
        now = self.clock()
        with self._cond:
            second = int(now)
            if second != self._second:
                self._second, self._in_second = second, 0
            if self._in_second >= self.lines_per_second:
                self.counts.over_rate += 1
                return
            self._in_second += 1
            if len(self._queue) >= self.max_queued:
                self.counts.queue_full += 1
                return
            self._queue.append(self._entry(text[:MAX_LINE_CHARS], stream, now))
            if len(self._queue) >= MAX_BATCH_ENTRIES:
                self._cond.notify()

    def _entry(self, text: str, stream: str, now: float) -> dict[str, object]:
        ident = self.identity
        at, at_micros = timestamp(now)
        seq = self._seq
        self._seq += 1
        labels = {
            JOB_LABEL: ident.job_id,
            ATTEMPT_LABEL: str(ident.attempt),
            SLICE_LABEL: str(ident.slice_id),
            WORKER_LABEL: str(ident.worker_id),
            SEQ_LABEL: str(seq),
            STREAM_LABEL: stream,
            SIGNATURE_LABEL: sign_entry(ident.key, ident.job_id, ident.attempt, ident.worker, seq, at_micros, text),
        }
        labels[KEY_VERSION_LABEL] = ident.key_names.get(KEY_VERSION_ATTRIBUTE, "")
        labels[JOB_CREATED_LABEL] = ident.key_names.get(JOB_CREATED_ATTRIBUTE, "")
        severity = "ERROR" if stream == "stderr" else "WARNING" if stream == "agent" else "INFO"
        # insertId: Cloud Logging drops a retried batch's copies of an entry by it.
        insert_id = f"{ident.job_id}-{ident.attempt}-{ident.worker}-{seq}"
        return {"insertId": insert_id, "timestamp": at, "severity": severity, "textPayload": text, "labels": labels}

    # --- the sender ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                began = time.monotonic()
                while not self._closing and len(self._queue) < MAX_BATCH_ENTRIES:
                    remaining = began + self.batch_seconds - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                closing = self._closing
            self._send_pending()
            if closing:
                return

    def _counts_entries(self) -> list[dict[str, object]]:
        """One entry per kind of loss that grew since the last: `N lines ... (in all)`."""
        found = []
        told = self._reported
        for kind, why in (
            ("over_rate", f"over the deployment's limit of {self.lines_per_second} lines per second"),
            ("queue_full", "while the queue to Cloud Logging was full"),
            ("send_failed", "because Cloud Logging did not accept them"),
        ):
            now_count = getattr(self.counts, kind)
            if now_count > getattr(told, kind):
                setattr(told, kind, now_count)
                text = f"[tpujobs-agent] {now_count} lines in all were not sent to Cloud Logging {why}"
                found.append(self._entry(text, "agent", self.clock()))
        return found

    def _send_pending(self) -> None:
        """Every queued line, in batches, then (once per round) the counts that grew."""
        counted = False
        while True:
            with self._cond:
                batch: list[dict[str, object]] = []
                size = 0
                while self._queue and len(batch) < MAX_BATCH_ENTRIES and size < MAX_BATCH_BYTES:
                    entry = self._queue.popleft()
                    size += len(str(entry["textPayload"])) + 300
                    batch.append(entry)
                if not self._queue and not counted:
                    batch.extend(self._counts_entries())
                    counted = True
            if not batch:
                return
            self._send(batch)

    def _send(self, batch: list[dict[str, object]]) -> None:
        body = {"logName": self.log_name, "resource": self.resource, "entries": batch}
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        try:
            self.api.call(
                "POST", "/v2/entries:write", data, "application/json", SEND_ATTEMPTS, timeout=SEND_TIMEOUT_SECONDS
            )
            self.sent += len(batch)
        except Exception as error:  # never the command's problem: count, say once, go on
            with self._cond:
                first = self.counts.send_failed == 0
                self.counts.send_failed += len(batch)
            if first:
                log(f"Cloud Logging did not take {len(batch)} lines of output: {error}")

    def close(self, timeout: float = 10.0) -> None:
        """Sends what is queued, within `timeout`; what is left then is lost (the GCS export has it)."""
        for stream in list(self._partial):
            self.flush(stream)
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log("Cloud Logging: output still queued when the agent ended")


def build_sink(
    config: dict[str, Any],
    metadata: Metadata,
    environ: dict[str, str],
    tokens: TokenSource | None,
    publisher: Publisher,
    slice_id: int,
    worker_id: int,
) -> CloudLogSink | None:
    """The attempt's sink when its config turns Cloud Logging on (`cloud_logging`), else None.

    The resource is this VM (`gce_instance`: a TPU VM is one), named by the metadata server."""
    wanted = config.get("cloud_logging")
    if not isinstance(wanted, dict) or not wanted.get("log_name"):
        return None
    tokens = tokens or TokenSource(metadata)
    identity = EntryIdentity(config["job_id"], config["attempt"], slice_id, worker_id, publisher.key, publisher.names)
    local = environ.get(LOGGING_ENDPOINT_VARIABLE, "").strip()
    api = GoogleApi(local if "://" in local else "http://" + local, tokens, direct=True) if local else None
    api = api or GoogleApi(LOGGING_API, tokens)
    labels = {"project_id": str(config["project"])}
    for label, path in (("instance_id", "instance/id"), ("zone", "instance/zone")):
        try:
            value = metadata.get_optional(path) or ""
        except Exception:  # the resource's names are not worth failing the attempt over
            value = ""
        labels[label] = value.rsplit("/", 1)[-1].strip()
    resource: dict[str, object] = {"type": "gce_instance", "labels": labels}
    rate = wanted.get("lines_per_second")
    rate = rate if isinstance(rate, int) and not isinstance(rate, bool) and rate > 0 else 100
    return CloudLogSink(api, str(wanted["log_name"]), resource, identity, rate)

"""Exported logs: an ended attempt's output chunks, put together per worker and combined.

On `tpujobs-log-export` ({"job_id", "attempt"}), `export_logs` writes `attempt-N/worker-K.log` for each
worker and `attempt-N/attempt.log` (every worker's lines, worker 0 first) beside the agents' chunks.
Idempotent and streamed: an object whose MD5 already matches is not uploaded again, and no log is held
whole. Unsettled workers are waited for, then redelivery is asked for, then what there is gets exported
with a cut-off line. The protocol and its reasons: docs/architecture.md#exporting-an-attempts-logs.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from tpujobs.domain.job import Job
from tpujobs.domain.naming import CODE_PREFIX, job_prefix
from tpujobs.domain.states import JobState
from tpujobs.engine import process_log
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.export_requests import LogExportRequest
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.messages import ReportError, decode_report
from tpujobs.engine.ports import AttemptLogs, Clock, JobStore, OutputBucket, Rejection

log = logging.getLogger(__name__)

SETTLE_SECONDS = 10.0  # a worker with no complete.json whose newest chunk is older is done writing
WAIT_IN_CALL_SECONDS = 10.0  # then TransientError: Pub/Sub redelivers after its backoff
MAX_WAIT_SECONDS = 40.0  # after the attempt's end: export what there is, cut-off lines and all
POLL_SECONDS = 1.0
CONTENT_TYPE = "text/plain; charset=utf-8"

# The end of an attempt, as the timeline records it (the event's `attempt` is the one that ended).
ATTEMPT_ENDS = frozenset({JobState.RECOVERING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

_CHUNK_OBJECT = re.compile(
    r"^chunks/slice-(?P<slice>[0-9]+)-worker-(?P<worker>[0-9]+)/"
    r"(?:(?P<seq>[0-9]+)\.log|(?P<complete>complete\.json))$"
)


# --- names and bytes (pure) -------------------------------------------------------------


def attempt_prefix(job_id: str, attempt: int, account: str | None = None) -> str:
    """The object prefix of one attempt's output: `logs/jobs/{job}/attempt-{N}/`, or
    `logs/accounts/{account}/jobs/{job}/attempt-{N}/` for a job on its own service account
    (`naming.job_prefix`)."""
    return f"{job_prefix(job_id, account)}attempt-{attempt}/"


def worker_log_name(job_id: str, attempt: int, worker: int, account: str | None = None) -> str:
    return f"{attempt_prefix(job_id, attempt, account)}worker-{worker}.log"


def attempt_log_name(job_id: str, attempt: int, account: str | None = None) -> str:
    return f"{attempt_prefix(job_id, attempt, account)}attempt.log"


def worker_number(slice_id: int, worker_id: int, hosts_per_slice: int) -> int:
    """K of `worker-K.log`: slice-major, so a single-slice job's K is its TPUJOBS_WORKER_ID."""
    return slice_id * hosts_per_slice + worker_id


def cut_off_line(worker: int) -> bytes:
    """The last line of a worker's log when its agent did not finish uploading it."""
    return (
        f"[tpujobs] output cut off: worker {worker} stopped before its output was complete "
        "(the host was preempted or lost)\n"
    ).encode()


def worker_log_parts(output: Iterable[bytes], cut_off: bool, worker: int) -> Iterator[bytes]:
    """A worker's exported log, as a stream: its output's pieces as they come, then, when it
    was cut off, the cut-off line on a line of its own."""
    last = b""
    for piece in output:
        if piece:
            last = piece[-1:]
            yield piece
    if cut_off:
        yield (b"\n" if last not in (b"", b"\n") else b"") + cut_off_line(worker)


def prefixed_lines(worker: int, text: bytes) -> bytes:
    """Every line of `text` as `[worker K] line`; a last line without a newline gets one."""
    return b"".join(prefixed_parts(worker, [text]))


def prefixed_parts(worker: int, pieces: Iterable[bytes]) -> Iterator[bytes]:
    """`prefixed_lines` as a stream: a line split across two pieces comes out whole, once its
    end has come (only that line's start is held meanwhile)."""
    prefix = f"[worker {worker}] ".encode()
    start = b""
    for piece in pieces:
        lines = (start + piece).split(b"\n")
        start = lines.pop()
        if lines:
            yield b"".join(prefix + line + b"\n" for line in lines)
    if start:
        yield prefix + start + b"\n"


def combined_log(worker_logs: Mapping[int, bytes]) -> bytes:
    """The attempt's log: each worker's lines, prefixed, worker 0 first."""
    return b"".join(combined_parts((k, [worker_logs[k]]) for k in sorted(worker_logs)))


def combined_parts(workers: Iterable[tuple[int, Iterable[bytes]]]) -> Iterator[bytes]:
    """`combined_log` as a stream, from each worker's log as a stream, in worker order: one
    worker's stream is read at a time, so the combined log costs the memory of one piece."""
    for worker, pieces in workers:
        yield from prefixed_parts(worker, pieces)


# --- what the bucket holds -------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    seq: int
    name: str
    updated: datetime | None


@dataclass
class WorkerOutput:
    """The chunk objects of one worker host of one attempt, as listed."""

    slice_id: int
    worker_id: int
    chunks: list[Chunk] = field(default_factory=list)
    complete_name: str | None = None  # complete.json, when the agent wrote it
    complete: Mapping[str, Any] | None = None  # its content, once read
    newest: datetime | None = None  # the latest update time among its objects

    def sorted_chunks(self) -> list[Chunk]:
        return sorted(self.chunks, key=lambda chunk: chunk.seq)

    @property
    def is_complete(self) -> bool:
        """The agent said it finished, and every chunk it counted is here (0 .. chunks-1)."""
        if self.complete is None:
            return False
        count = self.complete.get("chunks")
        return isinstance(count, int) and [c.seq for c in self.sorted_chunks()] == list(range(count))

    def settled(self, now: datetime, settle_seconds: float) -> bool:
        """Nothing more is coming: complete, or quiet for settle_seconds."""
        if self.is_complete:
            return True
        return self.newest is None or (now - self.newest).total_seconds() >= settle_seconds


class OutputObjects:
    """An attempt's output in the logs bucket (a `OutputBucket` port: `adapters.output_bucket`):
    its chunk objects worker by worker, and the logs exported from them."""

    def __init__(self, bucket: OutputBucket) -> None:
        self.bucket = bucket

    def uri(self, name: str) -> str:
        return self.bucket.uri(name)

    def worker_outputs(
        self, job_id: str, attempt: int, account: str | None = None
    ) -> dict[tuple[int, int], WorkerOutput]:
        """(slice, worker) -> its chunk objects; complete.json is read where there is one."""
        prefix = attempt_prefix(job_id, attempt, account)
        outputs: dict[tuple[int, int], WorkerOutput] = {}
        for stored in self.bucket.list_objects(prefix + "chunks/"):
            match = _CHUNK_OBJECT.match(stored.name[len(prefix) :])
            if match is None:
                continue
            key = (int(match["slice"]), int(match["worker"]))
            output = outputs.setdefault(key, WorkerOutput(*key))
            updated = stored.updated
            if updated is not None and (output.newest is None or updated > output.newest):
                output.newest = updated
            if match["complete"]:
                output.complete_name = stored.name
            else:
                output.chunks.append(Chunk(int(match["seq"]), stored.name, updated))
        for output in outputs.values():
            if output.complete_name is not None:
                output.complete = _json_object(self.bucket.read(output.complete_name))
        return outputs

    def read(self, name: str) -> bytes | None:
        """The object's bytes; None when there is no such object."""
        return self.bucket.read(name)

    def chunks_text(self, chunks: list[Chunk]) -> bytes:
        """The chunks' bytes, concatenated in the order given (a vanished chunk counts as empty)."""
        return b"".join(data or b"" for data in self.bucket.read_all([chunk.name for chunk in chunks]))

    def chunk_stream(self, chunks: list[Chunk]) -> Iterator[bytes]:
        """The chunks' bytes one chunk at a time, in the order given, read as they are asked
        for (a few ahead); a vanished chunk counts as empty."""
        for data in self.bucket.read_each([chunk.name for chunk in chunks]):
            yield data or b""

    def write_stream_if_changed(self, name: str, stream: Callable[[], Iterable[bytes]]) -> bool:
        """Upload the bytes `stream()` makes unless the object holds exactly them; whether it
        uploaded. `stream()` is called twice (hash, then upload): never held whole."""
        return self.bucket.write_stream_if_changed(name, stream, CONTENT_TYPE)

    def mark_code_used(self, code_uri: str | None, at: datetime) -> bool:
        """Move the custom time of a job's code tarball forward to `at`, if the tarball is one
        the CLI uploaded to this bucket (`code/...`); whether it moved. Code elsewhere is not ours
        to keep, and a tarball already gone stays gone."""
        base = self.bucket.uri(CODE_PREFIX)
        if not code_uri or not code_uri.startswith(base):
            return False
        return self.bucket.mark_used(CODE_PREFIX + code_uri[len(base) :], at)


# --- the export ------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportResult:
    """What one export did: the URIs of the attempt's logs, or why there was nothing to do."""

    job_id: str
    attempt: int
    log_uri: str | None = None  # the combined log; None when nothing was exported
    worker_logs: Mapping[int, str] = field(default_factory=dict)  # K -> gs:// URI
    cut_off_workers: tuple[int, ...] = ()
    written: tuple[str, ...] = ()  # objects uploaded this time; unchanged ones are skipped
    reason: str = ""  # when nothing was exported: why


def attempt_has_ended(job: Job, attempt: int) -> bool:
    """Whether the attempt is over: the job moved past it, or is recovering from it or ended."""
    return attempt < job.attempt or (
        attempt == job.attempt and (job.state is JobState.RECOVERING or job.state.is_terminal)
    )


class OutputExporter:
    """Puts ended attempts' output together, on a storage client, the job store and a clock."""

    def __init__(
        self,
        objects: OutputObjects,
        store: JobStore,
        clock: Clock,
        sleep: Callable[[float], None] = time.sleep,
        settle_seconds: float = SETTLE_SECONDS,
        wait_in_call_seconds: float = WAIT_IN_CALL_SECONDS,
        max_wait_seconds: float = MAX_WAIT_SECONDS,
    ) -> None:
        self.objects = objects
        self.store = store
        self.clock = clock
        self.sleep = sleep
        self.settle_seconds = settle_seconds
        self.wait_in_call_seconds = wait_in_call_seconds
        self.max_wait_seconds = max_wait_seconds

    def handle(self, message: InboundMessage) -> ExportResult | None:
        """tpujobs-log-export: decode the request and export. Bad input is recorded as a
        rejection and acknowledged; a PermanentError is logged and acknowledged; only
        TransientError (late chunks, storage or Firestore unavailable) makes Pub/Sub redeliver."""
        try:
            request = decode_report(LogExportRequest, message.data)
        except ReportError as error:
            reason = message.undecodable or str(error)
            log.warning("rejected message %s on %s: %s", message.message_id, message.topic, reason)
            self.store.reject(
                Rejection(message.message_id, self.clock(), reason, message.payload_text(), message.topic)
            )
            return None
        process_log.bind_job(request.job_id)
        try:
            return self.export(request.job_id, request.attempt)
        except PermanentError as error:
            log.error("logs of %s attempt %d not exported: %s", request.job_id, request.attempt, error)
            return None

    def export(self, job_id: str, attempt: int) -> ExportResult:
        """Write worker-K.log for every worker with output, and attempt.log; record their URIs.

        A missing job, an attempt that has not ended, or one without output: nothing to do.
        """
        job = self.store.get(job_id)
        if job is None:
            return ExportResult(job_id, attempt, reason=f"no job {job_id!r}")
        if not attempt_has_ended(job, attempt):
            return ExportResult(job_id, attempt, reason=f"attempt {attempt} has not ended")
        self._keep_code(job)
        outputs = self._settled_outputs(job, attempt)
        if not outputs:
            return ExportResult(job_id, attempt, reason=f"attempt {attempt} has no output")

        hosts = job.spec.hosts_per_slice
        # (slice, worker) order is K order: K = slice * hosts_per_slice + worker.
        workers = [(worker_number(s, w, hosts), output) for (s, w), output in sorted(outputs.items())]
        cut_off = [k for k, output in workers if not output.is_complete]

        written = []
        worker_uris = {}
        for k, output in workers:
            name = worker_log_name(job_id, attempt, k, job.spec.service_account)
            if self.objects.write_stream_if_changed(name, partial(self._worker_stream, k, output)):
                written.append(name)
            worker_uris[k] = self.objects.uri(name)
        name = attempt_log_name(job_id, attempt, job.spec.service_account)
        if self.objects.write_stream_if_changed(name, partial(self._combined_stream, workers)):
            written.append(name)
        result = ExportResult(
            job_id,
            attempt,
            self.objects.uri(name),
            worker_uris,
            tuple(cut_off),
            tuple(written),
        )
        self.store.record_attempt_logs(
            job_id,
            AttemptLogs(attempt, self.objects.uri(name), worker_uris, self.clock(), tuple(cut_off)),
        )
        log.info(
            "exported %d worker log(s) of %s attempt %d (%d uploaded, cut off: %s)",
            len(workers),
            job_id,
            attempt,
            len(written),
            ", ".join(map(str, cut_off)) or "none",
        )
        return result

    def _worker_stream(self, k: int, output: WorkerOutput) -> Iterator[bytes]:
        """Worker K's exported log as a stream of its chunks, read as they are needed."""
        return worker_log_parts(self.objects.chunk_stream(output.sorted_chunks()), not output.is_complete, k)

    def _combined_stream(self, workers: list[tuple[int, WorkerOutput]]) -> Iterator[bytes]:
        """attempt.log as a stream: each worker's stream in turn, opened only when reached."""
        return combined_parts((k, self._worker_stream(k, output)) for k, output in workers)

    def _keep_code(self, job: Job) -> None:
        """Mark the job's code as used now, so the code lifecycle rule keeps it while the job
        may resume. A refusal is logged, not fatal: the logs are worth exporting regardless;
        a TransientError propagates, and the redelivered export does it again."""
        try:
            self.objects.mark_code_used(job.spec.code_uri, self.clock())
        except PermanentError as error:
            log.warning("code of %s not marked as used: %s", job.job_id, error)

    def _settled_outputs(self, job: Job, attempt: int) -> dict[tuple[int, int], WorkerOutput]:
        """The attempt's outputs once every worker is settled, or once waiting is over.

        Waits here up to wait_in_call_seconds; TransientError when workers are still writing
        and the attempt ended less than max_wait_seconds ago, so Pub/Sub redelivers.
        """
        job_id = job.job_id
        started = self.clock()
        ended_at: datetime | None = None
        while True:
            outputs = self.objects.worker_outputs(job_id, attempt, job.spec.service_account)
            now = self.clock()
            unsettled = sorted(key for key, output in outputs.items() if not output.settled(now, self.settle_seconds))
            if not unsettled:
                return outputs
            if ended_at is None:
                ended_at = self._ended_at(job_id, attempt) or job.ended_at or job.updated_at or now
            if (now - ended_at).total_seconds() >= self.max_wait_seconds:
                log.warning(
                    "%s attempt %d: workers %s still incomplete %.0f s after the end; exporting what there is",
                    job_id,
                    attempt,
                    unsettled,
                    (now - ended_at).total_seconds(),
                )
                return outputs
            if (now - started).total_seconds() >= self.wait_in_call_seconds:
                raise TransientError(f"{job_id} attempt {attempt}: workers {unsettled} are still writing their output")
            self.sleep(POLL_SECONDS)

    def _ended_at(self, job_id: str, attempt: int) -> datetime | None:
        """When the attempt ended: its first ending entry in the job's timeline."""
        for event in self.store.events(job_id):
            if event.attempt == attempt and event.to_state in ATTEMPT_ENDS:
                return event.at
        return None


# --- reading, for `tpujobs logs` -------------------------------------------------------


class LogReader:
    """What `tpujobs logs` shows: an attempt's exported log, else its chunks as they are;
    or, following a running attempt, its new output as it arrives."""

    def __init__(self, objects: OutputObjects, store: JobStore, sleep: Callable[[float], None] = time.sleep) -> None:
        self.objects = objects
        self.store = store
        self.sleep = sleep

    def show(self, job: Job, attempt: int, worker: int | None = None) -> tuple[bytes, bool]:
        """The combined log (or worker K's) and whether it is the exported one."""
        if worker is None:
            exported = self.objects.read(attempt_log_name(job.job_id, attempt, job.spec.service_account))
        else:
            exported = self.objects.read(worker_log_name(job.job_id, attempt, worker, job.spec.service_account))
        if exported is not None:
            return exported, True
        texts = {
            k: self.objects.chunks_text(output.sorted_chunks())
            for k, output in self._numbered(job, attempt).items()
            if worker is None or k == worker
        }
        if worker is not None:
            return texts.get(worker, b""), False
        return combined_log(texts), False

    def follow(
        self,
        job: Job,
        attempt: int,
        write: Callable[[bytes], None],
        worker: int | None = None,
        poll_seconds: float = 1.0,
        tail_seconds: float = 5.0,
    ) -> None:
        """Write new output of the attempt as it arrives (all workers' lines prefixed, or
        worker K's bytes as they are) until the attempt has ended and its workers finished
        uploading (complete.json, or tail_seconds after the end)."""
        shown: dict[int, int] = {}  # K -> chunks written so far
        partial: dict[int, bytes] = {}  # K -> the start of a line whose end has not come yet
        ended_for = 0.0
        while True:
            current = self.store.get(job.job_id)
            ended = current is None or attempt_has_ended(current, attempt)
            numbered = self._numbered(job, attempt)
            for k, output in sorted(numbered.items()):
                if worker is not None and k != worker:
                    continue
                fresh: list[Chunk] = []
                for chunk in output.sorted_chunks():
                    if chunk.seq == shown.get(k, 0) + len(fresh):  # in order, no gap
                        fresh.append(chunk)
                if not fresh:
                    continue
                data = self.objects.chunks_text(fresh)
                shown[k] = shown.get(k, 0) + len(fresh)
                if worker is not None:
                    write(data)
                    continue
                text = partial.pop(k, b"") + data
                whole, newline, rest = text.rpartition(b"\n")
                if rest:
                    partial[k] = rest
                if newline:
                    write(prefixed_lines(k, whole + newline))
            if ended:
                watched = [o for k, o in numbered.items() if worker is None or k == worker]
                if ended_for >= tail_seconds or all(o.is_complete for o in watched):
                    for k in sorted(partial):
                        write(prefixed_lines(k, partial[k]))
                    return
                ended_for += poll_seconds
            self.sleep(poll_seconds)

    def _numbered(self, job: Job, attempt: int) -> dict[int, WorkerOutput]:
        hosts = job.spec.hosts_per_slice
        return {
            worker_number(slice_id, worker_id, hosts): output
            for (slice_id, worker_id), output in self.objects.worker_outputs(
                job.job_id, attempt, job.spec.service_account
            ).items()
        }


def _json_object(data: bytes | None) -> Mapping[str, Any] | None:
    try:
        value = json.loads(data or b"")
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None

"""The messages that come in on every topic but `tpujobs-submit`, validated at the door.

Each is a small strict pydantic model; a message that does not fit becomes a
`ReportError` with a sentence naming the field, which the service records as a
rejection and acknowledges. The worker agent (`agent/worker.py`) writes the first two.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from tpujobs.domain.pools import MAX_UNITS
from tpujobs.domain.spec import (
    ID_PATTERN,
    MAX_RETRY_PATTERNS,
    OWNER_PATTERN,
    POOL_NAME_PATTERN,
    ZONE_PATTERN,
    DuplicateKey,
    require_unicode_text,
    unique_keys,
)

MAX_REPORT_BYTES = 16 * 1024
MAX_LAST_LINES = 20  # of a failed command's output, and at most MAX_LAST_LINES_CHARS of text
MAX_LAST_LINES_CHARS = 4096
MAX_RETRY_LINE_CHARS = 256
# An audit-log entry of a queued resource's creation carries its request, startup script and all.
MAX_AUDIT_ENTRY_BYTES = 1024 * 1024
TPU_SERVICE = "tpu.googleapis.com"
_QR_PATH = re.compile(
    r"projects/[^/]+/locations/([a-z]+-[a-z]+[0-9]+-[a-z])/queuedResources/([a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)$"
)
JobId = Annotated[str, Field(pattern=ID_PATTERN)]
Attempt = Annotated[int, Field(ge=1, le=10_000)]
Index = Annotated[int, Field(ge=0, le=100_000)]
ExitCode = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
Step = Annotated[int, Field(ge=0, le=2**62)]
ImageDigest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
EARLIEST = datetime(2000, 1, 1, tzinfo=timezone.utc)
LATEST = datetime(2200, 1, 1, tzinfo=timezone.utc)


def _plausible(moment: datetime | None) -> datetime | None:
    """A report's time, in UTC, within years Firestore (and reason) can hold."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    try:
        moment = moment.astimezone(timezone.utc)
    except OverflowError:
        raise ValueError("is out of range") from None
    if not EARLIEST <= moment < LATEST:
        raise ValueError("must be between the years 2000 and 2200")
    return moment


def _bounded_text(lines: list[str]) -> list[str]:
    if sum(len(line) for line in lines) > MAX_LAST_LINES_CHARS:
        raise ValueError(f"must hold at most {MAX_LAST_LINES_CHARS} characters in all")
    return lines


LastLines = Annotated[
    list[Annotated[str, Field(max_length=MAX_LAST_LINES_CHARS)]],
    Field(max_length=MAX_LAST_LINES),
    AfterValidator(_bounded_text),
]


# JSON has no datetime: timestamps arrive as RFC 3339 strings, so this one field is lax.
Timestamp = Annotated[datetime | None, Field(strict=False), AfterValidator(_plausible)]


class ReportError(ValueError):
    """A message on an inbound topic that cannot be used; the message names the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


# A fresh random value in every signed report: two reports never have the same bytes, so
# the same signature seen under two message ids is a replay (`tpujobs.domain.signing`).
Nonce = Annotated[str, Field(pattern=r"^[0-9a-f]{16,64}$")]
PeerId = Annotated[int, Field(ge=1, le=100_000)]  # a peer of worker 0 in its slice, never worker 0


class WorkerReport(_Strict):
    """tpujobs-worker-events: what one worker host's agent says about its command.

    `aborted`: the attempt could not run its command for a reason no restart fixes (a
    secret missing or unreadable, code whose digest differs); `detail` says which.
    `rebooted`: the agent started again for an attempt that had already started on its
    host (the VM rebooted and re-ran its startup script), so the attempt lost that host;
    it ran nothing, and `detail` says what it found of the first start.
    `started` may carry `image_digest`: the container image the host runs the command in, as
    it pulled it. `exited` may carry `detail` when the agent itself ended the attempt (an image
    it could not pull): the job's reason then says so.
    `peer_silent`: worker 0 of a multi-host slice heard nothing over the slice's network for
    its peer timeout from `peer_worker_id`, a peer it had heard (`agent/worker.py`, SliceLink).

    Liveness (`started`, `heartbeat`): `next_report_seconds` says when this host reports next,
    so the service knows when it is silent; `watch: slice` says worker 0 of its slice speaks
    for it from now on (its heartbeats stop). Neither: an agent from before both, whose
    heartbeats come every `heartbeat_seconds` of the deployment. Worker 0's `exited` 0 with
    `peers_heard` (and `next_report_seconds`): its command ended, but it goes on heartbeating
    for those peers until they end, so its record stays live (`service.speaks_after_exit`).
    """

    kind: Literal["started", "heartbeat", "exited", "checkpoint", "aborted", "rebooted", "peer_silent"]
    job_id: JobId
    attempt: Attempt
    slice_id: Index
    worker_id: Index
    at: Timestamp
    nonce: Nonce
    exit_code: ExitCode | None = None
    step: Step | None = None
    detail: str | None = Field(default=None, max_length=1024)
    image_digest: ImageDigest | None = None
    # `heartbeat`: when the command last printed a line (progress for `hang_timeout`), if ever.
    last_output_at: Timestamp = None
    # `exited`: when the host started the job (setup or command), so an exit handled before its
    # `started` report (push delivery does not keep order) still counts the chip time between.
    command_started_at: Timestamp = None
    # `exited`: the agent stopped the command itself because this time limit ran out.
    limit: Literal["time_limit", "attempt_time_limit"] | None = None
    # A failed `exited`: the output's last lines (secrets cut out), and which retry_on.output
    # pattern (its index) the agent found in which of them (`tpujobs.domain.error_classes`).
    last_lines: LastLines | None = None
    retry_pattern: Annotated[int, Field(ge=0, lt=MAX_RETRY_PATTERNS)] | None = None
    retry_line: str | None = Field(default=None, max_length=MAX_RETRY_LINE_CHARS)
    next_report_seconds: Annotated[float, Field(gt=0, le=3600, strict=False)] | None = None
    watch: Literal["slice"] | None = None
    # Worker 0's `heartbeat`: its slice's latest checkpoint time (`step` is its step) and how
    # many of its peers it hears.
    checkpoint_at: Timestamp = None
    peers_heard: Annotated[int, Field(ge=0, le=100_000)] | None = None
    peer_worker_id: PeerId | None = None
    # Worker 0's `heartbeat`: the peers it reported silent (`peer_silent`) and never heard a bye
    # from since. The service takes the first as `peer_silent` again, so a report lost for good
    # (dead-lettered) still loses the host at worker 0's next heartbeat.
    peers_silent: Annotated[list[PeerId], Field(min_length=1, max_length=64)] | None = None


class PreemptionNotice(_Strict):
    """tpujobs-preemption: a worker got notice that its VM is being preempted."""

    job_id: JobId
    attempt: Attempt
    slice_id: Index = 0
    worker_id: Index = 0
    reason: str = Field(default="preemption notice", max_length=256)
    at: Timestamp
    nonce: Nonce


SignedReport = WorkerReport | PreemptionNotice


class QrStateReport(_Strict):
    """tpujobs-qr-state: an observed state of a queued resource (reconciler, audit-log sink)."""

    queued_resource: Annotated[str, Field(pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$", max_length=63)]
    zone: Annotated[str, Field(pattern=ZONE_PATTERN)]
    state: Annotated[str, Field(pattern=r"^[A-Z_]{1,40}$")]
    detail: str = Field(default="", max_length=1024)
    # Hosts whose node is TERMINATED, PREEMPTED or unhealthy.
    unhealthy_hosts: Annotated[int, Field(ge=0, le=100_000)] = 0


class ControlRequest(_Strict):
    """tpujobs-control: a user's request about a job."""

    action: Literal["cancel", "resume", "rerun"]
    job_id: JobId
    owner: Annotated[str, Field(pattern=OWNER_PATTERN)]
    # resume, rerun: the request's id (default: the message id), so a retry starts nothing, and the
    # spec fields to change (`domain.restart.OVERRIDABLE`; checked there, each refusal a sentence).
    request_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,128}$")] | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)


PoolName = Annotated[str, Field(pattern=POOL_NAME_PATTERN)]
Owner = Annotated[str, Field(pattern=OWNER_PATTERN)]


class _PoolControl(BaseModel):
    """A warm pool's request on tpujobs-control: unlike the agents' reports, a field it does not
    know is an error, so a misspelt `count` is refused, not ignored. `owner` is a claim (the
    topic checks no one): `tpujobs.engine.pool_service` decides what it may do."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    owner: Owner


class PoolCreateRequest(_PoolControl):
    """`{"action": "pool-create", "owner", "pool": {name, accelerator_type, ...}}`: the pool's
    fields as the jobs API's pool-create takes them (checked by `domain.warm_pools`)."""

    action: Literal["pool-create"]
    pool: dict[str, Any]

    @field_validator("pool")
    @classmethod
    def _owner_is_the_message_s(cls, pool: dict[str, Any]) -> dict[str, Any]:
        if "owner" in pool:
            raise ValueError("must not name an owner: the message's owner owns the pool")
        return pool


class PoolResizeRequest(_PoolControl):
    """`{"action": "pool-resize", "owner", "name", "count"}`."""

    action: Literal["pool-resize"]
    name: PoolName
    count: Annotated[int, Field(ge=1, le=MAX_UNITS)]


class PoolDeleteRequest(_PoolControl):
    """`{"action": "pool-delete", "owner", "name"}`."""

    action: Literal["pool-delete"]
    name: PoolName


PoolControlRequest = PoolCreateRequest | PoolResizeRequest | PoolDeleteRequest
POOL_CONTROL: dict[str, type[PoolControlRequest]] = {
    "pool-create": PoolCreateRequest,
    "pool-resize": PoolResizeRequest,
    "pool-delete": PoolDeleteRequest,
}


class LogExportRequest(_Strict):
    """tpujobs-log-export: put one ended attempt's output chunks together (`tpujobs.engine.output_export`)."""

    job_id: JobId
    attempt: Attempt


Report = TypeVar("Report", bound=_Strict)
Model = TypeVar("Model", bound=BaseModel)


def decode_control(raw: bytes | None) -> ControlRequest | PoolControlRequest:
    """A tpujobs-control message: a job's request, or a warm pool's (by its `action`)."""
    data = _message_object(raw)
    pool_model = POOL_CONTROL.get(str(data.get("action")))
    return _validated(pool_model, data) if pool_model is not None else _validated(ControlRequest, data)


def decode_report(model: type[Report], raw: bytes | None) -> Report:
    """One inbound message as `model`, or ReportError with the reason."""
    return _validated(model, _message_object(raw))


def _message_object(raw: bytes | None) -> dict[str, Any]:
    """The message as a JSON object of Unicode text, or ReportError saying why not."""
    if raw is None:
        raise ReportError("the message has no data")
    if len(raw) > MAX_REPORT_BYTES:
        raise ReportError(f"the message is {len(raw)} bytes; at most {MAX_REPORT_BYTES} are expected")
    try:
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=unique_keys)
    except UnicodeDecodeError:
        raise ReportError("the message is not valid UTF-8") from None
    except DuplicateKey as error:
        raise ReportError(str(error)) from None
    except (ValueError, RecursionError):  # JSONDecodeError, or a number too long to convert
        raise ReportError("the message is not JSON") from None
    if not isinstance(data, dict):
        raise ReportError(f"the message must be a JSON object, got {type(data).__name__}")
    try:
        require_unicode_text(data)
    except ValueError as error:
        raise ReportError(str(error)) from None
    return data


def _validated(model: type[Model], data: dict[str, Any]) -> Model:
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        field = ".".join(str(part) for part in first.get("loc", ())) or "the message"
        raise ReportError(f"field {field!r}: {first.get('msg', 'is invalid')}") from None


def audit_log_target(raw: bytes | None) -> tuple[str, str] | None:
    """(zone, queued resource) of a TPU audit-log entry that the log sink routed here, or None.

    The sink publishes Cloud Logging `LogEntry` JSON: `protoPayload` is the AuditLog, whose
    `resourceName` (or the operation's `response.name`, or the create request's `parent`
    and `queuedResourceId`) names the queued resource. The entry says what was done, not
    what state the resource is in now, so the service reads that from the TPU API.
    """
    if raw is None or len(raw) > MAX_AUDIT_ENTRY_BYTES:
        return None
    try:
        entry = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    payload = entry.get("protoPayload") if isinstance(entry, dict) else None
    if not isinstance(payload, dict) or payload.get("serviceName") != TPU_SERVICE:
        return None
    response = _json_object(payload.get("response"))
    request = _json_object(payload.get("request"))
    candidates = [payload.get("resourceName"), response.get("name")]
    if isinstance(request.get("parent"), str) and isinstance(request.get("queuedResourceId"), str):
        candidates.append(f"{request['parent']}/queuedResources/{request['queuedResourceId']}")
    for candidate in candidates:
        match = _QR_PATH.search(candidate) if isinstance(candidate, str) else None
        if match:
            return match[1], match[2]
    return None


def _json_object(value: Any) -> dict[str, Any]:
    """A decoded JSON value if it is an object, else an empty one: a field to read further."""
    return value if isinstance(value, dict) else {}

"""tpujobs-worker-events and tpujobs-preemption: what the worker agent (`tpujobs.agent`) says.

Both are signed (`tpujobs.domain.signing`); their limits are the agent's wire contract
(`tpujobs.agent.wire`), written once for both sides.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from tpujobs.agent.wire import MAX_DETAIL_CHARS, MAX_LAST_LINES, MAX_LAST_LINES_CHARS, MAX_RETRY_LINE_CHARS
from tpujobs.domain.spec import MAX_RETRY_PATTERNS
from tpujobs.engine.messages import Attempt, JobId, Strict, Timestamp

Index = Annotated[int, Field(ge=0, le=100_000)]
ExitCode = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
Step = Annotated[int, Field(ge=0, le=2**62)]
ImageDigest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


def _bounded_text(lines: list[str]) -> list[str]:
    if sum(len(line) for line in lines) > MAX_LAST_LINES_CHARS:
        raise ValueError(f"must hold at most {MAX_LAST_LINES_CHARS} characters in all")
    return lines


LastLines = Annotated[
    list[Annotated[str, Field(max_length=MAX_LAST_LINES_CHARS)]],
    Field(max_length=MAX_LAST_LINES),
    AfterValidator(_bounded_text),
]


# A fresh random value in every signed report: two reports never have the same bytes, so
# the same signature seen under two message ids is a replay (`tpujobs.domain.signing`).
Nonce = Annotated[str, Field(pattern=r"^[0-9a-f]{16,64}$")]
PeerId = Annotated[int, Field(ge=1, le=100_000)]  # a peer of worker 0 in its slice, never worker 0


class WorkerReport(Strict):
    """tpujobs-worker-events: what one worker host's agent says about its command.

    `aborted`: the attempt could not run its command for a reason no restart fixes (a
    secret missing or unreadable, code whose digest differs); `detail` says which.
    `rebooted`: the agent started again for an attempt that had already started on its
    host (the VM rebooted and re-ran its startup script), so the attempt lost that host;
    it ran nothing, and `detail` says what it found of the first start.
    `started` may carry `image_digest`: the container image the host runs the command in, as
    it pulled it. `exited` may carry `detail` when the agent itself ended the attempt (an image
    it could not pull): the job's reason then says so.
    `stopped`: after its preemption notice, the host's command ended (saved on SIGTERM, or
    killed at the grace's end), with `exit_code`: its worker's record only, never the job's
    state (the notice decided that), so the next attempt's key need not wait out the grace.
    `peer_silent`: worker 0 of a multi-host slice heard nothing over the slice's network for
    its peer timeout from `peer_worker_id`, a peer it had heard (`agent/slice_link.py`, SliceLink).

    Liveness (`started`, `heartbeat`): `next_report_seconds` says when this host reports next,
    so the service knows when it is silent; `watch: slice` says worker 0 of its slice speaks
    for it from now on (its heartbeats stop). Neither: an agent from before both, whose
    heartbeats come every `heartbeat_seconds` of the deployment. Worker 0's `exited` 0 with
    `peers_heard` (and `next_report_seconds`): its command ended, but it goes on heartbeating
    for those peers until they end, so its record stays live (`service.speaks_after_exit`).
    """

    kind: Literal[
        "started", "heartbeat", "exited", "checkpoint", "aborted", "rebooted", "peer_silent", "maintenance", "stopped"
    ]
    job_id: JobId
    attempt: Attempt
    slice_id: Index
    worker_id: Index
    at: Timestamp
    nonce: Nonce
    exit_code: ExitCode | None = None
    step: Step | None = None
    detail: str | None = Field(default=None, max_length=MAX_DETAIL_CHARS)
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
    # `maintenance`: the host's `instance/upcoming-maintenance`, as Google scheduled it.
    window_start: Timestamp = None
    window_end: Timestamp = None
    maintenance_type: Annotated[str, Field(pattern=r"^[A-Z_]{1,40}$")] | None = None


class PreemptionNotice(Strict):
    """tpujobs-preemption: a worker got notice that its VM is being preempted."""

    job_id: JobId
    attempt: Attempt
    slice_id: Index = 0
    worker_id: Index = 0
    reason: str = Field(default="preemption notice", max_length=256)
    at: Timestamp
    nonce: Nonce


SignedReport = WorkerReport | PreemptionNotice

"""The runner of `tpujobs drill`: one job run twice on the local stack, once left alone and once hit
by faults at chosen points, then judged by `tpujobs.domain.drill` from both runs' output.

The spec comes prepared (checked, its code uploaded) from the CLI's submit path. Both runs are
submitted at once, as any client would (the submit topic); the faults are the simulator's
(`tpujobs.local.faults`), one per attempt of the drilled run, each when the attempt reaches its
point. The output is read from the Cloud Storage copy, as `tpujobs logs` reads it. What each
fault and point means: docs/resumable.md.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from tpujobs.agent.progress import Progress, parse_progress
from tpujobs.domain.drill import Outputs, Timeline, Verdict, judge
from tpujobs.domain.job import Job
from tpujobs.domain.states import JobState
from tpujobs.engine.output_export import Chunk, LogReader, OutputObjects, WorkerOutput
from tpujobs.engine.settings import Settings

FAULTS = {
    "preempt": "a Spot preemption with its notice",
    "maintenance": "scheduled maintenance: a window announced 10 s ahead; the job's maintenance rule acts",
    "silent": "worker 0 of slice 0 dies without notice (a host error)",
    "reboot": "every host resets: processes die at once, the startup script runs again",
    "sigterm": "SIGTERM to every host's processes with no notice (an unannounced shutdown)",
}
DEFAULT_FAULTS = "preempt,sigterm"
DEFAULT_AT = "checkpoint:1"
POLL_SECONDS = 0.25
OUTPUT_POLL_SECONDS = 1.0  # the output arrives in chunks every 2 s (the agent's chunk_seconds)
MAINTENANCE_LEAD_SECONDS = 10.0  # Google announces days ahead; the job's rule (wait, checkpoint-and-move) is the same
MAINTENANCE_WINDOW_SECONDS = 60.0
SETTLE_SECONDS = 20.0  # after the end: for the last output chunks (and complete.json) to land
FAULT_TRIES = 20  # a fault the simulator refuses (capacity not ACTIVE yet) is tried on the next polls


class DrillError(Exception):
    """The drill could not run (exit 2): no stack, an invalid plan, a timeout, a fault never injected."""


@dataclass(frozen=True)
class Point:
    """When a fault hits the attempt it is meant for: after its K-th checkpoint, its step N, or N s."""

    kind: str  # "checkpoint", "step" or "seconds"
    value: float

    @classmethod
    def parse(cls, text: str) -> Point:
        text = text.strip()
        if match := re.fullmatch(r"(checkpoint|step):([0-9]+)", text):
            if int(match.group(2)) < 1:
                raise ValueError(f"--at {text!r}: the count starts at 1")
            return cls(match.group(1), int(match.group(2)))
        if match := re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)s", text):
            return cls("seconds", float(match.group(1)))
        raise ValueError(f"--at {text!r} is none of checkpoint:K, step:N or Ns (seconds after RUNNING)")

    def reached(self, checkpoints: int, step: int | None, seconds: float) -> bool:
        """Whether the attempt is there: `checkpoints` it reported, the last `step` it printed, `seconds` RUNNING."""
        if self.kind == "checkpoint":
            return checkpoints >= self.value
        if self.kind == "step":
            return step is not None and step >= self.value
        return seconds >= self.value

    def __str__(self) -> str:
        return f"{self.value:g}s" if self.kind == "seconds" else f"{self.kind}:{int(self.value)}"


@dataclass(frozen=True)
class PlannedFault:
    fault: str
    at: Point


def fault_plan(faults: str | None = None, at: str | None = None) -> tuple[PlannedFault, ...]:
    """`--faults a,b` with `--at p,q`: one point per fault in order; fewer points repeat the last one."""
    names = [name.strip() for name in (DEFAULT_FAULTS if faults is None else faults).split(",") if name.strip()]
    unknown = [name for name in names if name not in FAULTS]
    if unknown or not names:
        raise ValueError(f"--faults {faults!r}: choose from {', '.join(FAULTS)}")
    points = [Point.parse(text) for text in (DEFAULT_AT if at is None else at).split(",") if text.strip()]
    if not points:
        raise ValueError("--at names no point")
    if len(points) > len(names):
        raise ValueError(f"--at has {len(points)} points for {len(names)} faults")
    return tuple(PlannedFault(name, points[min(i, len(points) - 1)]) for i, name in enumerate(names))


@dataclass
class Injected:
    """A planned fault as it went: which attempt it hit and when (seconds after the drill began)."""

    planned: PlannedFault
    attempt: int | None = None
    at_seconds: float | None = None
    checkpoint: int | None = None  # the attempt's newest reported checkpoint step when it hit
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "fault": self.planned.fault,
            "at": str(self.planned.at),
            "attempt": self.attempt,
            "after_seconds": None if self.at_seconds is None else round(self.at_seconds, 2),
            "checkpoint": self.checkpoint,
            "errors": self.errors[-3:],
        }


@dataclass(frozen=True)
class DrillResult:
    verdict: Verdict
    baseline_id: str
    drilled_id: str
    faults: tuple[Injected, ...]
    wall_seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            **self.verdict.to_json(),
            "jobs": {"uninterrupted": self.baseline_id, "drilled": self.drilled_id},
            "faults": [f.to_json() for f in self.faults],
            "wall_seconds": round(self.wall_seconds, 1),
        }


@dataclass
class _Watch:
    """The drilled job's current attempt as the drill sees it: from the job document (reported
    checkpoints, which may lag under load) and from the output uploaded so far (every few seconds)."""

    attempt: int
    running_since: float | None = None
    checkpoints: set[int] = field(default_factory=set)
    last_step: int | None = None
    read_at: float = 0.0  # when the output was last read (time.monotonic())
    read: dict[tuple[int, int], OutputCursor] = field(default_factory=dict)  # (slice, worker) -> its cursor


@dataclass
class OutputCursor:
    """How far one worker's output has been read: chunks are written once, in order, so each poll
    reads only the chunks after `next_seq`; `partial` is a line the next chunk will finish."""

    next_seq: int = 0
    partial: bytes = b""

    def new_lines(self, objects: OutputObjects, output: WorkerOutput) -> list[bytes]:
        chunks: list[Chunk] = []
        for chunk in output.sorted_chunks():
            if chunk.seq == self.next_seq + len(chunks):  # a gap waits for its chunk
                chunks.append(chunk)
        if not chunks:
            return []
        self.next_seq += len(chunks)
        lines = (self.partial + objects.chunks_text(chunks)).split(b"\n")
        self.partial = lines.pop()
        return lines


class Drill:
    """Submits both runs, injects the plan's faults into the drilled one, reads and judges the outputs."""

    def __init__(
        self,
        settings: Settings,
        state_dir: Path,
        spec: dict[str, Any],
        plan: tuple[PlannedFault, ...],
        timeout: float,
        say: Callable[[str], None],
    ) -> None:
        from google.cloud import firestore

        from tpujobs.adapters.firestore_store import FirestoreJobStore
        from tpujobs.adapters.pubsub import Publisher
        from tpujobs.runtime.instances import build_log_objects

        self.settings, self.state_dir, self.spec, self.plan = settings, state_dir, spec, plan
        self.timeout, self.say = timeout, say
        self.store = FirestoreJobStore(firestore.Client(project=settings.project))
        self.publisher = Publisher.build(settings.project, settings.prefix)
        self.objects = build_log_objects(settings)
        self.reader = LogReader(self.objects, self.store)

    def run(self) -> DrillResult:
        began = time.monotonic()
        tag = uuid.uuid4().hex[:6]
        baseline_id, drilled_id = f"drill-{tag}-base", f"drill-{tag}"
        for job_id in (baseline_id, drilled_id):
            self._submit(job_id)
        self.say(f"submitted {baseline_id} (left alone) and {drilled_id} (drilled: {self._plan_text()})")
        injected = self._drive(baseline_id, drilled_id, began)
        baseline, drilled = self._ended(baseline_id), self._ended(drilled_id)
        missed = [f for f in injected if f.attempt is None]
        if missed and drilled.state is JobState.SUCCEEDED:  # it ran out of work first; an end in failure is judged
            first = missed[0]
            raise DrillError(
                f"{drilled_id} ended {drilled.state.value} at attempt {drilled.attempt} before fault "
                f"{first.planned.fault} reached its point {first.planned.at}"
                + (f" ({first.errors[-1]})" if first.errors else "")
                + ": give the job more steps, or choose earlier points (--at)"
            )
        self._settle(baseline)
        self._settle(drilled)
        timeline = Timeline.of(drilled, self.store.events(drilled_id))
        verdict = judge(self._outputs(baseline), self._outputs(drilled), timeline, baseline.state.value)
        return DrillResult(verdict, baseline_id, drilled_id, tuple(injected), time.monotonic() - began)

    def _plan_text(self) -> str:
        return ", then ".join(f"{p.fault} at {p.at}" for p in self.plan)

    def _submit(self, job_id: str) -> None:
        from tpujobs.engine.topology import SUBMIT

        spec = {**self.spec, "job_id": job_id}
        # Each fault costs the drilled run one restart: enough of them that the faults alone never use them up.
        spec["max_restarts"] = max(int(spec.get("max_restarts") or 0), len(self.plan) + 2)
        self.publisher.publish_json(SUBMIT, spec)

    def _drive(self, baseline_id: str, drilled_id: str, began: float) -> list[Injected]:
        """Poll both jobs until they end; hit the drilled one's attempts as planned."""
        injected = [Injected(p) for p in self.plan]
        watch = _Watch(attempt=0)
        deadline = began + self.timeout
        while time.monotonic() < deadline:
            base, job = self.store.get(baseline_id), self.store.get(drilled_id)
            if job is not None and not job.state.is_terminal:
                watch = self._observe(job, watch)
                if self._due(job, watch, injected):
                    self._inject(job, watch, next(f for f in injected if f.attempt is None), began)
            if base is not None and job is not None and base.state.is_terminal and job.state.is_terminal:
                return injected
            time.sleep(POLL_SECONDS)
        raise DrillError(
            f"timed out after {self.timeout:g} s: {baseline_id} or {drilled_id} has not ended "
            "(they are left as they are; `tpujobs cancel` them, or raise --timeout)"
        )

    def _observe(self, job: Job, watch: _Watch) -> _Watch:
        if job.attempt != watch.attempt:
            watch = _Watch(job.attempt)
        if job.state is JobState.RUNNING and watch.running_since is None:
            watch.running_since = time.monotonic()
        usage = next((u for u in job.usage if u.attempt == job.attempt), None)
        if usage is not None and usage.last_checkpoint_step is not None:
            watch.checkpoints.add(usage.last_checkpoint_step)
        if job.state is JobState.RUNNING and time.monotonic() - watch.read_at >= OUTPUT_POLL_SECONDS:
            watch.read_at = time.monotonic()
            for found in self._progress(job, watch):
                if found.kind == "CHECKPOINT" and found.step is not None:
                    watch.checkpoints.add(found.step)
                elif found.kind == "STEP" and found.step is not None:
                    watch.last_step = max(found.step, watch.last_step or 0)
        return watch

    def _due(self, job: Job, watch: _Watch, injected: list[Injected]) -> bool:
        """Whether the current attempt is RUNNING, later than the last one hit (that one is ending),
        and at the next fault's point."""
        pending = next((f for f in injected if f.attempt is None), None)
        if pending is None or job.state is not JobState.RUNNING or watch.running_since is None:
            return False
        if job.attempt <= max((f.attempt for f in injected if f.attempt is not None), default=0):
            return False
        seconds = time.monotonic() - watch.running_since
        return pending.planned.at.reached(len(watch.checkpoints), watch.last_step, seconds)

    def _inject(self, job: Job, watch: _Watch, pending: Injected, began: float) -> None:
        try:
            self._apply(pending.planned.fault, job.job_id)
        except (typer.Exit, OSError) as error:  # typer.Exit: the refusal was said on stderr already
            said = "the simulator refused it" if isinstance(error, typer.Exit) else f"{type(error).__name__}: {error}"
            pending.errors.append(said)
            if len(pending.errors) >= FAULT_TRIES:
                raise DrillError(f"the simulator refused fault {pending.planned.fault}: {pending.errors[-1]}") from None
            return
        pending.attempt, pending.at_seconds = job.attempt, time.monotonic() - began
        pending.checkpoint = max(watch.checkpoints, default=None)
        self.say(f"{pending.planned.fault} hit attempt {job.attempt} of {job.job_id} at {pending.planned.at}")

    def _apply(self, fault: str, job_id: str) -> None:
        from tpujobs.local import faults

        if fault in ("preempt", "silent"):
            faults.preempt_job(job_id, silent=fault == "silent", state_dir=self.state_dir)
        elif fault == "reboot":
            faults.reboot(job_id, worker=None, slice_index=None, state_dir=self.state_dir)
        elif fault == "maintenance":
            faults.maintenance(
                job_id,
                notice=None,
                scheduled_in=MAINTENANCE_LEAD_SECONDS,
                window=MAINTENANCE_WINDOW_SECONDS,
                slice_index=None,
                state_dir=self.state_dir,
            )
        else:
            faults.sigterm(job_id, worker=None, slice_index=None, state_dir=self.state_dir)

    def _progress(self, job: Job, watch: _Watch) -> list[Progress]:
        """The protocol lines of the current attempt's output, every worker's, uploaded since the last poll."""
        outputs = self.objects.worker_outputs(job.job_id, job.attempt, job.spec.service_account)
        found = []
        for key, output in outputs.items():
            for line in watch.read.setdefault(key, OutputCursor()).new_lines(self.objects, output):
                progress = parse_progress(line.rstrip(b"\r").decode("utf-8", "replace"))
                if progress is not None:
                    found.append(progress)
        return found

    def _ended(self, job_id: str) -> Job:
        job = self.store.get(job_id)
        if job is None:
            raise DrillError(f"{job_id} vanished from the job store")
        return job

    def _settle(self, job: Job) -> None:
        """Wait (up to SETTLE_SECONDS) for every worker of the last attempt to mark its output complete."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline:
            outputs = self.objects.worker_outputs(job.job_id, job.attempt, job.spec.service_account)
            if len(outputs) >= job.total_workers and all(o.is_complete for o in outputs.values()):
                return
            time.sleep(0.5)

    def _outputs(self, job: Job) -> Outputs:
        """Every attempt's output, per worker number, as `tpujobs logs --attempt N --worker K` shows it."""
        found: dict[int, dict[int, str]] = {}
        for attempt in range(1, job.attempt + 1):
            for worker in range(job.total_workers):
                text, _ = self.reader.show(job, attempt, worker)
                if text:
                    found.setdefault(attempt, {})[worker] = text.decode("utf-8", "replace")
        return found

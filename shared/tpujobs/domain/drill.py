"""The judgement of `tpujobs drill`: did a job resume correctly after the faults it was given?

Pure: it reads the progress lines (`tpujobs.agent.progress`, docs/resumable.md) of an uninterrupted
run and of a drilled one, per attempt and per worker, with the drilled job's timeline, and says
what went wrong, each finding with its evidence. The local runner (`tpujobs.local.drill`) gathers
the inputs; nothing here reads a clock or talks to Google.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tpujobs.agent.progress import Progress, parse_progress
from tpujobs.domain.accounting import AttemptUsage, account
from tpujobs.domain.job import Job, JobEvent
from tpujobs.domain.states import JobState

Outputs = Mapping[int, Mapping[int, str]]  # attempt -> worker number K (slice x hosts + worker) -> its output
BASELINE, DRILLED = "baseline", "drilled"
KINDS = (
    "not-succeeded",  # the drilled (or uninterrupted) job did not end SUCCEEDED
    "no-progress-lines",  # nothing to judge by: no protocol line, or steps with no START
    "restore-skipped",  # a later attempt started from step 0 though a checkpoint was written before
    "restore-not-newest",  # it started from an older checkpoint than the newest one written before
    "workers-disagree",  # the processes of one attempt started from different steps
    "checkpoint-writers",  # a step written by more than one process, a resume from a step no one wrote, or none
    "too-many-steps-redone",  # a resume redid more than the checkpoint interval plus the step in progress
    "data-order",  # a step consumed another batch than in the uninterrupted run: replayed or skipped data
    "result-mismatch",  # the final result differs from the uninterrupted run's
    "no-result",  # a run that succeeded printed no TPUJOBS_RESULT
)


@dataclass(frozen=True)
class Line:
    """One protocol line as evidence: which run, attempt and worker printed it."""

    run: str
    attempt: int
    worker: int
    text: str
    progress: Progress = field(compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run, "attempt": self.attempt, "worker": self.worker, "text": self.text}


@dataclass(frozen=True)
class TimelineEntry:
    """One entry of the drilled job's timeline."""

    attempt: int
    at: datetime
    state: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "at": self.at.isoformat(), "state": self.state, "reason": self.reason}


@dataclass(frozen=True)
class Timeline:
    """What the control plane recorded of the drilled job: its end, its attempts' usage, its events."""

    state: str
    ended_at: datetime | None
    usage: tuple[AttemptUsage, ...]
    entries: tuple[TimelineEntry, ...]

    @classmethod
    def of(cls, job: Job, events: Iterable[JobEvent]) -> Timeline:
        entries = tuple(TimelineEntry(e.attempt, e.at, e.to_state.value, e.reason) for e in events)
        ended = job.ended_at or (entries[-1].at if entries else None)
        return cls(job.state.value, ended, job.usage, entries)

    def of_attempt(self, attempt: int) -> tuple[TimelineEntry, ...]:
        return tuple(e for e in self.entries if e.attempt == attempt)

    def ending(self, attempt: int) -> TimelineEntry | None:
        """The entry that ended the attempt: its first RECOVERING or end state, else its last entry."""
        found = self.of_attempt(attempt)
        ends = [e for e in found if e.state == JobState.RECOVERING.value or JobState(e.state).is_terminal]
        return ends[0] if ends else (found[-1] if found else None)

    def reported_checkpoint(self, attempt: int) -> int | None:
        """The newest checkpoint step the attempt's agents reported to the control plane."""
        return next((u.last_checkpoint_step for u in self.usage if u.attempt == attempt), None)


@dataclass(frozen=True)
class Finding:
    kind: str
    sentence: str
    lines: tuple[Line, ...] = ()
    timeline: tuple[TimelineEntry, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "sentence": self.sentence,
            "lines": [line.to_json() for line in self.lines],
            "timeline": [entry.to_json() for entry in self.timeline],
        }


@dataclass(frozen=True)
class AttemptReport:
    """One drilled attempt: where it started, how far it got, what it wrote and redid, why it ended."""

    attempt: int
    started_from: int | None
    last_step: int | None
    checkpoints: tuple[int, ...]
    redone: int | None
    ended: str

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "started_from": self.started_from,
            "last_step": self.last_step,
            "checkpoints": list(self.checkpoints),
            "steps_redone": self.redone,
            "ended": self.ended,
        }


@dataclass(frozen=True)
class Verdict:
    findings: tuple[Finding, ...]
    attempts: tuple[AttemptReport, ...]
    steps_redone: int
    goodput: float | None  # the accounting's, of the drilled run
    result_matches: bool | None  # None when a result is missing
    allowed_redo: int | None  # per resume: the checkpoint interval plus the step in progress
    step_goodput: float | None  # distinct steps over steps executed, from the STEP lines

    @property
    def passed(self) -> bool:
        return not self.findings

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "findings": [f.to_json() for f in self.findings],
            "attempts": [a.to_json() for a in self.attempts],
            "steps_redone": self.steps_redone,
            "goodput": self.goodput,
            "result_matches": self.result_matches,
            "allowed_steps_redone_per_resume": self.allowed_redo,
            "step_goodput": self.step_goodput,
        }


def progress_lines(run: str, outputs: Outputs) -> list[Line]:
    """Every protocol line of a run, attempt by attempt, worker by worker, in printed order."""
    found = []
    for attempt in sorted(outputs):
        for worker in sorted(outputs[attempt]):
            for text in outputs[attempt][worker].splitlines():
                parsed = parse_progress(text)
                if parsed is not None:
                    found.append(Line(run, attempt, worker, text.strip(), parsed))
    return found


def judge(baseline: Outputs, drilled: Outputs, timeline: Timeline, baseline_state: str = "SUCCEEDED") -> Verdict:
    """The drill's verdict on `drilled` (with its timeline), measured against the uninterrupted `baseline`."""
    base, lines = progress_lines(BASELINE, baseline), progress_lines(DRILLED, drilled)
    findings: list[Finding] = []
    for run, state in ((BASELINE, baseline_state), (DRILLED, timeline.state)):
        if state != JobState.SUCCEEDED.value:
            findings.append(
                Finding(
                    "not-succeeded",
                    f"The {run} run ended {state}, not SUCCEEDED.",
                    (),
                    timeline.entries[-3:] if run == DRILLED else (),
                )
            )
    for run, found in ((BASELINE, base), (DRILLED, lines)):
        if not found:
            findings.append(
                Finding(
                    "no-progress-lines",
                    f"The {run} run printed no TPUJOBS_ line at all: "
                    "nothing to judge its resume by (see docs/resumable.md).",
                )
            )
    if not base or not lines:
        return Verdict(tuple(findings), (), 0, _goodput(timeline), None, None, None)
    allowed = _allowed_redo(base)
    if allowed is None:
        findings.append(
            Finding(
                "checkpoint-writers",
                "The uninterrupted run wrote no checkpoint (no "
                "TPUJOBS_CHECKPOINT line): an interrupted run can only start over.",
            )
        )
    reports, resume_findings = _attempts(lines, timeline, allowed)
    findings += resume_findings
    findings += _writers(lines)
    findings += _data_order(base, lines)
    matches, result_findings = _results(base, lines, baseline_state, timeline.state)
    findings += result_findings
    executed = [ln.progress.step for ln in lines if ln.progress.kind == "STEP" and ln.worker == 0]
    step_goodput = len(set(executed)) / len(executed) if executed else None
    redone = sum(r.redone or 0 for r in reports)
    return Verdict(tuple(findings), tuple(reports), redone, _goodput(timeline), matches, allowed, step_goodput)


def _goodput(timeline: Timeline) -> float | None:
    if timeline.ended_at is None:
        return None
    return account(timeline.usage, timeline.ended_at).goodput


def _of(lines: Sequence[Line], kind: str, attempt: int | None = None) -> list[Line]:
    return [ln for ln in lines if ln.progress.kind == kind and attempt in (None, ln.attempt)]


def _allowed_redo(base: Sequence[Line]) -> int | None:
    """What one resume may redo: the largest gap between consecutive checkpoints of the uninterrupted run
    (from step 0), plus the steps it ran while a save was still being written (an async save is durable,
    and said so, some steps after the step it saves), plus the step in progress."""
    steps = sorted({ln.progress.step or 0 for ln in _of(base, "CHECKPOINT")})
    if not steps:
        return None
    return max(b - a for a, b in zip([0, *steps], steps, strict=False)) + _save_lag(base) + 1


def _save_lag(base: Sequence[Line]) -> int:
    """The most steps worker 0 completed between reaching a checkpoint's step and printing that checkpoint."""
    lag, reached, attempt = 0, 0, None
    for ln in base:
        if ln.worker != 0:
            continue
        if ln.attempt != attempt:
            reached, attempt = 0, ln.attempt
        if ln.progress.kind == "STEP":
            reached = max(reached, ln.progress.step or 0)
        elif ln.progress.kind == "CHECKPOINT" and ln.progress.step is not None and reached >= ln.progress.step:
            lag = max(lag, reached - ln.progress.step)
    return lag


def _attempts(
    lines: Sequence[Line], timeline: Timeline, allowed: int | None
) -> tuple[list[AttemptReport], list[Finding]]:
    """Per attempt: its start checked against the newest checkpoint written before, and the steps it redid."""
    reports, findings = [], []
    written: set[int] = set()  # checkpoint steps written by earlier attempts
    done: set[int] = set()  # steps completed by earlier attempts (worker 0's STEP lines)
    last_seen: Line | None = None  # the furthest STEP or CHECKPOINT line before this attempt
    for attempt in sorted({ln.attempt for ln in lines} | {u.attempt for u in timeline.usage}):
        starts, steps = _of(lines, "START", attempt), [ln for ln in _of(lines, "STEP", attempt) if ln.worker == 0]
        mine = _of(lines, "CHECKPOINT", attempt)
        around = tuple(e for e in (timeline.ending(attempt - 1), *timeline.of_attempt(attempt)[:1]) if e)
        start = _agreed_start(starts)
        if len({ln.progress.step for ln in starts}) > 1:
            findings.append(
                Finding(
                    "workers-disagree",
                    f"The processes of attempt {attempt} started from different "
                    f"steps: {_list(sorted({ln.progress.step or 0 for ln in starts}))}.",
                    tuple(starts),
                    around,
                )
            )
        if steps and not starts:
            findings.append(
                Finding(
                    "no-progress-lines",
                    f"Attempt {attempt} printed steps but no TPUJOBS_START line: where it resumed from is unknown.",
                    tuple(steps[:1]),
                )
            )
        if start is not None:
            findings += _restore(attempt, start, written, starts, last_seen, around)
        redone = sum(1 for ln in steps if ln.progress.step in done) if steps else None
        if redone is None and start is not None and last_seen is not None:
            redone = max(0, (last_seen.progress.step or 0) - start)
        if attempt > 1 and allowed is not None and redone is not None and redone > allowed:
            evidence = tuple(x for x in (last_seen, starts[0] if starts else None) if x)
            findings.append(
                Finding(
                    "too-many-steps-redone",
                    f"Attempt {attempt} redid {redone} steps; the job's "
                    f"checkpoint interval allows {allowed} (the interval, {allowed - 1}, plus the "
                    "step in progress).",
                    evidence,
                    around,
                )
            )
        reported = timeline.reported_checkpoint(attempt)
        ckpts = sorted({ln.progress.step or 0 for ln in mine} | ({reported} if reported is not None else set()))
        own = max((ln for ln in (*steps, *mine)), key=lambda ln: ln.progress.step or 0, default=None)
        if own is not None and (last_seen is None or (own.progress.step or 0) > (last_seen.progress.step or 0)):
            last_seen = own
        ending = timeline.ending(attempt)
        reports.append(
            AttemptReport(
                attempt,
                start,
                own.progress.step if own else None,
                tuple(ckpts),
                redone if attempt > 1 else None,
                f"{ending.state}: {ending.reason}" if ending else "",
            )
        )
        written |= set(ckpts)
        done |= {ln.progress.step for ln in steps if ln.progress.step is not None}
    return reports, findings


def _agreed_start(starts: Sequence[Line]) -> int | None:
    """The step worker 0 started from (else the most common one), or None without a START line."""
    if not starts:
        return None
    first = next((ln for ln in starts if ln.worker == 0), None)
    if first is not None:
        return first.progress.step
    return Counter(ln.progress.step for ln in starts).most_common(1)[0][0]


def _restore(
    attempt: int,
    start: int,
    written: set[int],
    starts: Sequence[Line],
    last_seen: Line | None,
    around: tuple[TimelineEntry, ...],
) -> list[Finding]:
    newest = max(written, default=0)
    evidence = tuple(x for x in (*starts[:1], last_seen) if x)
    if start == newest:
        return []
    if start == 0:
        return [
            Finding(
                "restore-skipped",
                f"Attempt {attempt} started from step 0, but checkpoint {newest} had "
                "been written before it: its restore was skipped or found nothing.",
                evidence,
                around,
            )
        ]
    reached = last_seen.progress.step if last_seen is not None else None
    if start not in written and start > newest and start == reached:
        return []  # saved on stop at the step the last attempt reached; its line died with the host
    if start not in written:
        return [
            Finding(
                "checkpoint-writers",
                f"Attempt {attempt} resumed from step {start}, a checkpoint no process "
                f"said it wrote (the newest written was {newest or 'none'}).",
                evidence,
                around,
            )
        ]
    return [
        Finding(
            "restore-not-newest",
            f"Attempt {attempt} resumed from checkpoint {start}, not the newest one written before it ({newest}).",
            evidence,
            around,
        )
    ]


def _writers(lines: Sequence[Line]) -> list[Finding]:
    """A checkpoint step written by more than one process of the same attempt."""
    findings = []
    by_step: dict[tuple[int, int], list[Line]] = {}
    for ln in _of(lines, "CHECKPOINT"):
        by_step.setdefault((ln.attempt, ln.progress.step or 0), []).append(ln)
    for (attempt, step), found in sorted(by_step.items()):
        workers = sorted({ln.worker for ln in found})
        if len(workers) > 1:
            findings.append(
                Finding(
                    "checkpoint-writers",
                    f"Checkpoint {step} of attempt {attempt} was written by "
                    f"{len(workers)} processes (workers {_list(workers)}); exactly one must write "
                    "it.",
                    tuple(found),
                )
            )
    return findings


def _data_order(base: Sequence[Line], lines: Sequence[Line]) -> list[Finding]:
    """Steps whose batch fingerprint differs from the uninterrupted run's (one finding, the first few as evidence)."""
    expected: dict[int | None, Line] = {}
    for ln in _of(base, "STEP"):
        expected.setdefault(ln.progress.step, ln)
    wrong = [
        (expected[ln.progress.step], ln)
        for ln in _of(lines, "STEP")
        if ln.progress.step in expected
        and ln.progress.words.get("data") != expected[ln.progress.step].progress.words.get("data")
    ]
    if not wrong:
        return []
    steps = sorted({ln.progress.step or 0 for _, ln in wrong})
    return [
        Finding(
            "data-order",
            f"{len(steps)} step(s) consumed other batches than in the uninterrupted run "
            f"(first: step {steps[0]}): the data loader replays or skips batches after a resume.",
            tuple(x for pair in wrong[:3] for x in pair),
        )
    ]


def _results(
    base: Sequence[Line], lines: Sequence[Line], base_state: str, state: str
) -> tuple[bool | None, list[Finding]]:
    ok = JobState.SUCCEEDED.value
    expected, got = _result(base), _result(lines)
    findings = []
    for run, found, ended in ((BASELINE, expected, base_state), (DRILLED, got, state)):
        if found is None and ended == ok:
            findings.append(
                Finding(
                    "no-result",
                    f"The {run} run succeeded but printed no TPUJOBS_RESULT "
                    "digest=HEX line: whether its result is right cannot be told.",
                )
            )
    if expected is None or got is None:
        return None, findings
    if expected.progress.words["digest"] == got.progress.words["digest"]:
        return True, findings
    findings.append(
        Finding(
            "result-mismatch",
            "The drilled run's final result differs from the uninterrupted run's: its resume changed what it computed.",
            (expected, got),
        )
    )
    return False, findings


def _result(lines: Sequence[Line]) -> Line | None:
    """Process 0's last RESULT line (of the last attempt that printed one)."""
    found = [ln for ln in _of(lines, "RESULT") if ln.worker == 0]
    return found[-1] if found else None


def _list(items: Sequence[int]) -> str:
    return ", ".join(str(i) for i in items)

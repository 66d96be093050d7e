"""The drill's judgement (domain/drill.py) on made-up outputs: a good resume passes, each planted bug is named."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone

import pytest

from tpujobs.agent.progress import parse_checkpoint, parse_progress
from tpujobs.domain.accounting import AttemptUsage
from tpujobs.domain.drill import KINDS, Timeline, TimelineEntry, judge

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
STEPS, EVERY = 20, 5


def fingerprint(step: int) -> str:
    return hashlib.sha256(f"batch-{step}".encode()).hexdigest()[:12]


def worker_output(
    worker: int,
    start: int,
    stop: int,
    every: int = EVERY,
    batch=fingerprint,
    result: str | None = "abc123",
    writers: tuple[int, ...] = (0,),
) -> str:
    """What one process of a well-behaved job prints from `start` until it stops after step `stop`."""
    lines = ["some log line", f"TPUJOBS_START step={start}"]
    for step in range(start + 1, stop + 1):
        if worker == 0:
            lines.append(f"TPUJOBS_STEP step={step} data={batch(step)}")
        if step % every == 0 and worker in writers:
            lines.append(f"TPUJOBS_CHECKPOINT step={step}")
    if stop == STEPS and worker == 0 and result is not None:
        lines.append(f"TPUJOBS_RESULT digest={result}")
    return "\n".join(lines) + "\n"


def attempt(start: int, stop: int, workers: int = 2, **options) -> dict[int, str]:
    return {k: worker_output(k, start, stop, **options) for k in range(workers)}


BASELINE = {1: attempt(0, STEPS)}


def timeline(attempts: int, state: str = "SUCCEEDED", lost_seconds: float = 0.0) -> Timeline:
    """`attempts` attempts of 100 s each; all but the last lost their capacity `lost_seconds` after a checkpoint."""
    usage, entries = [], []
    for n in range(1, attempts + 1):
        held = T0 + timedelta(seconds=200 * (n - 1))
        end = held + timedelta(seconds=100)
        last = n == attempts
        usage.append(
            AttemptUsage(n, 4, held, held_from=held, ended_at=end, capacity_lost=not last,
                         last_checkpoint_at=end - timedelta(seconds=lost_seconds))
        )  # fmt: skip
        entries.append(TimelineEntry(n, held, "RUNNING", "workers started"))
        entries.append(TimelineEntry(n, end, state if last else "RECOVERING", "end" if last else "preempted"))
    return Timeline(state, entries[-1].at, tuple(usage), tuple(entries))


def kinds(verdict) -> list[str]:
    return [f.kind for f in verdict.findings]


def test_a_correct_resume_from_the_newest_checkpoint_passes() -> None:
    """Preempted after step 12 (checkpoint 10): the second attempt starts at 10, redoes 11 and 12, same result."""
    drilled = {1: attempt(0, 12), 2: attempt(10, STEPS)}
    verdict = judge(BASELINE, drilled, timeline(2, lost_seconds=10))
    assert verdict.passed, verdict.findings
    assert verdict.steps_redone == 2
    assert verdict.result_matches is True
    assert verdict.allowed_redo == EVERY + 1
    assert [(a.attempt, a.started_from, a.last_step, a.redone) for a in verdict.attempts] == [
        (1, 0, 12, None),
        (2, 10, STEPS, 2),
    ]
    assert verdict.attempts[1].checkpoints == (15, 20)
    assert verdict.goodput == pytest.approx(1 - 10 / 200)  # the accounting's: 10 of 200 held seconds lost
    assert verdict.step_goodput == pytest.approx(20 / 22)


def test_the_json_has_exactly_the_documented_keys_first() -> None:
    verdict = judge(BASELINE, {1: attempt(0, 12), 2: attempt(0, STEPS)}, timeline(2))
    answer = verdict.to_json()
    assert list(answer)[:6] == ["passed", "findings", "attempts", "steps_redone", "goodput", "result_matches"]
    assert answer["passed"] is False
    finding = next(f for f in answer["findings"] if f["kind"] == "restore-skipped")
    assert {"run": "drilled", "attempt": 2, "worker": 0, "text": "TPUJOBS_START step=0"} in finding["lines"]
    assert [e["state"] for e in finding["timeline"]] == ["RECOVERING", "RUNNING"]


def test_a_skipped_restore_is_named_with_its_start_line_and_the_timeline() -> None:
    """The planted bug of the e2e test: the later attempt starts from 0 though checkpoint 10 exists."""
    drilled = {1: attempt(0, 12), 2: attempt(0, STEPS)}
    verdict = judge(BASELINE, drilled, timeline(2))
    assert "restore-skipped" in kinds(verdict)
    found = next(f for f in verdict.findings if f.kind == "restore-skipped")
    assert "checkpoint 10" in found.sentence
    assert found.timeline[0].reason == "preempted"
    assert verdict.steps_redone == 12
    assert "too-many-steps-redone" in kinds(verdict)


def test_a_restore_from_an_older_checkpoint_is_not_the_newest() -> None:
    drilled = {1: attempt(0, 12), 2: attempt(5, STEPS)}
    verdict = judge(BASELINE, drilled, timeline(2))
    assert "restore-not-newest" in kinds(verdict)
    assert "restore-skipped" not in kinds(verdict)


def test_a_resume_from_a_step_no_one_wrote_blames_the_checkpoint_writers() -> None:
    drilled = {1: attempt(0, 12), 2: attempt(11, STEPS)}
    verdict = judge(BASELINE, drilled, timeline(2))
    assert kinds(verdict) == ["checkpoint-writers"]
    assert "step 11" in verdict.findings[0].sentence


def test_a_save_on_stop_whose_line_died_with_the_host_passes() -> None:
    """Attempt 1 reached step 12 and was stopped; attempt 2 resumes from 12, newer than any reported
    checkpoint: the job saved on SIGTERM and its host went before the line was shipped. Not a finding;
    a resume from a step the attempt never reached is (above)."""
    drilled = {1: attempt(0, 12), 2: attempt(12, STEPS)}
    verdict = judge(BASELINE, drilled, timeline(2))
    assert verdict.passed, verdict.findings
    assert verdict.steps_redone == 0


def test_a_checkpoint_reported_to_the_control_plane_counts_as_written() -> None:
    """The line itself may be lost with a killed host; the agent's report on the document still says it was written."""
    drilled = {1: attempt(0, 12), 2: attempt(12, STEPS)}
    line = timeline(2)
    usage = (line.usage[0].__class__(**{**line.usage[0].__dict__, "last_checkpoint_step": 12}), line.usage[1])
    verdict = judge(BASELINE, drilled, Timeline(line.state, line.ended_at, usage, line.entries))
    assert verdict.passed, verdict.findings


def test_a_checkpoint_written_by_every_process_is_flagged() -> None:
    drilled = {1: attempt(0, 12, writers=(0, 1)), 2: attempt(10, STEPS)}
    verdict = judge(BASELINE, drilled, timeline(2))
    assert kinds(verdict) == ["checkpoint-writers", "checkpoint-writers"]  # steps 5 and 10 of attempt 1
    assert "workers 0, 1" in verdict.findings[0].sentence
    assert {line.worker for line in verdict.findings[0].lines} == {0, 1}


def test_a_job_that_never_checkpoints_is_flagged() -> None:
    base = {1: attempt(0, STEPS, every=STEPS + 1)}
    drilled = {1: attempt(0, 12, every=STEPS + 1), 2: attempt(0, STEPS, every=STEPS + 1)}
    verdict = judge(base, drilled, timeline(2))
    assert kinds(verdict) == ["checkpoint-writers"]
    assert verdict.allowed_redo is None


def test_workers_that_start_from_different_steps_disagree() -> None:
    second = attempt(10, STEPS)
    second[1] = worker_output(1, 5, STEPS)
    verdict = judge(BASELINE, {1: attempt(0, 12), 2: second}, timeline(2))
    assert kinds(verdict) == ["workers-disagree"]
    assert "5, 10" in verdict.findings[0].sentence


def test_a_data_loader_that_restarts_its_order_is_caught_by_fingerprints() -> None:
    """The resumed attempt restores step 10 but feeds batches from the start again: step 11 sees batch 1."""

    def reset(step: int) -> str:
        return fingerprint(step - 10)

    drilled = {1: attempt(0, 12), 2: attempt(10, STEPS, batch=reset, result="other")}
    verdict = judge(BASELINE, drilled, timeline(2))
    assert kinds(verdict) == ["data-order", "result-mismatch"]
    assert "10 step(s)" in verdict.findings[0].sentence and "step 11" in verdict.findings[0].sentence
    assert {line.run for line in verdict.findings[0].lines} == {"baseline", "drilled"}
    assert verdict.result_matches is False


def test_too_many_steps_redone_beyond_the_interval() -> None:
    """Checkpoints every 5 in the uninterrupted run, but the drilled run lost 7 steps at one resume."""
    drilled = {1: attempt(0, 17, every=10), 2: attempt(10, STEPS)}
    verdict = judge(BASELINE, drilled, timeline(2))
    assert kinds(verdict) == ["too-many-steps-redone"]
    assert "redid 7 steps" in verdict.findings[0].sentence and "allows 6" in verdict.findings[0].sentence


def test_a_different_result_is_a_mismatch_and_a_missing_one_is_no_result() -> None:
    verdict = judge(BASELINE, {1: attempt(0, 12), 2: attempt(10, STEPS, result="f00")}, timeline(2))
    assert kinds(verdict) == ["result-mismatch"]
    verdict = judge(BASELINE, {1: attempt(0, 12), 2: attempt(10, STEPS, result=None)}, timeline(2))
    assert kinds(verdict) == ["no-result"]
    assert verdict.result_matches is None


def test_a_drilled_job_that_failed_is_not_succeeded_and_is_not_asked_for_a_result() -> None:
    verdict = judge(BASELINE, {1: attempt(0, 12)}, timeline(1, state="FAILED"))
    assert kinds(verdict) == ["not-succeeded"]
    assert "FAILED" in verdict.findings[0].sentence


def test_no_protocol_lines_at_all_says_so_and_judges_nothing_else() -> None:
    silent = {1: {0: "step 1\nstep 2\n", 1: "step 1\n"}}
    verdict = judge(BASELINE, silent, timeline(1))
    assert kinds(verdict) == ["no-progress-lines"]
    assert verdict.attempts == ()


def test_steps_without_a_start_line_are_flagged() -> None:
    second = {k: text.replace("TPUJOBS_START step=10\n", "") for k, text in attempt(10, STEPS).items()}
    verdict = judge(BASELINE, {1: attempt(0, 12), 2: second}, timeline(2))
    assert kinds(verdict) == ["no-progress-lines"]


def test_an_attempt_with_no_output_is_reported_and_not_judged() -> None:
    """The second attempt never got its processes started (no output); the third resumed correctly."""
    drilled = {1: attempt(0, 12), 3: attempt(10, STEPS)}
    verdict = judge(BASELINE, drilled, timeline(3))
    assert verdict.passed, verdict.findings
    assert [a.attempt for a in verdict.attempts] == [1, 2, 3]
    assert verdict.attempts[1].started_from is None


def test_every_finding_kind_is_documented() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[3] / "docs" / "resumable.md").read_text(encoding="utf-8")
    assert all(f"`{kind}`" in page for kind in KINDS)


def test_the_protocol_lines_parse_and_bad_ones_do_not() -> None:
    assert parse_progress("TPUJOBS_START step=3") == ("START", 3, {"step": "3"})
    assert parse_progress("  TPUJOBS_STEP step=4 data=ab12\r") == ("STEP", 4, {"step": "4", "data": "ab12"})
    assert parse_progress("TPUJOBS_RESULT digest=ff") == ("RESULT", None, {"digest": "ff"})
    assert parse_progress("TPUJOBS_CHECKPOINT step=5 on SIGTERM") is not None
    for bad in (
        "TPUJOBS_START",
        "TPUJOBS_STEP step=x",
        "TPUJOBS_RESULT",
        "TPUJOBS_STARTED step=1",
        "x TPUJOBS_START step=1",
    ):
        assert parse_progress(bad) is None, bad
    assert parse_checkpoint(b"TPUJOBS_CHECKPOINT step=7 on SIGTERM\n") == (7, "on SIGTERM")


def test_steps_run_while_an_async_save_is_written_are_allowed_to_be_redone() -> None:
    """The uninterrupted run says each checkpoint 3 steps after its step (an async save): a resume may redo
    the interval, those 3 steps and the step in progress; one more is a finding."""

    def late(start: int, stop: int) -> str:
        lines = [f"TPUJOBS_START step={start}"]
        for step in range(start + 1, stop + 1):
            lines.append(f"TPUJOBS_STEP step={step} data={fingerprint(step)}")
            if step - 3 > start and (step - 3) % EVERY == 0:
                lines.append(f"TPUJOBS_CHECKPOINT step={step - 3}")
        if stop == STEPS:
            lines += [f"TPUJOBS_CHECKPOINT step={STEPS}", "TPUJOBS_RESULT digest=abc123"]
        return "\n".join(lines) + "\n"

    base = {1: {0: late(0, STEPS)}}
    # attempt 1 reached step 12 with checkpoint 10 still being written: it resumes from 5, redoing 7
    verdict = judge(base, {1: {0: late(0, 12)}, 2: {0: late(5, STEPS)}}, timeline(2))
    assert verdict.allowed_redo == EVERY + 3 + 1
    assert (verdict.passed, verdict.steps_redone) == (True, 7), verdict.findings
    synchronous = {1: attempt(0, STEPS)}  # the same redo against a job that saves at once is too much
    verdict = judge(synchronous, {1: attempt(0, 12), 2: attempt(5, STEPS)}, timeline(2))
    assert verdict.allowed_redo == EVERY + 1
    assert "too-many-steps-redone" in kinds(verdict)

"""Error classes (`retry_on`): the ruling on a failed command, and the reports that carry it.

Exit codes are matched by the domain; output patterns by the agent, whose claim (pattern index
and line) arrives in the `exited` report and is taken for that job only.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tpujobs.domain.error_classes import classify_error
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import RetryOn, SpecError, parse_spec
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Decision, Observation, decide
from tpujobs.engine.messages import ReportError, decode_report
from tpujobs.engine.worker_reports import WorkerReport

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
LATER = NOW + timedelta(minutes=7)
RETRY_ON = {"exit_codes": [75], "output": ["DEADLINE_EXCEEDED", "UNAVAILABLE"]}
LINE = "jax.errors: DEADLINE_EXCEEDED: deadline exceeded"


def running_job(**spec_changes: Any) -> Job:
    """A RUNNING job of one worker from a valid spec."""
    data = {
        "job_id": "train-1",
        "name": "train",
        "owner": "alice",
        "accelerator_type": "v4-8",
        "command": "python train.py",
        "max_restarts": 2,
        **spec_changes,
    }
    job, _ = new_job(parse_spec(data), "us-central2-b", NOW)
    return job.evolve(state=JobState.RUNNING)


def failed(job: Job, code: int, pattern: int | None = None, line: str = "") -> Decision:
    seen = Observation(
        EventKind.COMMAND_FAILED, job.attempt, "agent", exit_code=code, worker="0-0", retry_pattern=pattern,
        retry_line=line,
    )  # fmt: skip
    decision = decide(job, seen, LATER)
    assert isinstance(decision, Decision), decision
    return decision


# --- classify_error --------------------------------------------------------------------


def test_without_retry_on_there_is_no_class() -> None:
    """No retry_on: None, so one `on_error` rules every failure as before."""
    assert classify_error(None, 7, 0, LINE) is None


def test_a_listed_exit_code_is_retryable_whatever_the_output() -> None:
    """An exit code in retry_on.exit_codes is retryable, and the words name the code."""
    found = classify_error(RetryOn(**RETRY_ON), 75, None, "")
    assert found is not None and found.retryable
    assert found.why == "exit code 75 is listed in retry_on.exit_codes"


def test_a_matched_pattern_is_named_with_its_line() -> None:
    """The agent's pattern index becomes the pattern's text and the quoted line."""
    found = classify_error(RetryOn(**RETRY_ON), 7, 1, "grpc: UNAVAILABLE: socket closed")
    assert found is not None and found.retryable
    assert found.why == 'output matched "UNAVAILABLE": "grpc: UNAVAILABLE: socket closed"'


@pytest.mark.parametrize("pattern", [None, 2, -1, 19])
def test_no_match_or_an_index_past_the_patterns_is_not_retryable(pattern: int | None) -> None:
    """Without a claim, or with one naming no pattern of the spec, the error is not retryable."""
    found = classify_error(RetryOn(**RETRY_ON), 7, pattern, LINE)
    assert found is not None and not found.retryable
    assert "exit code 7 is not listed" in found.why


def test_a_long_line_is_quoted_cut() -> None:
    """The quoted line is at most 200 characters in the reason."""
    found = classify_error(RetryOn(output=["x"]), 1, 0, "x" * 1000)
    assert found is not None
    assert found.why == 'output matched "x": "' + "x" * 197 + '..."'


# --- decide(): the ruling ---------------------------------------------------------------


def test_a_retryable_error_resumes_under_on_retryable_error_though_on_error_is_fail() -> None:
    """retry_on matched and on_error fail: the default on_retryable_error (resume) applies."""
    job = running_job(retry_on=RETRY_ON, on_error="fail")
    decision = failed(job, 7, 0, LINE)
    assert decision.job.state is JobState.RECOVERING
    assert (decision.job.restarts, decision.job.resume_next, decision.job.exit_code) == (1, True, 7)
    assert decision.event.reason == (
        f'Worker 0-0 exited with 7: retryable (output matched "DEADLINE_EXCEEDED": "{LINE}"); '
        "restart 1 of 2 will resume from its checkpoint"
    )


def test_a_listed_exit_code_follows_on_retryable_error_rerun() -> None:
    """on_retryable_error rerun: RECOVERING from scratch, the reason naming the listed code."""
    job = running_job(retry_on=RETRY_ON, on_error="fail", on_retryable_error="rerun")
    decision = failed(job, 75)
    assert (decision.job.state, decision.job.resume_next) == (JobState.RECOVERING, False)
    assert "retryable (exit code 75 is listed in retry_on.exit_codes)" in decision.event.reason


def test_an_error_that_matches_nothing_follows_on_error() -> None:
    """No listed code, no matched pattern: on_error fail ends the job, saying it was not retryable."""
    job = running_job(retry_on=RETRY_ON, on_error="fail")
    decision = failed(job, 1)
    assert decision.job.state is JobState.FAILED
    assert decision.event.reason.startswith("Worker 0-0 exited with 1: not retryable (exit code 1 is not listed")
    assert decision.event.reason.endswith("; the job's rule is 'fail'")


def test_a_retryable_error_still_counts_against_max_restarts() -> None:
    """Retryable errors share the one budget: with every restart used, FAILED."""
    job = running_job(retry_on=RETRY_ON, on_error="fail").evolve(restarts=2)
    decision = failed(job, 7, 0, LINE)
    assert decision.job.state is JobState.FAILED
    assert decision.event.reason.endswith("; all 2 restarts are used up")


def test_on_retryable_error_fail_fails_even_a_matched_error() -> None:
    """on_retryable_error fail with on_error resume: a retryable error fails, another resumes."""
    job = running_job(retry_on=RETRY_ON, on_error="resume", on_retryable_error="fail")
    assert failed(job, 75).job.state is JobState.FAILED
    assert failed(job, 1).job.state is JobState.RECOVERING


def test_a_job_without_retry_on_keeps_its_old_reason() -> None:
    """Without retry_on a claimed match changes nothing: on_error, and the old sentence."""
    job = running_job(on_error="fail")
    decision = failed(job, 7, 0, LINE)
    assert decision.job.state is JobState.FAILED
    assert decision.event.reason == "The command exited with code 7 on worker 0-0; the job's rule is 'fail'"


# --- the exited report ------------------------------------------------------------------


def exited(**extra: Any) -> bytes:
    payload = {
        "kind": "exited", "job_id": "train-1", "attempt": 1, "slice_id": 0, "worker_id": 0,
        "at": "2025-03-01T12:00:00.000Z", "nonce": "0123456789abcdef", "exit_code": 7, **extra,
    }  # fmt: skip
    return json.dumps(payload).encode()


def test_an_exited_report_carries_last_lines_and_the_agents_match() -> None:
    """last_lines, retry_pattern and retry_line are read from a failed `exited`."""
    report = decode_report(WorkerReport, exited(last_lines=["a", LINE], retry_pattern=0, retry_line=LINE))
    assert (report.last_lines, report.retry_pattern, report.retry_line) == (["a", LINE], 0, LINE)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"last_lines": ["x"] * 21}, "last_lines"),
        ({"last_lines": ["x" * 2049, "y" * 2048]}, "last_lines"),
        ({"retry_pattern": 20}, "retry_pattern"),
        ({"retry_pattern": -1}, "retry_pattern"),
        ({"retry_line": "x" * 257}, "retry_line"),
    ],
)
def test_unbounded_last_lines_or_claims_are_refused_naming_the_field(extra: dict[str, Any], field: str) -> None:
    """Over 20 lines, over 4096 characters, a pattern index past 20 or a long line: a ReportError."""
    with pytest.raises(ReportError, match=f"field '{field}"):
        decode_report(WorkerReport, exited(**extra))


def test_a_pattern_that_does_not_compile_is_a_spec_error_naming_it() -> None:
    """parse_spec refuses retry_on.output that is not a regular expression."""
    with pytest.raises(SpecError, match=r"retry_on.output pattern '\(unclosed' is not a regular expression"):
        running_job(retry_on={"output": ["(unclosed"]})

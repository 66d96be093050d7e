"""The agent's part of error classes: a failed command's last lines, bounded, secrets cut out,
and the job's retry_on.output patterns matched on the host (in a child it can stop)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_stubs import (
    FAST,
    HF_VERSION,
    SETTINGS,
    WORKER_EVENTS,
    FakeMetadata,
    GoogleStub,
    a_config,
    a_job,
    run_script,
)

from tpujobs.agent.basics import AgentError
from tpujobs.agent.config import load_config
from tpujobs.agent.last_output import LastOutput, last_lines, match_retry_output
from tpujobs.agent.wire import encode_payload
from tpujobs.engine.messages import decode_report
from tpujobs.engine.startup_script import agent_config, render_startup_script
from tpujobs.engine.worker_reports import WorkerReport

# --- last lines -------------------------------------------------------------------------


def test_the_last_twenty_lines_are_kept_oldest_first() -> None:
    """Of 30 short lines, lines 10 to 29; the final newline makes no empty line."""
    window = b"".join(f"line {n}\n".encode() for n in range(30))
    assert last_lines(window, {}) == [f"line {n}" for n in range(10, 30)]


def test_the_last_lines_hold_at_most_4_kib() -> None:
    """Ten 1000-byte lines: only the newest four fit in 4096 bytes."""
    lines = [bytes([65 + n]) * 1000 for n in range(10)]
    kept = last_lines(b"\n".join(lines), {})
    assert kept == [line.decode() for line in lines[-4:]]


def test_one_line_longer_than_4_kib_keeps_its_end() -> None:
    """A single 10 000-byte last line is cut to its last 4096 bytes."""
    kept = last_lines(b"a" * 5000 + b"b" * 5000, {})
    assert kept == ["b" * 4096]


def test_control_characters_and_bad_utf8_become_printable() -> None:
    """Carriage returns at line ends go, other control bytes become '?', bad UTF-8 U+FFFD."""
    kept = last_lines(b"progress\r\n\x1b[31mred\x00\tok \xff\n", {})
    assert kept == ["progress", "?[31mred?\tok \ufffd"]


def test_the_last_output_keeps_a_bounded_window_and_says_when_it_dropped() -> None:
    """LastOutput keeps its newest `keep` bytes and marks that older ones were let go."""
    last = LastOutput(keep=10)
    last.write(b"12345")
    assert (last.snapshot(), last.dropped) == (b"12345", False)
    last.write(b"6789abcdef")
    assert (last.snapshot(), last.dropped) == (b"6789abcdef", True)


# --- redaction --------------------------------------------------------------------------


def test_a_secret_value_is_replaced_by_its_name() -> None:
    """Every occurrence, also one holding a newline, becomes [secret NAME]."""
    secrets = {"HF_TOKEN": "hf_abc123", "PEM": "BEGIN\nkey\nEND"}
    kept = last_lines(b"token hf_abc123 and hf_abc123\nBEGIN\nkey\nEND done\n", secrets)
    assert kept == ["token [secret HF_TOKEN] and [secret HF_TOKEN]", "[secret PEM] done"]


def test_the_longest_value_wins_when_one_holds_another() -> None:
    """A value inside a longer one does not leave the longer one's rest behind."""
    kept = last_lines(b"x=secret-long-value\n", {"A": "secret", "B": "secret-long-value"})
    assert kept == ["x=[secret B]"]


def test_a_secret_cut_by_the_window_start_leaves_nothing_of_itself() -> None:
    """After output was dropped, a value whose start fell outside the window is not sent in part,
    even when later values shrink to short names and the 4 KiB would reach back."""
    value = "S" * 1000 + "T" * 1000
    window = ("T" * 1000 + value * 3 + "tail\n").encode()  # the window starts inside a value
    kept = last_lines(window, {"KEY": value}, dropped=True)
    assert "T" not in "".join(kept) and "S" not in "".join(kept)
    assert kept == ["[secret KEY][secret KEY][secret KEY]tail"]


def test_an_empty_secret_value_is_left_alone() -> None:
    """An empty value matches everywhere; it is not a thing to cut out."""
    assert last_lines(b"hello\n", {"EMPTY": ""}) == ["hello"]


# --- matching on the host ---------------------------------------------------------------


def test_the_newest_matching_line_and_the_first_pattern_are_reported() -> None:
    """Index of the first pattern that matches the newest line any pattern matches, and that line."""
    lines = ["UNAVAILABLE: early", "DEADLINE_EXCEEDED: late", "Traceback end"]
    assert match_retry_output(["UNAVAILABLE", "DEADLINE_.*"], lines) == (1, "DEADLINE_EXCEEDED: late")
    assert match_retry_output(["Socket closed"], lines) is None


def test_a_pattern_this_python_cannot_compile_is_skipped_keeping_the_indexes() -> None:
    """A pattern that does not compile is passed over; the next keeps its own index."""
    assert match_retry_output(["(unclosed", "closed"], ["Socket closed"]) == (1, "Socket closed")


def test_a_backtracking_pattern_is_stopped_and_said() -> None:
    """A catastrophic pattern runs in a child killed after the timeout: a sentence, no match."""
    said = match_retry_output(["(a+)+$"], ["a" * 40 + "!"], timeout=0.5)
    assert isinstance(said, str) and "took over 0.5 s" in said


def test_the_config_carries_the_patterns_to_the_host() -> None:
    """agent_config puts retry_on.output in `retry_output`; without retry_on, an empty list."""
    job = a_job(retry_on={"exit_codes": [3], "output": ["DEADLINE_EXCEEDED"]})
    assert agent_config(job, SETTINGS)["retry_output"] == ["DEADLINE_EXCEEDED"]
    assert agent_config(a_job(), SETTINGS)["retry_output"] == []


# --- the whole agent --------------------------------------------------------------------


@pytest.fixture
def metadata() -> Iterator[FakeMetadata]:
    with FakeMetadata() as server:
        yield server


@pytest.fixture
def google() -> Iterator[GoogleStub]:
    with GoogleStub() as server:
        yield server


def test_a_failed_command_sends_its_last_lines_secrets_cut_and_the_match(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """exited(7) carries the last lines with the secret's value replaced, and pattern 1 with its line."""
    google.secrets[HF_VERSION] = b"hf_value_42"
    command = 'echo "token is $HF_TOKEN"; echo "rpc: DEADLINE_EXCEEDED: deadline exceeded" >&2; exit 7'
    job = a_job(secrets={"HF_TOKEN": "hf-token"}, command=command, retry_on={"output": ["UNAVAILABLE", "DEADLINE"]})
    code, _, stderr = run_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google)
    assert code == 7, stderr
    exited, _ = google.messages(WORKER_EVENTS)[-1]
    assert exited["kind"] == "exited"
    # stdout and stderr are two pipes: lines written at once may be read in either order
    assert sorted(exited["last_lines"]) == ["rpc: DEADLINE_EXCEEDED: deadline exceeded", "token is [secret HF_TOKEN]"]
    assert (exited["retry_pattern"], exited["retry_line"]) == (1, "rpc: DEADLINE_EXCEEDED: deadline exceeded")
    assert "hf_value_42" not in repr(google.messages(WORKER_EVENTS))
    report = decode_report(WorkerReport, encode_payload(exited))
    assert report.retry_pattern == 1


def test_a_success_sends_no_last_lines_and_a_failure_without_a_match_no_claim(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """exited(0) is as before; exited(1) that matches nothing has last_lines and no retry_pattern."""
    ok = a_job(command="echo DEADLINE", retry_on={"output": ["DEADLINE"]})
    run_script(render_startup_script(ok, SETTINGS, timings=FAST), tmp_path / "ok", metadata, google)
    exited, _ = google.messages(WORKER_EVENTS)[-1]
    assert exited["exit_code"] == 0 and "last_lines" not in exited and "retry_pattern" not in exited
    bad = a_job(job_id="train-2", command="echo boom; exit 1", retry_on={"output": ["DEADLINE"]})
    run_script(render_startup_script(bad, SETTINGS, timings=FAST), tmp_path / "bad", metadata, google)
    exited, _ = google.messages(WORKER_EVENTS)[-1]
    assert (exited["exit_code"], exited["last_lines"]) == (1, ["boom"])
    assert "retry_pattern" not in exited


@pytest.mark.parametrize("patterns", ["DEADLINE", ["DEADLINE", 7]])
def test_a_retry_output_that_is_not_a_list_of_strings_is_refused(tmp_path: Path, patterns: object) -> None:
    """A config whose retry_output is not a list of strings is an AgentError naming the key; none is []."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(a_config(retry_output=patterns)))
    with pytest.raises(AgentError, match="retry_output"):
        load_config(str(path))
    path.write_text(json.dumps(a_config()))
    assert load_config(str(path))["retry_output"] == []

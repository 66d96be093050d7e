"""The agent's side of time limits and hang detection: its own deadline, and the last output time in heartbeats."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_stubs import FAST, SETTINGS, WORKER_EVENTS, FakeMetadata, GoogleStub, a_config, a_job, run_script

from tpujobs.agent.basics import AgentError, rfc3339
from tpujobs.agent.config import attempt_deadline, load_config
from tpujobs.engine.startup_script import agent_config, render_startup_script

START = 1_740_830_400.0  # 2025-03-01T12:00:00Z


@pytest.fixture
def host() -> Iterator[FakeMetadata]:
    with FakeMetadata() as server:
        yield server


@pytest.fixture
def api() -> Iterator[GoogleStub]:
    with GoogleStub() as server:
        yield server


def test_the_deadline_is_the_earliest_limit_and_says_which() -> None:
    """time_limit_at is absolute; the relative limits count from the agent's start."""
    config = {"time_limit_at": "2025-03-01T12:10:00Z", "attempt_time_limit_seconds": 300}
    assert attempt_deadline(config, START) == (START + 300, "attempt_time_limit")
    assert attempt_deadline({**config, "attempt_time_limit_seconds": 900}, START) == (START + 600, "time_limit")
    assert attempt_deadline({"time_limit_seconds": 60}, START) == (START + 60, "time_limit")
    assert attempt_deadline({}, START) is None


def test_the_startup_config_carries_the_limits_the_agent_needs() -> None:
    """A first attempt gets its time_limit relative: its capacity's start is not known yet."""
    config = agent_config(a_job(time_limit="2h", attempt_time_limit="30m"), SETTINGS)
    assert (config["time_limit_at"], config["time_limit_seconds"], config["attempt_time_limit_seconds"]) == (
        None,
        7200,
        1800,
    )


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"time_limit_at": "yesterday"}, "time_limit_at"),
        ({"time_limit_at": "2025-03-01T12:00:00"}, "time_limit_at"),  # no zone: ambiguous
        ({"attempt_time_limit_seconds": 0}, "attempt_time_limit_seconds"),
        ({"time_limit_seconds": True}, "time_limit_seconds"),
    ],
)
def test_a_bad_limit_in_the_config_is_refused_naming_the_key(
    tmp_path: Path, changes: dict[str, Any], named: str
) -> None:
    """The agent refuses to start on a limit it cannot read, rather than run without it."""
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(a_config(**changes)))
    with pytest.raises(AgentError, match=named):
        load_config(str(path))


def test_at_its_deadline_the_agent_stops_the_command_and_reports_the_limit(
    tmp_path: Path, host: FakeMetadata, api: GoogleStub
) -> None:
    """`sleep 600` with attempt_time_limit 1s: SIGTERM at the deadline, and `exited` names the limit."""
    job = a_job(command="sleep 600", attempt_time_limit="1s")
    began = time.monotonic()
    code, _, stderr = run_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", host, api)
    assert time.monotonic() - began < 60, "the command was not stopped"
    assert code == 128 + 15, stderr
    exited = [p for p, _ in api.messages(WORKER_EVENTS) if p["kind"] == "exited"]
    assert len(exited) == 1
    assert exited[0]["limit"] == "attempt_time_limit" and exited[0]["exit_code"] == 143
    assert "time limit reached" in exited[0]["detail"]


def test_heartbeats_say_when_the_command_last_printed_and_a_silent_one_says_nothing(
    tmp_path: Path, host: FakeMetadata, api: GoogleStub
) -> None:
    """A command that prints once then sleeps: heartbeats carry that line's time; a silent one's carry none."""
    job = a_job(command="echo one; sleep 1.2")
    before = rfc3339()  # the line may be read before the started report is stamped
    code, _, stderr = run_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", host, api)
    assert code == 0, stderr
    beats = [p for p, _ in api.messages(WORKER_EVENTS) if p["kind"] == "heartbeat"]
    assert beats and all("last_output_at" in p for p in beats)
    exited = next(p for p, _ in api.messages(WORKER_EVENTS) if p["kind"] == "exited")
    assert {p["last_output_at"] for p in beats} == {beats[0]["last_output_at"]}  # one line, one time
    assert before <= beats[0]["last_output_at"] <= exited["at"]  # the line's time, during the run

    silent = a_job(command="sleep 1.2", job_id="quiet-1")
    code, _, stderr = run_script(render_startup_script(silent, SETTINGS, timings=FAST), tmp_path / "w2", host, api)
    assert code == 0, stderr
    later = [p for p, _ in api.messages(WORKER_EVENTS) if p["kind"] == "heartbeat"][len(beats) :]
    assert later and all("last_output_at" not in p for p in later)

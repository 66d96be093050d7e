"""The whole agent, run as a VM runs it: the startup script unpacks the zipapp and runs it."""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from agent_stubs import (
    BUCKET,
    FAST,
    PREEMPTION,
    SETTINGS,
    WORKER_EVENTS,
    FakeMetadata,
    GoogleStub,
    a_job,
    assert_all_signed,
    chunk_prefix,
    python3_dir,
    run_script,
    start_script,
)

import tpujobs.agent
from tpujobs.agent.basics import AGENT_FAILED
from tpujobs.agent.reports import Reporter
from tpujobs.engine.startup_script import render_startup_script
from tpujobs.local.testing import wait_for

# --- the whole agent, through the startup script --------------------------------------


def test_the_agent_reports_started_and_exited_and_ships_the_output(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """A command printing to stdout and stderr and exiting 3: started, exited(3), output in chunks."""
    job = a_job(command="echo out-1; echo err-1 >&2; echo out-2; exit 3")
    code, stdout, stderr = run_script(
        render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google
    )
    assert code == 3, stderr
    assert google.kinds(WORKER_EVENTS)[0] == "started"
    assert google.kinds(WORKER_EVENTS)[-1] == "exited"
    exited, attributes = google.messages(WORKER_EVENTS)[-1]
    assert exited["exit_code"] == 3
    assert {k: exited[k] for k in ("job_id", "attempt", "slice_id", "worker_id")} == {
        "job_id": "train-1",
        "attempt": 1,
        "slice_id": 0,
        "worker_id": 0,
    }
    assert attributes == {
        "job_id": "train-1",
        "attempt": "1",
        "kind": "exited",
        "tpujobs-signature": attributes["tpujobs-signature"],
        "tpujobs-key-version": "1",
        "tpujobs-job-created": "1",
    }
    assert_all_signed(google, WORKER_EVENTS)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", exited["at"])
    # When the host started the command, as the started report said: an exit handled first still counts it.
    started = google.messages(WORKER_EVENTS)[0][0]
    assert exited["command_started_at"] <= started["at"] <= exited["at"]
    # stdout and stderr are two pipes: each keeps its order; between them, the order the agent read
    # them in (written at once, as here, the two may be ready together).
    assert google.output(chunk_prefix()) in (
        b"out-1\nerr-1\nout-2\n",
        b"out-1\nout-2\nerr-1\n",
        b"err-1\nout-1\nout-2\n",
    )
    assert json.loads(google.objects[(BUCKET, chunk_prefix() + "complete.json")])["exit_code"] == 3
    assert "out-1\n" in stdout  # tee'd to the agent's own stdout
    assert google.messages(PREEMPTION) == []
    assert "fake-token" not in stdout + stderr


def test_heartbeats_arrive_while_the_command_runs(tmp_path: Path, metadata: FakeMetadata, google: GoogleStub) -> None:
    """With heartbeat_seconds 0.3 a 1.2 s command is seen alive several times between started and exited."""
    job = a_job(command="sleep 1.2")
    code, _, stderr = run_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google)
    assert code == 0, stderr
    kinds = google.kinds(WORKER_EVENTS)
    assert kinds[0] == "started" and kinds[-1] == "exited"
    assert kinds.count("heartbeat") >= 2
    assert set(kinds[1:-1]) == {"heartbeat"}


def test_a_checkpoint_line_becomes_a_checkpoint_report(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """`TPUJOBS_CHECKPOINT step=5 detail` printed by the command is reported with step and detail."""
    job = a_job(command="echo TPUJOBS_CHECKPOINT step=5 saved ok")
    code, _, stderr = run_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google)
    assert code == 0, stderr
    checkpoints = [(p, a) for p, a in google.messages(WORKER_EVENTS) if p["kind"] == "checkpoint"]
    assert len(checkpoints) == 1
    payload, attributes = checkpoints[0]
    assert (payload["step"], payload["detail"]) == (5, "saved ok")
    assert attributes["kind"] == "checkpoint"


def test_setup_runs_once_per_host_and_later_attempts_skip_it(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """Two attempts in sibling work dirs: setup ran once; the command ran twice."""
    host = tmp_path / "host"
    host.mkdir()
    counter = tmp_path / "setups"
    for attempt in (1, 2):
        job = a_job(attempt, setup=f"echo x >> {counter}", command="echo ran")
        code, _, stderr = run_script(
            render_startup_script(job, SETTINGS, timings=FAST),
            host / f"attempt-{attempt}",
            metadata,
            google,
        )
        assert code == 0, stderr
    assert counter.read_text() == "x\n"
    assert google.output(chunk_prefix(2)) == b"ran\n"


def test_a_failed_setup_is_the_attempts_error_and_the_command_never_runs(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """Setup exiting 4: exited(4) is reported, the command's output never appears, no setup marker."""
    job = a_job(setup="echo installing; exit 4", command="echo command-ran")
    code, _, _ = run_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google)
    assert code == 4
    exited = [p for p, _ in google.messages(WORKER_EVENTS) if p["kind"] == "exited"]
    assert [p["exit_code"] for p in exited] == [4]
    assert google.output(chunk_prefix()) == b"installing\n"
    assert not list(tmp_path.glob(".setup-done-*"))


def test_a_missing_code_object_fails_the_attempt_with_a_reason_in_the_output(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """code_uri naming nothing: exited(1), the command does not run, the log says why."""
    job = a_job(code_uri=f"gs://{BUCKET}/missing.tar.gz", command="echo command-ran")
    code, _, _ = run_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google)
    assert code == AGENT_FAILED
    assert [p["exit_code"] for p, _ in google.messages(WORKER_EVENTS) if p["kind"] == "exited"] == [1]
    output = google.output(chunk_prefix())
    assert b"could not fetch the code" in output and b"command-ran" not in output


@pytest.mark.parametrize("python", ["default", "3.8"])
def test_sigterm_publishes_one_notice_first_then_stops_the_command_without_an_exited_report(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub, python: str
) -> None:
    """SIGTERM to the agent: one preemption notice, the command's trap runs, no exited report."""
    job = a_job(command="trap 'echo got-term; exit 9' TERM; echo ready; while true; do sleep 0.05; done")
    process = start_script(
        render_startup_script(job, SETTINGS, timings=FAST),
        tmp_path / "w",
        metadata,
        google,
        python_dir=python3_dir(tmp_path, python),
    )
    try:
        wait_for(lambda: b"ready" in google.output(chunk_prefix()))
        os.kill(process.pid, signal.SIGTERM)
        os.kill(process.pid, signal.SIGTERM)  # a second signal sends no second notice
        process.wait(timeout=20)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    notices = google.messages(PREEMPTION)
    assert len(notices) == 1
    notice, attributes = notices[0]
    assert notice["reason"] == "SIGTERM"
    assert attributes == {
        "job_id": "train-1",
        "attempt": "1",
        "tpujobs-signature": attributes["tpujobs-signature"],
        "tpujobs-key-version": "1",
        "tpujobs-job-created": "1",
    }
    assert_all_signed(google, PREEMPTION)
    assert re.fullmatch(r"[0-9a-f]{32}", notice["nonce"])
    assert "exited" not in google.kinds(WORKER_EVENTS)
    assert b"got-term\n" in google.output(chunk_prefix())
    assert (BUCKET, chunk_prefix() + "complete.json") not in google.objects
    assert process.returncode == 9


def test_the_agent_runs_on_python_3_8(tmp_path: Path, metadata: FakeMetadata, google: GoogleStub) -> None:
    """With python3 being 3.8 (the oldest we promise), a job runs and reports as usual."""
    bin_dir = python3_dir(tmp_path, "3.8")
    job = a_job(command="python3 -c 'import sys; print(sys.version_info[:2])'; exit 2")
    code, _, stderr = run_script(
        render_startup_script(job, SETTINGS, timings=FAST),
        tmp_path / "w",
        metadata,
        google,
        python_dir=bin_dir,
    )
    assert code == 2, stderr
    assert google.output(chunk_prefix()) == b"(3, 8)\n"
    assert google.kinds(WORKER_EVENTS)[-1] == "exited"


AGENT_MODULES = sorted(Path(tpujobs.agent.__file__).parent.glob("*.py"))


@pytest.mark.parametrize("path", AGENT_MODULES, ids=lambda path: path.name)
def test_every_agent_module_parses_as_python_3_8(path: Path) -> None:
    """No syntax newer than 3.8 in the agent (it runs on old TPU VM images)."""
    ast.parse(path.read_text(), feature_version=(3, 8))


@pytest.mark.parametrize("path", AGENT_MODULES, ids=lambda path: path.name)
def test_every_agent_module_imports_only_the_standard_library_and_the_agent(path: Path) -> None:
    """Every absolute import of the agent's modules is in sys.stdlib_module_names; the rest are
    relative, within the package (the zipapp names it otherwise than tpujobs.agent)."""
    tree = ast.parse(path.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {
        n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level
    }
    assert names - set(sys.stdlib_module_names) == set()


def test_the_agent_modules_are_found_and_hold_its_entry_point() -> None:
    """The checks above look at the real package, main loop included."""
    assert {"main.py", "wire.py", "__main__.py"} <= {path.name for path in AGENT_MODULES}


def test_after_the_preemption_notice_only_checkpoints_and_the_stop_are_still_reported() -> None:
    """A job saving on SIGTERM keeps its work; its exit code, caused by the notice, is not a failure
    (no `exited`), but `stopped` says its command is done, so the next attempt need not wait."""
    published: list[str] = []

    class Recorder:
        def publish(self, topic, payload, attributes, **_):
            published.append(payload["kind"])

    identity = {"job_id": "j", "attempt": 1, "slice_id": 0, "worker_id": 0}
    reporter = Reporter(Recorder(), "tpujobs-worker-events", identity)
    reporter.report("heartbeat")
    reporter.silence()
    reporter.report("checkpoint", step=7, detail="")
    reporter.report("exited", exit_code=143)
    reporter.report("stopped", exit_code=143)
    reporter.close(timeout=5.0)
    assert published[-2:] == ["checkpoint", "stopped"] and "exited" not in published


def test_checkpoints_waiting_to_be_published_coalesce_to_the_latest() -> None:
    """A command printing checkpoint lines in a loop while a publish is slow queues one report,
    the latest step, in its place among the others: it cannot flood the topic."""
    published: list[tuple[str, Any]] = []
    first_publish_may_end = threading.Event()

    class SlowRecorder:
        def publish(self, topic, payload, attributes, **_):
            first_publish_may_end.wait(5.0)
            published.append((payload["kind"], payload.get("step")))

    identity = {"job_id": "j", "attempt": 1, "slice_id": 0, "worker_id": 0}
    reporter = Reporter(SlowRecorder(), "tpujobs-worker-events", identity)
    reporter.report("started")  # being published (slowly) while the rest is queued
    for step in range(1, 1001):
        reporter.report("checkpoint", step=step, detail="")
    reporter.report("exited", exit_code=0)
    first_publish_may_end.set()
    reporter.close(timeout=5.0)
    assert published == [("started", None), ("checkpoint", 1000), ("exited", None)]

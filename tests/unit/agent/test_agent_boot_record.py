"""A second start of an attempt on one host (a reboot) reports it lost and runs nothing (`agent/boot_record.py`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from agent_stubs import (
    FAST,
    PREEMPTION,
    RECORD,
    SETTINGS,
    WORKER_EVENTS,
    FakeMetadata,
    GoogleStub,
    a_job,
    assert_all_signed,
    chunk_prefix,
    gone,
    kill_group,
    read_record,
    run_script,
    start_script,
)

from tpujobs.agent.basics import AGENT_STARTED_AGAIN
from tpujobs.agent.boot_record import AttemptRecord, started_again_detail
from tpujobs.engine.startup_script import render_startup_script
from tpujobs.local.testing import wait_for

# --- reboots ----------------------------------------------------------------------------

SURVIVORS = {
    "nothing": ("its command (pid {command}, started ", ") is gone"),
    "the_command": ("its command (pid {command}, started ", ") is still running"),
    "agent_and_command": ("that agent (pid {agent}) is still running", ") is still running"),
}


@pytest.mark.parametrize("survivors", SURVIVORS, ids=SURVIVORS)
def test_a_second_start_of_an_attempt_reports_it_lost_and_never_runs_the_command_again(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub, survivors: str
) -> None:
    """The startup script run again for a started attempt: one signed `rebooted` saying what it found, no
    second command, the output untouched."""
    runs = tmp_path / "runs"
    job = a_job(command=f"echo run >> '{runs}'; echo ready; sleep 600")
    script = render_startup_script(job, SETTINGS, timings=FAST)
    record = tmp_path / RECORD
    first = start_script(script, tmp_path / "w", metadata, google)
    command = 0
    try:
        wait_for(lambda: "running" in read_record(record) and b"ready" in google.output(chunk_prefix()))
        command = read_record(record)["running"]["pid"]
        if survivors != "agent_and_command":
            kill_group(first.pid)  # the agent (the startup script exec'd it) dies
            first.wait(timeout=10)
        if survivors == "nothing":
            kill_group(command)
            wait_for(lambda: gone(command))
        output = google.chunks(chunk_prefix())
        code, _, stderr = run_script(script, tmp_path / "w", metadata, google)
    finally:
        kill_group(first.pid)
        if command:
            kill_group(command)
        first.wait(timeout=10)
    assert code == AGENT_STARTED_AGAIN, stderr
    assert runs.read_text() == "run\n"
    rebooted = [(p, a) for p, a in google.messages(WORKER_EVENTS) if p["kind"] == "rebooted"]
    assert len(rebooted) == 1
    payload, attributes = rebooted[0]
    assert {k: payload[k] for k in ("job_id", "attempt", "slice_id", "worker_id")} == {
        "job_id": "train-1",
        "attempt": 1,
        "slice_id": 0,
        "worker_id": 0,
    }
    assert attributes["kind"] == "rebooted"
    for fragment in SURVIVORS[survivors]:
        assert fragment.format(command=command, agent=first.pid) in payload["detail"]
    assert payload["detail"].endswith(": nothing is started again")
    assert_all_signed(google, WORKER_EVENTS)
    assert google.kinds(WORKER_EVENTS).count("started") == 1
    assert google.chunks(chunk_prefix()) == output  # the first start's output, as it was
    assert google.messages(PREEMPTION) == []


def test_a_start_after_the_attempt_ended_on_this_host_reports_nothing_and_runs_nothing(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """A reboot after the command exited and said so: the second start sends nothing (the end was counted) and runs
    nothing."""
    runs = tmp_path / "runs"
    script = render_startup_script(a_job(command=f"echo run >> '{runs}'; exit 3"), SETTINGS, timings=FAST)
    code, _, stderr = run_script(script, tmp_path / "w", metadata, google)
    assert code == 3, stderr
    assert read_record(tmp_path / RECORD)["ended"] == "exited"
    sent = google.kinds(WORKER_EVENTS)
    code, _, stderr = run_script(script, tmp_path / "w", metadata, google)
    assert code == AGENT_STARTED_AGAIN, stderr
    assert "already ended on this host" in stderr
    assert google.kinds(WORKER_EVENTS) == sent and sent[-1] == "exited"
    assert runs.read_text() == "run\n"


def test_another_attempt_slice_or_worker_on_the_same_disk_is_a_first_start() -> None:
    """The record is named by job, attempt, slice and worker, beside the attempt's work dir."""
    config = {"job_id": "train-1", "attempt": 1}
    paths = {
        AttemptRecord.beside("/var/lib/tpujobs/train-1/attempt-1", c, s, w).path
        for c, s, w in [
            (config, 0, 0),
            ({**config, "attempt": 2}, 0, 0),
            (config, 1, 0),
            (config, 0, 1),
            ({**config, "job_id": "train-2"}, 0, 0),
        ]
    }
    assert len(paths) == 5
    assert "/var/lib/tpujobs/train-1/.tpujobs-attempt-train-1-a1-slice0-worker0.json" in paths
    hostile = AttemptRecord.beside("/w/work", {"job_id": "../../etc/x", "attempt": 1}, 0, 0)
    assert os.path.dirname(hostile.path) == "/w"


def test_of_two_claims_of_one_attempt_only_the_first_wins(tmp_path: Path) -> None:
    """claim() is None once, then returns what the first start wrote; an unreadable record still counts as a start."""
    record = AttemptRecord(str(tmp_path / "host" / RECORD))
    assert record.claim({"agent_started_at": "T1"}) is None
    assert record.claim({"agent_started_at": "T2"}) == {"agent_started_at": "T1"}
    record.update(ended="exited")
    assert record.read() == {"agent_started_at": "T1", "ended": "exited"}
    Path(record.path).write_text("{torn")
    assert record.claim({"agent_started_at": "T3"}) == {}
    assert [p.name for p in (tmp_path / "host").iterdir()] == [RECORD]  # no temporary left


def test_what_a_second_start_found_is_said_in_one_sentence() -> None:
    """Another boot, this boot, nothing started, an ended attempt, an unreadable record."""
    first = {"agent_started_at": "12:00Z", "boot": "boot-1", "agent_pid": 1, "agent_start": "5"}
    command = {"what": "command", "pid": 2**22 + 7, "start": "9", "boot": "boot-1", "at": "12:01Z"}
    assert started_again_detail({**first, "running": command}, "boot-2") == (
        "the agent first started 12:00Z, before the host rebooted; its command "
        f"(pid {2**22 + 7}, started 12:01Z) is gone: nothing is started again"
    )
    assert started_again_detail(first, "boot-1") == (
        "the agent first started 12:00Z, earlier in this boot; it had not started setup or "
        "the command: nothing is started again"
    )
    ended = started_again_detail({**first, "running": {**command, "what": "setup"}, "ended": "preempted"}, "")
    assert "its setup (pid" in ended and "it had ended (preempted)" in ended
    assert "unreadable" in started_again_detail({}, "boot-1")

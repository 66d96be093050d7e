"""Preemption and maintenance notices, waited on in the metadata (`agent/notices.py`)."""

from __future__ import annotations

import os
import signal
import threading
import time
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
    read_record,
    run_script,
    start_script,
)

from tpujobs.agent.notices import maintenance_notice, watch_metadata, watch_preempted
from tpujobs.agent.rest import Metadata
from tpujobs.engine.startup_script import render_startup_script
from tpujobs.local.testing import wait_for

# --- maintenance events and preemption, waited on -------------------------------------


@pytest.mark.parametrize(
    ("flip", "key", "reason"),
    [
        ("preempted", "instance/preempted", "metadata: instance/preempted"),
        (
            "maintenance",
            "instance/maintenance-event",
            "metadata: instance/maintenance-event is TERMINATE_ON_HOST_MAINTENANCE (host maintenance)",
        ),
    ],
)
def test_a_preemption_or_terminating_maintenance_in_the_metadata_is_one_notice(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub, flip: str, key: str, reason: str
) -> None:
    """Waited on with wait_for_change: one signed notice naming its cause, the command stopped, no exited report."""
    job = a_job(command="trap 'echo got-term; exit 9' TERM; echo ready; while true; do sleep 0.05; done")
    process = start_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google)
    try:
        wait_for(lambda: b"ready" in google.output(chunk_prefix()))
        wait_for(lambda: any(key in r and "last_etag=" in r for r in metadata.requests))  # held
        if flip == "preempted":
            metadata.preempted = True
        else:
            metadata.maintenance_event = "TERMINATE_ON_HOST_MAINTENANCE"
        process.wait(timeout=20)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    notices = google.messages(PREEMPTION)
    assert [n["reason"] for n, _ in notices] == [reason]
    assert_all_signed(google, PREEMPTION)
    assert "exited" not in google.kinds(WORKER_EVENTS)
    assert b"got-term\n" in google.output(chunk_prefix())
    assert read_record(tmp_path / RECORD)["ended"] == "preempted"


def test_a_stop_asked_in_the_metadata_stops_the_command_and_says_stopped_without_a_notice(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """tpujobs took the chips back (a reclaim): `tpujobs-stop` appears among the attributes; the
    command gets SIGTERM, no preemption notice is published, and the last report is `stopped`."""
    job = a_job(command="trap 'echo got-term; exit 9' TERM; echo ready; while true; do sleep 0.05; done")
    process = start_script(render_startup_script(job, SETTINGS, timings=FAST), tmp_path / "w", metadata, google)
    try:
        wait_for(lambda: b"ready" in google.output(chunk_prefix()))
        wait_for(lambda: any(r.startswith("/computeMetadata/v1/instance/attributes/?") for r in metadata.requests))
        metadata.extra["instance/attributes/tpujobs-stop"] = "Reclaimed by team-b (its nominal share), for b-0"
        process.wait(timeout=20)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert google.messages(PREEMPTION) == []
    kinds = google.kinds(WORKER_EVENTS)
    assert kinds[-1] == "stopped" and "exited" not in kinds
    output = google.output(chunk_prefix())
    assert b"got-term\n" in output
    assert b"tpujobs asked this attempt to stop: Reclaimed by team-b (its nominal share), for b-0" in output


@pytest.mark.parametrize(
    "value", ["NONE", "MIGRATE_ON_HOST_MAINTENANCE", "SOMETHING_GOOGLE_ADDS_LATER", "", "TERMINATE"]
)
def test_a_maintenance_event_that_does_not_terminate_the_vm_stops_nothing(value: str) -> None:
    """Only TERMINATE_ON_HOST_MAINTENANCE (any case, spaces) is a notice; a TPU VM is never live-migrated."""
    assert maintenance_notice(value) is None
    assert "host maintenance" in str(maintenance_notice(" terminate_on_host_maintenance\n"))


def test_a_job_runs_to_its_end_while_the_metadata_announces_a_migration(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """MIGRATE_ON_HOST_MAINTENANCE: no notice, the command exits as it would, the value is logged once."""
    metadata.maintenance_event = "MIGRATE_ON_HOST_MAINTENANCE"
    code, _, stderr = run_script(
        render_startup_script(a_job(command="sleep 0.5; exit 4"), SETTINGS, timings=FAST),
        tmp_path / "w",
        metadata,
        google,
    )
    assert code == 4, stderr
    assert google.messages(PREEMPTION) == []
    assert google.kinds(WORKER_EVENTS)[-1] == "exited"
    assert stderr.count("MIGRATE_ON_HOST_MAINTENANCE") == 1


def test_watching_a_server_that_answers_at_once_does_not_spin(metadata: FakeMetadata) -> None:
    """A metadata server that never holds a request is asked at most once per floor interval."""
    metadata.hold = False
    seen: list[str] = []
    stop = threading.Event()
    watcher = watch_metadata(
        Metadata(metadata.base), "instance/maintenance-event", lambda v: seen.append(v) or False,
        stop, floor=0.2,
    )  # fmt: skip
    time.sleep(1.0)
    stop.set()
    watcher.join(5)
    assert 2 <= len(seen) <= 8 and set(seen) == {"NONE"}


def test_a_watch_ends_when_its_value_comes_and_keeps_going_through_errors(
    metadata: FakeMetadata,
) -> None:
    """A key the server lacks (404) is asked again later, not taken for a value; the wanted value ends the watch."""
    seen: list[str] = []
    stop = threading.Event()
    watcher = watch_preempted(Metadata(metadata.base), seen.append, stop)
    metadata.preempted = True
    watcher.join(10)
    assert seen == ["metadata: instance/preempted"] and not watcher.is_alive()
    missing = watch_metadata(Metadata(metadata.base), "instance/nothing", lambda v: True, stop)
    time.sleep(0.3)
    assert missing.is_alive()
    stop.set()
    missing.join(15)

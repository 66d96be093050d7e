"""The preemption window: a preempted VM is switched off a fixed time after its notice, so the
agent sends the notice, SIGTERMs the command, SIGKILLs it early enough, and flushes its output
before the VM goes (`Agent._stop_for_preemption`, `LogShipper.hurry`)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from agent_stubs import (
    PREEMPTION,
    SETTINGS,
    FakeMetadata,
    GoogleStub,
    a_config,
    a_job,
    chunk_prefix,
    start_script,
)

from tpujobs.agent.basics import AgentError
from tpujobs.agent.config import check_config
from tpujobs.agent.output import LogShipper
from tpujobs.engine.startup_script import AgentTimings, agent_config, render_startup_script
from tpujobs.local.testing import wait_for

# The real window scaled down: SIGKILL 2 s after the notice, the VM off 7 s after it. The 5 s
# between are generous on purpose (a loaded machine), and far less than the normal stop's 30 s
# grace, so only the preemption window can get the output out in time. Chunks every 2 s (the
# default): the window is no multiple of them, so output shipped only by the ordinary ticks
# misses the last second of it.
WINDOW = AgentTimings(
    heartbeat_seconds=0.3, grace_seconds=30, chunk_seconds=2, preemption_grace_seconds=2, preemption_window_seconds=7
)


def timed_requests(google: GoogleStub) -> list[tuple[float, str, str]]:
    """(wall time, method, path) of every request the stub answers from now on."""
    seen: list[tuple[float, str, str]] = []
    answer = google.answer

    def timed(method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        seen.append((time.time(), method, path))
        return answer(method, path, headers, body)

    google.answer = timed  # type: ignore[method-assign]
    return seen


def test_output_printed_until_sigkill_reaches_storage_before_the_vm_is_switched_off(
    tmp_path: Path, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """A command that ignores SIGTERM and prints every 0.05 s: every line it printed is in Storage
    when the VM goes, in the order notice, SIGTERM, final flush, all within the window."""
    printed, termed = tmp_path / "printed", tmp_path / "termed"
    command = (
        f"trap 'date +%s.%N > {termed}' TERM; echo pid=$$; i=0; "
        f"while true; do i=$((i+1)); echo line-$i; echo line-$i >> {printed}; sleep 0.05; done"
    )
    requests = timed_requests(google)
    process = start_script(
        render_startup_script(a_job(command=command), SETTINGS, timings=WINDOW), tmp_path / "w", metadata, google
    )
    pgid = None
    try:
        wait_for(lambda: b"line-3\n" in google.output(chunk_prefix()), timeout=30, what="the command's output")
        pgid = int(google.output(chunk_prefix()).split(b"pid=")[1].split()[0])
        sent = time.time()
        os.kill(process.pid, signal.SIGTERM)  # the notice, as the VM's ACPI soft-off brings it
        time.sleep(sent + WINDOW.preemption_window_seconds - time.time())
        in_storage = google.output(chunk_prefix())  # what survives the VM switched off now
    finally:
        for group in (process.pid, pgid):
            with contextlib.suppress(ProcessLookupError, TypeError):  # TypeError: no pid was seen
                os.killpg(group, signal.SIGKILL)  # type: ignore[arg-type]
        process.wait()
    lines = printed.read_text().split()
    assert len(lines) > 3
    missing = [line for line in lines if f"{line}\n".encode() not in in_storage]
    assert missing == []
    notices = [at for at, method, path in requests if f"/topics/{PREEMPTION}:publish" in path]
    uploads = [at for at, method, path in requests if "/upload/" in path and ".log" in path and at > sent]
    term_at = float(termed.read_text())
    assert len(notices) == 1 and uploads
    assert notices[0] <= term_at <= uploads[-1] <= sent + WINDOW.preemption_window_seconds


class HangingStorage:
    """Uploads that hang until their timeout runs out, as over a network going down."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def upload(self, bucket: str, name: str, data: bytes, content_type: str, attempts: int, timeout: float) -> None:
        self.timeouts.append(timeout)
        time.sleep(timeout)
        raise OSError("timed out")


def test_a_hurried_final_flush_ends_by_its_deadline_even_when_uploads_hang() -> None:
    """After `hurry`, close() returns by the deadline (not after a minute per upload), and no
    upload is given more time than is left."""
    storage = HangingStorage()
    shipper = LogShipper(storage, "b", "p/", chunk_seconds=2)  # type: ignore[arg-type]
    shipper.write(b"the last words\n")
    deadline = time.monotonic() + 1.0
    shipper.hurry(deadline)
    shipper.close(None)
    assert time.monotonic() < deadline + 3.0  # unhurried, one hanging upload alone is 60 s
    assert storage.timeouts and max(storage.timeouts) <= 1.0


class RecordingStorage:
    def __init__(self) -> None:
        self.uploaded: list[tuple[float, bytes]] = []
        self.lock = threading.Lock()

    def upload(self, bucket: str, name: str, data: bytes, content_type: str, attempts: int, timeout: float) -> None:
        with self.lock:
            self.uploaded.append((time.monotonic(), data))


def test_after_a_notice_output_is_shipped_at_once_and_then_often() -> None:
    """`hurry` ships what is pending at once, and every HURRIED_CHUNK_SECONDS after, not every
    chunk_seconds (30 s here: the waits below give up long before)."""
    storage = RecordingStorage()
    shipper = LogShipper(storage, "b", "p/", chunk_seconds=30)  # type: ignore[arg-type]
    try:
        shipper.write(b"before\n")
        shipper.hurry(time.monotonic() + 60)
        wait_for(lambda: storage.uploaded, timeout=10, interval=0.02, what="the pending output")
        shipper.write(b"after\n")
        wait_for(lambda: len(storage.uploaded) == 2, timeout=10, interval=0.02, what="the next chunk")
    finally:
        shipper.close(None)
    assert [data for _, data in storage.uploaded] == [b"before\n", b"after\n"]


def test_the_agent_is_told_the_window_and_a_normal_stop_keeps_its_grace() -> None:
    """The engine writes the preemption grace and window; the agent fills them in for a config
    written before they existed, and refuses a grace that leaves no time to flush."""
    config = agent_config(a_job(), SETTINGS)
    assert (config["grace_seconds"], config["preemption_grace_seconds"], config["preemption_window_seconds"]) == (
        30,
        20,
        30,
    )
    old = check_config(a_config())
    assert (old["grace_seconds"], old["preemption_grace_seconds"], old["preemption_window_seconds"]) == (30, 20, 30)
    with pytest.raises(AgentError, match="preemption_grace_seconds"):
        check_config(a_config(preemption_grace_seconds=30, preemption_window_seconds=30))

"""tpujobs.local.processes tells a running service from a gone one, a zombie, or a reused pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpujobs.local import processes

SLEEPER = (sys.executable, "-c", "import time; time.sleep(120)")


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[processes.ManagedProcess]:
    """A process in its own session, recorded as `adopt` records a service; killed and reaped after."""
    handle = subprocess.Popen(SLEEPER, start_new_session=True)
    try:
        yield processes.adopt("sleeper", handle, tmp_path / "sleeper.log")
    finally:
        handle.kill()
        handle.wait()


def exited_unreaped(process: processes.ManagedProcess) -> None:
    """Kill `process` and wait until it is a zombie, without collecting its exit status."""
    os.kill(process.pid, signal.SIGKILL)
    os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)


def test_a_started_process_is_running_with_its_group(sleeper: processes.ManagedProcess) -> None:
    """A live process is ours (pid and start time) and its group counts as running."""
    assert sleeper.create_time is not None
    assert processes.is_running(sleeper)
    assert processes.group_running(sleeper.pid)


def test_a_zombie_is_neither_running_nor_keeps_its_group_running(sleeper: processes.ManagedProcess) -> None:
    """An exited process not yet reaped counts as gone everywhere, and has no start time."""
    exited_unreaped(sleeper)
    assert not processes.is_running(sleeper)
    assert not processes.group_running(sleeper.pid)
    assert processes.process_create_time(sleeper.pid) is None


def test_a_pid_with_another_start_time_is_not_ours(sleeper: processes.ManagedProcess) -> None:
    """The kernel may hand the pid to someone else: another start time means another process."""
    from dataclasses import replace

    assert not processes.is_running(replace(sleeper, create_time=(sleeper.create_time or 0) + 1))


def test_a_gone_pid_has_no_start_time(sleeper: processes.ManagedProcess) -> None:
    """Once reaped, the pid names no process."""
    assert sleeper.handle is not None
    sleeper.handle.kill()
    sleeper.handle.wait()
    assert processes.process_create_time(sleeper.pid) is None
    assert not processes.is_running(sleeper)


def test_service_ports_come_from_below_the_ephemeral_range() -> None:
    """A port the kernel hands to any bind(0) could be taken before our service binds it."""
    low = processes._ephemeral_low()
    if low is None:
        pytest.skip("no ephemeral range to read on this system")
    ports = {processes.free_port() for _ in range(20)}
    assert all(port < low for port in ports)


def test_a_port_answered_by_another_process_is_a_failed_start(tmp_path: Path) -> None:
    """When someone else took the port first, their answer must not count as our service's."""
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Ok(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"Ok")

        def log_message(self, *args: object) -> None:
            pass

    squatter = ThreadingHTTPServer((processes.LOOPBACK, 0), Ok)
    port = int(squatter.server_address[1])
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    # Our "service" binds another port and lives: only the squatter answers on `port`.
    with socket.socket() as elsewhere:
        elsewhere.bind((processes.LOOPBACK, 0))
        spec = processes.ServiceSpec(
            name="svc",
            argv=SLEEPER,
            port=port,
            ready=processes.answers_ok(f"http://{processes.LOOPBACK}:{port}/", b"Ok"),
            deadline_s=10,
        )
        try:
            with pytest.raises(processes.ServiceStartError, match="answers from another process"):
                processes.start([spec], tmp_path)
        finally:
            squatter.shutdown()
            squatter.server_close()


def test_a_service_that_answers_on_its_own_port_has_started(tmp_path: Path) -> None:
    """The port check counts listeners in the started process's own tree (its children too)."""
    port = processes.free_port()
    server = f"import http.server as h; h.HTTPServer(('127.0.0.1', {port}), h.SimpleHTTPRequestHandler).serve_forever()"
    child_serves = (sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {server!r}])")
    spec = processes.ServiceSpec(
        name="svc",
        argv=child_serves,
        port=port,
        ready=processes.answers_http(f"http://{processes.LOOPBACK}:{port}/"),
        deadline_s=30,
    )
    started = processes.start([spec], tmp_path)
    try:
        assert processes.listens_on(started[0], port)
    finally:
        processes.stop(started)

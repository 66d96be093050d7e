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

"""How the simulator signals a host's processes: never by a group id that may be someone else's."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from types import SimpleNamespace

import pytest

from tpujobs.local.simulator import workers


def host(process: subprocess.Popen[bytes], mark: str = "") -> SimpleNamespace:
    return SimpleNamespace(process=process, pgid=process.pid, mark=mark)


def test_a_host_whose_script_was_reaped_is_not_signalled_by_its_old_group_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once reaped, the script's id may be the kernel's to give to any new session: a late SIGKILL
    by that id would end a stranger (a CI run lost a function of another test stack so)."""
    script = subprocess.Popen(["true"], start_new_session=True)
    script.wait()
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append((pgid, sig)))

    workers._signal(host(script), signal.SIGKILL)  # type: ignore[arg-type]

    assert sent == []


def test_a_running_host_is_killed_by_its_group() -> None:
    script = subprocess.Popen(["sleep", "30"], start_new_session=True)

    workers._signal(host(script), signal.SIGKILL)  # type: ignore[arg-type]

    assert script.wait(timeout=10) == -signal.SIGKILL


def test_what_outlives_a_reaped_script_is_found_by_the_host_mark() -> None:
    """The script left a child behind and exited: SIGTERM reaches the child through its mark."""
    mark = uuid.uuid4().hex
    environment = {**os.environ, workers.VM_MARK: mark}
    script = subprocess.Popen(["sh", "-c", "sleep 30 & echo $!"], start_new_session=True, env=environment,
                              stdout=subprocess.PIPE)  # fmt: skip
    assert script.stdout is not None
    orphan = int(script.stdout.readline())
    script.wait()
    assert orphan in workers._marked_pids(mark)

    workers._signal(host(script, mark), signal.SIGTERM)  # type: ignore[arg-type]

    deadline = time.monotonic() + 10
    while orphan in workers._marked_pids(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert orphan not in workers._marked_pids(mark)

"""`stack.running()`, the benches' stack: stopped on the way out, also when told to stop."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tpujobs.local import stack


class _Stack:
    """`up` and `down` as the context calls them, recorded."""

    def __init__(self) -> None:
        self.stopped: list[Path] = []

    def up(self, state_dir: Path, settings: Any, **_: Any) -> Any:
        return type("State", (), {"env": {"TPUJOBS_TEST_STACK": str(state_dir)}})()

    def down(self, state_dir: Path) -> None:
        self.stopped.append(state_dir)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> _Stack:
    recorded = _Stack()
    monkeypatch.setattr(stack, "stack_environment", lambda *a, **k: {})
    monkeypatch.setattr(stack, "up", recorded.up)
    monkeypatch.setattr(stack, "down", recorded.down)
    monkeypatch.setenv("TPUJOBS_TEST_STACK", "")  # restored (removed) after the test
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return recorded


def test_a_started_stack_is_stopped_when_the_bench_gets_sigterm(fake: _Stack) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped, stack.running(report=lambda line: None) as env:
        os.kill(os.getpid(), signal.SIGTERM)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert fake.stopped == [Path(env["TPUJOBS_TEST_STACK"])]
    assert signal.getsignal(signal.SIGTERM) == before  # the handler it found is back


def test_a_started_stack_is_stopped_on_a_normal_exit(fake: _Stack) -> None:
    with stack.running(report=lambda line: None) as env:
        pass
    assert fake.stopped == [Path(env["TPUJOBS_TEST_STACK"])]

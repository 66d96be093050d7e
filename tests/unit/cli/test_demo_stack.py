"""`tpujobs demo` stops only a local stack it started itself, never one it found running."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tpujobs.cli import demo
from tpujobs.local import stack


class _Stack:
    """`stack` as the demo calls it: none seen running, then `up` answering `already_running`."""

    def __init__(self, already_running: bool) -> None:
        self.already_running = already_running
        self.stopped: list[Path] = []

    def up(self, state_dir: Path, settings: Any, **_: Any) -> Any:
        return type("State", (), {"env": {}, "already_running": self.already_running})()

    def down(self, state_dir: Path) -> None:
        self.stopped.append(state_dir)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    def build(already_running: bool) -> _Stack:
        recorded = _Stack(already_running)
        monkeypatch.setattr(stack, "default_state_dir", lambda *a, **k: tmp_path)
        monkeypatch.setattr(stack, "stack_environment", lambda *a, **k: {})  # a slow probe: looks gone
        monkeypatch.setattr(stack, "up", recorded.up)
        monkeypatch.setattr(stack, "down", recorded.down)
        monkeypatch.setattr(demo, "_story", lambda *a, **k: True)
        return recorded

    return build


def test_a_stack_that_up_finds_running_is_left_running(fake) -> None:
    """The stack looked gone, but `up` found it running: it is someone else's (the e2e tests')."""
    recorded = fake(already_running=True)
    demo.demo(keep=False, timeout=1.0, pool=False)
    assert recorded.stopped == []


def test_a_stack_the_demo_started_is_stopped_after_it(fake, tmp_path: Path) -> None:
    recorded = fake(already_running=False)
    demo.demo(keep=False, timeout=1.0, pool=False)
    assert recorded.stopped == [tmp_path]

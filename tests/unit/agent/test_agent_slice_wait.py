"""The agent waits for its slice (issue 38 items 2 and 3): while the key function answers 409
(the attempt's holding is not ACTIVE: an interconnect still activating, a partial slice), the
agent asks again after a short growing pause, says once why it waits, and fails nothing; the
command starts when the key comes. The wait is bounded; any other refusal ends it at once.

The agent's own `fetch_attempt_key`, against the fake metadata server and GoogleStub's key
function (its `failures` answer the statuses given first); sleeps and the clock are stand-ins.
"""

from __future__ import annotations

from typing import Any

import pytest
from agent_stubs import KEY, KEY_PATH, FakeMetadata, GoogleStub

from tpujobs.agent import attempt_key
from tpujobs.agent.attempt_key import READY_FIRST_DELAY, READY_MAX_DELAY, READY_WAIT_SECONDS, fetch_attempt_key
from tpujobs.agent.basics import AgentError
from tpujobs.agent.rest import Metadata


class Waits:
    """Sleeps that only move a clock: what the agent slept, and the time it believes it is."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


@pytest.fixture
def key_function(google: GoogleStub, monkeypatch: pytest.MonkeyPatch) -> GoogleStub:
    """The stub's key function stands at the agent's key URL."""
    monkeypatch.setenv(attempt_key.KEY_URL_VARIABLE, google.url + KEY_PATH)
    return google


def fetch(metadata: FakeMetadata, waits: Waits) -> Any:
    return fetch_attempt_key(
        Metadata(metadata.base), "https://keys.invalid", "train-1", 1, 0, 0, sleep=waits.sleep, clock=waits.clock
    )


def test_a_slice_not_ready_is_waited_for_and_the_key_then_comes(metadata, key_function, capsys):
    """Two 409s, then the key: the agent pauses 1 s then 2 s (no failure), logs once why it
    waits (the key function's reason) and once that the slice is ready."""
    key_function.failures[KEY_PATH] = [409, 409]
    waits = Waits()
    key = fetch(metadata, waits)
    assert key.key == KEY
    assert waits.slept == [READY_FIRST_DELAY, READY_FIRST_DELAY * 2]
    assert len(key_function.key_requests) == 1 and len(key_function.failures[KEY_PATH]) == 0
    logged = capsys.readouterr().err
    assert logged.count("waits for the slice to be ready") == 1 and "HTTP 409" in logged
    assert "the slice is ready after 3 s" in logged


def test_the_wait_is_bounded_and_its_pauses_stay_short(metadata, key_function):
    """A slice never ready: the pauses grow to READY_MAX_DELAY and no further, and after
    READY_WAIT_SECONDS the agent gives up with the reason (it cannot start)."""
    key_function.failures[KEY_PATH] = [409] * 1000
    waits = Waits()
    with pytest.raises(AgentError, match=f"not ready after {READY_WAIT_SECONDS:.0f} s"):
        fetch(metadata, waits)
    assert max(waits.slept) == READY_MAX_DELAY
    assert READY_WAIT_SECONDS - READY_MAX_DELAY <= sum(waits.slept) <= READY_WAIT_SECONDS


def test_a_refusal_for_good_is_not_waited_on(metadata, key_function):
    """403 (a FAILED or released slice, a VM that is not the host): an AgentError at once, no pause."""
    key_function.key_answer = None
    waits = Waits()
    with pytest.raises(AgentError, match="refused the attempt's key"):
        fetch(metadata, waits)
    assert waits.slept == []
    assert [r["action"] for r in key_function.key_requests] == ["attempt-key"]

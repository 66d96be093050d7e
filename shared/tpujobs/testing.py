"""Helpers for tests of tpujobs and of code built on it (shipped, like structlog.testing)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(probe: Callable[[], T], timeout: float = 60.0, interval: float = 0.05) -> T:
    """Poll `probe` until it returns something truthy, and return that; AssertionError on timeout.

    For end-to-end tests across processes, where there is no event to wait on: the
    probe's docstring, if any, names what was awaited in the failure message.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {probe.__doc__ or probe}")
        time.sleep(interval)

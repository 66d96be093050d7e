"""Fixtures of the engine's tests: `engine(**settings)` builds the engine on in-memory fakes and
this test's TPU simulator (`engine_harness.build_engine`, the one place that knows its classes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from engine_harness import Engine, build_engine


@pytest.fixture
def sleeps() -> list[float]:
    """The sleeps the engine asked for (restart backoff, retry spreads): none is slept."""
    return []


@pytest.fixture
def engine(simulator_url: str, tpu_client: Any, sleeps: list[float]) -> Callable[..., Engine]:
    """`engine(**settings)`: the engine on fakes and this test's simulator; `clock`, `capacity`,
    `access` (policies; default none) and `steps` (a CrashPlan counting the store's and pools'
    calls) replace the defaults, the rest are settings on top of the local stack's."""
    return lambda **overrides: build_engine(simulator_url, tpu_client, sleeps, **overrides)

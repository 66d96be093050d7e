"""The fake metadata server and the recording Google APIs, one per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agent_stubs import FakeMetadata, GoogleStub


@pytest.fixture
def metadata() -> Iterator[FakeMetadata]:
    with FakeMetadata() as server:
        yield server


@pytest.fixture
def google() -> Iterator[GoogleStub]:
    with GoogleStub() as server:
        yield server

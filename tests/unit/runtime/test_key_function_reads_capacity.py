"""The attempt_key function reads capacity (issue 38 items 2 and 3): runtime.instances gives its
key grant the capacity port, so a key waits for its slice to be ACTIVE in every deployment.

Built on emulators nobody listens on, as tests/unit/runtime/test_runtime_instances.py builds them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_runtime_instances import forget_instances

from tpujobs.runtime import instances


@pytest.fixture(autouse=True)
def fresh_instance(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A deployment on emulators nobody listens on."""
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "key-capacity-test")
    monkeypatch.setenv("FIRESTORE_EMULATOR_HOST", "127.0.0.1:9")
    monkeypatch.setenv("TPUJOBS_TPU_ENDPOINT", "http://127.0.0.1:9")
    forget_instances()
    yield
    forget_instances()


def test_the_key_function_waits_for_slices_on_the_capacity_port_built_at_its_first_read():
    """key_api()'s grant holds a readiness gate whose reads go to this instance's capacity port,
    which building the function does not build (its first key request does)."""
    readiness = instances.key_api().keys.readiness
    assert readiness is not None
    assert instances.capacity.cache_info().currsize == 0
    assert readiness.holdings.built() is instances.capacity()

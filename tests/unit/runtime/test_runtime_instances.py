"""runtime.instances builds each client once per function instance, and reads its settings once.

Building a client opens no connection, so the emulator variables point at a closed port.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tpujobs.runtime import instances


def forget_instances() -> None:
    """Forget whatever runtime.instances built: each test starts as a fresh instance."""
    for built_once in vars(instances).values():
        if callable(getattr(built_once, "cache_clear", None)):
            built_once.cache_clear()


@pytest.fixture(autouse=True)
def fresh_instance(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A deployment with prefix t1- on emulators nobody listens on."""
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "instances-test")
    monkeypatch.setenv("TPUJOBS_PREFIX", "t1-")
    monkeypatch.setenv("FIRESTORE_EMULATOR_HOST", "127.0.0.1:9")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    forget_instances()
    yield
    forget_instances()


def test_settings_are_read_from_the_environment_once_per_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    """A message handled after the environment changed still sees the instance's first settings."""
    first = instances.settings()
    monkeypatch.setenv("TPUJOBS_PREFIX", "t2-")
    assert instances.settings() is first and first.prefix == "t1-"
    instances.settings.cache_clear()
    assert instances.settings().prefix == "t2-"


def test_every_target_of_an_instance_shares_one_firestore_client_and_job_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine's adapters, dead letters and the log exporter are built on one client, made once."""
    from google.cloud import firestore

    built: list[firestore.Client] = []
    real = firestore.Client

    def counted(*args: object, **kwargs: object) -> firestore.Client:
        built.append(real(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(firestore, "Client", counted)
    adapters = instances.adapters()
    exporter = instances.output_exporter()
    instances.dead_letters()
    instances.jobs_api()
    assert built == [adapters.firestore] and adapters.firestore.project == "instances-test"
    assert adapters.store is instances.job_store() is exporter.store
    assert adapters.settings is instances.settings()


def _reachable(root: object, depth: int = 6) -> list[object]:
    """Every object reachable from `root` through attributes, dataclass fields and containers."""
    seen: dict[int, object] = {}
    todo = [(root, 0)]
    while todo:
        item, level = todo.pop()
        if id(item) in seen or level > depth or isinstance(item, (str, bytes, int, float, bool, type(None))):
            continue
        seen[id(item)] = item
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            children = list(item)
        else:
            children = list(getattr(item, "__dict__", {}).values())
        todo += [(child, level + 1) for child in children]
    return list(seen.values())


def test_the_jobs_api_engine_holds_no_capacity_client() -> None:
    """The jobs API (and the dashboard on it) is built on NoCapacity with its hand-off: no TPU or
    Compute Engine adapter is reachable from it, and the capacity port is never built."""
    from tpujobs.adapters.capacity_router import PlatformCapacity
    from tpujobs.adapters.compute import ComputeEngine
    from tpujobs.adapters.tpu import CloudTpu
    from tpujobs.engine.capacity_handoff import NoCapacity

    api = instances.jobs_api()
    assert isinstance(api.service.capacity, NoCapacity)
    assert api.service.handoff is instances.adapters().publisher
    lazy = (PlatformCapacity, CloudTpu, ComputeEngine, instances.OnFirstUse)
    found = [o for o in _reachable(api) if isinstance(o, lazy) and o is not instances.adapters().publisher]
    assert found == []
    assert instances.capacity.cache_info().currsize == 0
    assert isinstance(instances.engine().capacity, PlatformCapacity)  # the internal functions' own

"""Shared fixtures: the real emulators for the session, a fresh project per test.

The Firestore and Pub/Sub emulators start once per session (or are reused when the
environment names running ones); each test gets its own project id, which the
emulators keep apart, so tests never see each other's documents or topics.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpujobs.local import processes


def pytest_configure(config: pytest.Config) -> None:
    """A pytest-xdist worker gets COLUMNS from its controller; a Rich console made at import
    would keep that width for good, where a serial run follows each test's own COLUMNS."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.pop("COLUMNS", None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test`), every end-to-end test goes to one worker: the local
    stack is started once, not once per worker. Everything else spreads freely; each worker
    starts emulators of its own, on free ports."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("e2e") is not None:
            item.add_marker(pytest.mark.xdist_group("e2e"))


def _answering(variable: str) -> str | None:
    value = os.environ.get(variable)
    if value and processes.http_get(processes.emulator_url(value) + "/") is not None:
        return value
    return None


def _start_missing(hosts: dict[str, str | None], log_dir: Path) -> list[processes.ManagedProcess]:
    """Start the emulators `hosts` has no address for, on free ports; fill in their addresses."""
    specs = []
    for variable in [name for name, address in hosts.items() if address is None]:
        port = processes.free_port()
        if variable == "FIRESTORE_EMULATOR_HOST":
            specs.append(processes.firestore_emulator(port))
        else:
            specs.append(processes.pubsub_emulator(port, "tpujobs-tests"))
        hosts[variable] = f"{processes.LOOPBACK}:{port}"
    if specs:
        processes.require_gcloud_emulators()
    return processes.start(specs, log_dir)


@pytest.fixture(scope="session")
def emulators(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """FIRESTORE_EMULATOR_HOST and PUBSUB_EMULATOR_HOST of running emulators, started if needed."""
    wanted = ("FIRESTORE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST")
    found = {variable: _answering(variable) for variable in wanted}
    hosts = dict(found)
    try:
        started = _start_missing(hosts, tmp_path_factory.mktemp("emulator-logs"))
    except processes.ServiceStartError:
        # A port chosen free can be taken before the emulator binds it: once more, on new ports.
        hosts = dict(found)
        started = _start_missing(hosts, tmp_path_factory.mktemp("emulator-logs"))
    ready = {variable: str(address) for variable, address in hosts.items()}
    saved = {name: os.environ.get(name) for name in ready}
    os.environ.update(ready)
    try:
        yield ready
    finally:
        processes.stop(started)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def project_id(emulators: dict[str, str]) -> str:
    """A project of this test's own: the emulators keep projects apart."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def firestore_client(project_id: str):
    """A Firestore client on the emulator, in this test's project."""
    from google.cloud import firestore

    return firestore.Client(project=project_id)


@pytest.fixture
def simulator_url(tmp_path: Path) -> Iterator[str]:
    """A TPU simulator of this test's own, in-process, with quick provisioning and no worker
    processes (tests of the workers start their own)."""
    from tpujobs.local.simulator import SimulatorConfig, SimulatorServer

    config = SimulatorConfig(waiting_seconds=0.05, provisioning_seconds=0.1)
    with SimulatorServer(config, run_workers=False) as server:
        yield server.url


@pytest.fixture
def tpu_client(simulator_url: str):
    """The real google-cloud-tpu REST client, pointed at the simulator."""
    from tpujobs.adapters.tpu import build_client

    return build_client(simulator_url)


@pytest.fixture(scope="session")
def local_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`host:port` of a registry on loopback (Debian's docker-registry) for the session, with
    Docker Engine answering (dockerd started when none does and this user may). Where Docker
    cannot run, every test that needs it fails with the sentence saying what to install or
    start: it never passes or skips silently."""
    from tpujobs.local import containers

    root = tmp_path_factory.mktemp("registry")
    started: list[processes.ManagedProcess] = []
    try:  # a dockerd started here is left running: the other test worker may be using it
        containers.start_dockerd(root / "dockerd.log")
    except containers.ContainerToolError as error:
        pytest.fail(f"Docker cannot run here: {error}", pytrace=False)
    problem = containers.docker_problem()
    port = processes.free_port()
    config = root / "registry.yml"
    config.write_text(containers.registry_config(root / "data", processes.LOOPBACK, port))
    try:
        if problem is not None:
            raise processes.StackError(problem)
        started += processes.start([processes.registry(port, config)], root)
    except processes.StackError as error:
        processes.stop(started)
        pytest.fail(f"Docker cannot run here: {error}", pytrace=False)
    try:
        yield f"{processes.LOOPBACK}:{port}"
    finally:
        processes.stop(started)

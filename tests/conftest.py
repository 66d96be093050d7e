"""Shared fixtures: the real emulators for the run, a fresh project per test.

The Firestore and Pub/Sub emulators start once per run, booting in the background while the
tests that need none run (or are reused when the environment names running ones); under
pytest-xdist every worker uses the same pair (support/shared_run.py). Each test gets its own
project id, which the emulators keep apart, so tests never see each other's documents or
topics. The test order and the e2e groups of pytest-xdist are set here too.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from support import shared_run
from tpujobs.local import processes


def pytest_configure(config: pytest.Config) -> None:
    """A pytest-xdist worker gets COLUMNS from its controller; a Rich console made at import
    would keep that width for good, where a serial run follows each test's own COLUMNS."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.pop("COLUMNS", None)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The test files that need no emulators first: they run while the emulators boot.

    Under pytest-xdist (`make test`), each file of end-to-end tests goes whole to one worker (its
    xdist group, `e2e-<file>`), so its module fixtures are made once; the files spread over the
    workers, which share one local stack (e2e/conftest.py). The tests whose faults would reach
    every job on it have a stack of their own and a group of their own (e2e/faults/). The e2e
    tests mostly wait, so a worker more than the cores (PYTEST_WORKERS in the Makefile) keeps the
    cores busy.

    First of the hooks: xdist's worker reads the groups in a hook of its own, registered after
    this file, so a mark added later would group nothing (it did not: every worker took e2e
    tests and started a stack)."""
    booting = {item.path for item in items if "emulators" in getattr(item, "fixturenames", ())}
    items.sort(key=lambda item: item.path in booting)  # whole files, so a module's fixtures are made once
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("e2e") is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(f"e2e-{item.path.stem}"))


_UNGROUPED = pytest.StashKey[str]()


def _check_groups(session: pytest.Session) -> None:
    """On a worker of `--dist loadgroup`, a grouped test's id carries its group (`...@e2e`): that is
    how xdist sends a group to one worker. Where it does not (pytest 9.2's structured ids, xdist
    issue 1386), every worker would start stacks of its own and share them with fault tests: each
    grouped test then fails, saying why, rather than run so."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        session.config.stash[_UNGROUPED] = (
            f"pytest-xdist's loadgroup groups none of the {len(lost)} grouped tests with this pytest "
            f"(xdist issue 1386): pin pytest as pyproject.toml says"
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    ungrouped = item.config.stash.get(_UNGROUPED, None)
    if ungrouped is not None and item.get_closest_marker("xdist_group"):
        pytest.fail(ungrouped, pytrace=False)


EMULATOR_VARIABLES = ("FIRESTORE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST")
Booted = tuple[dict[str, str], list[processes.ManagedProcess]]  # their addresses; what was started
_BOOT = pytest.StashKey["Future[Booted]"]()


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


def _boot() -> Booted:
    """Emulators that answer: those the environment names, else started on free ports."""
    found = {variable: _answering(variable) for variable in EMULATOR_VARIABLES}
    if all(found.values()):
        return {variable: str(address) for variable, address in found.items()}, []
    log_dir = Path(tempfile.mkdtemp(prefix="tpujobs-test-emulators-"))  # removed when they stop
    hosts = dict(found)
    try:
        started = _start_missing(hosts, log_dir)
    except processes.ServiceStartError:
        # A port chosen free can be taken before the emulator binds it: once more, on new ports.
        hosts = dict(found)
        started = _start_missing(hosts, log_dir)
    return {variable: str(address) for variable, address in hosts.items()}, started


def _boot_once(config: pytest.Config) -> Booted:
    """This session's emulators: on a pytest-xdist worker, the run's (booted by whichever worker
    asks first, stopped by the controller); else booted, and later stopped, by this session."""
    folder = shared_run.worker_folder(config)
    if folder is None:
        return _boot()
    return shared_run.shared_emulators(folder, _boot), []


def _booting(config: pytest.Config) -> Future[Booted]:
    """The session's emulators, booting in a thread of their own (started on the first call)."""
    if _BOOT not in config.stash:
        pool = ThreadPoolExecutor(1, thread_name_prefix="emulators")
        config.stash[_BOOT] = pool.submit(_boot_once, config)
        pool.shutdown(wait=False)  # its one task goes on
    return config.stash[_BOOT]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Boot the emulators as soon as the tests are known, when one of them needs them: the Java
    emulators take 15 s or more to answer, which the tests that need none (first in the order,
    `pytest_collection_modifyitems`) run through. And check that the e2e groups hold."""
    _check_groups(session)
    if any("emulators" in getattr(item, "fixturenames", ()) for item in session.items):
        _booting(session.config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """The controller hands each pytest-xdist worker the run's folder, where they share services."""
    node.workerinput[shared_run.WORKER_INPUT_KEY] = str(shared_run.controller_folder(node.config))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the emulators this session started, once every fixture that used them is done; on
    the controller of pytest-xdist workers, what the workers shared, once they are all done."""
    shared_run.stop_shared(session.config)
    boot = session.config.stash.get(_BOOT, None)
    if boot is None:
        return
    try:
        _, started = boot.result()
    except Exception:  # it never started: what went wrong was the emulators fixture's error
        return
    processes.stop(started)
    if started:
        shutil.rmtree(started[0].log_path.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def emulators(pytestconfig: pytest.Config) -> Iterator[dict[str, str]]:
    """FIRESTORE_EMULATOR_HOST and PUBSUB_EMULATOR_HOST of running emulators, started if needed
    (booting since collection ended; stopped when the session ends), exported for the session."""
    ready, _ = _booting(pytestconfig).result()
    saved = {name: os.environ.get(name) for name in ready}
    os.environ.update(ready)
    try:
        yield ready
    finally:
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


@pytest.fixture(scope="session")
def storage_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A storage emulator for the session (per xdist worker); each test makes buckets of its own."""
    port = processes.free_port()
    started = processes.start([processes.storage_emulator(port)], tmp_path_factory.mktemp("storage-emulator"))
    try:
        yield f"http://{processes.LOOPBACK}:{port}"
    finally:
        processes.stop(started)


@pytest.fixture
def bucket(storage_url: str, project_id: str):
    """A fresh bucket in the storage emulator, created with google-cloud-storage."""
    from tpujobs.local import wiring

    client = wiring.storage_client(storage_url, project_id)
    return client.create_bucket(f"logs-{uuid.uuid4().hex[:10]}")

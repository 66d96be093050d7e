"""`tpujobs dev up / down`: the whole local stack, started for real, in a temporary state dir."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tpujobs.engine import topology
from tpujobs.engine.settings import Settings
from tpujobs.local import processes, stack, wiring
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

EMULATOR_VARIABLES = ("FIRESTORE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST", "STORAGE_EMULATOR_HOST")
SETTINGS = Settings(prefix="t1-")
SHELL_REPORT_KEY = "a-report-key-left-in-the-shell"  # must reach no service: up makes its own


def clean_environ(**extra: str) -> dict[str, str]:
    """The test process environment without emulator addresses (so nothing is reused by accident)."""
    env = {k: v for k, v in os.environ.items() if k not in EMULATOR_VARIABLES}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack.StackState]:
    """One stack for the module; stopped at the end whatever happens."""
    state_dir = tmp_path_factory.mktemp("stack")
    try:
        yield stack.up(state_dir, SETTINGS, environ=clean_environ(TPUJOBS_REPORT_KEY=SHELL_REPORT_KEY))
    finally:
        stack.down(state_dir)


def test_up_starts_every_service_and_each_endpoint_answers(
    running: stack.StackState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After up, Firestore, Pub/Sub (topics and push subscriptions), the bucket and the simulator answer."""
    env = running.env
    # dockerd too when this `up` had to start it (none answered): it is then the stack's.
    assert {p.name for p in running.processes} - {"dockerd"} == {
        "registry",
        "firestore",
        "pubsub",
        "storage",
        "simulator",
        "secret-manager",
        "cloud-logging",
        "cloud-monitoring",
        "scheduler",
        "pusher",
        *(f"function-{r.target}" for r in topology.FUNCTIONS),
    }
    assert all(processes.is_running(p) for p in running.processes)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    from google.cloud import firestore, storage

    db = firestore.Client(project=env["GOOGLE_CLOUD_PROJECT"])
    db.collection("dev-stack-check").document("d").set({"ok": True})
    assert db.collection("dev-stack-check").document("d").get().to_dict() == {"ok": True}

    project = env["GOOGLE_CLOUD_PROJECT"]
    publisher = wiring.publisher_client(env["PUBSUB_EMULATOR_HOST"])
    subscriber = wiring.subscriber_client(env["PUBSUB_EMULATOR_HOST"])
    topics = {t.name for t in publisher.list_topics(project=f"projects/{project}")}
    assert topics == {
        publisher.topic_path(project, topology.topic_name(t, SETTINGS.prefix)) for t in topology.ALL_TOPICS
    }
    # The emulator holds each subscription's pull twin; the pusher pushes it to the function's URL.
    held = {s.name: s.push_config.push_endpoint for s in subscriber.list_subscriptions(project=f"projects/{project}")}
    expected = {
        subscriber.subscription_path(
            project, topology.push_subscription_name(r, SETTINGS.prefix)
        ): wiring.push_endpoint(running.functions[r.target])
        for r in topology.FUNCTIONS
        if r.signature == "cloudevent"
    }
    assert held == dict.fromkeys(expected, "")
    config = json.loads((running.state_dir / stack.PUSHER_CONFIG).read_text())
    assert {route["subscription"]: route["endpoint"] for route in config["routes"]} == expected

    bucket = storage.Client(project=project).lookup_bucket(env["TPUJOBS_LOGS_BUCKET"])
    assert bucket is not None

    health = processes.http_get(env["TPUJOBS_TPU_ENDPOINT"] + "/simulator/v1/health")
    assert health is not None and health[0] == 200 and json.loads(health[1])["ok"] is True
    for url in running.functions.values():
        assert processes.http_get(url) is not None


def test_env_lines_export_the_stack_endpoints(running: stack.StackState) -> None:
    """env_lines exports the project, every emulator, the simulator, the prefix and the local flag."""
    lines = stack.env_lines(running)
    exported = dict(line.removeprefix("export ").split("=", 1) for line in lines)
    assert exported["STORAGE_EMULATOR_HOST"].startswith("http://127.0.0.1:")
    assert exported["TPUJOBS_TPU_ENDPOINT"].startswith("http://127.0.0.1:")
    assert exported["TPUJOBS_SECRETS_ENDPOINT"].startswith("http://127.0.0.1:")
    assert exported["TPUJOBS_LOGGING_ENDPOINT"].startswith("http://127.0.0.1:")
    # One the environment names (another stack of this session exported its own) is kept;
    # else the stack's own default account: never a Compute default.
    expected = (
        os.environ.get("TPUJOBS_TPU_SERVICE_ACCOUNT") or f"tpujobs-tpu-vm@{SETTINGS.project}.iam.gserviceaccount.com"
    )
    assert exported["TPUJOBS_TPU_SERVICE_ACCOUNT"] == expected
    assert exported["TPUJOBS_PREFIX"] == "t1-"
    assert exported["TPUJOBS_LOCAL_STACK"] == "1"
    assert {
        "GOOGLE_CLOUD_PROJECT",
        "FIRESTORE_EMULATOR_HOST",
        "PUBSUB_EMULATOR_HOST",
        "TPUJOBS_DEFAULT_ZONE",
        "TPUJOBS_LOGS_BUCKET",
    } <= exported.keys()


def test_the_registry_answers_at_tpujobs_registry_with_its_data_under_the_state_dir(
    running: stack.StackState,
) -> None:
    """up starts docker-registry on loopback and exports it; its storage is the state dir's."""
    address = running.env["TPUJOBS_REGISTRY"]
    assert address.startswith("127.0.0.1:")
    answer = processes.http_get(f"http://{address}/v2/")
    assert answer is not None and answer[0] == 200
    registry = next(p for p in running.processes if p.name == "registry")
    assert registry.port == int(address.rsplit(":", 1)[1])
    config = (running.state_dir / "registry" / "config.yml").read_text()
    assert str(running.state_dir / "registry" / "data") in config and f"127.0.0.1:{registry.port}" in config
    assert f"export TPUJOBS_REGISTRY={address}" in stack.env_lines(running)


def test_dockerd_is_the_stacks_only_when_up_started_it(running: stack.StackState) -> None:
    """Recorded, it is up's own and serves; not recorded, an engine that already answered is used
    (and `down`, stopping only what is recorded, leaves it running)."""
    from tpujobs.local import containers

    assert containers.docker_problem() is None, containers.docker_problem()
    recorded = [p for p in running.processes if p.name == "dockerd"]
    assert all(processes.is_running(p) and p.argv[0].endswith("dockerd") for p in recorded)


def test_where_docker_cannot_run_up_says_why_and_starts_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    """No docker CLI: a warning with docker_problem's sentence, no dockerd recorded."""
    from tpujobs.local import containers

    monkeypatch.setattr(containers, "docker_binary", lambda: None)
    said: list[str] = []

    assert stack.docker_engine(Path("/nonexistent"), said.append) == []

    assert said == [f"warning: {containers.docker_problem()}; jobs with an image will fail when their hosts pull it"]
    assert "apt-get install docker.io" in said[0]


def test_a_process_started_elsewhere_is_adopted_and_stopped_like_the_others(tmp_path: Path) -> None:
    """dockerd is started by containers.start_dockerd; adopted, stop finds and ends its group."""
    handle = subprocess.Popen(["sleep", "60"], start_new_session=True)
    adopted = processes.adopt("dockerd", handle, tmp_path / "dockerd.log")
    assert adopted.argv == ("sleep", "60") and processes.is_running(adopted)

    assert processes.stop([adopted]) == [adopted]

    assert handle.poll() is not None and not processes.is_running(adopted)


def process_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {name: value for name, _, value in pairs}


def test_the_secret_manager_serves_the_real_client_and_the_simulator_points_hosts_at_it(
    running: stack.StackState,
) -> None:
    """up starts the local Secret Manager; the simulator (so every simulated host) and the
    functions have its endpoint and the TPU VM account in their environment."""
    from tpujobs.adapters.secrets import build_client

    endpoint = running.env["TPUJOBS_SECRETS_ENDPOINT"]
    client = build_client(endpoint)  # as the stack's operator
    parent = f"projects/{running.env['GOOGLE_CLOUD_PROJECT']}"
    made = client.create_secret(parent=parent, secret_id="dev-stack-check", secret={"replication": {"automatic": {}}})
    client.add_secret_version(parent=made.name, payload={"data": b"x"})
    assert client.access_secret_version(name=f"{made.name}/versions/latest").payload.data == b"x"

    simulator = next(p for p in running.processes if p.name == "simulator")
    function = next(p for p in running.processes if p.name.startswith("function-"))
    for process in (simulator, function):
        environ = process_environ(process.pid)
        assert environ["TPUJOBS_SECRETS_ENDPOINT"] == endpoint
        assert environ["TPUJOBS_TPU_SERVICE_ACCOUNT"] == running.env["TPUJOBS_TPU_SERVICE_ACCOUNT"]


def test_the_report_key_reaches_the_functions_only(running: stack.StackState) -> None:
    """A fresh key in every function's environment and in stack.json (0600), and nowhere else:
    not the simulator (whose hosts run jobs' code), not the scheduler, not the export lines."""
    key = running.report_key
    assert len(key) >= 64 and key != SHELL_REPORT_KEY
    functions = [p for p in running.processes if p.name.startswith("function-")]
    others = [p for p in running.processes if not p.name.startswith("function-")]
    assert functions and {"simulator", "secret-manager"} <= {p.name for p in others}
    for process in functions:
        assert process_environ(process.pid)["TPUJOBS_REPORT_KEY"] == key
    for process in others:
        environ = process_environ(process.pid)
        assert "TPUJOBS_REPORT_KEY" not in environ, process.name
        assert key not in "\0".join(environ.values()), process.name

    lines = "\n".join(stack.env_lines(running))
    assert "TPUJOBS_REPORT_KEY" not in lines and key not in lines
    assert key not in repr(running)
    path = running.state_dir / stack.STACK_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["report_key"] == key
    assert stack.load(running.state_dir).report_key == key  # type: ignore[union-attr]


def test_up_twice_returns_the_running_stack_with_the_same_pids(
    running: stack.StackState,
) -> None:
    """A second up starts nothing and returns the recorded processes."""
    again = stack.up(running.state_dir, SETTINGS, environ=clean_environ())
    assert again.already_running
    assert [p.pid for p in again.processes] == [p.pid for p in running.processes]


def test_down_stops_exactly_the_started_pids_and_leaves_a_reused_emulator_running(
    tmp_path: Path, emulators: dict[str, str]
) -> None:
    """Emulators named by the environment (the test run's own) are reused, not recorded, and survive down."""
    reused = {"firestore": emulators["FIRESTORE_EMULATOR_HOST"], "pubsub": emulators["PUBSUB_EMULATOR_HOST"]}
    settings = Settings(prefix="t2-")  # beside `running`'s topics, never on them
    state_dir = tmp_path / "stack"
    state = stack.up(state_dir, settings, environ=clean_environ(**emulators))
    assert state.reused == reused
    assert state.env["PUBSUB_EMULATOR_HOST"] == reused["pubsub"]
    assert not {"firestore", "pubsub"} & {p.name for p in state.processes}

    stopped = stack.down(state_dir)

    assert sorted(p.pid for p in stopped) == sorted(p.pid for p in state.processes)
    assert "secret-manager" in {p.name for p in stopped}
    assert processes.http_get(state.env["TPUJOBS_SECRETS_ENDPOINT"] + "/health") is None
    assert not any(processes.is_running(p) for p in state.processes)
    for address in reused.values():
        assert processes.http_get(f"http://{address}/") is not None
    assert not (state_dir / stack.STACK_FILE).exists()


def test_stop_leaves_alone_a_pid_that_is_no_longer_the_recorded_process(tmp_path: Path) -> None:
    """A recorded pid now held by another process (other start time or command) is not signalled."""
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        started = processes.ManagedProcess(
            name="ours", pid=other.pid, port=0, log_path=tmp_path / "ours.log", argv=("sleep", "60")
        )
        later_start = replace(started, create_time=(processes.process_create_time(other.pid) or 0) + 1)
        other_command = replace(started, argv=("gcloud", "emulators", "firestore", "start"))
        wait_for(lambda: processes.is_running(started), timeout=5)  # once `sleep` has exec'd
        assert not processes.is_running(later_start)
        assert not processes.is_running(other_command)

        assert processes.stop([later_start, other_command], grace_s=0.5) == []
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()

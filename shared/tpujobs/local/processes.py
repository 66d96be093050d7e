"""Start, probe and stop the background services of the local stack.

Each service runs in its own session (its process group holds every child it forks), logs to
a file, and counts as started once it answers a probe. `stop` signals the whole group, but
only while the recorded pid is still the process we started (pid and start time): `tpujobs
dev down` may run days later. See docs/local-stack.md.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tpujobs.engine.topology import FunctionRoute
from tpujobs.local import containers
from tpujobs.local.function_scale import requests_at_once

LOOPBACK = "127.0.0.1"

INSTALL_HINT = (
    "The local stack needs the Google Cloud CLI with the Firestore and Pub/Sub emulators, "
    "and Java 17 or newer. On Debian or Ubuntu (with Google's apt repository): "
    "`apt-get install google-cloud-cli google-cloud-cli-firestore-emulator "
    "google-cloud-cli-pubsub-emulator openjdk-17-jre-headless`; with a gcloud installed from "
    "the tarball: `gcloud components install beta cloud-firestore-emulator pubsub-emulator` "
    "and a Java 17+ runtime on PATH. Or start the emulators yourself (for example "
    "`firebase emulators:start`) and export FIRESTORE_EMULATOR_HOST and PUBSUB_EMULATOR_HOST."
)


class StackError(RuntimeError):
    """The local stack could not do what was asked; the message says why and what to do."""


class MissingToolError(StackError):
    """A program the local stack needs is not installed."""


class ServiceStartError(StackError):
    """A service exited or did not answer in time; the message quotes the end of its log."""


@dataclass(frozen=True)
class ServiceSpec:
    """How to run one service and how to tell that it is ready."""

    name: str
    argv: tuple[str, ...]
    port: int
    ready: Callable[[], bool]
    deadline_s: float = 30.0
    env: Mapping[str, str] | None = None  # the whole environment; None: inherit ours
    diagnose: Callable[[str], str | None] | None = None  # log tail -> a better message


@dataclass(frozen=True)
class ManagedProcess:
    """A service we started: enough to find it again, check it is still ours, and stop it."""

    name: str
    pid: int
    port: int
    log_path: Path
    argv: tuple[str, ...]
    # When it started (psutil's create_time, seconds since the epoch): with the pid, it names one
    # process for good, across reboots too. None: unknown (a state file from before psutil).
    create_time: float | None = None
    handle: subprocess.Popen[bytes] | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": self.pid,
            "port": self.port,
            "log_path": str(self.log_path),
            "argv": list(self.argv),
            "create_time": self.create_time,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ManagedProcess:
        return cls(
            name=data["name"],
            pid=int(data["pid"]),
            port=int(data["port"]),
            log_path=Path(data["log_path"]),
            argv=tuple(data["argv"]),
            create_time=data.get("create_time"),
        )


# --- probes ---------------------------------------------------------------------------


# Ports for our services come from below the kernel's ephemeral range: every bind to port 0
# (test servers, client sockets) draws from that range, and could take a port we chose for a
# service before the service binds it.
_SERVICE_PORTS = range(20000, 32768)
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nobody listens on right now, outside the ephemeral range (bind it soon)."""
    low = _ephemeral_low()
    candidates = [p for p in _SERVICE_PORTS if p < low] if low else []
    for port in random.sample(candidates, min(len(candidates), 64)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # no range known: the kernel's pick
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int | None:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def listens_on(process: ManagedProcess, port: int) -> bool:
    """The process, or one of its children, listens on the TCP port (not someone else who took it)."""
    found = _live(process.pid)
    if found is None:
        return False
    try:
        tree = [found, *found.children(recursive=True)]
    except psutil.Error:
        return False
    for member in tree:
        with contextlib.suppress(psutil.Error):
            for conn in member.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                    return True
    return False


def http_get(url: str, timeout_s: float = 1.0) -> tuple[int, bytes] | None:
    """Status and body of GET url, or None when nothing answers. Never goes through a proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read()
    except (OSError, ValueError):
        return None


def answers_http(url: str) -> Callable[[], bool]:
    """A probe: anything at all answers GET url (any status)."""
    return lambda: http_get(url) is not None


def answers_ok(url: str, body: bytes | None = None) -> Callable[[], bool]:
    """A probe: GET url answers 200 (and, if given, a body starting with `body`)."""

    def probe() -> bool:
        got = http_get(url)
        return got is not None and got[0] == 200 and (body is None or got[1].startswith(body))

    return probe


def emulator_url(host_port: str) -> str:
    """`host:port` or `http://host:port` as an http URL without a trailing slash."""
    value = host_port.strip().rstrip("/")
    return value if "://" in value else f"http://{value}"


# --- the services ---------------------------------------------------------------------


def firestore_emulator(port: int, *, deadline_s: float = 60.0) -> ServiceSpec:
    """The gcloud Firestore emulator (Java; a few seconds to start)."""
    return ServiceSpec(
        name="firestore",
        argv=(
            _gcloud(),
            "emulators",
            "firestore",
            "start",
            f"--host-port={LOOPBACK}:{port}",
        ),
        port=port,
        ready=answers_ok(f"http://{LOOPBACK}:{port}/", b"Ok"),
        deadline_s=deadline_s,
        env=_gcloud_env(),
        diagnose=_diagnose_gcloud,
    )


def pubsub_emulator(port: int, project: str, *, deadline_s: float = 60.0) -> ServiceSpec:
    """The gcloud Pub/Sub emulator (Java; a few seconds to start)."""
    return ServiceSpec(
        name="pubsub",
        argv=(
            _gcloud(),
            "beta",
            "emulators",
            "pubsub",
            "start",
            f"--host-port={LOOPBACK}:{port}",
            f"--project={project}",
        ),
        port=port,
        ready=answers_http(f"http://{LOOPBACK}:{port}/"),
        deadline_s=deadline_s,
        env=_gcloud_env(),
        diagnose=_diagnose_gcloud,
    )


def storage_emulator(port: int, *, deadline_s: float = 30.0) -> ServiceSpec:
    """gcp-storage-emulator, in memory: enough of the JSON API for google-cloud-storage (with two
    mends, `tpujobs.local.storage_emulator`)."""
    return ServiceSpec(
        name="storage",
        argv=(
            sys.executable,
            "-m",
            "tpujobs.local.storage_emulator",
            "start",
            f"--host={LOOPBACK}",
            f"--port={port}",
            "--in-memory",
        ),
        port=port,
        ready=answers_http(f"http://{LOOPBACK}:{port}/"),
        deadline_s=deadline_s,
    )


# The local stack's simulator settings that differ from SimulatorConfig's defaults.
LOCAL_SIMULATOR = {
    "deleting-seconds": 3.0,
    "default-page-size": 2,
    "maintenance-notice-seconds": 5.0,
}


def simulator(
    port: int,
    *,
    env: Mapping[str, str] | None = None,
    state_file: Path | None = None,
    workers_root: Path | None = None,
    deadline_s: float = 30.0,
) -> ServiceSpec:
    """The local TPU API (tpujobs.local.simulator); worker hosts run under `workers_root`.

    It is as unkind as Google where that costs a test little: deleting takes a few seconds
    (the DELETING state and the chips it still holds are seen), lists come two to a page (so
    every caller must follow nextPageToken), and a maintenance gives a short notice.
    """
    argv = [sys.executable, "-m", "tpujobs.local.simulator", "--host", LOOPBACK, "--port", str(port)]
    argv += [f"--{name}={value}" for name, value in LOCAL_SIMULATOR.items()]
    if state_file is not None:
        argv += ["--state-file", str(state_file)]
    if workers_root is not None:
        argv += ["--workers-root", str(workers_root)]
    return ServiceSpec(
        name="simulator",
        argv=tuple(argv),
        port=port,
        ready=answers_ok(f"http://{LOOPBACK}:{port}/simulator/v1/health"),
        deadline_s=deadline_s,
        env=env,
    )


def cloud_logging(port: int, *, env: Mapping[str, str] | None = None, deadline_s: float = 30.0) -> ServiceSpec:
    """The local Cloud Logging (tpujobs.local.simulator.cloud_logging): entries:write and entries:list."""
    return ServiceSpec(
        name="cloud-logging",
        argv=(sys.executable, "-m", "tpujobs.local.simulator.cloud_logging", "--host", LOOPBACK, "--port", str(port)),
        port=port,
        ready=answers_ok(f"http://{LOOPBACK}:{port}/health"),
        deadline_s=deadline_s,
        env=env,
    )


def cloud_monitoring(
    port: int, writers: Sequence[str], *, env: Mapping[str, str] | None = None, deadline_s: float = 30.0
) -> ServiceSpec:
    """The local Cloud Monitoring (tpujobs.local.simulator.cloud_monitoring, gRPC): timeSeries.create
    for `writers` (the functions' accounts) only, and timeSeries.list."""
    argv = [sys.executable, "-m", "tpujobs.local.simulator.cloud_monitoring", "--host", LOOPBACK, "--port", str(port)]
    for writer in writers:
        argv += ["--writer", writer]
    return ServiceSpec(
        name="cloud-monitoring",
        argv=tuple(argv),
        port=port,
        ready=lambda: _accepts(port),
        deadline_s=deadline_s,
        env=env,
    )


def _accepts(port: int) -> bool:
    """Whether something accepts TCP connections on the loopback port (a gRPC server has no HTTP to ask)."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1.0):
            return True
    except OSError:
        return False


def secret_manager(
    port: int,
    *,
    prefix: str = "",
    env: Mapping[str, str] | None = None,
    state_file: Path | None = None,
    deadline_s: float = 30.0,
) -> ServiceSpec:
    """The local Secret Manager (tpujobs.local.simulator.secret_manager); `prefix` is TPUJOBS_PREFIX,
    which starts the secret ids each VM account may read."""
    argv = [
        sys.executable,
        "-m",
        "tpujobs.local.simulator.secret_manager",
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        f"--prefix={prefix}",  # one argument even when empty: a command line read back may drop empty ones
    ]
    if state_file is not None:
        argv += ["--state-file", str(state_file)]
    return ServiceSpec(
        name="secret-manager",
        argv=tuple(argv),
        port=port,
        ready=answers_ok(f"http://{LOOPBACK}:{port}/health"),
        deadline_s=deadline_s,
        env=env,
    )


# Each function runs in one process with a thread for every request production serves at once
# (max instances x concurrency, `function_scale`), the pusher's limit too: one process holds the
# imports and memory once, and the handlers wait on I/O far more than they compute. A WORKERS or
# THREADS already in the function's environment wins, to measure other values.
FUNCTION_WORKERS = 1


def function(
    route: FunctionRoute,
    port: int,
    *,
    source: Path,
    env: Mapping[str, str] | None = None,
    deadline_s: float = 30.0,
) -> ServiceSpec:
    """One target of functions/main.py under functions-framework, in one process with as many
    threads as production serves requests at once (`function_scale`)."""
    environment = dict(os.environ if env is None else env)
    environment.setdefault("WORKERS", str(FUNCTION_WORKERS))
    environment.setdefault("THREADS", str(requests_at_once(route.target)))
    return ServiceSpec(
        name=f"function-{route.target}",
        argv=(
            _venv_script("functions-framework"),
            "--source",
            str(source),
            "--target",
            route.target,
            "--signature-type",
            route.signature,
            "--host",
            LOOPBACK,
            "--port",
            str(port),
        ),
        port=port,
        ready=answers_http(f"http://{LOOPBACK}:{port}/"),
        deadline_s=deadline_s,
        env=environment,
    )


def registry(port: int, config_path: Path, *, deadline_s: float = 30.0) -> ServiceSpec:
    """Debian's docker-registry on loopback, plain HTTP (`containers.registry_config` says where
    it keeps its data); ready when its API root answers. MissingToolError when not installed."""
    try:
        argv = containers.registry_command(config_path)
    except containers.ContainerToolError as error:
        raise MissingToolError(str(error)) from error
    return ServiceSpec(
        name="registry",
        argv=tuple(argv),
        port=port,
        ready=answers_ok(f"http://{LOOPBACK}:{port}/v2/"),
        deadline_s=deadline_s,
    )


def pusher(config_path: Path, *, env: Mapping[str, str] | None = None) -> ServiceSpec:
    """The local push delivery (tpujobs.local.pusher): every route's subscription, pushed to its
    function as concurrently as production pushes."""
    return ServiceSpec(
        name="pusher",
        argv=(sys.executable, "-m", "tpujobs.local.pusher", "--config", str(config_path)),
        port=0,
        ready=lambda: True,
        env=env,
    )


def scheduler(interval_s: float, *, env: Mapping[str, str] | None = None) -> ServiceSpec:
    """The local Cloud Scheduler: reconcile ticks every `interval_s` (tpujobs.local.scheduler)."""
    return ServiceSpec(
        name="scheduler",
        argv=(sys.executable, "-m", "tpujobs.local.scheduler", "--interval", str(interval_s)),
        port=0,
        ready=lambda: True,
        env=env,
    )


# --- starting -------------------------------------------------------------------------


def start(
    specs: Sequence[ServiceSpec],
    log_dir: Path,
    *,
    on_ready: Callable[[ManagedProcess], None] | None = None,
) -> list[ManagedProcess]:
    """Start every service at once, then wait for each to answer.

    All or nothing: if one fails, the others are stopped before the error is raised.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    started: list[ManagedProcess] = []
    try:
        pairs = []
        for spec in specs:
            process = _spawn(spec, log_dir)
            started.append(process)
            pairs.append((spec, process))
        for spec, process in pairs:
            _wait_ready(spec, process)
            if on_ready is not None:
                on_ready(process)
    except BaseException:
        stop(started)
        raise
    return started


def _spawn(spec: ServiceSpec, log_dir: Path) -> ManagedProcess:
    log_path = log_dir / f"{spec.name}.log"
    env = dict(os.environ if spec.env is None else spec.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    with log_path.open("wb") as log:
        try:
            handle = subprocess.Popen(
                spec.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: stop reaches every child
            )
        except FileNotFoundError as error:
            raise MissingToolError(f"cannot start {spec.name}: {spec.argv[0]} not found. {INSTALL_HINT}") from error
    return ManagedProcess(
        name=spec.name,
        pid=handle.pid,
        port=spec.port,
        log_path=log_path,
        argv=spec.argv,
        create_time=process_create_time(handle.pid),
        handle=handle,
    )


def adopt(name: str, handle: subprocess.Popen[bytes], log_path: Path) -> ManagedProcess:
    """A process started elsewhere in its own session (dockerd, by `containers.start_dockerd`),
    recorded like the services `start` starts, so `stop` finds it, and only it, again."""
    args = handle.args
    argv = tuple(str(part) for part in args) if isinstance(args, (list, tuple)) else (str(args),)
    return ManagedProcess(
        name=name,
        pid=handle.pid,
        port=0,
        log_path=log_path,
        argv=argv,
        create_time=process_create_time(handle.pid),
        handle=handle,
    )


def _wait_ready(spec: ServiceSpec, process: ManagedProcess, poll_s: float = 0.1) -> None:
    deadline = time.monotonic() + spec.deadline_s
    while True:
        # Exited first: if it lost its port, whoever holds the port would answer the probe.
        code = process.handle.poll() if process.handle is not None else None
        exited = code is not None if process.handle is not None else not is_running(process)
        if not exited and spec.ready():
            if spec.port == 0 or listens_on(process, spec.port):
                return
            # Something answers, but not ours: the port was taken before our service bound it.
            raise ServiceStartError(f"{spec.name} (pid {process.pid}): port {spec.port} answers from another process")
        if exited:
            tail = log_tail(process.log_path)
            hint = spec.diagnose(tail) if spec.diagnose is not None else None
            message = f"{spec.name} exited (code {code}) before answering"
            if hint is not None:
                raise MissingToolError(f"{message}: {hint}\n--- {process.log_path} ---\n{tail}")
            raise ServiceStartError(f"{message}.\n--- {process.log_path} ---\n{tail}")
        if time.monotonic() > deadline:
            raise ServiceStartError(
                f"{spec.name} (pid {process.pid}, port {spec.port}) did not answer within "
                f"{spec.deadline_s:.0f} s.\n--- {process.log_path} ---\n{log_tail(process.log_path)}"
            )
        time.sleep(poll_s)


def log_tail(path: Path, lines: int = 25) -> str:
    """The last lines of a log file, for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


# --- is it still ours, and stopping -----------------------------------------------------


def is_running(process: ManagedProcess) -> bool:
    """The recorded pid is alive and is still the process we started (not a reused pid).

    Its pid and start time name one process for good (it may rename itself); without a start
    time, its command line must still end with the arguments we gave it.
    """
    found = _live(process.pid)
    try:
        if found is None:
            return False
        if process.create_time is not None:
            return found.create_time() == process.create_time
        cmdline = found.cmdline()
    except psutil.Error:  # gone meanwhile
        return False
    expected = list(process.argv[1:])  # argv[0] may differ: scripts re-exec
    return bool(cmdline) and cmdline[len(cmdline) - len(expected) :] == expected


def stop(processes: Iterable[ManagedProcess], grace_s: float = 10.0) -> list[ManagedProcess]:
    """SIGTERM each process group we still own, wait up to grace_s, then SIGKILL what is left.

    A pid that is no longer ours is left alone. Returns the processes that were signalled.
    """
    signalled = [p for p in processes if is_running(p)]
    for process in signalled:
        _signal_group(process.pid, signal.SIGTERM)
    leftovers = _wait_gone(signalled, grace_s)
    for process in leftovers:
        _signal_group(process.pid, signal.SIGKILL)
    _wait_gone(leftovers, 5.0)
    return signalled


def _wait_gone(processes: Sequence[ManagedProcess], timeout_s: float) -> list[ManagedProcess]:
    deadline = time.monotonic() + timeout_s
    remaining = list(processes)
    while remaining:
        for process in remaining:
            _reap(process)
        remaining = [p for p in remaining if group_running(p.pid)]
        if not remaining or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return remaining


def _reap(process: ManagedProcess) -> None:
    """Collect the exit status if the process is our child, so it does not linger as a zombie."""
    if process.handle is not None:
        process.handle.poll()
        return
    with contextlib.suppress(ChildProcessError):  # not our child: init reaps it
        os.waitpid(process.pid, os.WNOHANG)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def group_running(pgid: int) -> bool:
    """Some process of the group still runs; zombies waiting to be reaped do not count."""
    for pid in psutil.pids():
        with contextlib.suppress(OSError):  # gone meanwhile
            if os.getpgid(pid) == pgid and _live(pid) is not None:
                return True
    return False


def process_create_time(pid: int) -> float | None:
    """When pid started (seconds since the epoch), or None if it is gone: with the pid, its identity."""
    found = _live(pid)
    try:
        return None if found is None else found.create_time()
    except psutil.Error:  # gone meanwhile
        return None


def _live(pid: int) -> psutil.Process | None:
    """The process with this pid while it runs; None once it is gone or a zombie waiting to be reaped.
    Every psutil look-up here goes through it."""
    try:
        found = psutil.Process(pid)
        return None if found.status() == psutil.STATUS_ZOMBIE else found
    except psutil.Error:
        return None


# --- tools ----------------------------------------------------------------------------


def _venv_script(name: str) -> str:
    """A console script installed next to this interpreter, else the one on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    return shutil.which(name) or name


def _gcloud() -> str:
    return shutil.which("gcloud") or "gcloud"


def _gcloud_env() -> dict[str, str]:
    env = dict(os.environ)
    env["CLOUDSDK_CORE_DISABLE_PROMPTS"] = "1"  # fail instead of asking to install components
    return env


def require_gcloud_emulators(components: Iterable[str] = ("firestore", "pubsub")) -> None:
    """Fail fast, before starting anything, when gcloud, Java or an emulator is missing."""
    wanted = set(components)
    if not wanted:
        return
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        raise MissingToolError(f"gcloud is not on PATH. {INSTALL_HINT}")
    java = shutil.which("java")
    if java is None:
        raise MissingToolError(f"java is not on PATH (the emulators are Java). {INSTALL_HINT}")
    major = _java_major(java)
    if major is not None and major < 11:
        raise MissingToolError(f"{java} is Java {major}; the emulators need 17+. {INSTALL_HINT}")
    sdk = Path(gcloud).resolve().parent.parent
    platform = sdk / "platform"
    if not (sdk / "lib" / "gcloud.py").exists() or not platform.is_dir():
        return  # an unusual layout: let the start command tell us what is missing
    needed = {"firestore": "cloud-firestore-emulator", "pubsub": "pubsub-emulator"}
    missing = [needed[c] for c in sorted(wanted) if not (platform / needed[c]).is_dir()]
    installed = sdk / ".install"  # component manifests; absent in some distributions
    if "pubsub" in wanted and installed.is_dir() and not (installed / "beta.manifest").exists():
        missing.append("beta")
    if missing:
        raise MissingToolError(f"gcloud at {sdk} lacks the components {', '.join(missing)}. {INSTALL_HINT}")


def _java_major(java: str) -> int | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


def _diagnose_gcloud(log: str) -> str | None:
    """Turn a gcloud emulator failure into an install instruction, when that is the cause."""
    lowered = log.lower()
    if "unsupportedclassversionerror" in lowered or ("java" in lowered and "not found" in lowered):
        return f"the emulator needs a newer Java. {INSTALL_HINT}"
    if "component" in lowered and ("not installed" in lowered or "requires the installation" in lowered):
        return f"an emulator component is missing. {INSTALL_HINT}"
    return None

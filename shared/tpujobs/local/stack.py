"""The local stack: every service of production on loopback, recorded so it can be stopped.

`up` starts what is missing (the emulators named by the environment are reused, not
started), wires topics, push subscriptions and the logs bucket, and writes `stack.json` in
the state directory. That file is the only memory between `tpujobs dev up` and `tpujobs dev
down`: `down` stops exactly the processes it lists, after checking each is still ours, so a
reused emulator or an unrelated process that inherited a pid is never touched.

Jobs' container images run on the machine's Docker Engine: `up` starts dockerd when none
answers and it may (root), and lists it then, and only then, so `down` stops it. A registry on
loopback (`TPUJOBS_REGISTRY`) is one of the stack's processes. Where Docker cannot run, `up`
says why and starts the rest: a job with an image then fails at its pull, naming the image.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import os
import secrets
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tpujobs.engine import topology
from tpujobs.engine.settings import Settings
from tpujobs.local import containers, processes, pusher, wiring
from tpujobs.local.function_accounts import function_account, function_accounts
from tpujobs.local.processes import LOOPBACK, ManagedProcess, StackError

STACK_FILE = "stack.json"
PUSHER_CONFIG = "pusher.json"  # the pusher's routes, beside stack.json
REPORT_KEY_VARIABLE = "TPUJOBS_REPORT_KEY"
FORMAT_VERSION = 1
RECONCILE_INTERVAL_S = 3.0  # Cloud Scheduler ticks once a minute; locally, every few seconds
# Hosts whose agent never reports are lost after this long (production: 600 s), so a test of
# capacity that never boots (`tpujobs dev fault no-boot`) sees the recovery within a minute.
LOCAL_BOOT_TIMEOUT_S = 45.0
# A node in a condition that often passes (health TIMEOUT, RESTARTING, ...) is a lost host after
# this long (production: 300 s), so `tpujobs dev fault node-health` shows the recovery quickly.
LOCAL_UNHEALTHY_GRACE_S = 20.0
REPO_ROOT = Path(__file__).resolve().parents[3]  # shared/tpujobs/local/stack.py -> the repo

Report = Callable[[str], None]


@dataclass(frozen=True)
class StackState:
    """A running local stack, as written to `stack.json`."""

    state_dir: Path
    env: Mapping[str, str]  # what `env_lines` exports
    processes: tuple[ManagedProcess, ...]  # what we started, and only that
    reused: Mapping[str, str] = field(default_factory=dict)  # service -> address from the env
    functions: Mapping[str, str] = field(default_factory=dict)  # target -> local URL
    functions_source: str = ""
    created_at: str = ""
    already_running: bool = False  # `up` found it running and started nothing
    # The report-signing master key: in the functions' environment only (TPUJOBS_REPORT_KEY),
    # never in `env`, the simulator's environment or a printed line; stack.json is 0600.
    report_key: str = field(default="", repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "created_at": self.created_at,
            "functions_source": self.functions_source,
            "env": dict(self.env),
            "reused": dict(self.reused),
            "functions": dict(self.functions),
            "processes": [p.to_json() for p in self.processes],
            "report_key": self.report_key,
        }

    @classmethod
    def from_json(cls, state_dir: Path, data: Mapping[str, Any]) -> StackState:
        return cls(
            state_dir=state_dir,
            env=dict(data["env"]),
            processes=tuple(ManagedProcess.from_json(p) for p in data["processes"]),
            reused=dict(data.get("reused", {})),
            functions=dict(data.get("functions", {})),
            functions_source=data.get("functions_source", ""),
            created_at=data.get("created_at", ""),
            report_key=data.get("report_key", ""),
        )


# What the simulated hosts never get: the addresses of the functions only users call. A host asks
# the attempt_key function (TPUJOBS_KEY_URL) for its key and calls no other (infra/functions.tf).
USER_ONLY_VARIABLES = frozenset({"TPUJOBS_API_URL", "TPUJOBS_DASHBOARD_URL"})


def host_env(service_env: Mapping[str, str]) -> dict[str, str]:
    """The environment the simulator (and so every simulated host) starts with: the services',
    less the addresses of the functions only users call."""
    return {k: v for k, v in service_env.items() if k not in USER_ONLY_VARIABLES}


def default_tpu_service_account(project: str) -> str:
    """The account the local stack's TPU VMs run as, as infra/ names the deployment's."""
    return f"tpujobs-tpu-vm@{project}.iam.gserviceaccount.com"


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """`$TPUJOBS_STATE_DIR`, else `.tpujobs/` in the current directory."""
    env = os.environ if environ is None else environ
    return Path(env.get("TPUJOBS_STATE_DIR") or Path.cwd() / ".tpujobs")


def default_functions_source(environ: Mapping[str, str] | None = None) -> Path:
    """`$TPUJOBS_FUNCTIONS_SOURCE`, else the repository's functions/main.py."""
    env = os.environ if environ is None else environ
    override = env.get("TPUJOBS_FUNCTIONS_SOURCE")
    return Path(override) if override else REPO_ROOT / "functions" / "main.py"


def load(state_dir: Path) -> StackState | None:
    """The stack recorded in state_dir, or None when there is none."""
    path = state_dir / STACK_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise StackError(f"{path} is unreadable ({error}); remove it and stop leftovers") from error
    return StackState.from_json(state_dir, data)


# A stack of about 25 ports, started beside another checkout's: each try takes fresh ones.
START_ATTEMPTS = 4
REUSED_PROBE_S = 10.0  # how long a reused emulator may take to answer before it counts as gone


def is_alive(state: StackState) -> bool:
    """Every recorded process is still ours, and every reused emulator still answers. Patiently:
    a loaded machine's emulator may take seconds, and a stack taken for gone is stopped by `up`."""
    return all(processes.is_running(p) for p in state.processes) and all(
        processes.http_get(processes.emulator_url(address) + "/", timeout_s=REUSED_PROBE_S) is not None
        for address in state.reused.values()
    )


def stack_environment(state_dir: Path | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of the running local stack in state_dir (default: see
    `default_state_dir`), or {} when none is recorded or it is no longer running."""
    directory = state_dir or default_state_dir(environ)
    try:
        state = load(directory)
    except StackError:
        return {}
    return dict(state.env) if state is not None and is_alive(state) else {}


@contextlib.contextmanager
def running(report: Report | None = None) -> Iterator[dict[str, str]]:
    """The running local stack's environment, exported; one is started in a temporary
    directory when none runs, and stopped on the way out (what benchmarks want), also when
    the process is told to stop (SIGTERM, as `timeout` sends): a stopped bench leaks nothing."""
    import signal
    import sys
    import tempfile

    env = stack_environment()
    state_dir = None
    previous = None
    if not env:
        state_dir = Path(tempfile.mkdtemp(prefix="tpujobs-bench-"))
        (report or (lambda line: print(line, file=sys.stderr)))(f"starting a local stack in {state_dir} ...")
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        env = dict(up(state_dir, Settings.from_env()).env)
    os.environ.update(env)
    try:
        yield env
    finally:
        if state_dir is not None:
            down(state_dir)
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM as SystemExit, so that `finally` blocks (the stack's `down`) run."""
    raise SystemExit(128 + signum)


def env_lines(state: StackState) -> list[str]:
    """`export NAME=VALUE` lines, for `eval "$(tpujobs dev env)"`."""
    return [f"export {name}={shlex.quote(value)}" for name, value in state.env.items()]


def up(
    state_dir: Path,
    settings: Settings,
    *,
    environ: Mapping[str, str] | None = None,
    functions_source: Path | None = None,
    simulator_state_file: Path | None = None,
    report: Report | None = None,
) -> StackState:
    """Start the stack (or return the one already running), wire it, record it.

    `environ` is where FIRESTORE_EMULATOR_HOST, PUBSUB_EMULATOR_HOST and
    STORAGE_EMULATOR_HOST are looked up (emulators that answer there are reused, and never
    stopped) and the base environment of the services; it defaults to os.environ.
    """
    say = report or _quiet
    base_env = dict(os.environ if environ is None else environ)
    state_dir.mkdir(parents=True, exist_ok=True)
    with _locked(state_dir):
        existing = load(state_dir)
        if existing is not None:
            if is_alive(existing):
                say(f"the local stack is already running (recorded in {state_dir / STACK_FILE})")
                _warn_if_different(existing, settings, say)
                return replace(existing, already_running=True)
            say("the recorded stack is partly gone: stopping what is left and starting afresh")
            processes.stop(existing.processes)
            (state_dir / STACK_FILE).unlink(missing_ok=True)

        source = (functions_source or default_functions_source(base_env)).resolve()
        if not source.is_file():
            raise StackError(
                f"functions source {source} does not exist (set TPUJOBS_FUNCTIONS_SOURCE or pass functions_source)"
            )
        reused = _reusable_emulators(base_env, say)
        processes.require_gcloud_emulators(name for name in ("firestore", "pubsub") if name not in reused)
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return _start(state_dir, settings, base_env, source, reused, simulator_state_file, say)
            except processes.ServiceStartError as error:
                # A port found free can be taken by another stack starting at the same time before our
                # service binds it: again on new ports (everything started so far was already stopped).
                if attempt == START_ATTEMPTS:
                    raise
                say(f"{error.args[0].splitlines()[0]}; trying again on other ports")
        raise AssertionError("unreachable: the last attempt returns or raises")


def down(state_dir: Path, *, report: Report | None = None) -> list[ManagedProcess]:
    """Stop the processes recorded in state_dir (only those still ours) and forget the stack.

    Returns the processes that were stopped; reused emulators are left running.
    """
    say = report or _quiet
    if not state_dir.is_dir():
        say(f"no local stack recorded in {state_dir}")
        return []
    with _locked(state_dir):
        state = load(state_dir)
        if state is None:
            say(f"no local stack recorded in {state_dir}")
            return []
        # The functions (and the pusher posting to them) first, while what they write to on SIGTERM
        # (their metrics) still answers.
        functions = [p for p in state.processes if p.name.startswith("function-") or p.name == "pusher"]
        stopped = processes.stop(functions) + processes.stop([p for p in state.processes if p not in functions])
        stopped_pids = {p.pid for p in stopped}
        for process in state.processes:
            if process.pid in stopped_pids:
                say(f"stopped {process.name} (pid {process.pid})")
            else:
                say(f"{process.name} (pid {process.pid}) was already gone")
        for name, address in state.reused.items():
            say(f"left {name} at {address} running (not started by tpujobs)")
        (state_dir / STACK_FILE).unlink(missing_ok=True)
        return stopped


# --- up, step by step ------------------------------------------------------------------

_EMULATOR_VARIABLES = {
    "firestore": "FIRESTORE_EMULATOR_HOST",
    "pubsub": "PUBSUB_EMULATOR_HOST",
    "storage": "STORAGE_EMULATOR_HOST",
}


def _reusable_emulators(environ: Mapping[str, str], say: Report) -> dict[str, str]:
    """Emulators named by the environment that answer: service -> address as given."""
    reused = {}
    for name, variable in _EMULATOR_VARIABLES.items():
        address = environ.get(variable, "").strip()
        if not address:
            continue
        if processes.http_get(processes.emulator_url(address) + "/") is not None:
            say(f"using the {name} emulator at {address} (from {variable})")
            reused[name] = address
        else:
            say(f"{variable}={address} does not answer: starting a new {name} emulator")
    return reused


def _start(
    state_dir: Path,
    settings: Settings,
    base_env: dict[str, str],
    source: Path,
    reused: dict[str, str],
    simulator_state_file: Path | None,
    say: Report,
) -> StackState:
    ports = {name: processes.free_port() for name in ("firestore", "pubsub", "storage")}
    simulator_port = processes.free_port()
    registry = _registry(state_dir, processes.free_port(), say)
    secrets_port = processes.free_port()
    logging_port = processes.free_port()
    monitoring_port = processes.free_port()
    function_ports = {route.target: processes.free_port() for route in topology.FUNCTIONS}
    functions = {target: f"http://{LOOPBACK}:{port}/" for target, port in function_ports.items()}

    firestore = reused.get("firestore") or f"{LOOPBACK}:{ports['firestore']}"
    pubsub = reused.get("pubsub") or f"{LOOPBACK}:{ports['pubsub']}"
    storage = processes.emulator_url(reused.get("storage") or f"{LOOPBACK}:{ports['storage']}")
    bucket = settings.logs_bucket or f"{settings.project}-tpujobs-logs"  # as Settings.from_env
    env = {
        "GOOGLE_CLOUD_PROJECT": settings.project,
        "FIRESTORE_EMULATOR_HOST": firestore,
        "PUBSUB_EMULATOR_HOST": pubsub,
        "STORAGE_EMULATOR_HOST": storage,
        "TPUJOBS_TPU_ENDPOINT": f"http://{LOOPBACK}:{simulator_port}",
        # The same simulator speaks Compute Engine v1 REST (TPU7x, and v5p/v6e on `platform: compute`).
        "TPUJOBS_COMPUTE_ENDPOINT": f"http://{LOOPBACK}:{simulator_port}",
        # Where the simulated VMs' identity tokens are verified: the simulator's key, not Google's.
        "TPUJOBS_VM_CERTS_URL": f"http://{LOOPBACK}:{simulator_port}/simulator/v1/certs",
        "TPUJOBS_SECRETS_ENDPOINT": f"http://{LOOPBACK}:{secrets_port}",
        # The local Cloud Logging: the simulated hosts' agents write job output to it, and
        # `tpujobs logs` reads it back (google-cloud-logging). On, as a deployment may turn it on.
        "TPUJOBS_LOGGING_ENDPOINT": f"http://{LOOPBACK}:{logging_port}",
        "TPUJOBS_CLOUD_LOGGING": base_env.get("TPUJOBS_CLOUD_LOGGING") or "1",
        # The local Cloud Monitoring (gRPC): the functions write their metrics to it, each with its
        # own account's token; it refuses any other caller, as IAM does (infra/iam.tf).
        "TPUJOBS_MONITORING_ENDPOINT": f"{LOOPBACK}:{monitoring_port}",
        # What the TPU VMs run as (and whose secrets they read): never a Compute default.
        "TPUJOBS_TPU_SERVICE_ACCOUNT": settings.tpu_service_account
        or base_env.get("TPUJOBS_TPU_SERVICE_ACCOUNT")
        or default_tpu_service_account(settings.project),
        "TPUJOBS_DEFAULT_ZONE": settings.default_zone,
        "TPUJOBS_PREFIX": settings.prefix,
        "TPUJOBS_LOGS_BUCKET": bucket,
        "TPUJOBS_LOCAL_STACK": "1",
    }
    if registry is not None:  # where images are pushed and the simulated hosts pull them from
        env["TPUJOBS_REGISTRY"] = f"{LOOPBACK}:{registry.port}"
    if "jobs" in functions:
        env["TPUJOBS_API_URL"] = functions["jobs"]
    if "attempt_key" in functions:  # where hosts trade identity tokens for keys, and all they call
        env["TPUJOBS_KEY_URL"] = functions["attempt_key"]
    if "dashboard" in functions:
        env["TPUJOBS_DASHBOARD_URL"] = functions["dashboard"]
    # The signing key goes to the functions alone: a job's code on a simulated host must not
    # inherit it (production mounts it into the functions from Secret Manager the same way).
    report_key = secrets.token_urlsafe(48)
    service_env = {k: v for k, v in {**base_env, **env}.items() if k != REPORT_KEY_VARIABLE}
    function_env = {
        "TPUJOBS_BOOT_TIMEOUT_SECONDS": f"{LOCAL_BOOT_TIMEOUT_S:g}",  # unless the caller set one
        "TPUJOBS_UNHEALTHY_GRACE_SECONDS": f"{LOCAL_UNHEALTHY_GRACE_S:g}",
        **service_env,
        REPORT_KEY_VARIABLE: report_key,
    }
    # Who the dashboard shows its pages to: no IAP on loopback, so the local user (honoured only
    # with TPUJOBS_LOCAL_STACK=1), as the CLI names its caller: $TPUJOBS_OWNER, else the login.
    function_env.setdefault("TPUJOBS_DASHBOARD_LOCAL_USER", base_env.get("TPUJOBS_OWNER") or getpass.getuser())

    specs = [] if registry is None else [registry]
    if "firestore" not in reused:
        specs.append(processes.firestore_emulator(ports["firestore"]))
    if "pubsub" not in reused:
        specs.append(processes.pubsub_emulator(ports["pubsub"], settings.project))
    if "storage" not in reused:
        specs.append(processes.storage_emulator(ports["storage"]))
    specs.append(processes.secret_manager(secrets_port, prefix=settings.prefix, env=service_env))
    specs.append(processes.cloud_logging(logging_port, env=service_env))
    writers = function_accounts(settings.project, settings.prefix)
    specs.append(processes.cloud_monitoring(monitoring_port, writers, env=service_env))
    base_path = service_env.get("PATH", "")
    specs.append(
        processes.simulator(
            simulator_port,
            # The simulated TPU VMs' `python3` is this venv's: a job's code finds there what its setup
            # would install on a real VM (examples/jax_lm's JAX: the jax extra).
            env={
                **host_env(service_env),
                "PATH": os.pathsep.join(filter(None, (str(Path(sys.executable).parent), base_path))),
            },
            state_file=simulator_state_file,
            workers_root=state_dir / "workers",  # kept after `down`: every worker's log
        )
    )
    specs.extend(
        processes.function(
            route,
            function_ports[route.target],
            source=source,
            env={
                **function_env,
                "TPUJOBS_FUNCTION_ACCOUNT": function_account(route.target, settings.project, settings.prefix),
            },
        )
        for route in topology.FUNCTIONS
    )
    engine = docker_engine(state_dir / "logs", say)
    say(f"starting {', '.join(spec.name for spec in specs)}")
    try:
        started = engine + processes.start(
            specs,
            state_dir / "logs",
            on_ready=lambda p: say(f"{p.name} answers on port {p.port} (pid {p.pid})"),
        )
    except BaseException:
        processes.stop(engine)
        raise
    try:
        # The emulator holds each push subscription's pull twin; the pusher pushes it, as many at once
        # as production would (tpujobs.local.pusher says why).
        wired = wiring.wire_pubsub(pubsub, settings.project, settings.prefix, functions, pushed_by_emulator=False)
        say(f"{len(wired.topics)} topics, {len(wired.subscriptions)} push subscriptions")
        wiring.ensure_bucket(storage, settings.project, bucket)
        say(f"bucket {bucket}")
        pusher_config = state_dir / PUSHER_CONFIG
        pusher.write_config(pusher_config, pubsub, pusher.routes(settings.project, settings.prefix, functions))
        started += processes.start(
            [
                processes.pusher(pusher_config, env=service_env),
                processes.scheduler(RECONCILE_INTERVAL_S, env=service_env),
            ],
            state_dir / "logs",
        )
        say("pusher delivers each subscription to its function, as many at once as production serves")
        say(f"scheduler ticks {topology.RECONCILE} every {RECONCILE_INTERVAL_S:g} s")
        state = StackState(
            state_dir=state_dir,
            env=env,
            processes=tuple(started),
            reused=reused,
            functions=functions,
            functions_source=str(source),
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            report_key=report_key,
        )
        _save(state)
    except BaseException as error:
        processes.stop(started)
        if isinstance(error, Exception) and not isinstance(error, StackError):
            raise StackError(f"wiring the local stack failed: {error}") from error
        raise
    say(f"the local stack is up (logs in {state_dir / 'logs'})")
    if "dashboard" in functions:
        say(f"dashboard: {functions['dashboard']}")
    return state


def docker_engine(log_dir: Path, say: Report) -> list[ManagedProcess]:
    """The machine's Docker Engine: the dockerd this call started, to be stopped by `down`, or
    none (one already answered, or Docker cannot run here: then a warning, and the rest starts)."""
    try:
        if containers.docker_binary() is None:
            raise containers.ContainerToolError(str(containers.docker_problem()))
        handle = containers.start_dockerd(log_dir / "dockerd.log")
    except containers.ContainerToolError as error:
        say(f"warning: {error}; jobs with an image will fail when their hosts pull it")
        return []
    if handle is None:  # start_dockerd asked it: one already answers
        say("using the Docker Engine that already runs (left running by `tpujobs dev down`)")
        return []
    dockerd = processes.adopt("dockerd", handle, log_dir / "dockerd.log")
    say(f"started dockerd (pid {dockerd.pid}); `tpujobs dev down` stops it")
    return [dockerd]


def _registry(state_dir: Path, port: int, say: Report) -> processes.ServiceSpec | None:
    """The local registry's service, its data kept under the state directory (after `down`
    too, like the workers' logs); None with a warning when docker-registry is not installed."""
    root = state_dir / "registry"
    config = root / "config.yml"
    try:
        spec = processes.registry(port, config)
    except processes.MissingToolError as error:
        say(f"warning: {error}; no TPUJOBS_REGISTRY, so no image can be pushed to this stack")
        return None
    (root / "data").mkdir(parents=True, exist_ok=True)
    config.write_text(containers.registry_config(root / "data", LOOPBACK, port), encoding="utf-8")
    return spec


def _warn_if_different(state: StackState, settings: Settings, say: Report) -> None:
    for variable, wanted in (
        ("GOOGLE_CLOUD_PROJECT", settings.project),
        ("TPUJOBS_PREFIX", settings.prefix),
    ):
        if state.env.get(variable) != wanted:
            say(
                f"note: it runs with {variable}={state.env.get(variable)!r}, not {wanted!r}; "
                "run `tpujobs dev down` first to change it"
            )


def _save(state: StackState) -> None:
    """Write stack.json readable by its owner only: it holds the report-signing key."""
    path = state.state_dir / STACK_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(state.to_json(), indent=2) + "\n")
    tmp.replace(path)


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    """One `up` or `down` at a time per state directory."""
    with (state_dir / "stack.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _quiet(_: str) -> None:
    pass

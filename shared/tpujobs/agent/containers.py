"""A job's image: pulled (logged in to Google's registries with the host's token), run with
setup and command in one `docker run` as TPU VMs run containers, and removed on every way out.
"""

from __future__ import annotations

import glob
import http.client
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Any

from .basics import AGENT_FAILED, PASSABLE_NAME, AgentError, host_variables, log, safe_name
from .confine import TPU_DEVICES
from .rest import TokenSource

DOCKER_CLI = "/usr/bin/docker"  # where TPU VM images install it; else the one on PATH
# Conservative: no whitespace, no leading `-` (so never an option); the spec validates the grammar.
IMAGE_REFERENCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,1023}")
IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
PULL_POLICIES = ("always", "if-missing")
DEFAULT_CONTAINER_WORKDIR = "/workspace"  # the code's mount point when the image names none
PRIVILEGED_VARIABLE = "TPUJOBS_CONTAINER_PRIVILEGED"  # "0" on the host: no --privileged (the simulator)
SIMULATED_HOST_VARIABLE = "SIMULATED_TPU_VM"  # set only on a simulated host: its mark
LABEL_PREFIX = "tpujobs."
HOST_LABEL = LABEL_PREFIX + "host"  # the simulated host's mark: the simulator removes these containers
DOCKER_FAILED = frozenset({125, 126, 127})  # docker run's own failures (or the command's, rarely)
MAX_DOCKER_WORDS = 400  # of docker's own words quoted in a sentence
PULL_SECONDS = 3600.0  # the longest one pull may take
DOCKER_SECONDS = 120.0  # the longest any other docker call may take
# Registries that take the host's own access token (Artifact Registry, Container Registry).
GOOGLE_REGISTRY = re.compile(r"(?:[a-z0-9-]+\.)*(?:pkg\.dev|gcr\.io)")

# Runs in the container as `sh -c WRAPPER tpujobs SETUP COMMAND`: setup (if any), then exec
# the command, each with bash when the image has it, else sh; one container, so the command
# sees whatever setup changed. SETUP and COMMAND arrive as arguments, never as wrapper text.
WRAPPER = """\
if command -v bash >/dev/null 2>&1; then shell=bash; else shell=sh; fi
if [ -n "$1" ]; then
  "$shell" -c "$1"
  code=$?
  if [ "$code" -ne 0 ]; then
    echo "[tpujobs-agent] setup exited with $code; the command does not run"
    exit "$code"
  fi
fi
exec "$shell" -c "$2"
"""

# Why a pull failed, by docker's words: the first row whose pattern matches names it. The
# image's own name is blanked out first, so an image called `timeout-test` is not "no network".
PULL_PROBLEMS = (
    (
        "no network",
        re.compile(
            r"connection refused|no such host|dial tcp|i/o timeout|timeout exceeded|handshake timeout"
            r"|context deadline exceeded|network is unreachable|no route to host|connection reset",
            re.IGNORECASE,
        ),
    ),
    ("access denied", re.compile(r"denied|unauthori[sz]ed|forbidden|\b40[13]\b", re.IGNORECASE)),
    ("not found", re.compile(r"manifest unknown|name unknown|not found|does not exist|\b404\b", re.IGNORECASE)),
)


class AnyOf:
    """Set when any of its events is: the one stop of a pull that a preemption notice or a
    withdrawal (pool mode) ends."""

    def __init__(self, *events: threading.Event) -> None:
        self.events = events

    def is_set(self) -> bool:
        return any(event.is_set() for event in self.events)


class ImageProblem(AgentError):
    """The job's image cannot be pulled or run: the attempt ends with `code`, and the sentence
    goes into the job's output and the `exited` report's detail."""

    def __init__(self, sentence: str, code: int = AGENT_FAILED) -> None:
        super().__init__(sentence)
        self.code = code


def default_pull_policy(image: str) -> str:
    """As Kubernetes (and JobSpec.pull_policy): `always` for an untagged or `:latest` image, else `if-missing`."""
    if "@" in image:
        return "if-missing"
    last = image.rsplit("/", 1)[-1]
    return "if-missing" if ":" in last and not last.endswith(":latest") else "always"


def image_repository(image: str) -> str:
    """The reference without its tag or digest: registry.example/team/trainer."""
    name = image.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    if ":" in last:
        last = last.rsplit(":", 1)[0]
    return f"{head}/{last}" if head else last


def registry_host(image: str) -> str:
    """The registry an image is pulled from: its first component when that names a host."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def docker_words(text: str) -> str:
    """Docker's output on one line, bounded."""
    words = " ".join(text.split())
    return words if len(words) <= MAX_DOCKER_WORDS else words[: MAX_DOCKER_WORDS - 3] + "..."


def pull_problem(image: str, said: str) -> str:
    """The one sentence a failed pull is reported with: why (not found, access denied, no
    network), then docker's own words; docker's words alone when the reason is not known."""
    words = docker_words(said)
    scrubbed = words
    names = {image, image_repository(image), image_repository(image).rsplit("/", 1)[-1]}
    for name in sorted(names, key=len, reverse=True):  # whole names only: `t` is not in `not found`
        scrubbed = re.sub(r"(?<![A-Za-z0-9_.-])" + re.escape(name) + r"(?![A-Za-z0-9_-])", "<image>", scrubbed)
    for why, pattern in PULL_PROBLEMS:
        if pattern.search(scrubbed):
            return f"cannot pull the image {image}: {why} (docker said: {words})"
    return f"cannot pull the image {image}: docker said: {words or 'nothing'}"


def docker_failure(tail: bytes) -> str | None:
    """The line in which docker (or the container's init) said it could not run the container,
    from the end of the output, else None: a 125, 126 or 127 without one is the command's own."""
    for raw in reversed(tail.decode("utf-8", "replace").splitlines()):
        line = raw.strip()
        if line.startswith("docker: ") or line.startswith("[FATAL tini") or "Error response from daemon" in line:
            return docker_words(line)
    return None


def container_name(config: dict[str, Any], slice_id: int, worker_id: int) -> str:
    """The container of one attempt on one worker host: deterministic, so anyone can find it."""
    return f"tpujobs-{safe_name(config['job_id'])}-a{int(config['attempt'])}-s{slice_id}-w{worker_id}"


def container_labels(config: dict[str, Any], slice_id: int, worker_id: int, host_mark: str) -> list[str]:
    """`key=value` labels: the job, attempt, slice, worker, and a simulated host's mark."""
    labels = {
        "job": safe_name(config["job_id"]),
        "attempt": str(int(config["attempt"])),
        "slice": str(slice_id),
        "worker": str(worker_id),
    }
    if host_mark:
        labels["host"] = re.sub(r"[^A-Za-z0-9_./-]", "_", host_mark)
    return [f"{LABEL_PREFIX}{key}={value}" for key, value in labels.items()]


def container_environment(
    job_env: dict[str, str],
    host_environ: dict[str, str],
    config: dict[str, Any],
    secret_names: list[str],
    megascale: dict[str, str],
) -> tuple[list[str], dict[str, str], list[str]]:
    """(names passed with `-e NAME`, the docker CLI's environment, names left out).

    Passed: the TPUJOBS_ variables, MEGASCALE_* from tpu-env, the spec's env and the secrets;
    their values travel in the docker CLI's own environment, so no value is ever on a command
    line or on disk. The host's other variables stay out of the container. Names beginning
    with DOCKER_ are left out: the docker CLI itself obeys them (DOCKER_HOST, DOCKER_CONFIG),
    so the job's values would steer the agent's docker; so are names no shell could set. A
    job's HOME passes, but the CLI keeps the host's config directory (DOCKER_CONFIG), since
    a config under the job's HOME could name another daemon.
    """
    wanted = set(config["env"]) | set(secret_names) | set(megascale)
    wanted |= {name for name in job_env if name.startswith("TPUJOBS_")}
    left_out = sorted(n for n in wanted if n.startswith("DOCKER_") or not PASSABLE_NAME.fullmatch(n))
    names = sorted(wanted - set(left_out))
    cli_env = host_variables(host_environ)
    cli_env.update({name: job_env[name] for name in names})
    if "HOME" in names and "DOCKER_CONFIG" not in cli_env:
        # The CLI reads its config (which daemon, through contexts) from $HOME/.docker: the host's.
        cli_env["DOCKER_CONFIG"] = os.path.join(host_environ.get("HOME") or os.path.expanduser("~"), ".docker")
    return names, cli_env, left_out


def container_privileged(config: dict[str, Any], host_environ: dict[str, str]) -> bool:
    """Whether the job's container runs `--privileged`: only when its spec asks
    (`container.privileged`, the config's `privileged`) and the host allows it (not a simulated
    host, whose TPUJOBS_CONTAINER_PRIVILEGED is 0)."""
    return config.get("privileged") is True and host_environ.get(PRIVILEGED_VARIABLE, "1").strip() != "0"


def tpu_devices() -> list[str]:
    """This host's TPU device nodes (/dev/accel*, /dev/vfio/N), passed to an unprivileged container."""
    return sorted(path for pattern in TPU_DEVICES for path in glob.glob(pattern))


def docker_run_argv(
    docker: str,
    image: str,
    name: str,
    labels: list[str],
    env_names: list[str],
    setup: str | None,
    command: str,
    privileged: bool = False,
    mount: tuple[str, str] | None = None,
    devices: list[str] | None = None,
) -> list[str]:
    """`docker run` as TPU VMs run containers: host network and IPC, /dev mounted, docker's
    init (tini) as PID 1 forwarding signals to the command's whole process group; unprivileged,
    with `devices` (the host's TPU devices) passed in, unless `privileged` (the spec's
    `container.privileged`); `mount` is (code directory, working directory in the container).
    The image's ENTRYPOINT and CMD are not used: the wrapper runs setup and command."""
    argv = [docker, "run", "--rm", "--name", name, "--init", "--sig-proxy=false"]
    argv += ["--network", "host", "--ipc", "host", "-v", "/dev:/dev", "-e", "TINI_KILL_PROCESS_GROUP=1"]
    if privileged:
        argv.append("--privileged")
    else:
        for device in devices or []:
            argv += ["--device", device]
    for label in labels:
        argv += ["--label", label]
    for env_name in env_names:
        argv += ["-e", env_name]
    if mount is not None:
        source, target = mount
        for path in (source, target):
            if ":" in path or "," in path or not path.startswith("/"):
                raise ImageProblem(
                    f"the path {path!r} cannot be mounted into a container (it must be absolute, no ':' or ',')"
                )
        argv += ["-v", f"{source}:{target}", "-w", target]
    argv += ["--entrypoint", "sh", image, "-c", WRAPPER, "tpujobs", setup or "", command]
    return argv


class Docker:
    """The host's docker CLI as the agent uses it: pull (with the host's token for Google's
    registries), inspect, kill and remove. Every call is an argv list with the host's own
    environment; nothing goes through a shell."""

    def __init__(self, binary: str, environ: dict[str, str], tokens: TokenSource | None = None) -> None:
        self.binary = binary
        self.environ = host_variables(environ)
        self.tokens = tokens

    @classmethod
    def find(cls, environ: dict[str, str], tokens: TokenSource | None = None) -> Docker | None:
        """The docker CLI of this host, or None when it has none."""
        binary = DOCKER_CLI if os.access(DOCKER_CLI, os.X_OK) else shutil.which("docker", path=environ.get("PATH"))
        return cls(binary, environ, tokens) if binary else None

    def call(
        self, *args: str, stdin: bytes | None = None, timeout: float = DOCKER_SECONDS
    ) -> subprocess.CompletedProcess[bytes]:
        """One docker command, its output captured; a CLI that cannot start or hangs is returncode 125."""
        try:
            return subprocess.run(
                [self.binary, *args],
                input=stdin,
                stdin=None if stdin is not None else subprocess.DEVNULL,
                capture_output=True,
                env=self.environ,
                timeout=timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return subprocess.CompletedProcess([self.binary, *args], 125, b"", str(error).encode())

    @staticmethod
    def said(done: subprocess.CompletedProcess[bytes]) -> str:
        return ((done.stderr or b"") + b"\n" + (done.stdout or b"")).decode("utf-8", "replace").strip()

    def has_image(self, image: str) -> bool:
        return self.call("image", "inspect", "--format", "{{.Id}}", image).returncode == 0

    def ensure(self, image: str, policy: str, stop: threading.Event | AnyOf) -> bool:
        """The image is here, pulled as `policy` says (`always`; `if-missing`: only when absent).
        True when a pull ran; ImageProblem with a sentence when it failed."""
        if policy == "if-missing" and self.has_image(image):
            return False
        self.pull(image, stop)
        return True

    def pull(self, image: str, stop: threading.Event | AnyOf) -> None:
        """docker pull, stopped early when `stop` is set. A Google registry gets the host's token
        in a private config directory of this pull's own, removed after it; the token goes to
        docker on stdin only."""
        config_dir = self._login(image)
        try:
            args = ([] if config_dir is None else ["--config", config_dir]) + ["pull", "--quiet", image]
            process = subprocess.Popen(
                [self.binary, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=self.environ,
            )
            deadline = time.monotonic() + PULL_SECONDS
            while True:
                try:  # output read before a timeout is kept: the last call returns all of it
                    output = process.communicate(timeout=0.5)[0] or b""
                    break
                except subprocess.TimeoutExpired:
                    if stop.is_set() or time.monotonic() >= deadline:
                        process.kill()
            if stop.is_set():
                return  # a preemption notice: nothing is to run
            if time.monotonic() >= deadline and process.returncode != 0:
                raise ImageProblem(f"cannot pull the image {image}: the pull took over {PULL_SECONDS:g} s")
            if process.returncode != 0:
                raise ImageProblem(pull_problem(image, output.decode("utf-8", "replace")))
        except OSError as error:
            raise ImageProblem(f"cannot pull the image {image}: docker did not start ({error})") from None
        finally:
            if config_dir is not None:
                shutil.rmtree(config_dir, ignore_errors=True)

    def _login(self, image: str) -> str | None:
        """A fresh private docker config directory logged in to the image's Google registry with
        the host's access token; None for any other registry (no login)."""
        host = registry_host(image)
        if self.tokens is None or not GOOGLE_REGISTRY.fullmatch(host):
            return None
        try:
            token = self.tokens.token()
        except (AgentError, OSError, http.client.HTTPException) as error:
            raise ImageProblem(f"cannot pull the image {image}: access denied (no access token: {error})") from None
        config_dir = tempfile.mkdtemp(prefix="tpujobs-docker-")  # 0700: readable by this user only
        done = self.call(
            "--config",
            config_dir,
            "login",
            "--username",
            "oauth2accesstoken",
            "--password-stdin",
            f"https://{host}",
            stdin=token.encode("utf-8"),
        )
        if done.returncode != 0:
            shutil.rmtree(config_dir, ignore_errors=True)
            raise ImageProblem(pull_problem(image, self.said(done)))
        return config_dir

    def digest(self, image: str) -> str | None:
        """The digest of the image as its registry knows it (`sha256:...`), or None."""
        if "@" in image:
            given = image.rsplit("@", 1)[1]
            return given if IMAGE_DIGEST.fullmatch(given) else None
        done = self.call("image", "inspect", "--format", "{{json .RepoDigests}}", image)
        try:
            entries = json.loads(done.stdout or b"null") if done.returncode == 0 else None
        except ValueError:
            entries = None
        repository = image_repository(image)
        for entry in entries or []:
            name, _, digest = str(entry).partition("@")
            if name == repository and IMAGE_DIGEST.fullmatch(digest):
                return digest
        return None

    def working_dir(self, image: str) -> str:
        """The image's WorkingDir, or /workspace when it names none (or `/`)."""
        done = self.call("image", "inspect", "--format", "{{json .Config.WorkingDir}}", image)
        try:
            found = json.loads(done.stdout or b'""') if done.returncode == 0 else ""
        except ValueError:
            found = ""
        found = found if isinstance(found, str) else ""
        return found if found.startswith("/") and found.rstrip("/") else DEFAULT_CONTAINER_WORKDIR

    def kill(self, name: str, signal_name: str = "KILL") -> bool:
        """Sends the signal to the container's init (which passes it to the command's group)."""
        return self.call("kill", "--signal", signal_name, name, timeout=30.0).returncode == 0

    def remove(self, name: str) -> None:
        """The container is gone, whatever it was doing; one that never existed is fine."""
        done = self.call("rm", "--force", name)
        said = self.said(done)
        if done.returncode != 0 and "No such container" not in said:
            log(f"could not remove container {name}: {docker_words(said)}")

"""What an attempt runs, in order: the job's secrets, its code, setup (once per host) and the
command; or, with an image, setup and command in one container of it.

`JobRun` is the part of `Agent` that knows the job's steps; the command runner runs each.
"""

from __future__ import annotations

import http.client
import os
import signal
import tarfile
import threading
from collections.abc import Callable
from typing import Any

from .basics import AGENT_FAILED, AgentError, Refused, log, rfc3339, safe_name
from .code_fetch import fetch_code
from .commands import CommandRunner
from .config import job_environment
from .confine import Confinement
from .containers import (
    DOCKER_FAILED,
    SIMULATED_HOST_VARIABLE,
    AnyOf,
    Docker,
    ImageProblem,
    container_environment,
    container_labels,
    container_name,
    container_privileged,
    docker_failure,
    docker_run_argv,
    tpu_devices,
)
from .output import OutputPump
from .rest import SecretReader, Storage


class JobRun:
    """The job's steps on this host. `stops` (a preemption notice, a withdrawal) end a pull and
    keep setup's marker from being left."""

    def __init__(
        self,
        config: dict[str, Any],
        slice_id: int,
        worker_id: int,
        workdir: str,
        environ: dict[str, str],
        megascale: dict[str, str],
        storage: Storage,
        secret_reader: SecretReader,
        runner: CommandRunner,
        stops: tuple[threading.Event, threading.Event],
        note: Callable[[str], None],
    ) -> None:
        self.config = config
        self.slice_id = slice_id
        self.worker_id = worker_id
        self.workdir = workdir
        self.environ = environ
        self.megascale = megascale
        self.storage = storage
        self.secret_reader = secret_reader
        self.runner = runner
        self.stops = stops
        self.note = note
        self.secret_values: dict[str, str] = {}  # once read: to cut out of a failed command's last lines

    def run(self, confinement: Confinement) -> int:
        """Read the secrets, fetch the code, run setup (once per host), run the command; or,
        with an image, setup and command in one container of it (`_contained`).

        Returns their exit code; raises Refused, before anything of the job runs, when a
        secret cannot be read or the code is not what was submitted, and ImageProblem when
        the image cannot be pulled or run.
        """
        code_dir = os.path.join(self.workdir, "code")
        os.makedirs(code_dir, exist_ok=True)
        # The values live only here and in the environment of setup and command.
        secret_values = self.secret_reader.read_all(self.config["secrets"])
        self.secret_values = secret_values
        self.runner.hide(secret_values)
        code = _fetched(self.storage, self.config, code_dir, self.note)
        confinement.hand_over(code_dir)
        env = job_environment(self.environ, self.config, self.worker_id, self.slice_id, secret_values, self.megascale)
        if self.config.get("image"):
            return code or self._contained(self.config["image"], code_dir, env, sorted(secret_values))
        env = confinement.environment(env)
        if code == 0 and self.config.get("setup"):
            code = setup_once(self.runner.run, self.config, self.workdir, code_dir, env, self.stops)
        if code == 0:
            code = self.runner.run(["bash", "-c", self.config["command"]], code_dir, env, "command")
        return code

    def _contained(self, image: str, code_dir: str, env: dict[str, str], secret_names: list[str]) -> int:
        """Setup and command in one container of `image`, pulled as the config's policy says;
        the container's exit code. The container is removed on every way out of here."""
        docker: Docker | None = self.runner.docker
        if docker is None:
            raise ImageProblem(f"cannot run the image {image}: this host has no docker CLI")
        name = container_name(self.config, self.slice_id, self.worker_id)
        try:
            if docker.ensure(image, self.config["image_pull_policy"], AnyOf(*self.stops)):
                log(f"pulled the image {image}")
            if any(stop.is_set() for stop in self.stops):
                return 128 + int(signal.SIGTERM)
            digest = docker.digest(image)
            mount = None
            if self.config.get("code_uri"):
                mount = (os.path.abspath(code_dir), docker.working_dir(image))
            names, cli_env, left_out = container_environment(
                env, self.environ, self.config, secret_names, self.megascale
            )
            if left_out:
                self.note(f"not passed into the container (the docker CLI obeys DOCKER_*): {', '.join(left_out)}")
            privileged = container_privileged(self.config, self.environ)
            labels = container_labels(
                self.config, self.slice_id, self.worker_id, self.environ.get(SIMULATED_HOST_VARIABLE, "")
            )
            argv = docker_run_argv(
                docker.binary, image, name, labels, names, self.config.get("setup"), self.config["command"],
                privileged, mount, tpu_devices(),
            )  # fmt: skip
            log(f"running setup and command in {image} ({digest or 'no registry digest'}) as container {name}")
            started = {"image_digest": digest} if digest else {}
            pump_tail: list[OutputPump] = []
            code = self.runner.run(argv, code_dir, cli_env, "command", container=name, started=started, pumps=pump_tail)
            said = docker_failure(pump_tail[0].tail) if code in DOCKER_FAILED and pump_tail else None
            if said is not None:
                raise ImageProblem(f"docker could not run the image {image}: {said}", code)
            return code
        finally:
            docker.remove(name)


def setup_once(
    run: Callable[[list[str], str, dict[str, str], str], int],
    config: dict[str, Any],
    workdir: str,
    code_dir: str,
    env: dict[str, str],
    stops: tuple[threading.Event, ...],
) -> int:
    """Setup, unless it already ran on this host for this job: a marker beside the workdir, left
    when it succeeded and none of `stops` (a notice, a withdrawal) is set."""
    marker = os.path.join(os.path.dirname(os.path.abspath(workdir)), f".setup-done-{safe_name(config['job_id'])}")
    if os.path.exists(marker):
        log("setup already ran on this host for this job; skipping it")
        return 0
    code = run(["bash", "-c", config["setup"]], code_dir, env, "setup")
    if code == 0 and not any(stop.is_set() for stop in stops):
        with open(marker, "w", encoding="utf-8") as handle:
            handle.write(rfc3339() + "\n")
    elif code != 0:
        log(f"setup exited with {code}; the command does not run")
    return code


def _fetched(storage: Storage, config: dict[str, Any], code_dir: str, note: Callable[[str], None]) -> int:
    """The job's code into `code_dir`, if it has any: 0, or AGENT_FAILED when it could not be
    fetched (said); Refused, raised, when it is not what was submitted."""
    if not config.get("code_uri"):
        return 0
    try:
        fetch_code(storage, config["code_uri"], code_dir, config["code_sha256"])
    except Refused:
        raise
    except (AgentError, OSError, http.client.HTTPException, tarfile.TarError) as error:
        note(f"could not fetch the code from {config['code_uri']}: {error}")
        return AGENT_FAILED
    return 0

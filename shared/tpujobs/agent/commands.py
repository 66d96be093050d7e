"""How an attempt runs its commands: setup and command in their own process group, or in a
container, until they and their group are gone; stopped with SIGTERM, then SIGKILL at the grace's end
(`grace` from the SIGTERM; after a preemption notice, a deadline counted from the notice).

`CommandRunner` is the part of `Agent` that starts, waits on and stops processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from .basics import exit_status, log, rfc3339
from .boot_record import AttemptRecord, process_start
from .confine import Confinement
from .containers import (
    DOCKER_FAILED,
    DOCKER_SECONDS,
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
from .last_output import LastOutput
from .liveness import Liveness
from .output import LogShipper, OutputPump, Tee
from .processes import group_alive, signal_group
from .slice_link import heartbeat_period


class CommandRunner(Liveness):
    """Setup and command as processes (or one container), and how they are stopped."""

    _current: subprocess.Popen[bytes] | None
    _container: str | None
    _kill_at: float | None  # when the stopped command gets SIGKILL (time.monotonic()); None: not stopped
    _term_delivered: bool
    _started_at: str | None
    grace: float
    docker: Docker | None
    environ: dict[str, str]
    megascale: dict[str, str]
    worker_id: int
    shipper: LogShipper
    last_output: LastOutput
    secret_values: dict[str, str]  # cut out of everything the command prints
    record: AttemptRecord
    boot: str
    _stopping: Callable[[], bool]
    confinement: Confinement | None  # the attempt's user and cgroup, once its commands may start

    def _sigterm_locked(self, kill_at: float | None = None) -> str | None:
        """SIGTERM to the running command's group (the lock held), SIGKILL due at `kill_at` (by
        default `grace` from now); in a container, the container's name: its SIGTERM goes
        through `_sigterm_container`."""
        container = self._container
        if self._current is not None:
            if container is None:
                signal_group(self._current.pid, signal.SIGTERM)
            self._kill_at = time.monotonic() + self.grace if kill_at is None else kill_at
        return container

    def _sigterm_container(self, container: str | None) -> None:
        """`docker kill --signal TERM`, never under the lock (docker may be slow); `_wait`
        tries again if it found no container yet."""
        if container is not None and self.docker is not None:
            self._term_delivered = self.docker.kill(container, "TERM")

    def _contained(self, image: str, code_dir: str, env: dict[str, str], secret_names: list[str]) -> int:
        """Setup and command in one container of `image`, pulled as the config's policy says;
        the container's exit code. The container is removed on every way out of here."""
        if self.docker is None:
            raise ImageProblem(f"cannot run the image {image}: this host has no docker CLI")
        docker = self.docker
        name = container_name(self.config, self.slice_id, self.worker_id)
        try:
            if docker.ensure(image, self.config["image_pull_policy"], AnyOf(self.preemption.noticed, self.withdrawn)):
                log(f"pulled the image {image}")
            if self.preemption.noticed.is_set() or self.withdrawn.is_set():
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
            code = self._run(argv, code_dir, cli_env, "command", container=name, started=started, pumps=pump_tail)
            said = docker_failure(pump_tail[0].tail) if code in DOCKER_FAILED and pump_tail else None
            if said is not None:
                raise ImageProblem(f"docker could not run the image {image}: {said}", code)
            return code
        finally:
            docker.remove(name)

    def _run(
        self,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        what: str,
        container: str | None = None,
        started: dict[str, Any] | None = None,
        pumps: list[OutputPump] | None = None,
    ) -> int:
        """Runs argv (`bash -c script`, or `docker run` of `container`) in its own process group
        until it and its group are gone; `what` (setup or command) is recorded with its pid,
        for a later start to find. `started` joins the first `started` report. With a
        confinement, it starts in the attempt's cgroup, as the job's user (the docker CLI as root)."""
        if self.confinement is not None:
            argv = self.confinement.launch(argv, as_user=container is None)
        with self._lock:
            if self._stopping():
                return 128 + int(signal.SIGTERM)
            pipes = {"stdout": os.pipe(), "stderr": os.pipe()}  # apart: stderr's lines are errors in Cloud Logging
            try:
                process = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=pipes["stdout"][1],
                    stderr=pipes["stderr"][1],
                    start_new_session=True,
                )
            except OSError as error:
                for read_fd, _ in pipes.values():
                    os.close(read_fd)
                self.note(f"cannot start {os.path.basename(argv[0])}: {error}")
                return 127
            finally:
                for _, write_fd in pipes.values():
                    os.close(write_fd)
            self._current = process
            self._container = container
            self._term_delivered = False
        tee = Tee(self.shipper, self.last_output, self.secret_values)
        pump = OutputPump({name: fds[0] for name, fds in pipes.items()}, tee, self._checkpoint, self._output_seen)
        pump.start()
        if pumps is not None:
            pumps.append(pump)
        if not self._started:
            with self._lock:  # against `_watched`: the service hears `watch` once, in order
                self._started = True
                self._started_at = rfc3339()
                self.reporter.report("started", **(started or {}), **self._liveness(heartbeat_period(0.0, self.config)))
            threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True).start()
        running: dict[str, Any] = {"what": what, "pid": process.pid, "start": process_start(process.pid)}
        if container is not None:
            running["container"] = container
        if self.confinement is not None:
            running.update(self.confinement.record())  # a restarted pool agent stops these too
        self.record.update(running={**running, "boot": self.boot, "at": rfc3339()})
        try:
            returncode = self._wait(process, container)
            self._clear_group(process.pid)
        except BaseException:  # KeyboardInterrupt or a bug: leave nothing running
            signal_group(process.pid, signal.SIGKILL)
            raise
        pump.join(2.0)  # a process that left the group may hold the pipe open: do not wait for it
        with self._lock:
            self._current = None
            self._container = None
        return exit_status(returncode)

    def _wait(self, process: subprocess.Popen[bytes], container: str | None = None) -> int:
        """The exit of `process`; once stopped, SIGKILL when its grace is over (`_kill_at`). In a
        container the signals go through `docker kill` (a SIGTERM that found no container yet
        is sent again); a docker CLI still there long after the SIGKILL is killed itself."""
        docker = self.docker if container is not None else None
        killed_at: float | None = None
        tried_term = time.monotonic()
        while True:
            try:
                return process.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
            kill_at = self._kill_at
            now = time.monotonic()
            if kill_at is None:
                continue
            term_again = not self._term_delivered and killed_at is None and now - tried_term >= 0.5
            if docker is not None and container is not None and term_again:
                tried_term = now
                self._sigterm_container(container)
            if killed_at is None and now >= kill_at:
                log("the command outlived its grace period: SIGKILL")
                killed_at = now
                if docker is not None and container is not None:
                    docker.kill(container, "KILL")
                else:
                    signal_group(process.pid, signal.SIGKILL)
            elif docker is not None and killed_at is not None and now - killed_at >= DOCKER_SECONDS / 4:
                log(f"the docker CLI of container {container} outlived its SIGKILL: killing the CLI")
                signal_group(process.pid, signal.SIGKILL)
                killed_at = now

    def _clear_group(self, pgid: int) -> None:
        """Whatever the command left running in its group: SIGTERM, then SIGKILL after grace."""
        if not group_alive(pgid):
            return
        with self._lock:
            if self._kill_at is None:
                signal_group(pgid, signal.SIGTERM)
                self._kill_at = time.monotonic() + self.grace
            deadline = self._kill_at
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        signal_group(pgid, signal.SIGKILL)
        with self._lock:
            if not self.preemption.noticed.is_set():
                self._kill_at = None

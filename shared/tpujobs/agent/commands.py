"""How an attempt runs its commands: setup and command in their own process group, or in a
container, until they and their group are gone; stopped with SIGTERM, then SIGKILL at the grace's end
(`grace` from the SIGTERM; after a preemption notice, a deadline counted from the notice).

`CommandRunner` is the part of `Agent` that starts, waits on and stops processes; whether one may
still start is the attempt's stops' word (`stopping`), and what they print goes to the shipper,
the last output and the liveness.
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
from .containers import DOCKER_SECONDS, Docker
from .last_output import LastOutput
from .liveness import Liveness
from .output import LogShipper, OutputPump, Tee
from .processes import group_alive, signal_group


class CommandRunner:
    """Setup and command as processes (or one container), and how they are stopped. `preempted`
    is the preemption notice: after it, a stop's SIGKILL deadline stays for every later process."""

    def __init__(
        self,
        grace: float,
        docker: Docker | None,
        shipper: LogShipper,
        last_output: LastOutput,
        liveness: Liveness,
        record: AttemptRecord,
        boot: str,
        stopping: Callable[[], bool],
        preempted: threading.Event,
        note: Callable[[str], None],
    ) -> None:
        self.grace = grace
        self.docker = docker
        self.shipper = shipper
        self.last_output = last_output  # setup's and the command's, for a failed `exited`
        self.liveness = liveness
        self.record = record
        self.boot = boot  # this boot's id, recorded with each process
        self.stopping = stopping
        self.preempted = preempted
        self.note = note
        self._lock = threading.Lock()
        self._current: subprocess.Popen[bytes] | None = None
        self._container: str | None = None  # the running container's name, in an image
        self._kill_at: float | None = None  # when the stopped command gets SIGKILL (time.monotonic())
        self._term_delivered = False  # the container got its SIGTERM (docker kill succeeded)
        self.secret_values: dict[str, str] = {}  # cut out of everything the command prints
        self.confinement: Confinement | None = None  # the attempt's user and cgroup, once its commands may start

    def confine(self, confinement: Confinement) -> None:
        """From now on every process starts as the attempt's user, in its cgroup."""
        with self._lock:
            self.confinement = confinement

    def hide(self, secret_values: dict[str, str]) -> None:
        """The job's secret values, cut out of everything its commands print from now on."""
        self.secret_values = secret_values

    def sigterm(self, kill_at: float | None = None) -> str | None:
        """SIGTERM to the running command's group, SIGKILL due at `kill_at` (by default `grace`
        from now); in a container, the container's name: its SIGTERM goes through
        `sigterm_container`."""
        with self._lock:
            container = self._container
            if self._current is not None:
                if container is None:
                    signal_group(self._current.pid, signal.SIGTERM)
                self._kill_at = time.monotonic() + self.grace if kill_at is None else kill_at
            return container

    def sigterm_container(self, container: str | None) -> None:
        """`docker kill --signal TERM`, never under a lock (docker may be slow); `_wait`
        tries again if it found no container yet."""
        if container is not None and self.docker is not None:
            self._term_delivered = self.docker.kill(container, "TERM")

    def kill_now(self) -> int:
        """Every process of the attempt killed at once; how many (in its cgroup and of its user)."""
        with self._lock:
            confinement = self.confinement
            if self._current is not None:
                self._kill_at = time.monotonic()  # `_wait` sends SIGKILL now (in a container: docker kill)
        return confinement.kill() if confinement is not None else 0

    def run(
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
            if self.stopping():
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
        streams = {name: fds[0] for name, fds in pipes.items()}
        pump = OutputPump(streams, tee, self.liveness.checkpoint, self.liveness.output_seen)
        pump.start()
        if pumps is not None:
            pumps.append(pump)
        self.liveness.command_started(started or {})
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
                self.sigterm_container(container)
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
            if not self.preempted.is_set():
                self._kill_at = None

"""The process side of the simulator: each worker host's startup script as a local process.

The pool listens to the model's hooks and does to the processes what the cloud does to a VM (SIGTERM,
then SIGKILL after a grace, on preemption or delete; SIGKILL at once on a failure or a reset), so the
control plane is tested end to end while the model's rules still test on a fake clock. Each host runs in
a process group of its own, on a scratch directory that is its boot disk, and its containers are removed
when it is killed. What each event does: docs/local-stack.md#the-hosts-one-process-per-worker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tpujobs.agent.containers import HOST_LABEL, PRIVILEGED_VARIABLE, SIMULATED_HOST_VARIABLE, Docker
from tpujobs.local.processes import group_running
from tpujobs.local.simulator.model import (
    HostAction,
    HostEvent,
    NodeRecord,
    QrState,
    QueuedResourceRecord,
    Simulator,
)

_log = logging.getLogger(__name__)

SCRIPT_KEY = "startup-script"  # the node metadata key a TPU VM runs at boot
SWEEP_SECONDS = 0.02  # how often exits are collected and due SIGKILLs sent
GONE_TIMEOUT_SECONDS = 5.0  # close() waits this long past the grace for groups to vanish

MetadataUrl = Callable[[NodeRecord, int], str]


VM_MARK = SIMULATED_HOST_VARIABLE  # in the environment of every process of one simulated host
DOCKER_SECONDS = 30.0  # the longest one container removal may take


class StopReason:
    """Why a worker was signalled, as WorkerInfo.stopped_by reports it."""

    PREEMPTION = "preemption"
    DELETION = "deletion"
    FAILURE = "failure"
    HOST_FAILURE = "host-failure"
    REBOOT = "reboot"
    MAINTENANCE = "maintenance"
    SHUTDOWN = "shutdown"


@dataclass(frozen=True)
class WorkerInfo:
    """One worker process as it is now: for GET /simulator/v1/state and for tests."""

    project: str
    zone: str
    qr_id: str
    node_id: str
    slice_index: int
    worker: int
    pid: int
    pgid: int
    scratch: Path
    alive: bool  # the startup script's process is still running
    exit_code: int | None  # None while alive; negative: killed by that signal number
    stopped_by: str  # "" or a StopReason: what the simulator did to it
    boot: int = 1  # 1 for the host's first boot, 2 after one reboot or maintenance, ...

    @property
    def log(self) -> Path:
        return self.scratch / "worker.log"

    @property
    def workdir(self) -> Path:
        return self.scratch / "work"

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node_id,
            "slice": self.slice_index,
            "worker": self.worker,
            "pid": self.pid,
            "pgid": self.pgid,
            "scratch": str(self.scratch),
            "log": str(self.log),
            "alive": self.alive,
            "exitCode": self.exit_code,
            "stoppedBy": self.stopped_by,
            "boot": self.boot,
        }


class _Worker:
    """A started worker; mutable, guarded by the pool's lock."""

    def __init__(
        self, qr: QueuedResourceRecord, node: NodeRecord, slice_index: int, worker: int,
        process: subprocess.Popen[bytes], scratch: Path, mark: str = "", boot: int = 1,
    ) -> None:  # fmt: skip
        self.mark = mark  # the VM_MARK value of every process of this worker host
        self.boot = boot
        self.key = (qr.project, qr.zone, qr.qr_id)
        self.node_id = node.node_id
        self.slice_index = slice_index
        self.worker = worker
        self.process = process
        self.scratch = scratch
        self.stopped_by = ""
        self.terminated = False  # SIGTERM sent
        self.kill_at: float | None = None  # when SIGKILL is due

    @property
    def pgid(self) -> int:
        return self.process.pid  # start_new_session: the script leads its own group

    def info(self) -> WorkerInfo:
        code = self.process.poll()
        return WorkerInfo(
            project=self.key[0],
            zone=self.key[1],
            qr_id=self.key[2],
            node_id=self.node_id,
            slice_index=self.slice_index,
            worker=self.worker,
            pid=self.process.pid,
            pgid=self.pgid,
            scratch=self.scratch,
            alive=code is None,
            exit_code=code,
            stopped_by=self.stopped_by,
            boot=self.boot,
        )


class WorkerPool:
    """Starts and signals worker processes on the simulator's hooks. Thread-safe.

    ``attach()`` subscribes to the hooks and starts the sweeper thread that reaps exits and
    sends due SIGKILLs; ``close()`` stops every group it started and waits until they are gone.
    """

    def __init__(
        self,
        simulator: Simulator,
        root: str | os.PathLike[str],
        metadata_url: MetadataUrl,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._simulator = simulator
        self.root = Path(root)
        self._metadata_url = metadata_url
        self._environ = None if environ is None else dict(environ)
        self._clock = clock
        self._bash = shutil.which("bash") or "/bin/bash"
        self._lock = threading.Lock()
        self._workers: dict[tuple[str, str, str], list[_Worker]] = {}
        self._closed = False
        self._sweeping = threading.Event()
        self._sweeper: threading.Thread | None = None
        self._containers = HostContainers()

    # -- wiring -------------------------------------------------------------------------

    def attach(self) -> None:
        """Listen to the simulator's hooks and start sweeping."""
        self._simulator.on_active.append(self._on_active)
        self._simulator.on_stopped.append(self._on_stopped)
        self._simulator.on_host_failed.append(self._on_host_failed)
        self._simulator.on_hosts.append(self._on_hosts)
        self._sweeper = threading.Thread(target=self._sweep_forever, name="tpujobs-simulator-workers", daemon=True)
        self._sweeper.start()

    def close(self, grace_seconds: float | None = None) -> list[WorkerInfo]:
        """Stop every worker group: SIGTERM, SIGKILL after the grace, wait until all are gone.

        Idempotent. The grace defaults to the config's delete_grace_seconds. Returns the
        workers that were still alive.
        """
        grace = self._simulator.config.delete_grace_seconds if grace_seconds is None else grace_seconds
        with self._lock:
            first = not self._closed
            self._closed = True  # no more starts, even from hooks already queued
            everyone = [w for group in self._workers.values() for w in group]
            alive = [w.info() for w in everyone if w.process.poll() is None]
            self._stop(everyone, grace, StopReason.SHUTDOWN)
        if first:
            for hooks, hook in (
                (self._simulator.on_active, self._on_active),
                (self._simulator.on_stopped, self._on_stopped),
                (self._simulator.on_host_failed, self._on_host_failed),
                (self._simulator.on_hosts, self._on_hosts),
            ):
                with contextlib.suppress(ValueError):
                    hooks.remove(hook)  # type: ignore[arg-type]
        # Wait until no group exists at all: not even as zombies of killed grandchildren,
        # which init reaps in its own time (up to about 2 s on some machines).
        deadline = self._clock() + grace + GONE_TIMEOUT_SECONDS
        while True:
            self._sweep()
            remaining = [w for w in everyone if _group_exists(w.pgid)]
            if not remaining or self._clock() > deadline:
                break
            time.sleep(SWEEP_SECONDS)
        for worker in remaining:
            if _group_running(worker.pgid):
                _log.warning("worker group %d of %s did not go away", worker.pgid, worker.key[2])
        self._containers.wait(DOCKER_SECONDS)
        self._sweeping.set()
        if self._sweeper is not None and self._sweeper is not threading.current_thread():
            self._sweeper.join(timeout=5)
        return alive

    # -- what tests and the state endpoint read ----------------------------------------

    def workers(self, qr_id: str, *, zone: str | None = None, project: str | None = None) -> tuple[WorkerInfo, ...]:
        """The workers of a QR (also one already deleted), by slice then worker."""
        with self._lock:
            found = [
                w.info()
                for key, group in self._workers.items()
                if key[2] == qr_id and zone in (None, key[1]) and project in (None, key[0])
                for w in group
            ]
        return tuple(sorted(found, key=lambda w: (w.project, w.zone, w.slice_index, w.worker)))

    def all_workers(self) -> dict[str, tuple[WorkerInfo, ...]]:
        """Every QR's workers, keyed by the QR's resource name."""
        with self._lock:
            return {
                f"projects/{project}/locations/{zone}/queuedResources/{qr_id}": tuple(w.info() for w in group)
                for (project, zone, qr_id), group in sorted(self._workers.items())
            }

    def sigterm(
        self,
        qr_id: str,
        *,
        zone: str,
        project: str | None = None,
        slice_index: int | None = None,
        worker: int | None = None,
    ) -> tuple[WorkerInfo, ...]:
        """SIGTERM to hosts' processes with no notice and no SIGKILL after (as a VM's OS sends on a
        shutdown no one announced): the model is not told; what follows is the agents' doing."""
        with self._lock:
            chosen = [
                w
                for key, group in self._workers.items()
                if key[2] == qr_id and key[1] == zone and project in (None, key[0])
                for w in group
                if slice_index in (None, w.slice_index) and worker in (None, w.worker) and w.process.poll() is None
            ]
            for w in chosen:
                self._signal(w, signal.SIGTERM)
            return tuple(w.info() for w in chosen)

    # -- hooks (run outside the simulator's lock; quick: Popen and kill only) ------------

    def _on_active(self, qr: QueuedResourceRecord) -> None:
        nodes = self._simulator.nodes.nodes_of(qr)
        key = (qr.project, qr.zone, qr.qr_id)
        with self._lock:
            if self._closed:
                return
            leftovers = self._workers.pop(key, [])  # an earlier QR of the same name
            for leftover in leftovers:
                self._signal(leftover, signal.SIGKILL)
            if not qr.hosts_boot:
                _log.info("%s: its hosts never run their startup script (no-boot)", qr.name)
                return
            started: list[_Worker] = []
            for slice_index, node in enumerate(nodes):
                script = node.metadata.get(SCRIPT_KEY)
                if script is None:
                    _log.info("node %s has no %s: nothing to run", node.node_id, SCRIPT_KEY)
                    continue
                for worker in range(len(node.host_addresses)):
                    try:
                        started.append(self._start(qr, node, slice_index, worker, script))
                    except OSError:
                        _log.exception("could not start worker %d of %s", worker, node.node_id)
            self._workers[key] = started

    def _on_stopped(self, qr: QueuedResourceRecord) -> None:
        config = self._simulator.config
        if qr.state is QrState.SUSPENDING:
            grace, reason = config.preemption_grace_seconds, StopReason.PREEMPTION
        elif qr.state is QrState.FAILED:
            grace, reason = 0.0, StopReason.FAILURE
        else:
            grace, reason = config.delete_grace_seconds, StopReason.DELETION
        with self._lock:
            self._stop(self._workers.get((qr.project, qr.zone, qr.qr_id), []), grace, reason)

    def _on_host_failed(self, qr: QueuedResourceRecord, slice_index: int, worker: int) -> None:
        with self._lock:
            chosen = [
                w
                for w in self._workers.get((qr.project, qr.zone, qr.qr_id), [])
                if (w.slice_index, w.worker) == (slice_index, worker)
            ]
            self._stop(chosen, 0.0, StopReason.HOST_FAILURE)

    def _on_hosts(self, event: HostEvent) -> None:
        """Reboot and maintenance: hosts go down (RESET, SHUTDOWN) or boot again (BOOT); Compute
        Engine preempts or deletes single VMs of a slice (PREEMPT, DELETE)."""
        qr = event.qr
        key = (qr.project, qr.zone, qr.qr_id)
        with self._lock:
            group = self._workers.get(key, [])
            chosen = [w for w in group if w.slice_index == event.slice_index and w.worker in event.workers]
            if event.action is HostAction.RESET:
                self._stop(chosen, 0.0, StopReason.REBOOT)
            elif event.action is HostAction.SHUTDOWN:
                grace = self._simulator.config.delete_grace_seconds
                self._stop(chosen, grace, StopReason.MAINTENANCE)
            elif event.action is HostAction.PREEMPT:  # one Compute Engine VM of a slice preempted
                self._stop(chosen, self._simulator.config.preemption_grace_seconds, StopReason.PREEMPTION)
            elif event.action is HostAction.DELETE:
                self._stop(chosen, self._simulator.config.delete_grace_seconds, StopReason.DELETION)
            elif not self._closed and qr.hosts_boot:
                self._boot_again(qr, event, group)

    def _boot_again(self, qr: QueuedResourceRecord, event: HostEvent, group: list[_Worker]) -> None:
        """Run the startup script again on hosts that were down, on their kept disks."""
        nodes = self._simulator.nodes.nodes_of(qr)
        if event.slice_index >= len(nodes):
            return
        node = nodes[event.slice_index]
        script = node.metadata.get(SCRIPT_KEY)
        if script is None:
            return
        for index in event.workers:
            old = next((w for w in group if (w.slice_index, w.worker) == (event.slice_index, index)), None)
            if old is not None:
                self._signal(old, signal.SIGKILL)  # a host boots only once its old life is over
                group.remove(old)
            boot = 1 if old is None else old.boot + 1
            try:
                group.append(self._start(qr, node, event.slice_index, index, script, boot))
            except OSError:
                _log.exception("could not boot worker %d of %s again", index, node.node_id)
        group.sort(key=lambda w: (w.slice_index, w.worker))
        self._workers[(qr.project, qr.zone, qr.qr_id)] = group

    # -- processes (callers hold the lock) -----------------------------------------------

    def _start(
        self, qr: QueuedResourceRecord, node: NodeRecord, slice_index: int, worker: int,
        script: str, boot: int = 1,
    ) -> _Worker:  # fmt: skip
        """Boot one host: its first boot gets a fresh disk, a later one keeps it."""
        scratch = self.root / qr.qr_id / f"slice-{slice_index}-worker-{worker}"
        if boot == 1 and scratch.exists():  # a fresh VM: nothing of an earlier QR of this name
            shutil.rmtree(scratch, ignore_errors=True)
        (scratch / "work").mkdir(parents=True, exist_ok=True)
        script_file = scratch / SCRIPT_KEY
        script_file.write_text(script, encoding="utf-8")
        env = dict(os.environ if self._environ is None else self._environ)
        env["TPUJOBS_WORKDIR"] = str(scratch / "work")
        env["TPUJOBS_METADATA_URL"] = self._metadata_url(node, worker)
        # Everything started on this "VM" inherits the mark, even in sessions of its own
        # (the agent runs the command in one): killing the VM kills everything marked.
        env[VM_MARK] = f"{qr.qr_id}/{slice_index}/{worker}/{uuid.uuid4().hex}"
        env[PRIVILEGED_VARIABLE] = "0"  # this machine refuses privileged containers
        with (scratch / "worker.log").open("wb" if boot == 1 else "ab") as log:
            process = subprocess.Popen(
                [self._bash, str(script_file)],
                cwd=scratch,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: signals reach all it starts
            )
        _log.info(
            "started worker %d of %s (slice %d of %s): pid %d",
            worker, node.node_id, slice_index, qr.qr_id, process.pid,
        )  # fmt: skip
        return _Worker(qr, node, slice_index, worker, process, scratch, env[VM_MARK], boot)

    def _stop(self, workers: Iterable[_Worker], grace: float, reason: str) -> None:
        """SIGTERM now and SIGKILL after *grace* (0: SIGKILL at once); never later than asked before."""
        now = self._clock()
        for worker in workers:
            if worker.process.poll() is not None and not _group_running(worker.pgid):
                continue  # ended by itself (or already stopped): nothing to signal
            if not worker.stopped_by:
                worker.stopped_by = reason
            if grace <= 0:
                self._signal(worker, signal.SIGKILL)
                worker.kill_at = None
                continue
            if not worker.terminated:
                worker.terminated = True
                self._signal(worker, signal.SIGTERM)
            due = now + grace
            worker.kill_at = due if worker.kill_at is None else min(worker.kill_at, due)

    def _signal(self, worker: _Worker, sig: signal.Signals) -> None:
        """_signal, and on SIGKILL (the host dies) its containers are removed too."""
        _signal(worker, sig)
        if sig == signal.SIGKILL and worker.mark:
            self._containers.remove(worker.mark)

    def _sweep(self) -> None:
        """Collect exits and send the SIGKILLs that are due."""
        now = self._clock()
        with self._lock:
            for group in self._workers.values():
                for worker in group:
                    worker.process.poll()
                    if worker.kill_at is not None and worker.kill_at <= now:
                        worker.kill_at = None
                        self._signal(worker, signal.SIGKILL)
                        worker.process.poll()

    def _sweep_forever(self) -> None:
        while not self._sweeping.wait(SWEEP_SECONDS):
            try:
                self._sweep()
            except Exception:  # keep sweeping: a missed SIGKILL would leak a process
                _log.exception("worker sweep failed")


def _signal(worker: _Worker, sig: signal.Signals) -> None:
    """SIGTERM goes to the startup script's group (the agent passes it on, as on a VM);
    SIGKILL is the VM dying: it takes every process of the host, whatever its session.

    The group is signalled by id only while its leader, the script, is not reaped yet: until
    then the id is the script's, after that the kernel may give it to any new session (a CI
    machine starting test stacks reuses ids within minutes), and a late SIGKILL would end a
    stranger. What is left of the host after that is found by its mark."""
    if worker.process.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.pgid, sig)
    if worker.mark and (sig == signal.SIGKILL or worker.process.returncode is not None):
        for pid in _marked_pids(worker.mark):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


class HostContainers:
    """Removes the containers of simulated hosts that died, by their `tpujobs.host` label.

    Each host's removal runs once, in a thread of its own, so a SIGKILL never waits for
    docker; nothing happens where this machine has no docker CLI.
    """

    def __init__(self) -> None:
        found = Docker.find(dict(os.environ))  # the same CLI the agent on a host would use
        self.docker = found.binary if found is not None else None
        self._lock = threading.Lock()
        self._done: set[str] = set()
        self._threads: list[threading.Thread] = []

    def remove(self, mark: str) -> None:
        """Starts removing every container labelled with this host's mark (once per mark)."""
        if self.docker is None:
            return
        with self._lock:
            if mark in self._done:
                return
            self._done.add(mark)
            thread = threading.Thread(target=self._remove, args=(self.docker, mark), daemon=True)
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def wait(self, timeout: float) -> None:
        """Until the removals started so far are done, or `timeout` passes."""
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    @staticmethod
    def _remove(docker: str, mark: str) -> None:
        try:
            listed = subprocess.run(
                [docker, "ps", "--all", "--quiet", "--filter", f"label={HOST_LABEL}={mark}"],
                capture_output=True, timeout=DOCKER_SECONDS, check=False,
            )  # fmt: skip
            ids = listed.stdout.decode("ascii", "replace").split() if listed.returncode == 0 else []
            if ids:
                subprocess.run(
                    [docker, "rm", "--force", *ids], capture_output=True, timeout=DOCKER_SECONDS, check=False
                )
                _log.info("removed %d container(s) of simulated host %s", len(ids), mark)
        except (OSError, subprocess.TimeoutExpired):
            _log.warning("could not remove the containers of simulated host %s", mark, exc_info=True)


def _marked_pids(mark: str) -> list[int]:
    """Processes whose environment carries VM_MARK=mark (those whose environment we may read)."""
    return [
        candidate.pid
        for candidate in psutil.process_iter(["environ"])
        if (candidate.info["environ"] or {}).get(VM_MARK) == mark
    ]


def _group_exists(pgid: int) -> bool:
    """Whether any process, zombies included, is still in the group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # there, but not ours to signal
        pass
    return True


def _group_running(pgid: int) -> bool:
    """Whether any process of the group still runs; zombies waiting for init do not count."""
    return _group_exists(pgid) and group_running(pgid)

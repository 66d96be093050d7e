"""Run examples/jax_lm as a plain process, as tpujobs would (its TPUJOBS_* variables), and read its
progress lines; optionally SIGTERM it once it has reported a given step, as a preemption notice would.

Each process pays about 8 CPU-seconds to import JAX, Flax and orbax and trace the model, and its first
compile about 15 more: so every JAX run of a pytest run, the e2e drill's included, shares one
compilation cache (`compilation_cache`), and the example's tests share one uninterrupted run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support import shared_run
from tpujobs.agent.progress import parse_progress
from tpujobs.local.processes import free_port


@dataclass(frozen=True)
class Run:
    """One process of the example: how it ended and what it printed."""

    returncode: int
    output: str

    def lines(self, kind: str) -> list[dict[str, str]]:
        """The `key=value` words of every `TPUJOBS_<kind>` line, in order."""
        return [p.words for line in self.output.splitlines() if (p := parse_progress(line)) and p.kind == kind]

    @property
    def start(self) -> int:
        (start,) = self.lines("START")
        return int(start["step"])

    @property
    def checkpoints(self) -> list[int]:
        return [int(words["step"]) for words in self.lines("CHECKPOINT")]

    @property
    def steps(self) -> dict[int, dict[str, str]]:
        """Step -> its STEP line's words (data, loss)."""
        return {int(words["step"]): words for words in self.lines("STEP")}

    @property
    def result(self) -> str | None:
        results = self.lines("RESULT")
        return results[-1]["digest"] if results else None


STEPS, EVERY = 20, 5  # the uninterrupted run's, which every resumed run of the example's tests matches
DEVICES = 2  # CPU devices per run: one process of two, or two processes (hosts) of one each
CACHE_FOLDER = "jax-compilation-cache"


def compilation_cache(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """JAX's compilation cache for every JAX run of this pytest run: in the folder pytest-xdist's
    workers share (support/shared_run.py), else under the run's base temporary directory; made once."""
    root = shared_run.worker_folder(config) or tmp_path_factory.getbasetemp()
    cache = root / CACHE_FOLDER
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def jax_env(cache_dir: Path | None, devices: int | None = None) -> dict[str, str]:
    """JAX's variables for a run on `devices` CPU devices (default: one) compiling into `cache_dir`,
    where a run that finds its programs skips seconds of compiling, and computes the same."""
    env = {"JAX_PLATFORMS": "cpu"}  # no search for accelerator plugins
    if cache_dir is not None:
        env.update({"JAX_COMPILATION_CACHE_DIR": str(cache_dir), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"})
    if devices is not None:
        flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
        env["XLA_FLAGS"] = flags.strip()
    return env


def example_env(
    attempt: int,
    resume: bool,
    cache_dir: Path | None = None,
    worker: int = 0,
    workers: int = 1,
    devices: int | None = None,
) -> dict[str, str]:
    """The environment of one attempt on worker `worker` of `workers` in slice 0, with `devices` CPU
    devices; JAX's compilation cache in `cache_dir`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("TPUJOBS_", "STORAGE_EMULATOR"))}
    env.update(
        {
            "TPUJOBS_ATTEMPT": str(attempt),
            "TPUJOBS_RESUME": "1" if resume else "0",
            "TPUJOBS_SLICE_ID": "0",
            "TPUJOBS_WORKER_ID": str(worker),
            "TPUJOBS_NUM_WORKERS": str(workers),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(jax_env(cache_dir, devices))
    return env


def run_example(example: Path, checkpoints: Path, **options: Any) -> Run:
    """Run `example`/train.py alone to its end (`run_hosts`' options; with `sigterm_after`, SIGTERM
    it once it reports that step)."""
    (run,) = run_hosts(example, checkpoints, hosts=1, **options)
    return run


def run_hosts(
    example: Path,
    checkpoints: Path,
    *,
    hosts: int,
    steps: int,
    attempt: int = 1,
    resume: bool = False,
    sigterm_after: int | None = None,
    sigterm_worker: int = 0,
    extra_args: tuple[str, ...] = (),
    cache_dir: Path | None = None,
    devices: int | None = None,
    timeout_s: float = 300,
) -> list[Run]:
    """Run `example`/train.py as `hosts` processes of one slice, joined by jax.distributed (process 0
    coordinates, on a free local port) when more than one, each to its end, each with `devices` CPU
    devices (default: one); with `sigterm_after`, SIGTERM worker `sigterm_worker` alone once process 0
    reports that step."""
    argv = [sys.executable, "train.py", "--steps", str(steps), "--checkpoint-dir", str(checkpoints), *extra_args]
    if hosts > 1:
        argv += ["--coordinator", f"127.0.0.1:{free_port()}"]
    processes = [
        subprocess.Popen(
            argv,
            cwd=example,
            env=example_env(attempt, resume, cache_dir, worker, hosts, devices),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for worker in range(hosts)
    ]
    outputs: list[list[str]] = [[] for _ in processes]
    pending = [sigterm_after]

    def read(worker: int) -> None:
        stream = processes[worker].stdout
        assert stream is not None
        for line in stream:
            outputs[worker].append(line)
            due = pending[0]
            reported = parse_progress(line) if worker == 0 and due is not None else None
            if due is not None and reported is not None and reported.kind == "STEP" and (reported.step or 0) >= due:
                processes[sigterm_worker].send_signal(signal.SIGTERM)
                pending[0] = None

    readers = [threading.Thread(target=read, args=(worker,), daemon=True) for worker in range(hosts)]
    try:
        for reader in readers:
            reader.start()
        codes = [process.wait(timeout=timeout_s) for process in processes]
        for reader in readers:
            reader.join(timeout=10)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return [Run(code, "".join(lines)) for code, lines in zip(codes, outputs, strict=True)]

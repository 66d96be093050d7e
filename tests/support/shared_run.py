"""What the pytest-xdist workers of one run share: the emulators and the local stack.

A pair of Java emulators and a local stack each cost a worker a minute of this 2-core machine,
and every worker booting its own spent that several times over. So the controller makes one
folder per run and hands it to its workers (`workerinput`); the first worker that needs a
service starts it there under a file lock, the others find it recorded, and the controller
stops everything recorded once every worker is done. A run without workers has no such folder:
its fixtures start and stop their services themselves.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tpujobs.local import processes, stack

WORKER_INPUT_KEY = "tpujobs_run_folder"
_FOLDER = pytest.StashKey[Path]()
EMULATORS_FILE = "emulators.json"
STACKS = "stacks"  # one state folder per local stack, named for the stack

Booted = tuple[dict[str, str], list[processes.ManagedProcess]]  # addresses; what was started


def controller_folder(config: pytest.Config) -> Path:
    """The run's folder, made by the controller on first use."""
    if _FOLDER not in config.stash:
        config.stash[_FOLDER] = Path(tempfile.mkdtemp(prefix="tpujobs-test-run-"))
    return config.stash[_FOLDER]


def worker_folder(config: pytest.Config) -> Path | None:
    """On a pytest-xdist worker, the folder its controller shares with every worker; else None."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or WORKER_INPUT_KEY not in workerinput:
        return None
    return Path(workerinput[WORKER_INPUT_KEY])


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def shared_emulators(folder: Path, boot: Callable[[], Booted]) -> dict[str, str]:
    """The run's emulators: booted by the first worker to ask (`boot`), recorded, found by the rest."""
    record = folder / EMULATORS_FILE
    with _locked(folder / "emulators.lock"):
        if record.exists():
            addresses: dict[str, str] = json.loads(record.read_text())["addresses"]
            return addresses
        addresses, started = boot()
        record.write_text(json.dumps({"addresses": addresses, "processes": [p.to_json() for p in started]}))
        return addresses


def stack_folder(folder: Path, name: str) -> Path:
    """Where the run's local stack `name` is recorded: `stack.up` there starts it once, under its lock."""
    return folder / STACKS / name


def stop_shared(config: pytest.Config) -> None:
    """On the controller, once every worker is done: what they shared (nothing elsewhere)."""
    folder = config.stash.get(_FOLDER, None)
    if folder is not None:
        _stop_everything(folder)


def _stop_everything(folder: Path) -> None:
    """Each recorded stack, then the emulators they used, then the folder."""
    stacks = folder / STACKS
    for state_dir in sorted(stacks.iterdir()) if stacks.is_dir() else []:
        stack.down(state_dir)
    record = folder / EMULATORS_FILE
    if record.exists():
        started = [processes.ManagedProcess.from_json(p) for p in json.loads(record.read_text())["processes"]]
        processes.stop(started)
        if started:  # their logs' folder, made by the worker that booted them
            shutil.rmtree(started[0].log_path.parent, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)

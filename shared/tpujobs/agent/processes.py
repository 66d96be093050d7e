"""Process groups and trees on Linux: is a group alive, signal it, adopt orphans as a child
subreaper, and kill whatever a job left below the agent.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time


def proc_stat(pid: int | str) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state first), or [] when the
    process is gone or there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is in the process group."""
    if not os.path.exists("/proc/self/stat"):
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = proc_stat(entry)
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def signal_group(pgid: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, number)


PR_SET_CHILD_SUBREAPER = 36  # prctl(2): orphans below this process are re-parented to it, not to init
CLEAN_ROUNDS = 50  # of killing what a job left (a process forking while it is killed needs more than one)


def become_subreaper() -> bool:
    """This process adopts its orphaned descendants (Linux), so a daemon a job double-forked is
    still found below it and killed at the job's end; False where that cannot be had."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError, TypeError):
        return False


def descendants(root: int) -> list[int]:
    """Live (non-zombie) processes descended from `root`, by their parent links in /proc."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if entry.isdigit():
            fields = proc_stat(entry)
            if len(fields) > 1 and fields[0] != "Z" and fields[1].isdigit():
                children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid != root and pid not in found:
            found.append(pid)
            todo.extend(children.get(pid, []))
    return found


def reap_children() -> None:
    """Collects every exited child (orphans adopted as a subreaper among them). Only while no
    job runs: it would take a running child's exit status from the code waiting for it."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_descendants(root: int) -> int:
    """SIGKILL to every process still descended from `root`, until none is left (bounded);
    how many were killed."""
    killed: set[int] = set()
    for _ in range(CLEAN_ROUNDS):
        found = descendants(root)
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        reap_children()
        time.sleep(0.02)  # their own children are re-parented to `root` as they die
    reap_children()
    return len(killed)

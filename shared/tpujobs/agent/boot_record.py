"""The attempt's record on this host's boot disk: a VM re-runs its startup script at every
boot, so a second start of the agent for one attempt finds the first's record and runs nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any

from .basics import log, safe_name
from .processes import proc_stat

BOOT_ID = "/proc/sys/kernel/random/boot_id"  # Linux: a new value at every boot


def boot_id() -> str:
    """This boot's id (Linux), or "" where there is none."""
    try:
        with open(BOOT_ID, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def process_start(pid: int) -> str:
    """When a live process started, in clock ticks since boot (/proc/PID/stat field 22), or ""
    when it is gone, a zombie, or there is no /proc. With the pid and the boot id it names
    one process, whatever pids are reused later."""
    fields = proc_stat(pid)
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else ""


def still_running(entry: dict[str, Any], boot: str) -> bool:
    """Whether the process an entry of the record names (`pid`, `start`, `boot`) still runs."""
    pid, start = entry.get("pid"), entry.get("start")
    if not isinstance(pid, int) or isinstance(pid, bool) or not start or not boot:
        return False
    return entry.get("boot") == boot and process_start(pid) == start


class AttemptRecord:
    """What this host did for one attempt, in a file beside the attempt's work directory.

    A VM runs its startup script at every boot (repair, maintenance, reset), and so starts
    the agent again with the same config; nothing in memory survives, but the boot disk
    does. The first start creates the record (atomically: of two agents, one creates it);
    a later start finds it and knows the attempt already ran here. The record names the
    job, attempt, slice and worker in its file name, and says when the agent started, what
    it was running (setup or command, with pid and start) and how it ended.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def beside(cls, workdir: str, config: dict[str, Any], slice_id: int, worker_id: int) -> AttemptRecord:
        name = (
            f".tpujobs-attempt-{safe_name(config['job_id'])}-a{int(config['attempt'])}"
            f"-slice{slice_id}-worker{worker_id}.json"
        )
        return cls(os.path.join(os.path.dirname(os.path.abspath(workdir)), name))

    def claim(self, first: dict[str, Any]) -> dict[str, Any] | None:
        """None when this is the attempt's first start here (the record now holds `first`),
        else what the earlier start recorded ({} if it cannot be read)."""
        temporary = self._write_temporary(first)
        try:
            os.link(temporary, self.path)  # fails if the record exists: one start wins
        except FileExistsError:
            return self.read()
        finally:
            os.unlink(temporary)
        self._sync_directory()
        return None

    def read(self) -> dict[str, Any]:
        try:
            with open(self.path, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def update(self, **changes: Any) -> None:
        """Adds to the record; a failure is logged: the record's existence is what matters."""
        try:
            temporary = self._write_temporary({**self.read(), **changes})
            os.replace(temporary, self.path)
            self._sync_directory()
        except OSError as error:
            log(f"could not update {self.path}: {error}")

    def _write_temporary(self, data: dict[str, Any]) -> str:
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=".tpujobs-record-", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(data, handle, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())  # on disk before a reset, not only in the page cache
        except BaseException:
            os.unlink(temporary)
            raise
        return temporary

    def _sync_directory(self) -> None:
        with contextlib.suppress(OSError):
            fd = os.open(os.path.dirname(self.path), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def started_again_detail(earlier: dict[str, Any], boot: str) -> str:
    """What a second start of the agent found of the first, in one sentence for its report."""
    if not earlier:
        return "the attempt's record on this host is unreadable, but it had started here before"
    first = str(earlier.get("agent_started_at") or "at an unknown time")
    same_boot = bool(boot) and earlier.get("boot") == boot
    where = "earlier in this boot" if same_boot else "before the host rebooted"
    sentence = f"the agent first started {first}, {where}"
    agent = {"pid": earlier.get("agent_pid"), "start": earlier.get("agent_start"), "boot": earlier.get("boot")}
    if still_running(agent, boot):
        sentence += f"; that agent (pid {agent['pid']}) is still running"
    running = earlier.get("running")
    if isinstance(running, dict) and running.get("what") in ("setup", "command"):
        what = running["what"]
        state = "is still running" if still_running(running, boot) else "is gone"
        sentence += f"; its {what} (pid {running.get('pid')}, started {running.get('at')}) {state}"
    else:
        sentence += "; it had not started setup or the command"
    if earlier.get("ended"):
        sentence += f"; it had ended ({earlier['ended']})"
    return sentence + ": nothing is started again"

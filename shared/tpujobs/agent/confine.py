"""What an attempt's processes run as and where: an unprivileged user made for the attempt (never
root), in a cgroup v2 directory of its own under the agent's, and everything in that cgroup, or
running as that user, killed before the host is handed to the next job.

Why: a warm pool's unit runs one job after another on the same VM, and any local process can ask
the metadata server for the next assignment and for the VM's identity token, with which the
control plane hands out the attempt's key. So no process of a job may outlive it. A process group
is not enough (`setsid` leaves it), nor is the subreaper (a daemon started through cron or systemd
is not below the agent); a cgroup holds every descendant whatever it does, `cgroup.kill` ends them
all at once, and a process running as the job's user cannot move itself out. What cron or `at`
starts for the user is outside the cgroup: those spools are emptied, and every process of the
user's uid killed, before the user is deleted. Each attempt gets a fresh uid, so nothing a job
leaves in /tmp is readable by the next one (and it is deleted anyway).

The command is started through a tiny launcher, as root: `LAUNCHER` (Python) joins the cgroup,
drops to the user and execs the command; with no user to drop to, `JOIN_CGROUP` (/bin/sh, which
starts at once) only joins. Either way the command's first instruction already runs confined.
Standard library only.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from .basics import log

# On the host, how the job's user is made: unset (a VM), with useradd (a bare uid where there is
# none); "uid": a bare uid, no /etc/passwd entry (tests on a shared machine); "root": no user,
# commands run as the agent's own (test harnesses whose commands write into private dirs).
JOB_USER_VARIABLE = "TPUJOBS_JOB_USER"
SIMULATED_HOST_VARIABLE = "SIMULATED_TPU_VM"  # the simulator's mark: its commands share the tests' private dirs
USER_PREFIX = "tpujob-"
UID_BASE = 1_500_000_000  # far above any account a VM image makes; a fresh uid per attempt
UID_SPAN = 500_000_000
CGROUP_PREFIX = "tpujobs-job-"
TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")  # world-writable: what the user left there is deleted
SPOOLS = ("/var/spool/cron/crontabs", "/var/spool/cron/atjobs", "/var/spool/cron", "/var/spool/at")
TPU_DEVICES = ("/dev/accel*", "/dev/vfio/[0-9]*")  # lent to the job's user while it runs
KILL_ROUNDS = 50
LAUNCH_FAILED = 125  # the launcher could not confine the command: it did not run
LAUNCHER = """\
import os, sys
procs, uid, gid = sys.argv[1:4]
try:
    if procs:
        with open(procs, "w") as handle:
            handle.write(str(os.getpid()))
    if uid:
        os.setgroups([])
        os.setgid(int(gid))
        os.setuid(int(uid))
        if os.getuid() != int(uid) or os.geteuid() != int(uid):
            raise OSError("the user did not change")
except OSError as error:
    sys.stderr.write("[tpujobs-agent] cannot confine the command: %s\\n" % error)
    sys.exit(125)
os.execv(sys.argv[4], sys.argv[4:])
"""
# Into the cgroup alone (no user to change to): the shell's own pid joins it, then it execs.
JOIN_CGROUP = 'echo $$ > "$0" || { echo "[tpujobs-agent] cannot join the job\'s cgroup" >&2; exit 125; }; exec "$@"'


# --- cgroup v2 ---------------------------------------------------------------------------


def cgroup2_mount(mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or .../unified on a hybrid host)."""
    try:
        with open(mountinfo, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        head, _, tail = line.partition(" - ")
        fields = head.split()
        if tail.split()[:1] == ["cgroup2"] and len(fields) > 4:
            return fields[4]
    return None


def own_cgroup(proc_cgroup: str = "/proc/self/cgroup", mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The directory of this process's cgroup v2, or None without one."""
    mount = cgroup2_mount(mountinfo)
    try:
        with open(proc_cgroup, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::") and mount is not None:
            return os.path.join(mount, line[3:].lstrip("/"))
    return None


class JobCgroup:
    """One attempt's cgroup: every process started in it, and all they start, stay in it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.procs = os.path.join(path, "cgroup.procs")

    @classmethod
    def create(cls, name: str, parent: str | None = None) -> JobCgroup | None:
        """A new cgroup `name` below `parent` (the agent's own by default); None where cgroup v2 is
        missing or not writable (the agent then falls back on process groups and its subreaper)."""
        parent = parent or own_cgroup()
        if parent is None:
            return None
        path = os.path.join(parent, name)
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            cgroup = cls(path)
            cgroup.kill()  # an earlier start's: nothing of it may run on
        except OSError as error:
            log(f"no cgroup for the job's processes ({error}): process groups and the subreaper only")
            return None
        return cls(path) if os.access(os.path.join(path, "cgroup.procs"), os.W_OK) else None

    def pids(self) -> list[int]:
        try:
            with open(self.procs, encoding="ascii") as handle:
                return [int(line) for line in handle.read().split()]
        except OSError:
            return []

    def kill(self) -> int:
        """Every process in the cgroup killed (`cgroup.kill`; where the kernel lacks it, frozen and
        SIGKILLed one by one), until none is left (bounded); how many there were."""
        found = set(self.pids())
        kill_file = os.path.join(self.path, "cgroup.kill")
        for _ in range(KILL_ROUNDS):
            pids = self.pids()
            if not pids:
                break
            found.update(pids)
            try:
                with open(kill_file, "w", encoding="ascii") as handle:
                    handle.write("1")
            except OSError:
                self._freeze_and_kill(pids)
            time.sleep(0.02)
        return len(found)

    def _freeze_and_kill(self, pids: list[int]) -> None:
        freeze = os.path.join(self.path, "cgroup.freeze")
        with contextlib.suppress(OSError), open(freeze, "w", encoding="ascii") as handle:
            handle.write("1")  # nothing forks while it is killed
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError), open(freeze, "w", encoding="ascii") as handle:
            handle.write("0")

    def remove(self) -> None:
        """Killed, then its directory removed (a zombie not yet reaped may hold it a moment)."""
        self.kill()
        for _ in range(KILL_ROUNDS):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.02)
        log(f"the job's cgroup {self.path} could not be removed")


def earlier_cgroup(path: object) -> JobCgroup | None:
    """The job cgroup an earlier start of the agent recorded (`path`), when it is one: a job
    cgroup directly below this agent's own cgroup, still there. None for anything else."""
    parent = own_cgroup()
    if not isinstance(path, str) or parent is None:
        return None
    if os.path.dirname(os.path.normpath(path)) != os.path.normpath(parent):
        return None
    if not os.path.basename(path).startswith(CGROUP_PREFIX) or not os.path.isdir(path):
        return None
    return JobCgroup(path)


# --- the job's user ----------------------------------------------------------------------


@dataclass(frozen=True)
class JobUser:
    """An unprivileged account for one attempt: a fresh uid, its own group, a home of its own.
    `listed`: in /etc/passwd (made with useradd), else a bare uid the kernel knows only as a number."""

    name: str
    uid: int
    gid: int
    home: str
    listed: bool

    def environment(self) -> dict[str, str]:
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}


def fresh_uid(taken: Callable[[int], bool]) -> int:
    """A uid in the job range that no account and no process has."""
    for _ in range(100):
        uid = UID_BASE + secrets.randbelow(UID_SPAN)
        if not taken(uid):
            return uid
    raise OSError("no free uid for the job's user")


def uid_taken(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return bool(processes_of(uid))


def _run(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False)


def make_job_user(
    home: str, useradd: str | None, run: Callable[[list[str]], subprocess.CompletedProcess[bytes]] = _run
) -> JobUser:
    """A new user for one attempt, with `home` (made, owned by it, 0700). With `useradd`, listed in
    /etc/passwd (no lastlog entry: the uid is large); without, a bare uid and gid."""
    uid = fresh_uid(uid_taken)
    name = f"{USER_PREFIX}{uid}"
    listed = False
    gid = uid
    if useradd:
        argv = [useradd, "--uid", str(uid), "--user-group", "--no-create-home", "--no-log-init"]
        argv += ["--home-dir", home, "--shell", "/bin/bash", "--comment", "tpujobs job", name]
        done = run(argv)
        if done.returncode != 0:
            raise OSError(f"useradd failed: {done.stderr.decode('utf-8', 'replace').strip()[:200]}")
        listed = True
        gid = pwd.getpwnam(name).pw_gid
    os.makedirs(home, mode=0o700, exist_ok=True)
    os.chown(home, uid, gid)
    os.chmod(home, 0o700)
    return JobUser(name, uid, gid, home, listed)


def processes_of(uid: int) -> list[int]:
    """Live processes whose real or effective uid is `uid`."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="utf-8", errors="replace") as handle:
                status = handle.read()
        except OSError:
            continue
        fields = {k: v.split() for k, _, v in (line.partition(":") for line in status.splitlines())}
        if fields.get("State", ["Z"])[0] != "Z" and str(uid) in fields.get("Uid", [])[:2]:
            found.append(int(entry))
    return found


def kill_processes_of(uid: int) -> int:
    """SIGKILL to every process of the uid, until none is left (bounded); how many there were."""
    killed: set[int] = set()
    for _ in range(KILL_ROUNDS):
        pids = processes_of(uid)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.02)
    return len(killed)


def remove_files_of(uid: int, roots: tuple[str, ...] = TEMP_DIRS) -> int:
    """What the uid left in the world-writable directories and the cron and at spools, deleted
    (symlinks themselves, never followed); how many entries."""
    removed = 0
    for root in roots + SPOOLS:
        try:
            entries = os.listdir(root)
        except OSError:
            continue
        for entry in entries:
            path = os.path.join(root, entry)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if info.st_uid != uid:
                continue
            with contextlib.suppress(OSError):
                if stat.S_ISDIR(info.st_mode):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
                removed += 1
    return removed


def lend_devices(uid: int, patterns: tuple[str, ...] = TPU_DEVICES) -> dict[str, tuple[int, int]]:
    """The host's TPU device nodes, owned by the user while its job runs: {path: (uid, gid) before}."""
    lent = {}
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            try:
                info = os.stat(path)
                os.chown(path, uid, -1)
            except OSError as error:
                log(f"cannot give the job's user {path}: {error}")
                continue
            lent[path] = (info.st_uid, info.st_gid)
    return lent


# --- one attempt's confinement -------------------------------------------------------------


class Confinement:
    """One attempt's user and cgroup (either may be None: not root, a test harness, no cgroup v2),
    how its commands are launched into them, and their end."""

    def __init__(self, user: JobUser | None, cgroup: JobCgroup | None, userdel: str | None = None) -> None:
        self.user = user
        self.cgroup = cgroup
        self.userdel = userdel
        self.lent: dict[str, tuple[int, int]] = lend_devices(user.uid) if user is not None else {}
        self.ended = False

    @classmethod
    def for_attempt(cls, environ: dict[str, str], tag: str, home: str) -> Confinement:
        """As this host allows: a user when the agent is root (unless the host says
        TPUJOBS_JOB_USER=root, or is simulated), a cgroup where cgroup v2 is writable."""
        cgroup = JobCgroup.create(f"{CGROUP_PREFIX}{tag}-{os.getpid()}")
        user = None
        how = environ.get(JOB_USER_VARIABLE, "").strip()
        wanted = how != "root" and not environ.get(SIMULATED_HOST_VARIABLE)
        if wanted and os.geteuid() == 0:
            path = (environ.get("PATH") or "/usr/bin:/bin") + ":/usr/sbin:/sbin"
            try:
                user = make_job_user(home, None if how == "uid" else shutil.which("useradd", path=path))
            except OSError:
                if cgroup is not None:
                    cgroup.remove()
                raise
            userdel = shutil.which("userdel", path=path) if user.listed else None
            log(f"the job's commands run as {user.name} (uid {user.uid}), not root")
            return cls(user, cgroup, userdel)
        if wanted:
            log("the agent is not root: the job's commands run as the agent's own user")
        return cls(None, cgroup)

    def launch(self, argv: list[str], as_user: bool = True) -> list[str]:
        """`argv` started through the launcher: into the cgroup, then (with `as_user`) as the
        job's user. The docker CLI keeps root (its socket is root's): `as_user` False."""
        user = self.user if as_user else None
        procs = self.cgroup.procs if self.cgroup is not None else ""
        if user is None:
            return ["/bin/sh", "-c", JOIN_CGROUP, procs, *argv] if procs else argv
        # The program's path found now: past setuid the launcher imports nothing (root's Python may
        # be unreadable to the user) and execs that path as it is.
        program = shutil.which(argv[0]) or argv[0]
        return [sys.executable, "-S", "-E", "-c", LAUNCHER, procs, str(user.uid), str(user.gid), program, *argv[1:]]

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        """The command's environment with the user's HOME, USER and LOGNAME."""
        return {**env, **self.user.environment()} if self.user is not None else env

    def hand_over(self, path: str) -> None:
        """`path` and all below it given to the job's user (its working directory, the code)."""
        if self.user is None:
            return
        os.chown(path, self.user.uid, self.user.gid)
        for top, dirs, files in os.walk(path):
            for name in dirs + files:
                os.lchown(os.path.join(top, name), self.user.uid, self.user.gid)

    def record(self) -> dict[str, object]:
        """What the attempt's record keeps of it, for a restarted agent to stop (`stop_recorded`)."""
        found: dict[str, object] = {}
        if self.cgroup is not None:
            found["cgroup"] = self.cgroup.path
        if self.user is not None:
            found["uid"] = self.user.uid
        return found

    def kill(self) -> int:
        """Every process of the attempt killed: the cgroup's, and any of the user's uid."""
        killed = self.cgroup.kill() if self.cgroup is not None else 0
        if self.user is not None:
            killed += kill_processes_of(self.user.uid)
        return killed

    def end(self) -> int:
        """Everything of the attempt killed and undone: its processes, what its user left in the
        shared temporary directories and spools, the devices lent, the user and the cgroup.
        Idempotent; how many processes were killed."""
        killed = self.kill()
        if self.ended:
            return killed
        self.ended = True
        if self.user is not None:
            remove_files_of(self.user.uid)
            killed += kill_processes_of(self.user.uid)  # what cron started meanwhile
            for path, (uid, gid) in self.lent.items():
                with contextlib.suppress(OSError):
                    os.chown(path, uid, gid)
            if self.userdel:
                done = _run([self.userdel, self.user.name])
                if done.returncode != 0:
                    log(f"userdel {self.user.name} failed: {done.stderr.decode('utf-8', 'replace').strip()[:200]}")
        if self.cgroup is not None:
            self.cgroup.remove()
        return killed


def stop_recorded(running: dict[str, object]) -> int:
    """What an earlier start of the agent recorded of an attempt (`Confinement.record`), killed: its
    cgroup (then removed) and its user's processes; how many processes."""
    killed = 0
    cgroup = earlier_cgroup(running.get("cgroup"))
    if cgroup is not None:
        killed += cgroup.kill()
        cgroup.remove()
    uid = running.get("uid")
    if isinstance(uid, int) and not isinstance(uid, bool) and UID_BASE <= uid < UID_BASE + UID_SPAN:
        killed += kill_processes_of(uid)
    return killed

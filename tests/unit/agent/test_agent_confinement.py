"""A job's processes run as a user made for the attempt, in a cgroup of their own, and nothing of
them outlives the attempt: a warm unit is handed to the next job clean (`agent/confine.py`).

Where this machine allows it (the tests run as root and cgroup v2 is writable), it is exercised for
real: the pool agent runs from its startup script, the job's user is a bare uid
(TPUJOBS_JOB_USER=uid: no /etc/passwd entry on a shared machine; a VM uses useradd), and a `setsid`
daemon is looked for at the moment the `exited` report is published. Elsewhere those tests skip and
the seams below (launch argv, cgroup discovery, useradd's argv) still run.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_stubs import FakeMetadata, GoogleStub, a_job, chunk_prefix, gone, kill_group
from test_pool_agent import ASSIGNMENT, UnitHost, assign, kinds_of

from tpujobs.agent import confine
from tpujobs.agent.confine import JOIN_CGROUP, Confinement, JobCgroup, JobUser, make_job_user, own_cgroup
from tpujobs.engine.startup_script import idle_assignment_text
from tpujobs.local.testing import wait_for


def cgroup_writable() -> bool:
    """Whether this process may make a cgroup v2 below its own (and remove it)."""
    parent = own_cgroup()
    if parent is None or os.geteuid() != 0:
        return False
    probe = os.path.join(parent, f"tpujobs-probe-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError:
        return False
    return True


REAL = pytest.mark.skipif(
    not cgroup_writable() or not os.path.exists("/proc/self/stat"),
    reason="needs root and a writable cgroup v2 (the launch and kill seams are tested below anyway)",
)


class WatchingGoogle(GoogleStub):
    """GoogleStub that, as each `exited` report is published, notes which daemon pids (printed by
    the job as `daemon=PID`) are still alive: what runs when the control plane may hand the unit on."""

    def __init__(self) -> None:
        super().__init__()
        self.alive_at_exit: dict[str, list[int]] = {}

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        if method == "POST" and path.endswith(":publish"):
            for message in json.loads(body).get("messages", []):
                payload = json.loads(base64.b64decode(message["data"]))
                if payload.get("kind") == "exited":
                    job = payload["job_id"]
                    pids = [int(p) for p in re.findall(rb"daemon=(\d+)", self.output(chunk_prefix(job_id=job)))]
                    self.alive_at_exit[job] = [pid for pid in pids if not gone(pid)]
        return super().answer(method, path, headers, body)


@pytest.fixture
def google() -> Iterator[WatchingGoogle]:
    with WatchingGoogle() as server:
        yield server


@pytest.fixture
def metadata(google: WatchingGoogle) -> Iterator[FakeMetadata]:
    with FakeMetadata(**{ASSIGNMENT: idle_assignment_text(0)}) as server:
        server.key_server = google
        yield server


@pytest.fixture
def host(tmp_path: Path, metadata: FakeMetadata, google: WatchingGoogle) -> Iterator[UnitHost]:
    unit = UnitHost(tmp_path, metadata, google)
    unit.extra_env = {confine.JOB_USER_VARIABLE: "uid"}  # a job user, as on a VM (a bare uid here)
    try:
        yield unit
    finally:
        unit.stop()


# The job: who it runs as, whether it can read the agent's private files or leave its cgroup,
# then a setsid'd daemon (a leftover) that would outlive it.
PROBE = (
    'echo "uid=$(id -u) home=$HOME"; '
    "cat {config} >/dev/null 2>&1 && echo config-read || echo config-refused; "
    "echo $$ > {root_procs} 2>/dev/null && echo cgroup-left || echo cgroup-kept; "
    "setsid sleep 600 </dev/null >/dev/null 2>&1 & d=$!; echo daemon=$d; "
    # Out of the group before the command ends (else the group's own SIGTERM would take it).
    'until [ "$(cut -d" " -f6 /proc/$d/stat)" = "$d" ]; do sleep 0.01; done'
)


@REAL
def test_a_setsid_leftover_is_killed_before_exited_is_published_and_the_job_ran_unprivileged(
    host: UnitHost, metadata: FakeMetadata, google: WatchingGoogle
) -> None:
    """A pool job runs as a fresh non-root uid with its own HOME, cannot read the agent's 0600 config
    nor move itself out of its cgroup; its setsid'd daemon is dead when `exited` goes out (the control
    plane may then hand the unit on), and the next job gets another uid."""
    root_procs = os.path.join(str(confine.cgroup2_mount()), "cgroup.procs")
    command = PROBE.format(config=host.workdir / "config.json", root_procs=root_procs)
    first, second = a_job(job_id="first-1", command=command), a_job(job_id="second-1", command=command)
    host.start()
    assign(metadata, 1, first)
    wait_for(lambda: "exited" in kinds_of(google, first))
    output = google.output(chunk_prefix(job_id="first-1")).decode()
    uid = int(re.search(r"uid=(\d+)", output).group(1))  # type: ignore[union-attr]
    assert uid >= confine.UID_BASE, output
    assert f"home={host.attempt_dir(first)}/work/home" in output
    assert "config-refused" in output and "cgroup-kept" in output, output
    assert re.search(r"daemon=\d+", output), output
    assert google.alive_at_exit["first-1"] == []
    assert "1 leftover process killed" in host.stderr()
    assert confine.processes_of(uid) == []

    wait_for(lambda: host.said("job first-1 attempt 1: ended"))
    assign(metadata, 2, second)
    wait_for(lambda: "exited" in kinds_of(google, second))
    again = google.output(chunk_prefix(job_id="second-1")).decode()
    assert int(re.search(r"uid=(\d+)", again).group(1)) != uid  # type: ignore[union-attr]
    assert google.alive_at_exit["second-1"] == []
    assert not [name for name in os.listdir(own_cgroup() or "/") if name.startswith(confine.CGROUP_PREFIX + "first")]


@REAL
def test_a_restarted_pool_agent_kills_the_setsid_daemon_its_earlier_start_left_in_the_jobs_cgroup(
    host: UnitHost, metadata: FakeMetadata, google: WatchingGoogle
) -> None:
    """The pool agent dies while its job runs (the job and its setsid daemon run on, no longer below it);
    started again, it finds the job's cgroup in the attempt's record and kills the daemon too."""
    job = a_job(job_id="lost-1", command=PROBE.format(config="/nonexistent", root_procs="/dev/null") + "; sleep 600")
    first = host.start()
    assign(metadata, 1, job)
    wait_for(lambda: b"daemon=" in google.output(chunk_prefix(job_id="lost-1")) and "running" in host.record(job))
    daemon = int(re.findall(rb"daemon=(\d+)", google.output(chunk_prefix(job_id="lost-1")))[0])
    assert host.record(job)["running"]["cgroup"].startswith(str(own_cgroup()))
    kill_group(first.pid)
    first.wait(timeout=10)
    assert not gone(daemon)

    host.start()
    wait_for(lambda: host.said("job lost-1 attempt 1: not run again"))
    assert gone(daemon)


@REAL
def test_a_cgroups_kill_ends_a_double_forked_setsid_process_the_launcher_started(tmp_path: Path) -> None:
    """Started through the launcher into a job cgroup, a process that setsid's and double-forks is
    still in the cgroup, and `kill` ends it; the cgroup is then removed."""
    cgroup = JobCgroup.create(f"{confine.CGROUP_PREFIX}test-{uuid.uuid4().hex[:8]}")
    assert cgroup is not None
    pid_file = tmp_path / "pid"
    script = f"(setsid sh -c 'sleep 600 & echo $! > {pid_file}' &) ; sleep 0.1"
    argv = Confinement(None, cgroup).launch(["bash", "-c", script])
    assert subprocess.run(argv, timeout=30, check=False).returncode == 0
    daemon = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip()))
    assert not gone(daemon) and daemon in cgroup.pids()
    assert cgroup.kill() >= 1
    assert gone(daemon)
    cgroup.remove()
    assert not os.path.exists(cgroup.path)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to change user")
def test_the_launcher_drops_to_the_users_uid_and_gid_with_no_extra_groups(tmp_path: Path) -> None:
    """The launched command runs as the user alone: its uid, its gid, no supplementary group (root's none)."""
    user = JobUser("tpujob-test", confine.UID_BASE + 7, confine.UID_BASE + 7, str(tmp_path), listed=False)
    argv = Confinement(user, None).launch(["sh", "-c", "id -u; id -g; id -G"])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.stdout.split() == [str(user.uid), str(user.gid), str(user.gid)], done.stderr


# --- the seams, wherever the tests run -------------------------------------------------------


def test_without_a_user_or_cgroup_a_command_is_launched_as_it_is() -> None:
    """No user (not root, or a harness) and no cgroup v2: the argv is unchanged (process groups and the
    subreaper still clean up)."""
    assert Confinement(None, None).launch(["bash", "-c", "true"]) == ["bash", "-c", "true"]


def test_the_docker_cli_joins_the_cgroup_but_keeps_roots_user() -> None:
    """`as_user=False` (the docker CLI, whose socket is root's): into the cgroup, no uid change."""
    user = JobUser("tpujob-1", 1_500_000_001, 1_500_000_001, "/h", listed=True)
    argv = Confinement.__new__(Confinement)
    argv.user, argv.cgroup, argv.userdel, argv.lent, argv.ended = user, JobCgroup("/cg/job"), None, {}, False
    launched = argv.launch(["docker", "run"], as_user=False)
    assert launched == ["/bin/sh", "-c", JOIN_CGROUP, "/cg/job/cgroup.procs", "docker", "run"]
    as_user = argv.launch(["bash", "-c", "x"])
    assert as_user[5:8] == ["/cg/job/cgroup.procs", "1500000001", "1500000001"]


def test_the_agents_cgroup_is_found_from_proc_on_a_hybrid_host(tmp_path: Path) -> None:
    """`0::/PATH` in /proc/self/cgroup under the cgroup2 mount named by mountinfo (here /sys/fs/cgroup/unified)."""
    (tmp_path / "cgroup").write_text("4:memory:/x\n0::/system.slice/google-startup-scripts.service\n")
    (tmp_path / "mountinfo").write_text(
        "30 25 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n"
        "35 30 0:31 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n"
    )
    found = own_cgroup(str(tmp_path / "cgroup"), str(tmp_path / "mountinfo"))
    assert found == "/sys/fs/cgroup/unified/system.slice/google-startup-scripts.service"
    (tmp_path / "mountinfo").write_text("30 25 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n")
    assert own_cgroup(str(tmp_path / "cgroup"), str(tmp_path / "mountinfo")) is None


def test_a_cgroup_that_cannot_be_made_leaves_the_job_to_process_groups(tmp_path: Path) -> None:
    """A parent that is not a cgroup (or not writable) gives no cgroup, and no error."""
    assert JobCgroup.create("job", parent=str(tmp_path / "missing")) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="chowns the home to the new uid")
def test_useradd_makes_a_user_with_a_fresh_large_uid_its_own_group_and_no_lastlog_entry(tmp_path: Path) -> None:
    """The argv a VM's agent gives useradd: an explicit fresh uid, a group of its own, the attempt's home,
    no home copied from /etc/skel and no lastlog entry (sparse files sized by the uid)."""
    seen: list[list[str]] = []

    def run(argv: list[str]) -> Any:
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 1, b"", b"useradd: stub")

    with pytest.raises(OSError, match="useradd failed: useradd: stub"):
        make_job_user(str(tmp_path / "home"), "/usr/sbin/useradd", run)
    (argv,) = seen
    uid = int(argv[argv.index("--uid") + 1])
    assert confine.UID_BASE <= uid < confine.UID_BASE + confine.UID_SPAN
    assert {"--user-group", "--no-create-home", "--no-log-init"} <= set(argv)
    assert argv[argv.index("--home-dir") + 1] == str(tmp_path / "home") and argv[-1] == f"tpujob-{uid}"

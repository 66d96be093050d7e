"""Containers on this machine: Docker Engine, a local registry, and a tiny image built here.

The local stack runs jobs' images for real: the machine's Docker Engine (Debian's `docker.io`)
pulls them from a registry on loopback (Debian's `docker-registry`), exported as
`TPUJOBS_REGISTRY`. Docker treats a registry on 127.0.0.0/8 as insecure by default, so plain
HTTP on loopback needs no daemon setting. Nothing outside this machine is reachable, so test
images are built from a local root filesystem: a static busybox (Debian's `busybox-static`)
and whatever files a test asks for.

Where Docker cannot run, `docker_problem` says what to install or start, in one sentence.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

DOCKER_SOCKET = "/var/run/docker.sock"
# Held while one process checks for and starts dockerd: two test workers or a test and
# `tpujobs dev up` starting it at once would race for its pid file and socket.
DOCKERD_LOCK = "/tmp/tpujobs-dockerd.lock"
BUSYBOX = "/bin/busybox"
INSTALL_HINT = "apt-get install docker.io docker-registry busybox-static (as root; make tools does it)"


class ContainerToolError(RuntimeError):
    """Docker, the registry or busybox is missing or will not run; the message says what to do."""


def docker_binary() -> str | None:
    """The docker CLI, preferring Debian's (it matches Debian's daemon) over any other on PATH."""
    if os.access("/usr/bin/docker", os.X_OK):
        return "/usr/bin/docker"
    return shutil.which("docker")


def docker_answers(timeout_s: float = 10.0) -> bool:
    docker = docker_binary()
    if docker is None:
        return False
    try:
        done = subprocess.run(
            [docker, "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and bool(done.stdout.strip())


def docker_problem() -> str | None:
    """None when Docker Engine answers; else a sentence saying what is missing and how to fix it."""
    if docker_binary() is None:
        return f"the docker CLI is not installed: {INSTALL_HINT}"
    if docker_answers():
        return None
    if shutil.which("dockerd") is None:
        return f"no Docker Engine answers and dockerd is not installed: {INSTALL_HINT}"
    if os.geteuid() != 0:
        return "no Docker Engine answers on /var/run/docker.sock; start dockerd (as root) and run again"
    return "no Docker Engine answers on /var/run/docker.sock; `tpujobs dev up` starts dockerd, or start it yourself"


@contextlib.contextmanager
def _dockerd_lock() -> Iterator[None]:
    with open(DOCKERD_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def start_dockerd(log_path: Path, *, deadline_s: float = 60.0) -> subprocess.Popen[bytes] | None:
    """Starts dockerd when none answers and this process may (root, dockerd installed);
    the process it started, or None when one already answered. ContainerToolError if it cannot."""
    if docker_answers():
        return None
    with _dockerd_lock():
        return _start_dockerd_locked(log_path, deadline_s)


def _start_dockerd_locked(log_path: Path, deadline_s: float) -> subprocess.Popen[bytes] | None:
    if docker_answers():  # another process started it while this one waited for the lock
        return None
    dockerd = shutil.which("dockerd")
    if dockerd is None or os.geteuid() != 0:
        raise ContainerToolError(docker_problem() or "Docker Engine does not answer")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [dockerd, "--host", f"unix://{DOCKER_SOCKET}"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ContainerToolError(f"dockerd exited with {process.returncode}; see {log_path}")
        if docker_answers(timeout_s=2.0):
            return process
        time.sleep(0.3)
    process.terminate()
    raise ContainerToolError(f"dockerd did not answer within {deadline_s:g} s; see {log_path}")


def registry_config(root: Path, host: str, port: int) -> str:
    """The docker-registry (distribution) configuration: filesystem storage, plain HTTP on loopback."""
    return "\n".join(
        [
            "version: 0.1",
            "log:",
            "  level: warn",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {json.dumps(str(root))}",
            "  delete:",
            "    enabled: true",
            "http:",
            f"  addr: {json.dumps(f'{host}:{port}')}",
            "",
        ]
    )


def registry_command(config_path: Path) -> list[str]:
    """The command that serves a registry with this configuration (Debian's docker-registry)."""
    binary = shutil.which("docker-registry")
    if binary is None:
        raise ContainerToolError(f"docker-registry is not installed: {INSTALL_HINT}")
    return [binary, "serve", str(config_path)]


def _docker(*args: str, stdin: bytes | None = None, timeout_s: float = 300.0) -> str:
    docker = docker_binary()
    if docker is None:
        raise ContainerToolError(f"the docker CLI is not installed: {INSTALL_HINT}")
    done = subprocess.run([docker, *args], input=stdin, capture_output=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).decode("utf-8", "replace").strip()
        raise ContainerToolError(f"docker {args[0]} failed: {said}")
    return done.stdout.decode("utf-8", "replace").strip()


def tiny_rootfs_tar(files: Mapping[str, str] | None = None) -> bytes:
    """A root filesystem as a tarball: static busybox with its applets linked in /bin, /tmp,
    and `files` (absolute path -> text) on top."""
    if not os.access(BUSYBOX, os.X_OK):
        raise ContainerToolError(f"{BUSYBOX} is missing: {INSTALL_HINT}")
    listing = subprocess.run([BUSYBOX, "--list"], capture_output=True, check=True, text=True).stdout.split()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "rootfs"
        (root / "bin").mkdir(parents=True)
        for directory in ("tmp", "etc", "dev", "proc", "sys", "workspace"):
            (root / directory).mkdir()
        (root / "tmp").chmod(0o1777)
        shutil.copy2(BUSYBOX, root / "bin" / "busybox")
        for applet in listing:
            if applet != "busybox" and "/" not in applet:
                (root / "bin" / applet).symlink_to("busybox")
        for path, text in (files or {}).items():
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        archive = Path(scratch) / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(root, arcname=".")
        return archive.read_bytes()


def build_tiny_image(reference: str, files: Mapping[str, str] | None = None, *, workdir: str = "/workspace") -> str:
    """Builds `reference` from a tiny local root filesystem (`tiny_rootfs_tar`), pushes it to
    its registry, and returns the digest the registry gave it (`sha256:...`)."""
    _docker(
        "import",
        "--change",
        f"WORKDIR {workdir}",
        "--change",
        "ENV PATH=/bin",
        "-",
        reference,
        stdin=tiny_rootfs_tar(files),
    )
    _docker("push", reference)
    digests = json.loads(_docker("image", "inspect", "--format", "{{json .RepoDigests}}", reference) or "[]")
    repository = reference.rsplit("@", 1)[0]
    if ":" in repository.rsplit("/", 1)[-1]:
        repository = repository.rsplit(":", 1)[0]
    for entry in digests:
        if entry.startswith(repository + "@"):
            return str(entry.split("@", 1)[1])
    raise ContainerToolError(f"the registry gave {reference} no digest (RepoDigests: {digests})")


def remove_local_image(reference: str) -> None:
    """Forgets `reference` in the local engine, so the next use has to pull it from the registry."""
    docker = docker_binary()
    if docker is not None:
        subprocess.run([docker, "image", "rm", "--force", reference], capture_output=True, check=False)


def main() -> int:
    """`python -m tpujobs.local.containers`: Docker Engine answering before a test run, started
    (as root) and left running like any machine service, so no test worker stops it under
    another; a sentence and exit 1 where it cannot run."""
    try:
        started = start_dockerd(Path(".tpujobs") / "dockerd.log")
    except ContainerToolError as error:
        print(f"Docker Engine cannot run here: {error}")
        return 1
    if started is not None:
        print(f"started dockerd (pid {started.pid}), left running; its log is .tpujobs/dockerd.log")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A warm-pool unit's secret (`agent/unit_secret.py`): made by the pool agent before any job runs,
in a root-only file a job's user cannot read, registered before the unit's first key is asked for,
and proved with every key request; kept across restarts.

The pool agent runs from its unit's startup script against the stand-ins of agent_stubs.py, as in
test_pool_agent.py. Where the tests run as root, a job runs as a bare uid (TPUJOBS_JOB_USER=uid,
as test_agent_confinement.py does) and tries to read the secret for real.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_stubs import KEY_PATH, FakeMetadata, GoogleStub, a_job, chunk_prefix
from test_pool_agent import ASSIGNMENT, UnitHost, assign, kinds_of

from tpujobs.agent import confine
from tpujobs.agent.basics import AgentError
from tpujobs.agent.unit_secret import SECRET_BYTES, SECRET_DIR, SECRET_FILE, UnitSecret
from tpujobs.engine.startup_script import idle_assignment_text
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or not os.path.exists("/proc/self/stat"), reason="bash")


class RegistrationStub(GoogleStub):
    """GoogleStub whose key function answers `unit-register` with `register_status` (409: the VM
    registered another secret already)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_status = 200

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        if method == "POST" and path == KEY_PATH and json.loads(body).get("action") == "unit-register":
            with self.lock:
                self.key_requests.append(json.loads(body))
            if self.register_status != 200:
                return self.register_status, b'{"error": "Instance 1 registered another secret already."}'
            return 200, b'{"registered": "1"}'
        return super().answer(method, path, headers, body)


@pytest.fixture
def google() -> Iterator[RegistrationStub]:
    with RegistrationStub() as server:
        yield server


@pytest.fixture
def metadata(google: RegistrationStub) -> Iterator[FakeMetadata]:
    with FakeMetadata(**{ASSIGNMENT: idle_assignment_text(0)}) as server:
        server.key_server = google
        yield server


@pytest.fixture
def open_root() -> Iterator[Path]:
    """A directory every user may pass through (pytest's tmp_path is root's 0700): what the job
    cannot read is then refused by the secret's own modes, not by a parent's."""
    root = Path(tempfile.mkdtemp(prefix="tpujobs-unit-secret-", dir="/tmp"))
    os.chmod(root, 0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def host(open_root: Path, metadata: FakeMetadata, google: RegistrationStub) -> Iterator[UnitHost]:
    unit = UnitHost(open_root, metadata, google)
    try:
        yield unit
    finally:
        unit.stop()


def secret_path(host: UnitHost) -> Path:
    return host.workdir / SECRET_DIR / SECRET_FILE


def actions(google: GoogleStub) -> list[str]:
    with google.lock:
        return [request["action"] for request in google.key_requests]


# -- for real: the job's user cannot read it -----------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the job runs as another uid")
def test_a_pool_job_running_as_its_own_user_cannot_read_the_units_secret(
    host: UnitHost, metadata: FakeMetadata, google: RegistrationStub
) -> None:
    """The job (a fresh uid) reads the agent's 0644 zipapp beside the secret but neither the 0600
    secret nor its 0700 directory (root's); the agent registered the secret's SHA-256 before it asked
    for the job's key, and proved the secret itself with that request."""
    host.extra_env = {confine.JOB_USER_VARIABLE: "uid"}
    secret, pool = secret_path(host), host.workdir
    command = (
        'echo "uid=$(id -u)"; '
        f"cat {pool}/agent.pyz >/dev/null 2>&1 && echo control-read || echo control-refused; "
        f"cat {secret} >/dev/null 2>&1 && echo secret-read || echo secret-refused; "
        f"ls {secret.parent} >/dev/null 2>&1 && echo dir-listed || echo dir-refused"
    )
    job = a_job(job_id="probe-1", command=command)
    host.start()
    assign(metadata, 1, job)
    wait_for(lambda: "exited" in kinds_of(google, job))
    output = google.output(chunk_prefix(job_id="probe-1")).decode()
    assert int(re.search(r"uid=(\d+)", output).group(1)) >= confine.UID_BASE, output  # type: ignore[union-attr]
    assert "control-read" in output, output  # the job can reach the pool's directory
    assert "secret-refused" in output and "dir-refused" in output, output
    info, folder = secret.stat(), secret.parent.stat()
    assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o600, 0)
    assert (stat.S_IMODE(folder.st_mode), folder.st_uid) == (0o700, 0)
    value = secret.read_bytes()
    register, key = google.key_requests
    assert register["action"] == "unit-register" and register["secret_sha256"] == hashlib.sha256(value).hexdigest()
    assert key["action"] == "attempt-key" and key["unit_secret"] == value.hex()


# -- wherever the tests run -------------------------------------------------------------------------------


def test_the_agent_registers_once_per_start_and_proves_the_same_secret_after_a_restart(
    host: UnitHost, metadata: FakeMetadata, google: RegistrationStub
) -> None:
    """The first start makes the secret and registers it before the first key; the second job's key
    needs no new registration; a restarted agent reads the same secret, registers it again (the same
    hash: the control plane accepts it) and proves it."""
    first, second, third = (a_job(job_id=f"j{n}-1", command="true") for n in (1, 2, 3))
    host.start()
    assign(metadata, 1, first)
    wait_for(lambda: host.said("job j1-1 attempt 1: ended"))
    assign(metadata, 2, second)
    wait_for(lambda: host.said("job j2-1 attempt 1: ended"))
    value = secret_path(host).read_bytes()
    assert len(value) == SECRET_BYTES
    assert actions(google) == ["unit-register", "attempt-key", "attempt-key"]

    host.stop()
    host.start()
    assign(metadata, 3, third)
    wait_for(lambda: host.said("job j3-1 attempt 1: ended"))
    assert secret_path(host).read_bytes() == value
    assert actions(google) == ["unit-register", "attempt-key", "attempt-key", "unit-register", "attempt-key"]
    hashes = {r["secret_sha256"] for r in google.key_requests if r["action"] == "unit-register"}
    assert hashes == {hashlib.sha256(value).hexdigest()}
    assert {r["unit_secret"] for r in google.key_requests if r["action"] == "attempt-key"} == {value.hex()}


def test_a_unit_whose_secret_the_control_plane_refuses_asks_for_no_key_and_runs_no_job(
    host: UnitHost, metadata: FakeMetadata, google: RegistrationStub
) -> None:
    """409 (another secret is registered for this VM): the job is not started and no key is asked for."""
    google.register_status = 409
    job = a_job(job_id="refused-1", command="echo ran")
    host.start()
    assign(metadata, 1, job)
    wait_for(lambda: host.said("job refused-1 attempt 1 not started"))
    assert "keeps another secret for this VM" in host.stderr()
    assert actions(google) == ["unit-register"]
    assert kinds_of(google, job) == []


# -- the file -------------------------------------------------------------------------------------------


def test_the_secret_is_made_once_private_and_read_again(tmp_path: Path) -> None:
    """32 random bytes in a 0600 file in a 0700 directory; a second start reads the same bytes, and
    loose modes (set by hand) are tightened."""
    made = UnitSecret.kept_in(str(tmp_path))
    path = tmp_path / SECRET_DIR / SECRET_FILE
    assert made.path == str(path) and path.read_bytes() == made.value and len(made.value) == SECRET_BYTES
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    os.chmod(path, 0o644)
    os.chmod(path.parent, 0o755)
    again = UnitSecret.kept_in(str(tmp_path))
    assert again.value == made.value and again.sha256() == hashlib.sha256(made.value).hexdigest()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    (tmp_path / "other").mkdir()
    assert UnitSecret.kept_in(str(tmp_path / "other")).value != made.value  # another VM's


def test_a_secret_of_the_wrong_size_or_behind_a_link_is_not_used(tmp_path: Path) -> None:
    """A cut file is refused (its hash was never registered); a link in place of the directory or the
    file is refused too (another user may own what it points at)."""
    cut = tmp_path / "cut"
    (cut / SECRET_DIR).mkdir(parents=True, mode=0o700)
    (cut / SECRET_DIR / SECRET_FILE).write_bytes(b"x" * 5)
    with pytest.raises(AgentError, match="is not 32 bytes"):
        UnitSecret.kept_in(str(cut))
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / SECRET_DIR).symlink_to(tmp_path)
    with pytest.raises(AgentError, match="not a directory of the agent's own user"):
        UnitSecret.kept_in(str(linked))
    file_link = tmp_path / "file-link"
    (file_link / SECRET_DIR).mkdir(parents=True, mode=0o700)
    (file_link / SECRET_DIR / SECRET_FILE).symlink_to(cut / SECRET_DIR / SECRET_FILE)
    with pytest.raises(AgentError, match="cannot be read"):
        UnitSecret.kept_in(str(file_link))

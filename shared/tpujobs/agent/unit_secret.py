"""A warm-pool unit's secret: 32 random bytes that only root on the unit's VM holds, so that its
jobs' keys go to the pool agent alone.

Any local process can read the unit's next assignment and mint the VM's identity token (the
metadata server answers every user), which is all a key request used to need: a process a job
left behind could ask for the next job's key in the few milliseconds before the pool agent kills
it. So at its first start on the VM, before any job runs, the pool agent makes the secret in
`unit-secret/secret` under its state directory (a 0700 directory and a 0600 file, the agent's
user's: root on a VM; a job's user cannot read them), keeps it across reboots, and registers its
SHA-256 with the key function (`unit-register`) before its first job's key is asked for. The
control plane keeps the first registration per VM and refuses any other; every pool job's key
request carries the secret (`attempt_key.fetch_attempt_key`). See
`tpujobs.engine.jobs_api.unit_secrets`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from dataclasses import dataclass, field

from .attempt_key import KeyFunctionRefused, ask_key_function
from .basics import AgentError, log
from .rest import Metadata

SECRET_DIR = "unit-secret"  # under the pool agent's state directory (/var/lib/tpujobs/pool)
SECRET_FILE = "secret"
SECRET_BYTES = 32
REGISTER_ACTION = "unit-register"


@dataclass
class UnitSecret:
    """The unit VM's secret, where it is kept, and whether this start registered it."""

    value: bytes = field(repr=False)
    path: str
    registered: bool = False

    @classmethod
    def kept_in(cls, state_dir: str) -> UnitSecret:
        """The secret in `state_dir`/unit-secret/secret: made now at the VM's first start, read
        again at a later one. AgentError when what is there cannot be trusted or used."""
        directory = os.path.join(state_dir, SECRET_DIR)
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
        _private_directory(directory)
        path = os.path.join(directory, SECRET_FILE)
        value = _read(path)
        if value is None:
            value = _write(path)
            log(f"the unit's secret is made in {path}")
        return cls(value, path)

    def sha256(self) -> str:
        """What the control plane keeps of the secret: its SHA-256, lower-case hex."""
        return hashlib.sha256(self.value).hexdigest()

    def register(self, metadata: Metadata, key_url: str) -> None:
        """The secret's hash registered for this VM (again after a reboot: the same hash is
        accepted), once per start. AgentError when the control plane keeps another (a VM whose
        secret was lost gets no key any more: the unit must be made again) or refuses."""
        if self.registered:
            return
        try:
            ask_key_function(metadata, key_url, REGISTER_ACTION, {"secret_sha256": self.sha256()})
        except KeyFunctionRefused as error:
            if error.status == 409:
                raise AgentError(
                    f"the control plane keeps another secret for this VM than {self.path}'s: "
                    "no job's key can be fetched on this unit"
                ) from None
            raise AgentError(f"the control plane refused the unit's secret: {error}") from None
        self.registered = True
        log("the unit's secret is registered with the control plane")


def _private_directory(path: str) -> None:
    """`path` is a directory of this process's user, not a link, and 0700 from now on."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise AgentError(f"{path} is not a directory of the agent's own user: the unit's secret is not kept there")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)


def _read(path: str) -> bytes | None:
    """The secret kept at `path`; None when there is none yet."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise AgentError(f"the unit's secret in {path} cannot be read: {error.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise AgentError(f"{path} is not a file of the agent's own user: the unit's secret is not used")
        if stat.S_IMODE(info.st_mode) != 0o600:
            os.fchmod(file.fileno(), 0o600)
        value = file.read(SECRET_BYTES + 1)
    if len(value) != SECRET_BYTES:
        raise AgentError(f"the unit's secret in {path} is not {SECRET_BYTES} bytes: no job's key can be fetched")
    return value


def _write(path: str) -> bytes:
    """A new secret at `path`, whole or not at all (written beside it, synced, renamed over it)."""
    value = secrets.token_bytes(SECRET_BYTES)
    new = f"{path}.new"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(new)
    fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(value)
        file.flush()
        os.fsync(file.fileno())
    os.replace(new, path)
    directory = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return value

"""The highest assignment `seq` a pool agent acted on, kept on its boot disk.

A write by someone else (gcloud's `ssh-keys`, a read-modify-write of the whole metadata map) can
bring back an older `tpujobs-assignment`. In one boot the agent ignores a seq below the highest it
saw; this file carries that seq across reboots, so an older assignment never runs after one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

from .basics import log


class HighestSeq:
    """One integer in a file beside the pool's work directory; -1 when none was kept."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def beside(cls, workdir: str, slice_id: int, worker_id: int) -> HighestSeq:
        name = f".tpujobs-assignment-seq-slice{int(slice_id)}-worker{int(worker_id)}"
        return cls(os.path.join(os.path.dirname(os.path.abspath(workdir)), name))

    def read(self) -> int:
        """The kept seq; -1 when there is none or it cannot be read (then nothing is refused)."""
        try:
            with open(self.path, encoding="ascii") as handle:
                text = handle.read().strip()
        except OSError:
            return -1
        return int(text) if text.isdigit() else -1

    def keep(self, seq: int) -> None:
        """Replace the kept seq atomically, on disk before a reset; a failure is only logged."""
        directory = os.path.dirname(self.path)
        try:
            os.makedirs(directory, exist_ok=True)
            fd, temporary = tempfile.mkstemp(prefix=".tpujobs-seq-", dir=directory)
            with os.fdopen(fd, "w", encoding="ascii") as handle:
                handle.write(f"{int(seq)}\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.path)
        except OSError as error:
            log(f"could not keep assignment seq {seq} in {self.path}: {error}")
            return
        with contextlib.suppress(OSError):
            directory_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(directory_fd)
            finally:
                os.close(directory_fd)

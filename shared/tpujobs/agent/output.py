"""The job's output: read from the command's pipe, shipped to Cloud Storage in numbered
chunks (and echoed), with `TPUJOBS_CHECKPOINT step=N` lines spotted on the way.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from .basics import AgentError, log
from .cloud_logging import CloudLogSink
from .rest import Storage
from .wire import MAX_DETAIL_CHARS

MAX_CHUNK_BYTES = 256 * 1024
MAX_PENDING_BYTES = 64 * 1024 * 1024  # output kept while uploads fail; older output is dropped
MAX_LINE_BYTES = 64 * 1024  # longer lines are not scanned for checkpoint markers
TAIL_BYTES = 4096  # of the output kept to read docker's own last words
UPLOAD_SECONDS = 60.0  # one upload's timeout, unhurried
HURRIED_CHUNK_SECONDS = 0.5  # after a preemption notice: at most this much output is lost with the VM
MIRROR_CLOSE_SECONDS = 10.0  # for Cloud Logging's last batches at the end
CHECKPOINT_LINE = re.compile(rb"^[ \t]*TPUJOBS_CHECKPOINT[ \t]+step=([0-9]+)(.*)$")


def parse_checkpoint(line: bytes) -> tuple[int, str] | None:
    """(step, detail) of a `TPUJOBS_CHECKPOINT step=N ...` line, else None."""
    match = CHECKPOINT_LINE.match(line.rstrip(b"\r\n"))
    if match is None:
        return None
    detail = match.group(2).decode("utf-8", "replace").strip()[:MAX_DETAIL_CHARS]
    return int(match.group(1)), detail


class LogShipper:
    """Output to numbered chunk objects: every chunk_seconds or 256 KiB, and once more at the end;
    hurried (`hurry`) when the VM is about to go."""

    def __init__(
        self,
        storage: Storage,
        bucket: str,
        prefix: str,
        chunk_seconds: float,
        echo: Any = None,
        attempts: int = 6,
        max_pending: int = MAX_PENDING_BYTES,
        mirror: CloudLogSink | None = None,
    ) -> None:
        self.storage = storage
        self.mirror = mirror  # Cloud Logging, when the job's output goes there too: the same (masked) bytes
        self.max_pending = max_pending
        self.attempts = attempts  # per upload; a chunk that still fails is tried again next tick
        self.bucket = bucket
        self.prefix = prefix  # ends with "/": objects are prefix + 000000.log, ...
        self.chunk_seconds = chunk_seconds
        self.echo = echo
        self.chunks = 0
        self.dropped = 0
        self._pending = bytearray()
        self._offset = 0  # how many bytes of output came before _pending[0]
        self._cond = threading.Condition()
        self._closing = False
        self._deadline: float | None = None  # hurried: nothing is uploaded after this (time.monotonic())
        self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)
        self._thread.start()

    def write(self, data: bytes) -> None:
        if self.mirror is not None:  # never blocks: a bounded queue
            self.mirror.write(data)
        if self.echo is not None:
            try:
                self.echo.write(data)
                self.echo.flush()
            except (OSError, ValueError):
                pass
        with self._cond:
            self._pending.extend(data)
            excess = len(self._pending) - self.max_pending
            if excess > 0:
                del self._pending[:excess]
                self._offset += excess
                self.dropped += excess
            if len(self._pending) >= MAX_CHUNK_BYTES:
                self._cond.notify()

    def hurry(self, deadline: float) -> None:
        """The VM goes soon (a preemption notice): ship every HURRIED_CHUNK_SECONDS from now on,
        each upload tried once per round, none after `deadline` (time.monotonic()), so the final
        flush ends in time and never holds up the agent's end."""
        with self._cond:
            self._deadline = deadline if self._deadline is None else min(self._deadline, deadline)
            self._cond.notify()

    def _interval(self) -> float:
        return self.chunk_seconds if self._deadline is None else min(self.chunk_seconds, HURRIED_CHUNK_SECONDS)

    def _run(self) -> None:
        while True:
            with self._cond:
                began = time.monotonic()
                while not self._closing and len(self._pending) < MAX_CHUNK_BYTES:
                    remaining = began + self._interval() - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                closing = self._closing
            self._ship()
            if closing:
                return

    def _ship(self) -> bool:
        """Uploads what is pending; False when an upload failed (the data stays pending)."""
        while True:
            with self._cond:
                start = self._offset
                piece = bytes(self._pending[:MAX_CHUNK_BYTES])
            if not piece:
                return True
            name = f"{self.prefix}{self.chunks:06d}.log"
            attempts, timeout = self.attempts, UPLOAD_SECONDS
            if self._deadline is not None:  # hurried: one try, within what is left
                attempts, timeout = 1, min(timeout, self._deadline - time.monotonic())
                if timeout <= 0:
                    log(f"no time left to upload output chunk {name} before the VM goes")
                    return False
            try:
                self.storage.upload(self.bucket, name, piece, "text/plain; charset=utf-8", attempts, timeout)
            except Exception as error:  # keep the data; the next tick tries again
                log(f"could not upload output chunk {name}: {error}")
                return False
            with self._cond:
                shipped = start + len(piece) - self._offset  # less if some was dropped meanwhile
                if shipped > 0:
                    del self._pending[:shipped]
                    self._offset += shipped
            self.chunks += 1

    def close(self, exit_code: int | None, timeout: float = 60.0) -> None:
        """The final flush (hurried: by the deadline); with an exit code (a clean end), also the
        complete.json marker."""
        with self._cond:
            self._closing = True
            self._cond.notify()
            if self._deadline is not None:
                timeout = max(0.0, min(timeout, self._deadline - time.monotonic()))
        self._thread.join(timeout)
        if self.mirror is not None:  # after the export, within what a hurried end leaves
            left = MIRROR_CLOSE_SECONDS if self._deadline is None else self._deadline - time.monotonic()
            self.mirror.close(max(0.0, min(MIRROR_CLOSE_SECONDS, left)))
        if self._thread.is_alive() or not self._ship():
            log("output not fully uploaded; no completion marker written")
            return
        if self.dropped:
            log(f"{self.dropped} bytes of output were dropped while uploads failed")
        if exit_code is not None:
            marker = json.dumps({"exit_code": exit_code, "chunks": self.chunks}).encode("utf-8")
            # Not application/json: the storage emulator would take the body for object metadata.
            try:
                self.storage.upload(self.bucket, self.prefix + "complete.json", marker, "text/plain; charset=utf-8")
            except (AgentError, OSError, http.client.HTTPException) as error:
                log(f"could not write the completion marker: {error}")


class OutputPump(threading.Thread):
    """Reads a child's merged stdout and stderr into the shipper; spots checkpoint lines."""

    def __init__(
        self,
        fd: int,
        shipper: LogShipper,
        on_checkpoint: Callable[[int, str], None],
        on_line: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name="output-pump", daemon=True)
        self.fd = fd
        self.shipper = shipper
        self.on_checkpoint = on_checkpoint
        self.on_line = on_line  # told once per read that ends at least one line (progress)
        self.tail = b""  # the output's last bytes: where docker says why it could not run a container

    def run(self) -> None:
        partial = b""
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                break
            if not data:
                break
            self.shipper.write(data)
            self.tail = (self.tail + data)[-TAIL_BYTES:]
            lines = (partial + data).split(b"\n")
            partial = lines.pop()
            if len(partial) > MAX_LINE_BYTES:
                partial = partial[:MAX_LINE_BYTES]
            if lines and self.on_line is not None:
                self.on_line()
            for line in lines:
                self._scan(line)
        if partial:
            self._scan(partial)
        flush = getattr(self.shipper, "flush", None)  # a Tee holds back what may start a secret
        if flush is not None:
            flush()
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def _scan(self, line: bytes) -> None:
        found = parse_checkpoint(line)
        if found is not None:
            self.on_checkpoint(*found)

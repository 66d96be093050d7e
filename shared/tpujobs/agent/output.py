"""The job's output: read from the command's stdout and stderr pipes (`OutputPump`), secrets cut
out per stream and the two merged line by line (`Tee`), shipped to Cloud Storage in numbered
chunks (and echoed), with `TPUJOBS_CHECKPOINT step=N` lines spotted on the way.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import selectors
import threading
import time
from collections.abc import Callable
from typing import Any

from .basics import AgentError, log
from .cloud_logging import CloudLogSink
from .last_output import LastOutput
from .masking import SecretMask
from .progress import CHECKPOINT_LINE as CHECKPOINT_LINE  # the protocol's; importable from here as before
from .progress import parse_checkpoint
from .rest import Storage

MAX_CHUNK_BYTES = 256 * 1024
MAX_PENDING_BYTES = 64 * 1024 * 1024  # output kept while uploads fail; older output is dropped
MAX_LINE_BYTES = 64 * 1024  # longer lines are not scanned for checkpoint markers
TAIL_BYTES = 4096  # of the output kept to read docker's own last words
UPLOAD_SECONDS = 60.0  # one upload's timeout, unhurried
HURRIED_CHUNK_SECONDS = 0.5  # after a preemption notice: at most this much output is lost with the VM
MIRROR_CLOSE_SECONDS = 10.0  # for Cloud Logging's last batches at the end
HOLD_SECONDS = 0.5  # an unfinished line waits this long for its end before it ships as it is


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
        self._open = ""  # the stream whose line the export left unfinished
        self._offset = 0  # how many bytes of output came before _pending[0]
        self._cond = threading.Condition()
        self._closing = False
        self._deadline: float | None = None  # hurried: nothing is uploaded after this (time.monotonic())
        self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)
        self._thread.start()

    def write(self, data: bytes, stream: str = "agent") -> bytes:
        """Output of `stream`: "stdout" or "stderr" from the pump, the agent's own lines by default.
        A line one stream left unfinished is ended in the export before another stream's bytes
        (Cloud Logging keeps each stream's lines apart itself): returns the newline put first, or b""."""
        if not data:
            return b""
        if self.mirror is not None:  # never blocks: a bounded queue
            self.mirror.write(data, stream)
        with self._cond:
            ended = b"\n" if self._open not in ("", stream) else b""
            self._open = "" if data.endswith(b"\n") else stream
            data = ended + data
            self._pending.extend(data)
            excess = len(self._pending) - self.max_pending
            if excess > 0:
                del self._pending[:excess]
                self._offset += excess
                self.dropped += excess
            if len(self._pending) >= MAX_CHUNK_BYTES:
                self._cond.notify()
        if self.echo is not None:
            try:
                self.echo.write(data)
                self.echo.flush()
            except (OSError, ValueError):
                pass
        return ended

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


class Tee:
    """What an output pump writes each stream's bytes to: the shipper, and the last output kept
    for `exited`, both after the stream's own `SecretMask` has cut the job's secret values out,
    so none leaves the VM in any form. A stream's unfinished line is held until it ends, grows to
    MAX_LINE_BYTES or is `release`d, so the other stream's lines land before it, never inside it."""

    def __init__(self, shipper: LogShipper, last: LastOutput, secrets: dict[str, str] | None = None) -> None:
        self.shipper = shipper
        self.last = last
        self.secrets = secrets or {}
        self.masks: dict[str, SecretMask] = {}
        self.held: dict[str, bytes] = {}
        self.held_since: dict[str, float] = {}  # when each held line began (time.monotonic())

    def write(self, data: bytes, stream: str = "stdout") -> None:
        if stream not in self.masks:
            self.masks[stream] = SecretMask(self.secrets)
        held = self.held.pop(stream, b"") + self.masks[stream].feed(data)
        cut = len(held) if len(held) >= MAX_LINE_BYTES else held.rfind(b"\n") + 1
        if cut:
            self.held_since.pop(stream, None)
            self._out(held[:cut], stream)
        if held[cut:]:
            self.held[stream] = held[cut:]
            self.held_since.setdefault(stream, time.monotonic())

    def release(self, began_by: float = math.inf) -> None:
        """Held lines that began by `began_by` go out unfinished; the rest of each follows later."""
        for stream, since in list(self.held_since.items()):
            if since <= began_by:
                del self.held_since[stream]
                self._out(self.held.pop(stream, b""), stream)

    def flush(self, stream: str = "stdout") -> None:
        """The stream ended: what its mask and the Tee held back goes out too."""
        mask = self.masks.get(stream)
        self.held_since.pop(stream, None)
        self._out(self.held.pop(stream, b"") + (mask.flush() if mask else b""), stream)

    def _out(self, data: bytes, stream: str) -> None:
        if data:
            self.last.write((self.shipper.write(data, stream) or b"") + data)


class OutputPump(threading.Thread):
    """Reads a child's stdout and stderr (a pipe each, `fds` by stream) in one thread, in the order
    they arrive, as `subprocess.communicate` does, into the Tee stream by stream; spots checkpoint
    lines in each, and lets an unfinished line the Tee holds go after `hold_seconds`."""

    def __init__(
        self,
        fds: dict[str, int],
        tee: Tee,
        on_checkpoint: Callable[[int, str], None],
        on_line: Callable[[], None] | None = None,
        hold_seconds: float = HOLD_SECONDS,
    ) -> None:
        super().__init__(name="output-pump", daemon=True)
        self.fds = fds
        self.tee = tee
        self.on_checkpoint = on_checkpoint
        self.on_line = on_line  # told once per read that ends at least one line (progress)
        self.hold_seconds = hold_seconds
        self.tail = b""  # the output's last bytes: where docker says why it could not run a container
        self._partial: dict[str, bytes] = {}  # each stream's unfinished line, for the checkpoint scan

    def run(self) -> None:
        with selectors.DefaultSelector() as selector:
            for stream, fd in self.fds.items():
                selector.register(fd, selectors.EVENT_READ, stream)
            while selector.get_map():
                held = min(self.tee.held_since.values(), default=None)
                wait = None if held is None else max(0.0, held + self.hold_seconds - time.monotonic())
                for key, _ in selector.select(wait):
                    if not self._read(key.fd, key.data):
                        selector.unregister(key.fd)
                        with contextlib.suppress(OSError):
                            os.close(key.fd)
                self.tee.release(time.monotonic() - self.hold_seconds)

    def _read(self, fd: int, stream: str) -> bool:
        """One read of `stream`; False when it ended (what it held back goes out then)."""
        try:
            data = os.read(fd, 65536)
        except OSError:
            data = b""
        if not data:
            self._scan(self._partial.pop(stream, b""))
            self.tee.flush(stream)
            return False
        self.tee.write(data, stream)
        self.tail = (self.tail + data)[-TAIL_BYTES:]
        lines = (self._partial.pop(stream, b"") + data).split(b"\n")
        self._partial[stream] = lines.pop()[:MAX_LINE_BYTES]
        if lines and self.on_line is not None:
            self.on_line()
        for line in lines:
            self._scan(line)
        return True

    def _scan(self, line: bytes) -> None:
        found = parse_checkpoint(line)
        if found is not None:
            self.on_checkpoint(*found)

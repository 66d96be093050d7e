"""Worker events and the preemption notice, published in order from one thread each, signed."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from secrets import token_hex
from typing import Any

from .basics import log, rfc3339
from .rest import Publisher


class Reporter:
    """Worker events, published in order from one thread so a slow publish never stalls the job.

    Checkpoints coalesce: while one waits to be published, a newer one replaces it (the latest
    step is what counts), so a command printing TPUJOBS_CHECKPOINT lines in a loop queues one
    report, not one per line, and cannot flood the topic or the agent's memory.
    """

    _CHECKPOINT_SLOT = object()  # in the queue: publish the latest pending checkpoint here

    def __init__(self, publisher: Publisher, topic: str, identity: dict[str, Any]) -> None:
        self.publisher = publisher
        self.topic = topic
        self.identity = identity  # job_id, attempt, slice_id, worker_id
        self._queue: queue.Queue[Any] = queue.Queue()
        self._slot_lock = threading.Lock()
        self._pending_checkpoint: dict[str, Any] | None = None
        self._silenced = threading.Event()
        self._muted = threading.Event()  # nothing at all, not even checkpoints (a withdrawn job)
        self._thread = threading.Thread(target=self._run, name="reporter", daemon=True)
        self._thread.start()

    def message(self, kind: str, **extra: Any) -> dict[str, Any]:
        """A report's payload: its kind, who says it, when, and a fresh nonce (no two alike)."""
        payload = {"kind": kind, **self.identity, "at": rfc3339(), "nonce": token_hex(16)}
        payload.update(extra)
        return payload

    # Still published after the preemption notice: a checkpoint saved on SIGTERM keeps work.
    # after a preemption notice: a save's checkpoint, and `stopped` (the command ended, the save done)
    AFTER_SILENCE = frozenset({"checkpoint", "stopped"})

    def report(self, kind: str, **extra: Any) -> None:
        if self._quiet(kind):
            return
        payload = self.message(kind, **extra)
        if kind != "checkpoint":
            self._queue.put(payload)
            return
        with self._slot_lock:
            waiting = self._pending_checkpoint is not None
            self._pending_checkpoint = payload
        if not waiting:
            self._queue.put(self._CHECKPOINT_SLOT)

    def silence(self, everything: bool = False) -> None:
        """Nothing more is published but checkpoints (with `everything`, not even those), not even
        what is queued."""
        if everything:
            self._muted.set()
        self._silenced.set()

    def _quiet(self, kind: str) -> bool:
        return self._muted.is_set() or (self._silenced.is_set() and kind not in self.AFTER_SILENCE)

    def close(self, timeout: float = 30.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            payload = self._queue.get()
            if payload is None:
                return
            if payload is self._CHECKPOINT_SLOT:
                with self._slot_lock:
                    payload, self._pending_checkpoint = self._pending_checkpoint, None
            if self._quiet(payload["kind"]):
                continue
            attributes = {
                "job_id": str(payload["job_id"]),
                "attempt": str(payload["attempt"]),
                "kind": str(payload["kind"]),
            }
            try:
                self.publisher.publish(self.topic, payload, attributes)
            except Exception as error:  # this thread must outlive any one report
                log(f"could not report {payload['kind']}: {error}")


class Preemption:
    """The one preemption notice of this agent: published first, before anything else happens."""

    def __init__(
        self,
        publisher: Publisher,
        topic: str,
        identity: dict[str, Any],
        on_notice: Callable[[str], None],
    ) -> None:
        self.publisher = publisher
        self.topic = topic
        self.identity = identity
        self.on_notice = on_notice
        self.noticed = threading.Event()
        self.noticed_at: float | None = None  # time.monotonic() at the notice: the VM's window starts
        self._lock = threading.Lock()
        self._retry: threading.Thread | None = None
        self._stood_down = False  # the job was withdrawn: no notice is ever sent for it
        self.told = True  # the notice was published (a preemption); False: tpujobs asked for the stop

    def trigger(self, reason: str, tell: bool = True) -> None:
        """Stop the command for a preemption (published first), or, with `tell` False, because
        tpujobs asked (a reclaim: the control plane knows, and no VM is about to be switched off)."""
        with self._lock:
            if self.noticed.is_set() or self._stood_down:
                return
            self.noticed_at = time.monotonic()
            self.told = tell
            self.noticed.set()
        if not tell:
            self.on_notice(reason)
            return
        payload = {**self.identity, "reason": reason, "at": rfc3339(), "nonce": token_hex(16)}
        attributes = {"job_id": str(payload["job_id"]), "attempt": str(payload["attempt"])}
        try:
            self.publisher.publish(self.topic, payload, attributes, attempts=1, timeout=3.0)
        except Exception as error:  # whatever happened, the command must still be stopped
            log(f"preemption notice failed once ({error}); retrying while the command stops")
            self._retry = threading.Thread(target=self._publish_again, args=(payload, attributes), daemon=True)
            self._retry.start()
        self.on_notice(reason)

    def stand_down(self) -> bool:
        """No notice from now on; False when one was already triggered (that stop stands)."""
        with self._lock:
            if self.noticed.is_set():
                return False
            self._stood_down = True
            return True

    def _publish_again(self, payload: dict[str, Any], attributes: dict[str, str]) -> None:
        try:
            self.publisher.publish(self.topic, payload, attributes, attempts=5)
        except Exception as error:  # a thread of its own: log, never raise
            log(f"could not publish the preemption notice: {error}")

    def wait(self, timeout: float) -> None:
        if self._retry is not None:
            self._retry.join(timeout)

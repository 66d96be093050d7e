"""An attempt's liveness: heartbeats, checkpoints and, on a multi-host slice, its peers' word.

`Liveness` is the part of `Agent` that tells the service the host is alive and moving: each
heartbeat says when the next comes, worker 0 speaks for the peers it hears, and checkpoint
lines become reports. It owns the slice link and its own lock; the command runner tells it
when the command started, printed or saved a checkpoint.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .basics import rfc3339
from .reports import Reporter
from .rest import Metadata
from .slice_link import SliceLink, heartbeat_period


class Liveness:
    """Heartbeats and progress of one attempt on one host. `stops` are the events after which
    the host's own word may be its last (a preemption notice, a withdrawal)."""

    def __init__(
        self,
        config: dict[str, Any],
        identity: dict[str, Any],
        reporter: Reporter,
        note: Callable[[str], None],
        stops: tuple[threading.Event, threading.Event],
        key: bytes,
        metadata: Metadata,
    ) -> None:
        self.config = config
        self.slice_id = int(identity["slice_id"])
        self.reporter = reporter
        self.note = note
        self.noticed, self.withdrawn = stops
        self._lock = threading.Lock()
        self._started = False
        self.started_at: str | None = None  # when the first of setup or command started (RFC 3339)
        self._period = heartbeat_period(0.0, config)  # seconds to the next heartbeat, as the last one said
        self._last_output_at: float | None = None  # when the command last printed a line
        self._checkpoint_at: tuple[int, float] | None = None  # this host's last checkpoint (step, epoch s)
        self._checkpoint_told = -1  # worker 0: the highest checkpoint step it published
        self._watched_said = False  # a peer told the service that worker 0 speaks for it
        self.stop_beating = threading.Event()  # heartbeats end (worker 0 may outlive its command)
        self.link: SliceLink | None = None  # a host of a multi-host slice: its slice's network
        if int(config["hosts_per_slice"]) > 1:
            self.link = SliceLink(
                key, identity, config, metadata, self._progress, self._peer_silent,
                self._watched, self._peer_checkpoint,
            )  # fmt: skip

    def join_slice(self) -> None:
        """Before the command: worker 0 may speak for it from its `started`."""
        if self.link is not None:
            self.link.start()

    def command_started(self, started: dict[str, Any]) -> None:
        """The first of setup or command started: `started` (with `started`'s extra fields) goes
        out, and the heartbeats begin. Later starts change nothing."""
        with self._lock:  # against `_watched`: the service hears `watch` once, in order
            if self._started:
                return
            self._started = True
            self.started_at = rfc3339()
            self.reporter.report("started", **started, **self._liveness(heartbeat_period(0.0, self.config)))
        threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True).start()

    def _heartbeats(self) -> None:
        """Alive, and when the command last printed a line and saved a checkpoint: progress for
        `hang_timeout`, one field per heartbeat rather than a message per line. Each says when
        the next comes (`heartbeat_period`); worker 0 of a multi-host slice adds its peers'
        progress, and a peer worker 0 speaks for says nothing."""
        began = time.monotonic()
        while not self.stop_beating.wait(self._period):
            if self._spoken_for():
                continue
            self._period = every = heartbeat_period(time.monotonic() - began, self.config)
            self.reporter.report("heartbeat", **self._liveness(every), **self._slice_progress())

    def _spoken_for(self) -> bool:
        """A peer whose beats worker 0 acknowledged: worker 0's heartbeats carry its liveness."""
        return self.link is not None and self.link.worker_id != 0 and self.link.peer.watched

    def _liveness(self, period: float) -> dict[str, Any]:
        """What a report that marks this host live adds: `watch: slice` when worker 0 speaks
        for it (the service then never finds it silent itself), else when it reports next."""
        if self._spoken_for():
            self._watched_said = True
            return {"watch": "slice"}
        return {"next_report_seconds": period}

    def _watched(self) -> None:
        """A peer's first ack from worker 0: once the service heard `started`, tell it now (the
        report says worker 0 watches it); before, `started` itself says so."""
        with self._lock:
            if not self._started or self._watched_said:
                return
            self._watched_said = True
            self.reporter.report("heartbeat", watch="slice", **self._slice_progress())

    def _progress(self) -> dict[str, Any]:
        """This host's progress for its beats to worker 0 (epoch seconds)."""
        found: dict[str, Any] = {"last_output_at": self._last_output_at}
        if self._checkpoint_at is not None:
            found["checkpoint_step"], found["checkpoint_at"] = self._checkpoint_at
        return found

    def _slice_progress(self) -> dict[str, Any]:
        """A heartbeat's progress: this host's, and on worker 0 the latest of its slice's."""
        seen = self._last_output_at
        step = self._checkpoint_at
        found: dict[str, Any] = {}
        if self.link is not None and self.link.worker_id == 0:
            peers = self.link.watch.progress()
            found["peers_heard"] = peers["peers_heard"]
            if "peers_silent" in peers:
                found["peers_silent"] = peers["peers_silent"]
            if "last_output_at" in peers:
                seen = max(seen or 0.0, peers["last_output_at"])
            if "checkpoint_step" in peers and (step is None or peers["checkpoint_step"] > step[0]):
                step = (peers["checkpoint_step"], peers["checkpoint_at"])
        if seen is not None:
            found["last_output_at"] = rfc3339(seen)
        if step is not None:
            found["step"] = step[0]
            if step[1]:
                found["checkpoint_at"] = rfc3339(step[1])
        return found

    def _peer_silent(self, worker: int, quiet: float) -> None:
        """Worker 0: a peer it heard went quiet. Said at once, in a report of its own."""
        where = f"{self.slice_id}-{worker}"
        self.note(f"worker {where} sent nothing over the slice network for {quiet:.0f} s: reporting it silent")
        detail = f"worker {self.slice_id}-0 heard nothing from it over the slice network for {quiet:.0f} s"
        self.reporter.report("peer_silent", peer_worker_id=worker, detail=detail)

    def _peer_checkpoint(self, worker: int, step: int) -> None:
        """Worker 0: a peer's checkpoint newer than any it published goes out as its slice's
        (coalesced by the reporter), so the job's usage learns it without the peer's report."""
        with self._lock:
            if step <= self._checkpoint_told:
                return
            self._checkpoint_told = step
        self.reporter.report("checkpoint", step=step, detail=f"saved by worker {self.slice_id}-{worker}")

    def output_seen(self) -> None:
        self._last_output_at = time.time()

    def checkpoint(self, step: int, detail: str) -> None:
        """A checkpoint line: reported, except by a peer worker 0 speaks for (its beats carry the
        step to worker 0, which reports the slice's newest) until a preemption notice, when
        the host's own report may be the last word."""
        self._checkpoint_at = (step, time.time())
        if self._spoken_for() and not self.noticed.is_set():
            return
        with self._lock:
            self._checkpoint_told = max(self._checkpoint_told, step)
        self.reporter.report("checkpoint", step=step, detail=detail)

    def still_speaking(self, code: int, limited: bool) -> dict[str, Any]:
        """What worker 0's `exited` 0 adds while it still hears peers: how many, and when it
        reports next, so the service keeps its record live and watched (`leave_slice` keeps
        the heartbeats going) and a worker 0 that dies then is found like any silent host.
        Nothing after a time limit (`limited`) stopped the command."""
        link = self.link
        if code != 0 or limited or link is None or link.worker_id != 0:
            return {}
        peers = link.watch.watching()
        return {"peers_heard": peers, "next_report_seconds": self._period} if peers else {}

    def leave_slice(self, speaks: bool) -> None:
        """The heartbeats end, and the slice link: a peer says bye; worker 0 whose command
        succeeded first goes on speaking for the peers it still hears, until each said bye or
        was reported silent (a stop ends that wait), so a peer that hangs after worker 0's end
        is still found at once."""
        link = self.link
        if link is not None and link.worker_id != 0:
            link.bye()
        elif link is not None and speaks and link.watch.watching():
            self.note(f"the command ended; worker 0 speaks for {link.watch.watching()} peers until they end")
            while link.watch.watching() and not (self.noticed.is_set() or self.withdrawn.is_set()):
                time.sleep(0.5)
        if link is not None:
            link.close()
        self.stop_beating.set()

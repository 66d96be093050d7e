"""Why an attempt's command stops before its end, and how: a preemption notice (or a stop tpujobs
asked for), a withdrawal (pool mode) or the job's time limit. Each is decided once, under this
part's lock, against the attempt's end: an end already reported stands.

`Stops` is the part of `Agent` that decides; the command runner sends the signals.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .basics import log, rfc3339
from .commands import CommandRunner
from .config import attempt_deadline
from .output import LogShipper
from .reports import Preemption, Reporter

# The last upload ends this long before a preempted VM is switched off (at most half of what the
# window leaves after the SIGKILL).
FLUSH_MARGIN_SECONDS = 2.0


class Stops:
    """The attempt's stops and its end: once `finish` is called, no stop changes anything."""

    def __init__(
        self,
        config: dict[str, Any],
        preemption: Preemption,
        withdrawn: threading.Event,
        runner: CommandRunner,
        reporter: Reporter,
        shipper: LogShipper,
        note: Callable[[str], None],
    ) -> None:
        self.config = config
        self.preemption = preemption
        self.withdrawn = withdrawn  # pool mode: the unit was given other work (`withdraw`)
        self.runner = runner
        self.reporter = reporter
        self.shipper = shipper
        self.note = note
        self.grace = float(config["grace_seconds"])
        # From a preemption notice to SIGKILL: never longer than a stop of the agent's own (`grace`).
        self.preemption_grace = min(self.grace, float(config["preemption_grace_seconds"]))
        self.preemption_window = float(config["preemption_window_seconds"])  # from the notice to the VM's end
        self._lock = threading.Lock()
        self._finished = False
        self.limit: str | None = None  # the time limit that ran out, once the agent acted on it

    def stopping(self) -> bool:
        """Whether nothing more of the job may start: a notice, a withdrawal or a time limit.
        Lock-free: the runner asks under its own lock."""
        return self.preemption.noticed.is_set() or self.withdrawn.is_set() or self.limit is not None

    def for_preemption(self, reason: str) -> None:
        """The VM is switched off `preemption_window` s after the notice (already sent), and what
        the command printed by then is lost unless shipped: SIGTERM now, SIGKILL
        `preemption_grace` s after the notice, output shipped often meanwhile, and the last of it
        flushed before the window ends."""
        noticed = self.preemption.noticed_at or time.monotonic()
        told = self.preemption.told  # else tpujobs stopped it (a reclaim): no VM switch-off, its own grace
        grace, window = (self.preemption_grace, self.preemption_window) if told else (self.grace, self.grace + 10)
        with self._lock:
            if self._finished:  # the command's end is known and reported: keep it
                log(f"preemption notice ({reason}) after the command ended")
                return
            self.reporter.silence()
            container = self.runner.sigterm(noticed + grace)
        self.shipper.hurry(noticed + window - min(FLUSH_MARGIN_SECONDS, (window - grace) / 2))
        self.note(
            f"{'preemption notice' if told else 'stop'} ({reason}): stopping the command, SIGKILL {grace:g} s "
            f"after the notice, output flushed within {window:g} s"
        )
        self.runner.sigterm_container(container)

    def withdraw(self, reason: str) -> bool:
        """Pool mode: the control plane gave the unit other work (or none), so this attempt stops
        as a preemption would stop it (SIGTERM, SIGKILL after the grace) but says nothing more:
        no notice, no `exited`, not even a checkpoint, since the job has already moved on. An end
        already known, or a preemption notice already sent, stands as it is (False)."""
        with self._lock:
            if self._finished or not self.preemption.stand_down():
                return False
            self.withdrawn.set()
            self.reporter.silence(everything=True)
            container = self.runner.sigterm()
        self.note(f"withdrawn ({reason}): stopping the command, SIGKILL after {self.grace:g} s")
        self.runner.sigterm_container(container)
        return True

    def watch_deadline(self, until: threading.Event) -> None:
        """At the attempt's deadline (`attempt_deadline`, from now), stop the command as a
        preemption would: SIGTERM, SIGKILL after the grace; `exited` then names the limit.
        The host stops on time even when the control plane cannot reach it. `until`: the
        attempt ended first."""
        deadline = attempt_deadline(self.config, time.time())
        if deadline is None:
            return
        at, limit = deadline
        self.note(f"the job's {limit} ends this attempt at {rfc3339(at)}")

        def wait() -> None:
            if not until.wait(max(0.0, at - time.time())):
                self._for_limit(limit)

        threading.Thread(target=wait, name="deadline", daemon=True).start()

    def _for_limit(self, limit: str) -> None:
        with self._lock:
            if self._finished or self.preemption.noticed.is_set() or self.withdrawn.is_set():
                return
            self.limit = limit
            container = self.runner.sigterm()
        self.note(f"the job's {limit} ran out: stopping the command, SIGKILL after {self.grace:g} s")
        self.runner.sigterm_container(container)

    def finish(self) -> tuple[bool, bool]:
        """The attempt's end is known: no stop acts from now on. (withdrawn, and whether it was
        stopped by a notice or a withdrawal: either way no end is told.)"""
        with self._lock:
            self._finished = True
            withdrawn = self.withdrawn.is_set()
            return withdrawn, self.preemption.noticed.is_set() or withdrawn

"""This function instance's metric recorder: built once, fed by every metric event, written to
Cloud Monitoring (or the local stand-in) on a timer thread, and flushed when the instance stops.

Cloud Run sends SIGTERM and allows 10 s before it kills the instance: the handler installed here
writes what is pending (after waiting out Monitoring's 5 s per series, at most), then hands the
signal on to whoever had it (functions-framework's server). An exit without a signal writes it
too (atexit). Nothing heavy is imported here: the Monitoring client loads with the first write.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import signal
import threading
import time
import uuid
from types import FrameType
from typing import Any

from tpujobs.engine import metric_events
from tpujobs.engine.metrics import MetricsRecorder
from tpujobs.engine.ports import Clock
from tpujobs.engine.settings import Settings

log = logging.getLogger(__name__)

CLOSE_WITHIN_S = 8.0  # of Cloud Run's 10 s between SIGTERM and the kill


def _later(delay_s: float, write: Any) -> None:
    timer = threading.Timer(delay_s, write)
    timer.daemon = True
    timer.start()


@functools.cache
def recorder(config: Settings, clock: Clock) -> MetricsRecorder | None:
    """This instance's recorder, added as a sink of `metric_events`; once per process (the runtime
    passes its one Settings). None where there is nowhere to write: neither on Cloud Run
    (K_SERVICE) nor given the local stand-in (TPUJOBS_MONITORING_ENDPOINT)."""
    if not (config.monitoring_endpoint or os.environ.get("K_SERVICE")):
        return None
    made = build(config, clock)
    metric_events.add_sink(made.add)
    _close_on_exit(made)
    return made


def build(settings: Settings, clock: Clock) -> MetricsRecorder:
    """A recorder on Cloud Monitoring (or the local stand-in) for these settings, as this instance's series."""
    from tpujobs.adapters.monitoring import CloudMonitoringWriter, Task

    task = Task(
        project=settings.project,
        location="global",
        namespace=f"{settings.prefix}tpujobs",
        job=os.environ.get("K_SERVICE") or os.environ.get("FUNCTION_TARGET") or "tpujobs",
        task_id=uuid.uuid4().hex,
    )
    token = f"simulated:{settings.function_account}" if settings.monitoring_endpoint else ""
    writer = CloudMonitoringWriter(task, settings.prefix, settings.monitoring_endpoint, token)
    return MetricsRecorder(writer, clock, _later)


def close(made: MetricsRecorder) -> None:
    """Write what is pending, once Monitoring takes a point again (at most CLOSE_WITHIN_S)."""
    if made.pending():
        time.sleep(min(made.wait_before_closing(), CLOSE_WITHIN_S - 2.0))
        made.write()


def _close_on_exit(made: MetricsRecorder) -> None:
    atexit.register(close, made)
    if threading.current_thread() is not threading.main_thread():
        return  # signals can be handled in the main thread only; atexit still writes
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        # In a thread: the main thread may hold the recorder's lock where the signal interrupted it.
        closing = threading.Thread(target=close, args=(made,), name="metrics-close", daemon=True)
        closing.start()
        closing.join(CLOSE_WITHIN_S)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)

"""The metrics the functions write to Cloud Monitoring themselves, from the metric events.

Metrics used to be log-based: Cloud Logging counted the functions' structured lines. A filter
sees only an entry's fields, and whoever may write log entries (every job account: its output
goes to Cloud Logging) sets all of them, so a job could move a metric or raise an alert. Now each
function instance folds the events it commits (`engine.metric_events`, the contract) into series
of its own and writes them with `projects.timeSeries.create`, which only the functions' accounts
may call (infra/iam.tf); infra/monitoring.tf declares the descriptors of `METRICS`.

Cloud Monitoring takes user-defined metrics as GAUGE or CUMULATIVE only, and one point per series
every 5 s at most. So `MetricsRecorder` keeps CUMULATIVE totals per series (INT64 counters,
DISTRIBUTION for values) since the instance started, each instance its own series (the writer
adds the instance to the monitored resource), and writes the series that changed at most once
every `interval_s`: at once when the last write is that old, else when it becomes so; and when
the instance stops (`close`). A failed write is retried at the next one: totals lose nothing.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from tpujobs.engine.metric_events import EVENTS, MetricEvent
from tpujobs.engine.ports import Clock

log = logging.getLogger(__name__)

INTERVAL_S = 10.0  # the most often an instance writes; Cloud Monitoring allows every 5 s per series
MIN_GAP_S = 5.0  # Cloud Monitoring's sampling limit for user-defined metrics: a closer point is refused
MAX_SERIES_PER_WRITE = 200  # projects.timeSeries.create takes at most 200 series a request


@dataclass(frozen=True)
class Buckets:
    """Exponential buckets: N finite ones, bucket i in [scale*growth^(i-1), scale*growth^i),
    an underflow below `scale` and an overflow from scale*growth^N."""

    count: int
    growth: float
    scale: float

    def index(self, value: float) -> int:
        """The bucket of `value`: 0 underflow, 1..count finite, count + 1 overflow."""
        if value < self.scale:
            return 0
        found = math.floor(math.log(value / self.scale) / math.log(self.growth)) + 1
        return max(1, min(found, self.count + 1))


@dataclass(frozen=True)
class Metric:
    """One metric: the events it counts and their fields that become its labels (same names).

    A counter adds 1 per event, or the event's `by` field; a distribution (`value`, `buckets`)
    adds the event's `value` field."""

    description: str
    events: tuple[str, ...]
    labels: Mapping[str, str]  # label (an event field) -> what it holds
    by: str | None = None
    value: str | None = None
    unit: str = "1"
    buckets: Buckets | None = None

    @property
    def distribution(self) -> bool:
        return self.value is not None


_FAMILY = {"family": "The TPU family (v4, v5p, ...)."}
_CAPACITY = {"capacity": "spot or on-demand."}
_TERMINAL = ("job_succeeded", "job_failed", "job_cancelled")

METRICS: Mapping[str, Metric] = {
    "jobs_submitted": Metric("Jobs accepted and recorded QUEUED.", ("job_submitted",), {**_FAMILY, **_CAPACITY}),
    "jobs_succeeded": Metric("Jobs that ended SUCCEEDED.", ("job_succeeded",), _FAMILY),
    "jobs_failed": Metric(
        "Jobs that ended FAILED, by what ended them (reason_class: command_failed, capacity_lost, ...).",
        ("job_failed",),
        {"reason_class": "The observation that ended the job (an EventKind value).", **_FAMILY},
    ),
    "preemptions": Metric(
        "Attempts that lost their capacity: preemption, hardware, a lost host.",
        ("preempted",),
        {**_FAMILY, **_CAPACITY, "source": "Who saw it: agent (the host's notice), tpu (the API's state), reconciler."},
    ),
    "rejections": Metric(
        "Messages refused and acknowledged (bad input, forged or unsigned, a job_id taken).",
        ("rejected",),
        {"topic": "The topic the message came on."},
        by="count",
    ),
    "dead_letters": Metric(
        "Messages Pub/Sub gave up delivering, recorded in Firestore's dead_letters.",
        ("dead_lettered",),
        {"topic": "The topic the message was first published to."},
    ),
    "stuck_jobs": Metric(
        "Jobs the reconciler found QUEUED or RECOVERING past the stuck limit and converged.",
        ("job_stuck",),
        {"state": "The state the job was stuck in."},
    ),
    "recovery_latency": Metric(
        "Seconds from an attempt losing its capacity to the next attempt running.",
        ("recovered",),
        _FAMILY,
        value="recovery_seconds",
        unit="s",
        buckets=Buckets(36, 1.5, 1.0),  # 1 s to about 36 h
    ),
    "queue_wait": Metric(
        "Seconds an attempt waited QUEUED before admission let it in.",
        ("admitted",),
        _FAMILY,
        value="queue_wait_seconds",
        unit="s",
        buckets=Buckets(40, 1.6, 0.1),  # 0.1 s to about 5 days
    ),
    "chip_hours": Metric(
        "Chip-hours of each ended job over all its attempts; the sum is what was paid for.",
        _TERMINAL,
        {"owner": "Who submitted the job.", **_FAMILY},
        value="chip_hours",
        unit="h",
        buckets=Buckets(24, 2.0, 0.001),  # 0.001 to about 67,000 chip-hours
    ),
}
"""Metric name -> what it counts. Its type is `custom.googleapis.com/{prefix}tpujobs/{name}`."""


def metric_type(prefix: str, name: str) -> str:
    return f"custom.googleapis.com/{prefix}tpujobs/{name}"


@dataclass(frozen=True)
class Distribution:
    """A distribution's totals, in Cloud Monitoring's terms."""

    buckets: Buckets
    count: int = 0
    mean: float = 0.0
    sum_of_squared_deviation: float = 0.0
    bucket_counts: tuple[int, ...] = ()

    def plus(self, value: float) -> Distribution:
        """With one more value (Welford's update, so the deviation stays exact in floats)."""
        count = self.count + 1
        delta = value - self.mean
        mean = self.mean + delta / count
        counts = list(self.bucket_counts or (0,) * (self.buckets.count + 2))
        counts[self.buckets.index(value)] += 1
        deviation = self.sum_of_squared_deviation + delta * (value - mean)
        return Distribution(self.buckets, count, mean, deviation, tuple(counts))


@dataclass(frozen=True)
class Point:
    """One CUMULATIVE point of one series: its total from `start` (the instance's start) to `end`."""

    metric: str  # a name of METRICS
    labels: Mapping[str, str]
    start: datetime
    end: datetime
    value: int | Distribution


class MetricWriter(Protocol):
    """projects.timeSeries.create, for this instance's series (adapters.monitoring)."""

    def write(self, points: Sequence[Point]) -> None:
        """Write each point (one per series); raise TransientError or PermanentError on failure."""


Schedule = Callable[[float, Callable[[], None]], None]  # run the callable after so many seconds


def series_of(event: MetricEvent) -> list[tuple[str, dict[str, str], float]]:
    """(metric, labels, amount) for each metric the event moves."""
    found = []
    for name, metric in METRICS.items():
        if event.name not in metric.events:
            continue
        labels = {key: str(event.fields.get(key, "")) for key in metric.labels}
        source = metric.value or metric.by
        amount = event.fields.get(source, 0) if source else 1
        found.append((name, labels, float(amount) if isinstance(amount, (int, float)) else 0.0))
    return found


@dataclass
class _Totals:
    """What the recorder holds, guarded by its lock."""

    values: dict[tuple[str, tuple[tuple[str, str], ...]], int | Distribution] = field(default_factory=dict)
    changed: set[tuple[str, tuple[tuple[str, str], ...]]] = field(default_factory=set)
    written_at: datetime | None = None  # the end of the last write that went through
    due: datetime | None = None  # when the write now pending is due; None: none pending


class MetricsRecorder:
    """This instance's CUMULATIVE series, written through `writer` at most every `interval_s`.

    `add` is the sink `metric_events.emit` feeds; it never raises, so a Monitoring outage never
    fails a handler. `schedule` runs a later write (a timer thread in the runtime)."""

    def __init__(
        self,
        writer: MetricWriter,
        clock: Clock,
        schedule: Schedule,
        interval_s: float = INTERVAL_S,
    ) -> None:
        self.writer = writer
        self.clock = clock
        self.schedule = schedule
        self.interval = timedelta(seconds=max(interval_s, MIN_GAP_S))
        self.started = clock()
        self._totals = _Totals()
        self._lock = threading.Lock()
        self._writing = threading.Lock()  # one write at a time: two would put points of a series 0 s apart

    def add(self, event: MetricEvent) -> None:
        """Fold the event into its series, and write now if the last write is `interval_s` old."""
        try:
            self._fold(event)
            now = self.clock()
            with self._lock:
                totals = self._totals
                if totals.due is None:
                    last = totals.written_at
                    totals.due = now if last is None else max(now, last + self.interval)
                    if totals.due > now:
                        self.schedule((totals.due - now).total_seconds(), self.write_due)
                now_due = totals.due <= now
            if now_due:
                self.write_due()
        except Exception:  # a metric must never fail the handler that committed the change
            log.warning("metric event %s not recorded", event.name, exc_info=True)

    def _fold(self, event: MetricEvent) -> None:
        with self._lock:
            for name, labels, amount in series_of(event):
                key = (name, tuple(sorted(labels.items())))
                metric = METRICS[name]
                before = self._totals.values.get(key)
                if metric.buckets is not None:
                    start = before if isinstance(before, Distribution) else Distribution(metric.buckets)
                    self._totals.values[key] = start.plus(amount)
                else:
                    self._totals.values[key] = (before if isinstance(before, int) else 0) + int(amount)
                self._totals.changed.add(key)

    def write_due(self) -> None:
        """Write the changed series if the pending write is due (a timer may fire late or twice)."""
        with self._lock:
            due = self._totals.due
        if due is not None and due <= self.clock():
            self.write()

    def write(self) -> bool:
        """Write every changed series now (the caller keeps to the interval); False if it failed,
        and then the series stay changed and a retry is scheduled."""
        with self._writing:
            now = self.clock()
            with self._lock:
                keys = sorted(self._totals.changed)
                self._totals.changed.clear()
                self._totals.due = None
                end = max(now, self.started + timedelta(milliseconds=1))  # a CUMULATIVE point has end > start
                points = [Point(k[0], dict(k[1]), self.started, end, self._totals.values[k]) for k in keys]
            if not points:
                return True
            try:
                for at in range(0, len(points), MAX_SERIES_PER_WRITE):
                    self.writer.write(points[at : at + MAX_SERIES_PER_WRITE])
            except Exception as error:  # one line: a write fails the same way every time (Monitoring away)
                log.warning("writing %d metric series failed; retrying later: %s", len(points), error)
                with self._lock:
                    self._totals.changed.update(keys)
                    if self._totals.due is None:
                        self._totals.due = now + self.interval
                        self.schedule(self.interval.total_seconds(), self.write_due)
                return False
            with self._lock:
                self._totals.written_at = end
            return True

    def wait_before_closing(self) -> float:
        """Seconds until a last write may go (MIN_GAP_S after the previous): `close` waits them."""
        with self._lock:
            last = self._totals.written_at
        if last is None:
            return 0.0
        return max(0.0, (last + timedelta(seconds=MIN_GAP_S) - self.clock()).total_seconds())

    def pending(self) -> int:
        """How many series changed since the last write that went through."""
        with self._lock:
            return len(self._totals.changed)


def check_table() -> None:
    """Every metric counts known events and labels itself with fields those events carry."""
    for name, metric in METRICS.items():
        for event in metric.events:
            fields = set(EVENTS[event][1])
            wanted = set(metric.labels) | {f for f in (metric.value, metric.by) if f}
            if not wanted <= fields:
                raise ValueError(f"metric {name}: event {event} has no field(s) {sorted(wanted - fields)}")
        if metric.distribution != (metric.buckets is not None):
            raise ValueError(f"metric {name}: a distribution has a value field and buckets, a counter neither")

"""The functions' metrics (issue 37, item 5b): each instance folds its metric events into CUMULATIVE
series and writes them to Cloud Monitoring at most every 10 s; the local Cloud Monitoring refuses
what Google refuses, a caller without metricWriter first of all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone

import pytest
from google.cloud.monitoring_v3.types import metric_service

from tpujobs.adapters.monitoring import CloudMonitoringWriter, Task
from tpujobs.engine import metric_events
from tpujobs.engine.errors import PermanentError
from tpujobs.engine.metric_events import MetricEvent
from tpujobs.engine.metrics import Buckets, Distribution, MetricsRecorder, Point, metric_type
from tpujobs.local.function_accounts import function_account
from tpujobs.local.simulator.cloud_monitoring import MonitoringServer

PROJECT = "demo"
FUNCTION = function_account("record_dead_letter", PROJECT)
JOB = "tpujobs-tpu-vm@demo.iam.gserviceaccount.com"
START = datetime(2030, 1, 1, tzinfo=timezone.utc)
log = logging.getLogger("test_metric_writes")


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class Writes:
    """A MetricWriter that keeps what it was given, and fails while `failing`."""

    def __init__(self) -> None:
        self.batches: list[list[Point]] = []
        self.failing = False

    def write(self, points: list[Point]) -> None:
        if self.failing:
            raise PermanentError("Cloud Monitoring refused")
        self.batches.append(list(points))


class Timers:
    """A Schedule that runs nothing until told: (delay, callable) pairs."""

    def __init__(self) -> None:
        self.pending: list[tuple[float, Callable[[], None]]] = []

    def __call__(self, delay: float, run: Callable[[], None]) -> None:
        self.pending.append((delay, run))

    def fire(self) -> None:
        pending, self.pending = self.pending, []
        for _, run in pending:
            run()


def job_event(name: str, **fields: object) -> MetricEvent:
    base = {"job_id": "j1", "owner": "ada@example.com", "family": "v5p", "capacity": "spot", "attempt": 1}
    return MetricEvent(name, {**base, **fields})  # type: ignore[arg-type]


@pytest.fixture
def parts() -> tuple[Writes, Clock, Timers, MetricsRecorder]:
    writes, clock, timers = Writes(), Clock(), Timers()
    clock.advance(1)
    recorder = MetricsRecorder(writes, clock, timers)
    return writes, clock, timers, recorder


def test_the_first_event_is_written_at_once_and_later_ones_together_ten_seconds_after(parts) -> None:
    """A point per series at most every 10 s: the next events wait for a timer, folded into one write."""
    writes, clock, timers, recorder = parts
    clock.advance(1)
    recorder.add(job_event("job_submitted"))
    assert [[(p.metric, p.value) for p in batch] for batch in writes.batches] == [[("jobs_submitted", 1)]]
    clock.advance(2)
    recorder.add(job_event("job_submitted"))
    recorder.add(metric_events.rejected("tpujobs-submit", 7))
    assert len(writes.batches) == 1 and [delay for delay, _ in timers.pending] == [8.0]
    clock.advance(8)
    timers.fire()
    (second,) = writes.batches[1:]
    assert {(p.metric, p.value) for p in second} == {("jobs_submitted", 2), ("rejections", 7)}
    assert {p.start for p in second} == {START + timedelta(seconds=1)}  # CUMULATIVE since the instance began
    assert {p.end for p in second} == {clock.now}


def test_series_are_per_label_and_distributions_keep_count_mean_and_buckets(parts) -> None:
    """Labels are the event's fields; recovery seconds land in their exponential bucket."""
    writes, clock, timers, recorder = parts
    recorder.add(job_event("job_failed", reason_class="command_failed", chip_hours=2.0))
    clock.advance(10)
    recorder.add(job_event("recovered", recovery_seconds=3.0))
    recorder.add(job_event("recovered", recovery_seconds=5.0))
    clock.advance(10)
    timers.fire()
    written = {(p.metric, tuple(sorted(p.labels.items()))): p.value for batch in writes.batches for p in batch}
    assert written[("jobs_failed", (("family", "v5p"), ("reason_class", "command_failed")))] == 1
    recovery = written[("recovery_latency", (("family", "v5p"),))]
    assert isinstance(recovery, Distribution)
    assert (recovery.count, recovery.mean, recovery.sum_of_squared_deviation) == (2, 4.0, 2.0)
    buckets = Buckets(36, 1.5, 1.0)
    assert recovery.bucket_counts[buckets.index(3.0)] == 1 and recovery.bucket_counts[buckets.index(5.0)] == 1
    assert (buckets.index(0.5), buckets.index(1.0), buckets.index(1.49), buckets.index(1.5), buckets.index(1e12)) == (
        0,
        1,
        1,
        2,
        37,
    )


def test_a_failed_write_loses_nothing_and_is_retried(parts) -> None:
    """The totals stay changed and a timer retries; the handler that emitted never sees the error."""
    writes, clock, timers, recorder = parts
    writes.failing = True
    recorder.add(metric_events.dead_lettered("tpujobs-submit", 5))
    assert writes.batches == [] and recorder.pending() == 1 and len(timers.pending) == 1
    writes.failing = False
    clock.advance(10)
    timers.fire()
    assert [[(p.metric, p.value) for p in batch] for batch in writes.batches] == [[("dead_letters", 1)]]
    assert recorder.pending() == 0


def test_emit_hands_each_event_to_the_sinks_and_a_failing_sink_fails_nothing() -> None:
    """metric_events.emit feeds every sink added, also after one raised, and still logs its line."""
    seen: list[str] = []

    def broken(event: MetricEvent) -> None:
        raise RuntimeError("boom")

    remove = [metric_events.add_sink(broken), metric_events.add_sink(lambda event: seen.append(event.name))]
    try:
        metric_events.emit(log, metric_events.rejected("tpujobs-submit"))
    finally:
        for undo in remove:
            undo()
    assert seen == ["rejected"]
    metric_events.emit(log, metric_events.rejected("tpujobs-submit"))
    assert seen == ["rejected"]


@pytest.fixture
def stand_in() -> Iterator[MonitoringServer]:
    server = MonitoringServer([FUNCTION])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def writer(server: MonitoringServer, account: str, task_id: str = "i1") -> CloudMonitoringWriter:
    task = Task(PROJECT, "global", "tpujobs", "tpujobs-dead-letter", task_id)
    return CloudMonitoringWriter(task, "", server.endpoint, f"simulated:{account}")


def point(value: int, end_s: float) -> Point:
    return Point("dead_letters", {"topic": "tpujobs-submit"}, START, START + timedelta(seconds=end_s), value)


def test_a_functions_account_writes_series_and_a_jobs_account_is_refused(stand_in: MonitoringServer) -> None:
    """Through google-cloud-monitoring: the function's write lands; the job's is a 403 and stores nothing."""
    writer(stand_in, FUNCTION).write([point(1, 10)])
    with pytest.raises(PermanentError, match="403"):
        writer(stand_in, JOB, "i2").write([point(50, 10)])
    (series,) = stand_in.store.latest(metric_type("", "dead_letters"))
    assert [p.value.int64_value for p in series.points] == [1]
    assert series.resource_labels["task_id"] == "i1"
    assert stand_in.store.refused == [JOB]


def test_the_stand_in_refuses_points_closer_than_five_seconds_and_out_of_order(stand_in: MonitoringServer) -> None:
    """As Cloud Monitoring: one point per series every 5 s, each newer than the last."""
    written = writer(stand_in, FUNCTION)
    written.write([point(1, 10)])
    with pytest.raises(PermanentError, match="sampling period"):
        written.write([point(2, 12)])
    with pytest.raises(PermanentError, match="in order"):
        written.write([point(2, 9)])
    written.write([point(3, 15)])
    answer = stand_in.store.list(
        metric_service.ListTimeSeriesRequest(
            name=f"projects/{PROJECT}",
            filter=f'metric.type = "{metric_type("", "dead_letters")}" AND metric.labels.topic = "tpujobs-submit"',
        )
    )
    (series,) = answer.time_series
    assert [p.value.int64_value for p in series.points] == [3, 1]  # newest first


def test_a_recorder_on_the_stand_in_writes_distributions_google_accepts(stand_in: MonitoringServer) -> None:
    """The adapter's DISTRIBUTION and INT64 CUMULATIVE series pass the stand-in's checks, bucket counts and all."""
    clock, timers = Clock(), Timers()
    recorder = MetricsRecorder(writer(stand_in, FUNCTION), clock, timers)
    clock.advance(1)
    recorder.add(job_event("job_succeeded", reason_class="command_succeeded", chip_hours=0.5))
    (chip_hours,) = stand_in.store.latest(metric_type("", "chip_hours"))
    value = chip_hours.points[-1].value.distribution_value
    assert (value.count, value.mean, sum(value.bucket_counts)) == (1, 0.5, 1)
    assert value.bucket_options.exponential_buckets.num_finite_buckets == 24
    (succeeded,) = stand_in.store.latest(metric_type("", "jobs_succeeded"))
    assert succeeded.points[-1].value.int64_value == 1


def test_the_runtime_writes_nowhere_off_cloud_run_without_the_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI, tests and benches build engines too: with neither K_SERVICE nor an endpoint no recorder is made."""
    from tpujobs.engine.settings import Settings
    from tpujobs.runtime import metrics as runtime_metrics

    monkeypatch.delenv("K_SERVICE", raising=False)
    assert runtime_metrics.recorder(Settings(project="nowhere"), Clock()) is None


def test_the_runtimes_recorder_writes_as_its_functions_account_and_close_writes_what_waits(
    stand_in: MonitoringServer,
) -> None:
    """Built from settings (endpoint, account), it writes through the stand-in; `close` writes the events held back."""
    from tpujobs.engine.settings import Settings
    from tpujobs.runtime import metrics as runtime_metrics

    clock = Clock()
    settings = Settings(project=PROJECT, monitoring_endpoint=stand_in.endpoint, function_account=FUNCTION)
    made = runtime_metrics.build(settings, clock)
    clock.advance(1)
    made.add(metric_events.dead_lettered("tpujobs-submit", 5))
    clock.advance(6)
    made.add(metric_events.dead_lettered("tpujobs-submit", 5))  # held: the last write is 6 s old
    assert made.pending() == 1
    runtime_metrics.close(made)
    (series,) = stand_in.store.latest(metric_type("", "dead_letters"))
    assert [p.value.int64_value for p in series.points] == [1, 2]
    assert stand_in.store.refused == []

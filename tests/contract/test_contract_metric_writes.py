"""The contract of `metrics.MetricWriter`: `InMemoryMetricWriter` into a Cloud Monitoring store, and
`CloudMonitoringWriter` over gRPC to the local stand-in serving the same store, write the same
series and are refused alike, for good: a series written again sooner than Google's sampling period
allows, and a caller that may not write metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tpujobs.adapters.monitoring import Task
from tpujobs.engine.errors import PermanentError
from tpujobs.engine.metrics import METRICS, Distribution, Point, metric_type
from tpujobs.local.fakes.metric_writes import InMemoryMetricWriter
from tpujobs.local.simulator.cloud_monitoring import MonitoringServer

PROJECT = "tpujobs-test"
FUNCTION = "tpujobs-fn@tpujobs-test.iam.gserviceaccount.com"
JOB = "job-vm@tpujobs-test.iam.gserviceaccount.com"
TASK = Task(PROJECT, "global", "tpujobs", "tpujobs-submit", "instance-1")
START = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


@dataclass
class Monitoring:
    """`writer(account)`: a MetricWriter as that account; `series(metric)`: what the store holds of it."""

    writer: Callable[[str], Any]
    series: Callable[[str], list[Any]]


@pytest.fixture(params=["memory", "grpc"])
def monitoring(request: pytest.FixtureRequest) -> Iterator[Monitoring]:
    server = MonitoringServer([FUNCTION])
    store = server.store
    if request.param == "memory":
        yield Monitoring(lambda account: InMemoryMetricWriter(store, TASK, "", account), store.latest)
        return
    from tpujobs.adapters.monitoring import CloudMonitoringWriter

    server.start()
    try:
        yield Monitoring(
            lambda account: CloudMonitoringWriter(TASK, "", server.endpoint, f"simulated:{account}"), store.latest
        )
    finally:
        server.stop()


def counter(seconds: float, value: int, topic: str = "tpujobs-submit") -> Point:
    return Point("dead_letters", {"topic": topic}, START, START + timedelta(seconds=seconds), value)


def test_each_point_is_its_own_series_on_this_instances_task(monitoring):
    """A counter and a distribution in one write: a series each, on the instance's generic_task."""
    buckets = METRICS["queue_wait"].buckets
    assert buckets is not None
    waits = Distribution(buckets).plus(2.0).plus(30.0)
    monitoring.writer(FUNCTION).write(
        [counter(10, 3), Point("queue_wait", {"family": "v5p"}, START, START + timedelta(seconds=10), waits)]
    )
    [dead] = monitoring.series(metric_type("", "dead_letters"))
    assert (dead.metric_labels, dead.resource_type, dead.resource_labels) == (
        {"topic": "tpujobs-submit"},
        "generic_task",
        TASK.labels(),
    )
    assert [p.value.int64_value for p in dead.points] == [3]
    [wait] = monitoring.series(metric_type("", "queue_wait"))
    assert wait.points[-1].value.distribution_value.count == 2


def test_a_series_written_again_within_the_sampling_period_is_refused_for_good(monitoring):
    """Google keeps one point per series each 5 s: sooner is PermanentError; later is kept."""
    writer = monitoring.writer(FUNCTION)
    writer.write([counter(10, 1)])
    with pytest.raises(PermanentError):
        writer.write([counter(12, 2)])
    writer.write([counter(15, 2), counter(15, 1, topic="tpujobs-control")])
    written = monitoring.series(metric_type("", "dead_letters"))
    totals = {series.metric_labels["topic"]: [p.value.int64_value for p in series.points] for series in written}
    assert totals == {"tpujobs-submit": [1, 2], "tpujobs-control": [1]}


def test_an_account_that_may_not_write_metrics_is_refused_for_good(monitoring):
    """A job's account (no roles/monitoring.metricWriter): PermanentError, nothing kept; no points, no call."""
    with pytest.raises(PermanentError):
        monitoring.writer(JOB).write([counter(10, 1)])
    monitoring.writer(JOB).write([])
    assert monitoring.series(metric_type("", "dead_letters")) == []

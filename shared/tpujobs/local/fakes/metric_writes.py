"""Metric writes into an in-process Cloud Monitoring store: `engine.metrics.MetricWriter` without
gRPC, refused as `adapters.monitoring.CloudMonitoringWriter` is refused by the local stand-in that
serves the same store (Google's rules for user-defined metrics: one point per series per request, a
point at least 5 s after its series' last; a caller without roles/monitoring.metricWriter is
refused). tests/contract/test_contract_metric_writes.py holds the two."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.cloud.monitoring_v3.types import metric_service

from tpujobs.adapters.monitoring import CloudMonitoringWriter, Task
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.metrics import Point
from tpujobs.local.simulator.cloud_monitoring import MonitoringError, MonitoringStore

_FINAL = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.NOT_FOUND,
)


class InMemoryMetricWriter:
    """MetricWriter into `store` as the account `caller` ("" or None: a caller with no account or token)."""

    def __init__(self, store: MonitoringStore, task: Task, prefix: str, caller: str | None) -> None:
        self.store = store
        self.caller = caller
        self._series = CloudMonitoringWriter(task, prefix)  # the TimeSeries the adapter would send
        self._name = f"projects/{task.project}"

    def write(self, points: Sequence[Point]) -> None:
        if not points:
            return
        series = [self._series.series(point) for point in points]
        request = metric_service.CreateTimeSeriesRequest(name=self._name, time_series=series)
        try:
            self.store.create(self.caller, request)
        except MonitoringError as error:
            kind = PermanentError if error.code in _FINAL else TransientError
            raise kind(f"Cloud Monitoring: write {len(series)} metric series: {error}") from error

"""A local Cloud Monitoring: `projects.timeSeries.create` and `projects.timeSeries.list` of v3, over
gRPC, for the functions' metric writes (google-cloud-monitoring speaks gRPC only) and the tests' reads.

Series in memory. A write is refused as Google refuses it: a caller without a token is
UNAUTHENTICATED, and one that holds no roles/monitoring.metricWriter is PERMISSION_DENIED (403).
Who holds it is `writers`: the functions' accounts, as infra/iam.tf grants it, and no job's or
VM's. The caller is known from its bearer token, `simulated:EMAIL`, as the Cloud Logging
stand-in knows it (`cloud_logging.TOKEN_PREFIX`). Google's rules for user-defined metrics hold:
GAUGE or CUMULATIVE only, one point per series per request, a point newer than the last of its
series and at least `MIN_GAP_S` after it, a CUMULATIVE start before its end. `timeSeries.list`
takes a filter of `metric.type`, `resource.type` and label equalities joined by AND.
"""

from __future__ import annotations

import argparse
import builtins
import re
import sys
import threading
from collections.abc import Iterable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import grpc
from google.api import metric_pb2
from google.cloud.monitoring_v3.types import metric as metric_types
from google.cloud.monitoring_v3.types import metric_service
from google.protobuf import empty_pb2

from tpujobs.local.simulator.cloud_logging import TOKEN_PREFIX
from tpujobs.local.simulator.http import serve_until_signalled

SERVICE = "google.monitoring.v3.MetricService"
MAX_SERIES = 200
MIN_GAP_S = 5.0  # "one point each 5 seconds" per series, for user-defined metrics
USER_DEFINED = "custom.googleapis.com/"
# The monitored resources a user-defined metric may be written against, and their labels.
RESOURCES = {
    "generic_task": ("project_id", "location", "namespace", "job", "task_id"),
    "generic_node": ("project_id", "location", "namespace", "node_id"),
    "global": ("project_id",),
}
Kind = metric_pb2.MetricDescriptor.MetricKind
_TERM = re.compile(r'\s*(?P<field>[a-z_.]+[A-Za-z0-9_]*)\s*=\s*"(?P<value>[^"]*)"\s*(?:AND\s+|$)')


class MonitoringError(Exception):
    """A request the stand-in refuses, with the gRPC status Google would answer."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Series:
    """One time series: its identity, kind and points, newest last."""

    metric_type: str
    metric_labels: dict[str, str]
    resource_type: str
    resource_labels: dict[str, str]
    kind: int
    value_type: int
    points: list[metric_types.Point] = field(default_factory=list)


def caller_of(authorization: str) -> str | None:
    """The account a `Bearer simulated:EMAIL` token stands for; '' for any other token; None for none."""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    token = token.strip()
    return token.removeprefix(TOKEN_PREFIX) if token.startswith(TOKEN_PREFIX) else ""


class MonitoringStore:
    """The series written, and who may write them."""

    def __init__(self, writers: Iterable[str] = ()) -> None:
        self.writers = frozenset(writers)
        self.series: dict[tuple[Any, ...], Series] = {}
        self.refused: list[str] = []  # each caller refused a write, in order
        self._lock = threading.Lock()

    def create(self, caller: str | None, request: metric_service.CreateTimeSeriesRequest) -> None:
        """Store each series' one point, or refuse the whole request."""
        if caller is None:
            raise MonitoringError(
                grpc.StatusCode.UNAUTHENTICATED, "Request is missing required authentication credential."
            )
        if caller not in self.writers:
            self.refused.append(caller)
            raise MonitoringError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"Permission monitoring.timeSeries.create denied (or the resource may not exist)"
                f" for {caller or 'the caller'}.",
            )
        if not re.fullmatch(r"projects/[^/]+", request.name):
            raise MonitoringError(grpc.StatusCode.INVALID_ARGUMENT, f"name: projects/PROJECT, not {request.name!r}")
        if not 0 < len(request.time_series) <= MAX_SERIES:
            raise MonitoringError(grpc.StatusCode.INVALID_ARGUMENT, f"time_series: 1 to {MAX_SERIES} per request")
        with self._lock:
            checked = [self._checked(index, series) for index, series in enumerate(request.time_series)]
            keys = [key for key, _ in checked]
            if len(set(keys)) != len(keys):
                raise MonitoringError(grpc.StatusCode.INVALID_ARGUMENT, "A time series appears more than once.")
            for key, series in checked:
                if key in self.series:
                    self.series[key].points.append(series.points[0])
                else:
                    self.series[key] = series

    def _checked(self, index: int, sent: metric_types.TimeSeries) -> tuple[tuple[Any, ...], Series]:
        where = f"time_series[{index}]"
        metric_type = sent.metric.type
        if not metric_type.startswith(USER_DEFINED):
            raise MonitoringError(
                grpc.StatusCode.INVALID_ARGUMENT, f"{where}: {metric_type!r} is not a user-defined metric"
            )
        wanted = RESOURCES.get(sent.resource.type)
        if wanted is None or set(sent.resource.labels) != set(wanted):
            raise MonitoringError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{where}: resource {sent.resource.type!r} with labels {sorted(wanted or ())}",
            )
        kind = int(sent.metric_kind)
        if kind not in (Kind.GAUGE, Kind.CUMULATIVE):
            raise MonitoringError(
                grpc.StatusCode.INVALID_ARGUMENT, f"{where}: user-defined metrics are GAUGE or CUMULATIVE"
            )
        if len(sent.points) != 1:
            raise MonitoringError(grpc.StatusCode.INVALID_ARGUMENT, f"{where}: exactly one point per series")
        point = sent.points[0]
        start, end = _time(point.interval.start_time), _time(point.interval.end_time)
        if kind == Kind.CUMULATIVE and not (start is not None and end is not None and start < end):
            raise MonitoringError(
                grpc.StatusCode.INVALID_ARGUMENT, f"{where}: a CUMULATIVE point's start is before its end"
            )
        key = (
            metric_type,
            tuple(sorted(sent.metric.labels.items())),
            sent.resource.type,
            tuple(sorted(sent.resource.labels.items())),
        )
        stored = self.series.get(key)
        if stored is not None:
            if (stored.kind, stored.value_type) != (kind, int(sent.value_type)):
                raise MonitoringError(
                    grpc.StatusCode.INVALID_ARGUMENT, f"{where}: the series' kind or value type changed"
                )
            last = _time(stored.points[-1].interval.end_time)
            if end is None or last is None or end <= last:
                raise MonitoringError(grpc.StatusCode.INVALID_ARGUMENT, f"{where}: Points must be written in order.")
            if end - last < timedelta(seconds=MIN_GAP_S):
                raise MonitoringError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{where}: One or more points were written more frequently than the maximum sampling period.",
                )
        series = Series(
            metric_type,
            dict(sent.metric.labels),
            sent.resource.type,
            dict(sent.resource.labels),
            kind,
            int(sent.value_type),
            [metric_types.Point(point)],
        )
        return key, series

    def list(self, request: metric_service.ListTimeSeriesRequest) -> metric_service.ListTimeSeriesResponse:
        """The series the filter names, with their points in the interval, newest first."""
        terms = parse_filter(request.filter)
        if not any(name == "metric.type" for name, _ in terms):
            raise MonitoringError(grpc.StatusCode.INVALID_ARGUMENT, "filter: a metric.type is required")
        start, end = _time(request.interval.start_time), _time(request.interval.end_time)
        found = []
        with self._lock:
            for series in self.series.values():
                if not all(_field(series, name) == value for name, value in terms):
                    continue
                points = [p for p in series.points if _within(_time(p.interval.end_time), start, end)]
                if points:
                    found.append(
                        metric_types.TimeSeries(
                            metric={"type": series.metric_type, "labels": series.metric_labels},
                            resource={"type": series.resource_type, "labels": series.resource_labels},
                            metric_kind=series.kind,
                            value_type=series.value_type,
                            points=list(reversed(points)),
                        )
                    )
        return metric_service.ListTimeSeriesResponse(time_series=found)

    def latest(self, metric_type: str) -> builtins.list[Series]:
        """Every series of `metric_type`, as written (for tests: the last point is its total)."""
        with self._lock:
            return [s for s in self.series.values() if s.metric_type == metric_type]


def parse_filter(text: str) -> list[tuple[str, str]]:
    """(field, value) for each `FIELD = "VALUE"` of an AND-only filter; anything else is refused."""
    terms, at = [], 0
    text = text.strip()
    while at < len(text):
        found = _TERM.match(text, at)
        if found is None:
            raise MonitoringError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f'filter: the stand-in reads FIELD = "VALUE" AND ..., at {text[at : at + 40]!r}',
            )
        terms.append((found["field"].replace(".label.", ".labels."), found["value"]))
        at = found.end()
    return terms


def _field(series: Series, name: str) -> str | None:
    if name == "metric.type":
        return series.metric_type
    if name == "resource.type":
        return series.resource_type
    if name.startswith("metric.labels."):
        return series.metric_labels.get(name.removeprefix("metric.labels."))
    if name.startswith("resource.labels."):
        return series.resource_labels.get(name.removeprefix("resource.labels."))
    raise MonitoringError(grpc.StatusCode.INVALID_ARGUMENT, f"filter: unknown field {name!r}")


def _time(value: Any) -> datetime | None:
    """A proto-plus timestamp as a datetime; None when unset."""
    return value if isinstance(value, datetime) and value.timestamp() > 0 else None


def _within(at: datetime | None, start: datetime | None, end: datetime | None) -> bool:
    return at is not None and (start is None or at > start) and (end is None or at <= end)


class MonitoringServer:
    """The local Cloud Monitoring on a loopback port (gRPC, local credentials), in background threads."""

    def __init__(self, writers: Iterable[str] = (), host: str = "127.0.0.1", port: int = 0) -> None:
        self.store = MonitoringStore(writers)
        self.host = host
        self.port = port
        self._server: grpc.Server | None = None

    @property
    def endpoint(self) -> str:
        """`HOST:PORT`, for TPUJOBS_MONITORING_ENDPOINT (the adapter's loopback channel)."""
        return f"{self.host}:{self.port}"

    def start(self) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="cloud-monitoring"))
        server.add_generic_rpc_handlers((self._handlers(),))
        self.port = server.add_secure_port(f"{self.host}:{self.port}", grpc.local_server_credentials())
        server.start()
        self._server = server
        return self.endpoint

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=1).wait()
            self._server = None

    def _handlers(self) -> grpc.GenericRpcHandler:
        def create(request: metric_service.CreateTimeSeriesRequest, context: grpc.ServicerContext) -> Any:
            authorization = dict(context.invocation_metadata()).get("authorization", "")
            self._answer(context, lambda: self.store.create(caller_of(str(authorization)), request))
            return empty_pb2.Empty()

        def list_series(request: metric_service.ListTimeSeriesRequest, context: grpc.ServicerContext) -> Any:
            return self._answer(context, lambda: self.store.list(request))

        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "CreateTimeSeries": grpc.unary_unary_rpc_method_handler(
                    create,
                    request_deserializer=metric_service.CreateTimeSeriesRequest.deserialize,
                    response_serializer=empty_pb2.Empty.SerializeToString,
                ),
                "ListTimeSeries": grpc.unary_unary_rpc_method_handler(
                    list_series,
                    request_deserializer=metric_service.ListTimeSeriesRequest.deserialize,
                    response_serializer=metric_service.ListTimeSeriesResponse.serialize,
                ),
            },
        )

    @staticmethod
    def _answer(context: grpc.ServicerContext, call: Any) -> Any:
        try:
            return call()
        except MonitoringError as error:
            context.abort(error.code, str(error))


def main(argv: Sequence[str] | None = None) -> int:
    """Serve in the foreground until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m tpujobs.local.simulator.cloud_monitoring")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 lets the system choose")
    parser.add_argument("--writer", action="append", default=[], help="an account holding monitoring.metricWriter")
    args = parser.parse_args(argv)
    server = MonitoringServer(args.writer, args.host, args.port)
    return serve_until_signalled(server.start, server.stop, "tpujobs-cloud-monitoring")


if __name__ == "__main__":
    sys.exit(main())

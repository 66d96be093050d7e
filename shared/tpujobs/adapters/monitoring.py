"""Writes this instance's metric series to Cloud Monitoring: `CloudMonitoringWriter`, the
`engine.metrics.MetricWriter` port, on google-cloud-monitoring's `projects.timeSeries.create`.

Each series is a user-defined metric (`custom.googleapis.com/{prefix}tpujobs/NAME`, declared in
infra/monitoring.tf) on a `generic_task` resource: `namespace` the deployment's tpujobs, `job` the
function, `task_id` this instance. So every instance writes series of its own, and a total is
their sum. Only the functions' accounts hold roles/monitoring.metricWriter (infra/iam.tf).

The library speaks gRPC only (2.32.0 has no REST transport). Against Google it uses the
instance's default credentials; against the local stand-in (`endpoint`, TPUJOBS_MONITORING_ENDPOINT)
a loopback channel carrying `token` (`simulated:EMAIL`, the function's account), from which the
stand-in knows the caller as Google knows it from the credentials. Imported lazily: the library
loads with the first write, not at a cold start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tpujobs.adapters.google_errors import translated
from tpujobs.engine.metrics import Distribution, Point, metric_type

TIMEOUT_S = 5.0  # a write sits in a handler's path at most this long


@dataclass(frozen=True)
class Task:
    """The monitored resource of this instance's series (`generic_task`)."""

    project: str
    location: str  # the region the functions run in ("global" where unknown)
    namespace: str  # "{prefix}tpujobs"
    job: str  # the function's Cloud Run service (K_SERVICE), or its target
    task_id: str  # this instance

    def labels(self) -> dict[str, str]:
        return {
            "project_id": self.project,
            "location": self.location,
            "namespace": self.namespace,
            "job": self.job,
            "task_id": self.task_id,
        }


def local_channel(endpoint: str, token: str) -> Any:
    """A gRPC channel to a loopback stand-in that sends `token` as a bearer token with each call."""
    import grpc

    target = endpoint.removeprefix("http://").removeprefix("grpc://").rstrip("/")
    credentials = grpc.composite_channel_credentials(
        grpc.local_channel_credentials(), grpc.access_token_call_credentials(token)
    )
    return grpc.secure_channel(target, credentials)


def build_client(endpoint: str = "", token: str = "") -> Any:
    """A MetricServiceClient: Google's with default credentials, or the stand-in's at `endpoint`."""
    from google.cloud import monitoring_v3

    if not endpoint:
        return monitoring_v3.MetricServiceClient()
    from google.cloud.monitoring_v3.services.metric_service.transports import MetricServiceGrpcTransport

    return monitoring_v3.MetricServiceClient(
        transport=MetricServiceGrpcTransport(channel=local_channel(endpoint, token))
    )


class CloudMonitoringWriter:
    """`engine.metrics.MetricWriter` on projects.timeSeries.create; the client is made at the first write."""

    def __init__(self, task: Task, prefix: str, endpoint: str = "", token: str = "") -> None:
        self.task = task
        self.prefix = prefix
        self.endpoint = endpoint
        self.token = token
        self._client: Any = None

    def write(self, points: Sequence[Point]) -> None:
        if not points:
            return
        if self._client is None:
            self._client = build_client(self.endpoint, self.token)
        series = [self.series(point) for point in points]
        with translated("Cloud Monitoring", f"write {len(series)} metric series"):
            self._client.create_time_series(name=f"projects/{self.task.project}", time_series=series, timeout=TIMEOUT_S)

    def series(self, point: Point) -> Any:
        """The TimeSeries of one point: CUMULATIVE, INT64 or DISTRIBUTION as its metric is."""
        from google.api import distribution_pb2, metric_pb2
        from google.cloud import monitoring_v3

        interval = monitoring_v3.TimeInterval(start_time=point.start, end_time=point.end)
        if isinstance(point.value, Distribution):
            value = monitoring_v3.TypedValue(distribution_value=_distribution(point.value, distribution_pb2))
            value_type = metric_pb2.MetricDescriptor.ValueType.DISTRIBUTION
        else:
            value = monitoring_v3.TypedValue(int64_value=point.value)
            value_type = metric_pb2.MetricDescriptor.ValueType.INT64
        return monitoring_v3.TimeSeries(
            metric={"type": metric_type(self.prefix, point.metric), "labels": dict(point.labels)},
            resource={"type": "generic_task", "labels": self.task.labels()},
            metric_kind=metric_pb2.MetricDescriptor.MetricKind.CUMULATIVE,
            value_type=value_type,
            points=[monitoring_v3.Point(interval=interval, value=value)],
        )


def _distribution(totals: Distribution, distribution_pb2: Any) -> Any:
    buckets = totals.buckets
    options = distribution_pb2.Distribution.BucketOptions(
        exponential_buckets=distribution_pb2.Distribution.BucketOptions.Exponential(
            num_finite_buckets=buckets.count, growth_factor=buckets.growth, scale=buckets.scale
        )
    )
    return distribution_pb2.Distribution(
        count=totals.count,
        mean=totals.mean,
        sum_of_squared_deviation=totals.sum_of_squared_deviation,
        bucket_options=options,
        bucket_counts=list(totals.bucket_counts),
    )

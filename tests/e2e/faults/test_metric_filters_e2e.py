"""infra/monitoring.tf's metrics held to what the local stack's functions really write to Cloud Monitoring.

The stack's functions write their metrics to the local Cloud Monitoring (TPUJOBS_MONITORING_ENDPOINT),
each with its own account's token, as production's functions write to Google's. The test drives a
job stuck QUEUED past the reconciler's limit while every TPU create fails, then a success after a
preemption, a failure, a rejection and a dead letter; then it reads every metric declared in
infra/ back from the stand-in's time series (`projects.timeSeries.list`, through
google-cloud-monitoring) and checks that each moved, with its labels filled. The stack is shared by
the e2e tests, so each series is compared with what it held before. A renamed event, field or
metric fails here, not silently in production. (Function errors are Cloud Run's own
request_count, which has no local stand-in: tests/infra checks that alert's filter.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tpujobs.adapters.monitoring import build_client
from tpujobs.domain.states import JobState
from tpujobs.engine import topology
from tpujobs.engine.metrics import METRICS, metric_type
from tpujobs.engine.settings import Settings
from tpujobs.local.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e-faults"), pytest.mark.timeout(400)]

INFRA = Path(__file__).resolve().parents[3] / "infra"
# The stuck limit the stack keeps (conftest leaves it): a job QUEUED longer is `job_stuck`.
STUCK_AFTER_S = Settings().stuck_after_seconds
# Every TPU create fails until the stuck metric moves; far more calls than that wait makes.
FAILING_CREATES = 100_000
# What a function holds before writing (10 s) and a margin for a loaded machine.
WRITTEN_WITHIN_S = 60

Labels = tuple[tuple[str, str], ...]


def declared_metrics() -> set[str]:
    """The names of every metric descriptor of infra/ (each for_each's instances)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "infra"))
    from for_each import instances
    from terraform_config import Terraform

    tf = Terraform.load(INFRA)
    return {
        name
        for resource in tf.of_kind("google_monitoring_metric_descriptor")
        for name in instances(tf, "google_monitoring_metric_descriptor", resource)
    }


class Readings:
    """The local Cloud Monitoring, read as a chart would: each series' latest CUMULATIVE total,
    summed over the instances (the generic_task resources) by metric labels."""

    def __init__(self, endpoint: str, project: str, prefix: str) -> None:
        self.client = build_client(endpoint, "simulated:reader@example.com")
        self.project = project
        self.prefix = prefix

    def totals(self, name: str) -> dict[Labels, dict[str, float]]:
        """Labels -> {"count": total (a counter's value, a distribution's count), "sum": a distribution's sum}."""
        found: dict[Labels, dict[str, float]] = {}
        query = f'metric.type = "{metric_type(self.prefix, name)}"'
        for series in self.client.list_time_series(name=f"projects/{self.project}", filter=query, interval={}):
            latest = series.points[0].value  # newest first
            labels = tuple(sorted(series.metric.labels.items()))
            total = found.setdefault(labels, {"count": 0.0, "sum": 0.0})
            if "distribution_value" in latest:
                total["count"] += latest.distribution_value.count
                total["sum"] += latest.distribution_value.count * latest.distribution_value.mean
            else:
                total["count"] += latest.int64_value
        return found

    def snapshot(self) -> dict[str, dict[Labels, dict[str, float]]]:
        return {name: self.totals(name) for name in METRICS}


def moved(before: dict[str, dict[Labels, dict[str, float]]], after: dict[str, dict[Labels, dict[str, float]]]):
    """Metric -> labels -> (count added, sum added), for the series that moved."""
    changes: dict[str, dict[Labels, tuple[float, float]]] = {}
    for name, series in after.items():
        for labels, total in series.items():
            old = before.get(name, {}).get(labels, {"count": 0.0, "sum": 0.0})
            if total["count"] > old["count"]:
                changes.setdefault(name, {})[labels] = (total["count"] - old["count"], total["sum"] - old["sum"])
    return changes


def stuck_while_creates_fail(env, submit_job, readings: Readings) -> str:
    """A job that stays QUEUED past the stuck limit: every TPU create answers 503 until the
    reconciler's `job_stuck` has moved stuck_jobs{state=QUEUED}; then creates work again, and the
    reconciler, converging the stuck job, gets it going. Its id."""
    before = readings.totals("stuck_jobs").get((("state", "QUEUED"),), {"count": 0.0})["count"]
    control = env["control"]
    control.plan_errors("create", 503, count=FAILING_CREATES)
    try:
        job_id = submit_job(prefix="metrics-stuck", command="true")

        def stuck() -> bool:
            now = readings.totals("stuck_jobs").get((("state", "QUEUED"),), {"count": 0.0})["count"]
            return now > before

        stuck.__doc__ = f"{job_id} counted stuck (after {STUCK_AFTER_S:.0f} s) in the local Cloud Monitoring"
        wait_for(stuck, timeout=STUCK_AFTER_S + 150, interval=1.0)
        job = env["store"].get(job_id)
        assert job is not None and job.state is JobState.QUEUED, job
    finally:
        control.clear_faults()
    return job_id


def ended(env, job_id: str):
    def probe():
        job = env["store"].get(job_id)
        return job if job and job.state.is_terminal else None

    probe.__doc__ = f"{job_id} ended"
    return wait_for(probe, timeout=120)


def test_every_metric_moves_in_cloud_monitoring_when_the_stack_runs_jobs(env, submit_job, local_stack):
    """Each metric of infra/monitoring.tf gets a point from the functions, labels filled, with the values driven."""
    assert declared_metrics() == set(METRICS)
    readings = Readings(
        local_stack["TPUJOBS_MONITORING_ENDPOINT"],
        local_stack["GOOGLE_CLOUD_PROJECT"],
        local_stack.get("TPUJOBS_PREFIX", ""),
    )
    before = readings.snapshot()
    stuck = stuck_while_creates_fail(env, submit_job, readings)

    # A job preempted while attempt 1 waits, that succeeds at attempt 2; one that fails.
    recovered = submit_job(
        prefix="metrics-ok",
        command='test "$TPUJOBS_ATTEMPT" -ge 2 || exec sleep 600',
        on_preemption="rerun",
        max_restarts=2,
    )
    failed = submit_job(prefix="metrics-fail", command="exit 3", on_error="fail")

    def running_first_attempt():
        job = env["store"].get(recovered)
        return job if job and job.state is JobState.RUNNING and job.attempt == 1 else None

    job = wait_for(running_first_attempt, timeout=120)
    env["control"].call("POST", f"queuedResources/{env['zone']}/{job.queued_resource}:preempt", {})
    # A message no handler can use (rejected), and one that Pub/Sub gave up on (dead-lettered).
    env["publisher"].publish_bytes(topology.SUBMIT, b"{not json")
    env["publisher"].publish_bytes(
        topology.DEAD_LETTER,
        b'{"job_id": "never"}',
        {
            "CloudPubSubDeadLetterSourceSubscription": f"{topology.SUBMIT}--submit_job",
            "CloudPubSubDeadLetterSourceDeliveryCount": "5",
        },
    )
    assert ended(env, recovered).state is JobState.SUCCEEDED
    assert ended(env, failed).state is JobState.FAILED
    assert ended(env, stuck).state is JobState.SUCCEEDED  # the reconciler converged it once creates worked

    def all_moved() -> dict[str, dict[Labels, tuple[float, float]]] | None:
        changes = moved(before, readings.snapshot())
        return changes if set(changes) == set(METRICS) else None

    all_moved.__doc__ = "every metric moved in the local Cloud Monitoring"
    changes: dict[str, dict[Labels, tuple[float, float]]] = wait_for(all_moved, timeout=WRITTEN_WITHIN_S)

    for name, series in changes.items():
        for labels in series:
            assert {key for key, _ in labels} == set(METRICS[name].labels), (name, labels)
            assert all(value for _, value in labels), (name, labels)
    assert sum(count for count, _ in changes["jobs_submitted"].values()) >= 3
    assert any(dict(labels)["reason_class"] == "command_failed" for labels in changes["jobs_failed"])
    assert any(dict(labels)["state"] == "QUEUED" for labels in changes["stuck_jobs"])
    assert any(dict(labels)["topic"] == topology.SUBMIT for labels in changes["dead_letters"])
    (recovery_count, recovery_sum), *_ = changes["recovery_latency"].values()
    assert recovery_count >= 1 and recovery_sum > 0
    assert all(total > 0 for _, total in changes["chip_hours"].values())

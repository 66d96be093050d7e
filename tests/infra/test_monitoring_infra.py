"""infra/monitoring.tf held to the code's metrics, to itself, and to the provider's schema in depth.

What the functions write is tests/e2e/faults/test_metric_filters_e2e.py's; here: the descriptors are the
code's `engine.metrics.METRICS` exactly, every event is counted, no metric is log-based, every alert
reads a metric declared here (or Cloud Run's own request count), the dashboard's JSON renders and
names only those, only the functions' accounts may write time series, and the schema check
reaches the nested blocks these resources use.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import provider_schema
import pytest
from for_each import instances
from terraform_config import INFRA, Terraform, block
from test_provider_schema import problems

from tpujobs.engine import metric_events
from tpujobs.engine.metrics import METRICS, check_table, metric_type
from tpujobs.local.function_accounts import ACCOUNT_IDS

KINDS = {"counter": "INT64", "distribution": "DISTRIBUTION"}
USER_METRIC = metric_type("", "NAME").removesuffix("/NAME")
REQUEST_ERRORS = (
    'resource.type="cloud_run_revision" AND resource.labels.service_name=starts_with("${var.prefix}tpujobs-") '
    'AND metric.type="run.googleapis.com/request_count" AND metric.labels.response_code_class="5xx"'
)


def descriptors(tf: Terraform) -> dict[str, dict[str, Any]]:
    """Every metric descriptor by its name: the instances of each for_each over a local map."""
    found: dict[str, dict[str, Any]] = {}
    for resource in tf.of_kind("google_monitoring_metric_descriptor"):
        for name, body in instances(tf, "google_monitoring_metric_descriptor", resource).items():
            assert name not in found, f"metric {name} declared twice"
            found[name] = body
    return found


def test_no_metric_is_log_based(tf: Terraform) -> None:
    """No google_logging_metric anywhere: a log-based metric counts entries any log writer can forge."""
    assert not [key for key in tf.resources if key[0] == "google_logging_metric"]
    assert "logging.googleapis.com/user" not in (INFRA / "monitoring.tf").read_text(encoding="utf-8")
    assert "logging.googleapis.com/user" not in (INFRA / "monitoring_dashboard.json.tftpl").read_text(encoding="utf-8")


def test_the_metrics_are_cumulative_descriptors_counters_and_distributions(tf: Terraform) -> None:
    """Counters are CUMULATIVE INT64 and distributions CUMULATIVE DISTRIBUTION, each a for_each over a local map."""
    assert set(tf.of_kind("google_monitoring_metric_descriptor")) == set(KINDS)
    for resource, value_type in KINDS.items():
        made = instances(tf, "google_monitoring_metric_descriptor", resource)
        assert made, resource
        assert {(body["metric_kind"], body["value_type"]) for body in made.values()} == {("CUMULATIVE", value_type)}


def test_the_descriptors_are_the_metrics_the_code_writes(tf: Terraform) -> None:
    """Same names, types, kinds, units and labels as engine.metrics.METRICS; no more, no fewer."""
    found = descriptors(tf)
    assert set(found) == set(METRICS)
    assert tf.locals["user_metric"].replace("${var.prefix}", "") == USER_METRIC
    for name, body in found.items():
        metric = METRICS[name]
        assert body["type"] == "${local.user_metric}/" + name
        assert body["value_type"] == ("DISTRIBUTION" if metric.distribution else "INT64"), name
        assert body["unit"] == metric.unit, name
        labels = {label["key"]: label for label in body.get("labels", [])}
        assert set(labels) == set(metric.labels), name
        assert {label["value_type"] for label in labels.values()} <= {"STRING"}, name


def test_every_event_is_counted_and_every_label_is_a_field_of_its_events() -> None:
    """No event of metric_events goes uncounted; each metric's labels and value are fields its events carry."""
    counted = {event for metric in METRICS.values() for event in metric.events}
    assert set(metric_events.EVENTS) == counted, set(metric_events.EVENTS) ^ counted
    check_table()


def test_every_alert_reads_a_metric_of_this_file_and_notifies_the_channels(tf: Terraform) -> None:
    """Dead letters, stuck jobs, slow recovery, rejection bursts on our series; function errors on Cloud Run's 5xx."""
    policies = tf.of_kind("google_monitoring_alert_policy")
    assert set(policies) == {"dead_letters", "stuck_jobs", "recovery_latency", "rejection_burst", "function_errors"}
    for name, policy in policies.items():
        assert policy["notification_channels"] == "${var.alert_notification_channels}"
        condition = block(block(policy, "conditions"), "condition_threshold")
        assert "${local.alert_docs}" in block(policy, "documentation")["content"], name
        if name == "function_errors":
            assert condition["filter"] == "${local.function_errors}"
            continue
        metric = re.fullmatch(
            r'resource\.type="generic_task" AND metric\.type="\$\{local\.user_metric\}/([a-z_]+)"', condition["filter"]
        )
        assert metric and metric[1] in METRICS, (name, condition["filter"])
        assert block(condition, "aggregations")["per_series_aligner"] == "ALIGN_DELTA", name  # CUMULATIVE: the change
    assert tf.locals["function_errors"] == REQUEST_ERRORS
    assert '"Metrics and alerts"' in tf.locals["alert_docs"]
    recovery = block(block(policies["recovery_latency"], "conditions"), "condition_threshold")
    assert recovery["threshold_value"] == "${var.recovery_latency_p95_alert_seconds}"
    assert block(recovery, "aggregations")["cross_series_reducer"] == "REDUCE_PERCENTILE_95"


def test_the_dashboard_renders_to_json_naming_only_metrics_declared_here(tf: Terraform) -> None:
    """The template with its three values is a dashboard charting every metric of this file and the 5xx answers."""
    dashboard = tf.resource("google_monitoring_dashboard", "tpujobs")
    assert "monitoring_dashboard.json.tftpl" in dashboard["dashboard_json"]
    template = (INFRA / "monitoring_dashboard.json.tftpl").read_text(encoding="utf-8")
    assert set(re.findall(r"\$\{(\w+)\}", template)) == {"title", "metric", "prefix"}
    rendered = json.loads(
        template.replace("${title}", "tpujobs").replace("${metric}", USER_METRIC).replace("${prefix}", "")
    )
    filters = [
        data["timeSeriesQuery"]["timeSeriesFilter"]["filter"]
        for tile in rendered["mosaicLayout"]["tiles"]
        for data in tile["widget"]["xyChart"]["dataSets"]
    ]
    ours = [
        re.fullmatch(rf'resource\.type="generic_task" AND metric\.type="{USER_METRIC}/([a-z_]+)"', f) for f in filters
    ]
    assert {match[1] for match in ours if match} == set(METRICS)
    others = [f for f, match in zip(filters, ours, strict=True) if not match]
    assert others == [REQUEST_ERRORS.replace("${var.prefix}", "")]


def test_only_the_functions_accounts_may_write_time_series(tf: Terraform) -> None:
    """Every function's account holds roles/monitoring.metricWriter; no other grant names a Monitoring role."""
    writer = tf.resource("google_project_iam_member", "function_metric_writer")
    assert (writer["for_each"], writer["role"], writer["member"]) == (
        "${local.functions}",
        "roles/monitoring.metricWriter",
        "${google_service_account.function[each.key].member}",
    )
    monitoring_grants = {
        (kind, name)
        for (kind, name), body in tf.resources.items()
        if "monitoring" in str(body.get("role", "")) or "monitoring." in str(body.get("permissions", ""))
    }
    assert monitoring_grants == {("google_project_iam_member", "function_metric_writer")}


def test_the_local_stacks_function_accounts_are_infras(tf: Terraform) -> None:
    """tpujobs.local.function_accounts names each function's account as functions.tf does."""
    functions = tf.locals["functions"]
    assert {target: f["account"] for target, f in functions.items()} == ACCOUNT_IDS


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return provider_schema.load()


def test_the_schema_check_reaches_the_nested_blocks_of_metrics_and_alerts(schema: dict[str, Any], tf: Terraform):
    """A wrong name inside a descriptor's labels or a condition's aggregations is found."""
    descriptor = copy.deepcopy(descriptors(tf)["chip_hours"])
    assert problems(descriptor, schema["resource"]["google_monitoring_metric_descriptor"], "m") == []
    descriptor["labels"][0]["kind"] = "STRING"
    del descriptor["metric_kind"]
    found = problems(descriptor, schema["resource"]["google_monitoring_metric_descriptor"], "m")
    assert "m.labels: no argument or block 'kind'" in found
    assert "m: required argument 'metric_kind' is missing" in found

    policy = copy.deepcopy(tf.resource("google_monitoring_alert_policy", "recovery_latency"))
    assert problems(policy, schema["resource"]["google_monitoring_alert_policy"], "p") == []
    policy["conditions"][0]["condition_threshold"][0]["aggregations"][0]["reducer"] = "REDUCE_SUM"
    found = problems(policy, schema["resource"]["google_monitoring_alert_policy"], "p")
    assert found == ["p.conditions.condition_threshold.aggregations: no argument or block 'reducer'"]

"""infra/monitoring.tf held to the code's event table, to itself, and to the provider's schema in depth.

What its filters match is tests/e2e/test_metric_filters_e2e.py's; here: every event is counted,
every field named exists, every alert reads a metric declared here, the dashboard's JSON renders
and names only those metrics, and the schema check reaches the nested blocks these resources use.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import provider_schema
import pytest
from for_each import instances
from terraform_config import INFRA, Terraform, block, parse
from test_provider_schema import problems

from tpujobs.engine import metric_events

USER_METRIC = "logging.googleapis.com/user/tpujobs"


def metrics(tf: Terraform) -> dict[str, dict[str, Any]]:
    """Every log-based metric by its name: the instances of each for_each over a local map."""
    found: dict[str, dict[str, Any]] = {}
    for resource in tf.of_kind("google_logging_metric"):
        for name, body in instances(tf, "google_logging_metric", resource).items():
            assert name not in found, f"metric {name} declared twice"
            found[name] = body
    return found


def test_the_metrics_are_two_maps_counters_and_distributions(tf: Terraform) -> None:
    """Counters are INT64 and distributions DISTRIBUTION, each written once as a for_each over a local map."""
    assert set(tf.of_kind("google_logging_metric")) == {"counter", "distribution"}
    kinds = {"counter": "INT64", "distribution": "DISTRIBUTION"}
    for resource, value_type in kinds.items():
        made = instances(tf, "google_logging_metric", resource)
        assert made, resource
        assert {block(body, "metric_descriptor")["value_type"] for body in made.values()} == {value_type}
    assert set(metrics(tf)) >= {"jobs_submitted", "stuck_jobs", "function_errors", "recovery_latency", "chip_hours"}


def test_every_metric_declared_before_the_maps_is_moved_to_its_instance(tf: Terraform) -> None:
    """A `moved` block per metric, from its old address to its instance: an upgrade renames, never re-creates."""
    parsed = parse((INFRA / "monitoring.tf").read_text(encoding="utf-8"))
    moved = {entry["from"]: entry["to"] for entry in parsed.get("moved", [])}
    expected = {
        f"${{google_logging_metric.{name}}}": f'${{google_logging_metric.{resource}["{name}"]}}'
        for resource in ("counter", "distribution")
        for name in instances(tf, "google_logging_metric", resource)
    }
    assert moved == expected


def test_every_event_is_counted_and_every_field_named_is_in_the_table(tf: Terraform) -> None:
    """No event of metric_events goes uncounted; no filter or extractor names a field the code never writes."""
    text = (INFRA / "monitoring.tf").read_text(encoding="utf-8")
    counted = set()
    for body in metrics(tf).values():
        counted |= set(re.findall(r'"([a-z_]+)"', body["filter"].split("jsonPayload.event=", 1)[-1]))
    assert set(metric_events.EVENTS) <= counted, f"not counted: {set(metric_events.EVENTS) - counted}"
    named = set(re.findall(r"jsonPayload\.([A-Za-z_]+)", text))
    assert named <= {"event", *metric_events.FIELDS}, named - {"event", *metric_events.FIELDS}


def test_each_metric_is_named_under_the_prefix_and_declares_the_labels_it_extracts(tf: Terraform) -> None:
    """`{prefix}tpujobs/NAME` after its resource; labels declared = labels extracted; distributions have buckets."""
    for name, body in metrics(tf).items():
        assert body["name"] == f"${{var.prefix}}tpujobs/{name}"
        descriptor = block(body, "metric_descriptor")
        declared = {label["key"] for label in descriptor.get("labels", [])}
        assert declared == set(body.get("label_extractors", {})), name
        distribution = descriptor["value_type"] == "DISTRIBUTION"
        assert distribution == ("value_extractor" in body) == ("bucket_options" in body), name


def test_every_alert_reads_a_metric_of_this_file_and_notifies_the_channels(tf: Terraform) -> None:
    """Dead letters, stuck jobs, slow recovery, rejection bursts and function errors, each documented."""
    policies = tf.of_kind("google_monitoring_alert_policy")
    assert set(policies) == {"dead_letters", "stuck_jobs", "recovery_latency", "rejection_burst", "function_errors"}
    for name, policy in policies.items():
        assert policy["notification_channels"] == "${var.alert_notification_channels}"
        condition = block(block(policy, "conditions"), "condition_threshold")
        metric = re.search(r'metric\.type="\$\{local\.user_metric\}/([a-z_]+)"', condition["filter"])
        assert metric and metric[1] in metrics(tf), (name, condition["filter"])
        assert "${local.alert_docs}" in block(policy, "documentation")["content"], name
    assert '"Metrics and alerts"' in tf.locals["alert_docs"]
    recovery = block(block(policies["recovery_latency"], "conditions"), "condition_threshold")
    assert recovery["threshold_value"] == "${var.recovery_latency_p95_alert_seconds}"
    assert block(recovery, "aggregations")["cross_series_reducer"] == "REDUCE_PERCENTILE_95"


def test_the_dashboard_renders_to_json_naming_only_metrics_declared_here(tf: Terraform) -> None:
    """The template with its two values is a dashboard whose every chart reads a metric of this file."""
    dashboard = tf.resource("google_monitoring_dashboard", "tpujobs")
    assert "monitoring_dashboard.json.tftpl" in dashboard["dashboard_json"]
    template = (INFRA / "monitoring_dashboard.json.tftpl").read_text(encoding="utf-8")
    assert set(re.findall(r"\$\{(\w+)\}", template)) == {"title", "metric"}
    rendered = json.loads(template.replace("${title}", "tpujobs").replace("${metric}", USER_METRIC))
    tiles = rendered["mosaicLayout"]["tiles"]
    charted = {
        re.search(r'metric\.type="[^"]+/([a-z_]+)"', data["timeSeriesQuery"]["timeSeriesFilter"]["filter"])[1]
        for tile in tiles
        for data in tile["widget"]["xyChart"]["dataSets"]
    }
    assert charted == set(metrics(tf))


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    try:
        return provider_schema.load()
    except provider_schema.RegistryUnreachable as error:
        pytest.skip(f"the Google provider's schema could not be fetched: {error}")


def test_the_schema_check_reaches_the_nested_blocks_of_metrics_and_alerts(schema: dict[str, Any], tf: Terraform):
    """A wrong name inside metric_descriptor.labels, bucket_options' buckets or a condition's aggregations is found."""
    metric = copy.deepcopy(metrics(tf)["recovery_latency"])
    assert problems(metric, schema["resource"]["google_logging_metric"], "m") == []
    metric["metric_descriptor"][0]["labels"][0]["kind"] = "STRING"
    del metric["bucket_options"][0]["exponential_buckets"][0]["scale"]
    found = problems(metric, schema["resource"]["google_logging_metric"], "m")
    assert "m.metric_descriptor.labels: no argument or block 'kind'" in found
    assert "m.bucket_options.exponential_buckets: required argument 'scale' is missing" in found

    policy = copy.deepcopy(tf.resource("google_monitoring_alert_policy", "recovery_latency"))
    assert problems(policy, schema["resource"]["google_monitoring_alert_policy"], "p") == []
    policy["conditions"][0]["condition_threshold"][0]["aggregations"][0]["reducer"] = "REDUCE_SUM"
    found = problems(policy, schema["resource"]["google_monitoring_alert_policy"], "p")
    assert found == ["p.conditions.condition_threshold.aggregations: no argument or block 'reducer'"]

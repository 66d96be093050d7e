# Metrics, alerts and a dashboard, from what the functions write to Cloud Monitoring themselves.
#
# Each event that matters is one metric event where the engine commits it (the event names and
# fields are a table in tpujobs.engine.metric_events). Each function instance folds them into
# CUMULATIVE series of its own (tpujobs.engine.metrics: METRICS is the code's side of the maps
# below, held to them by tests/infra/test_monitoring_infra.py) and writes them with
# projects.timeSeries.create on a generic_task resource (task_id: the instance). Only the
# functions' accounts hold roles/monitoring.metricWriter (iam.tf), so no job can move a metric:
# the log-based metrics these replace counted entries any log writer could forge. Function
# errors are Cloud Run's own count of 5xx answers (run.googleapis.com/request_count), which only
# Google writes. tests/e2e/test_metric_filters_e2e.py reads every metric back from the local
# Cloud Monitoring after the stack has run jobs.
locals {
  # What a metric of this file is called in Cloud Monitoring (tpujobs.engine.metrics.metric_type).
  user_metric = "custom.googleapis.com/${var.prefix}tpujobs"
  alert_docs  = "docs/operations.md, \"Metrics and alerts\", says what it means and what to do."
  # The functions' answers with a 5xx status (a handler that raised), by Cloud Run.
  function_errors = "resource.type=\"cloud_run_revision\" AND resource.labels.service_name=starts_with(\"${var.prefix}tpujobs-\") AND metric.type=\"run.googleapis.com/request_count\" AND metric.labels.response_code_class=\"5xx\""

  # The labels the metrics share, and what each holds (a label is the event field of its name).
  family   = "The TPU family (v4, v5p, ...)."
  capacity = "spot or on-demand."

  # Counters (CUMULATIVE INT64), NAME = {description, labels}.
  counters = {
    jobs_submitted = {
      description = "Jobs accepted and recorded QUEUED."
      labels      = { family = local.family, capacity = local.capacity }
    }
    jobs_succeeded = {
      description = "Jobs that ended SUCCEEDED."
      labels      = { family = local.family }
    }
    jobs_failed = {
      description = "Jobs that ended FAILED, by what ended them (reason_class: command_failed, capacity_lost, ...)."
      labels = {
        reason_class = "The observation that ended the job (an EventKind value)."
        family       = local.family
      }
    }
    preemptions = {
      description = "Attempts that lost their capacity: preemption, hardware, a lost host."
      labels = {
        family   = local.family
        capacity = local.capacity
        source   = "Who saw it: agent (the host's notice), tpu (the API's state), reconciler."
      }
    }
    rejections = {
      description = "Messages refused and acknowledged (bad input, forged or unsigned, a job_id taken)."
      labels      = { topic = "The topic the message came on." }
    }
    dead_letters = {
      description = "Messages Pub/Sub gave up delivering, recorded in Firestore's dead_letters."
      labels      = { topic = "The topic the message was first published to." }
    }
    stuck_jobs = {
      description = "Jobs the reconciler found QUEUED or RECOVERING past the stuck limit and converged."
      labels      = { state = "The state the job was stuck in." }
    }
  }

  # Distributions (CUMULATIVE DISTRIBUTION), as counters with a unit; their buckets are the code's.
  distributions = {
    recovery_latency = {
      description = "Seconds from an attempt losing its capacity to the next attempt running."
      unit        = "s"
      labels      = { family = local.family }
    }
    queue_wait = {
      description = "Seconds an attempt waited QUEUED before admission let it in."
      unit        = "s"
      labels      = { family = local.family }
    }
    chip_hours = {
      description = "Chip-hours of each ended job over all its attempts; the sum is what was paid for."
      unit        = "h"
      labels = {
        owner  = "Who submitted the job."
        family = local.family
      }
    }
  }
}

# -- metrics: google_monitoring_metric_descriptor.counter["NAME"] and .distribution["NAME"] --
# The log-based metrics that were here (google_logging_metric.counter and .distribution) are
# gone, and Terraform deletes them: a job's log writes could move them.

resource "google_monitoring_metric_descriptor" "counter" {
  for_each = local.counters

  type         = "${local.user_metric}/${each.key}"
  display_name = "${var.prefix}tpujobs ${each.key}"
  description  = each.value.description
  metric_kind  = "CUMULATIVE"
  value_type   = "INT64"
  unit         = "1"
  dynamic "labels" {
    for_each = each.value.labels
    content {
      key         = labels.key
      value_type  = "STRING"
      description = labels.value
    }
  }
}

resource "google_monitoring_metric_descriptor" "distribution" {
  for_each = local.distributions

  type         = "${local.user_metric}/${each.key}"
  display_name = "${var.prefix}tpujobs ${each.key}"
  description  = each.value.description
  metric_kind  = "CUMULATIVE"
  value_type   = "DISTRIBUTION"
  unit         = each.value.unit
  dynamic "labels" {
    for_each = each.value.labels
    content {
      key         = labels.key
      value_type  = "STRING"
      description = labels.value
    }
  }
}

# -- alerts ---------------------------------------------------------------------------------

resource "google_monitoring_alert_policy" "dead_letters" {
  display_name          = "${var.prefix}tpujobs: dead letters"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  conditions {
    display_name = "A message was dead-lettered"
    condition_threshold {
      filter          = "resource.type=\"generic_task\" AND metric.type=\"${local.user_metric}/dead_letters\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.topic"]
      }
    }
  }
  alert_strategy {
    auto_close = "86400s"
  }
  documentation {
    subject   = "tpujobs: a message was dead-lettered"
    content   = "Pub/Sub gave up delivering a message after its retries. `tpujobs dead-letters` lists them; replay one once its cause is fixed. ${local.alert_docs}"
    mime_type = "text/markdown"
  }
  depends_on = [google_monitoring_metric_descriptor.counter]
}

resource "google_monitoring_alert_policy" "stuck_jobs" {
  display_name          = "${var.prefix}tpujobs: a job stuck past its limit"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  conditions {
    display_name = "The reconciler found stuck jobs"
    condition_threshold {
      filter          = "resource.type=\"generic_task\" AND metric.type=\"${local.user_metric}/stuck_jobs\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period     = "600s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.state"]
      }
    }
  }
  alert_strategy {
    auto_close = "3600s"
  }
  documentation {
    subject   = "tpujobs: a job is stuck"
    content   = "A job stayed QUEUED or RECOVERING past TPUJOBS_STUCK_AFTER_SECONDS. The job_stuck lines name it; `tpujobs describe JOB` shows why. ${local.alert_docs}"
    mime_type = "text/markdown"
  }
  depends_on = [google_monitoring_metric_descriptor.counter]
}

resource "google_monitoring_alert_policy" "recovery_latency" {
  display_name          = "${var.prefix}tpujobs: slow recovery"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  conditions {
    display_name = "Recovery latency p95 over ${var.recovery_latency_p95_alert_seconds} s"
    condition_threshold {
      filter          = "resource.type=\"generic_task\" AND metric.type=\"${local.user_metric}/recovery_latency\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.recovery_latency_p95_alert_seconds
      duration        = "0s"
      aggregations {
        alignment_period     = "3600s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_PERCENTILE_95"
      }
    }
  }
  alert_strategy {
    auto_close = "86400s"
  }
  documentation {
    subject   = "tpujobs: recovery after lost capacity is slow"
    content   = "Over the last hour, 95% of recoveries took longer than the threshold: capacity is scarce in the jobs' zones, or quota is full. ${local.alert_docs}"
    mime_type = "text/markdown"
  }
  depends_on = [google_monitoring_metric_descriptor.distribution]
}

resource "google_monitoring_alert_policy" "rejection_burst" {
  display_name          = "${var.prefix}tpujobs: burst of rejections"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  conditions {
    display_name = "More than ${var.rejection_burst_alert_count} rejections in 5 minutes"
    condition_threshold {
      filter          = "resource.type=\"generic_task\" AND metric.type=\"${local.user_metric}/rejections\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.rejection_burst_alert_count
      duration        = "0s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }
  alert_strategy {
    auto_close = "3600s"
  }
  documentation {
    subject   = "tpujobs: many messages refused"
    content   = "A client sends bad specs in a loop, or someone publishes forged messages. `tpujobs rejections` shows them. ${local.alert_docs}"
    mime_type = "text/markdown"
  }
  depends_on = [google_monitoring_metric_descriptor.counter]
}

resource "google_monitoring_alert_policy" "function_errors" {
  display_name          = "${var.prefix}tpujobs: function errors"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  conditions {
    display_name = "The tpujobs functions answered 5xx"
    condition_threshold {
      filter          = local.function_errors
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["resource.label.service_name"]
      }
    }
  }
  alert_strategy {
    auto_close = "3600s"
  }
  documentation {
    subject   = "tpujobs: a function failed requests"
    content   = "A function answered 5xx (a handler raised). Read its ERROR entries in Logs Explorer (the service_name label names it). ${local.alert_docs}"
    mime_type = "text/markdown"
  }
}

# -- the dashboard --------------------------------------------------------------------------

resource "google_monitoring_dashboard" "tpujobs" {
  dashboard_json = templatefile("${path.module}/monitoring_dashboard.json.tftpl", {
    title  = "${var.prefix}tpujobs"
    metric = local.user_metric
    prefix = var.prefix
  })
  depends_on = [google_monitoring_metric_descriptor.counter, google_monitoring_metric_descriptor.distribution]
}

# Metrics, alerts and a dashboard, from the functions' own log lines.
#
# Each event that matters writes one structured line (tpujobs.engine.metric_events: the event
# names and fields are a table there). Cloud Functions (2nd gen) run on Cloud Run, so their
# entries have resource.type "cloud_run_revision" and the function's name as
# resource.labels.service_name. tests/e2e/test_metric_filters_e2e.py runs every filter and
# extractor below over the lines the local stack writes (tpujobs.local.log_filters reads the
# subset of the query language used here and refuses the rest): keep to that subset.
locals {
  tpujobs_logs = "resource.type=\"cloud_run_revision\" AND resource.labels.service_name=~\"^${var.prefix}tpujobs-\""
  # What a log-based metric of this file is called in Cloud Monitoring.
  user_metric = "logging.googleapis.com/user/${var.prefix}tpujobs"
  alert_docs  = "docs/operations.md, \"Metrics and alerts\", says what it means and what to do."
}

# -- counts ---------------------------------------------------------------------------------

resource "google_logging_metric" "jobs_submitted" {
  name        = "${var.prefix}tpujobs/jobs_submitted"
  description = "Jobs accepted and recorded QUEUED."
  filter      = "${local.tpujobs_logs} AND jsonPayload.event=\"job_submitted\""
  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
    labels {
      key         = "family"
      description = "The TPU family (v4, v5p, ...)."
    }
    labels {
      key         = "capacity"
      description = "spot or on-demand."
    }
  }
  label_extractors = {
    family   = "EXTRACT(jsonPayload.family)"
    capacity = "EXTRACT(jsonPayload.capacity)"
  }
}

resource "google_logging_metric" "jobs_succeeded" {
  name        = "${var.prefix}tpujobs/jobs_succeeded"
  description = "Jobs that ended SUCCEEDED."
  filter      = "${local.tpujobs_logs} AND jsonPayload.event=\"job_succeeded\""
  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
    labels {
      key         = "family"
      description = "The TPU family (v4, v5p, ...)."
    }
  }
  label_extractors = {
    family = "EXTRACT(jsonPayload.family)"
  }
}

resource "google_logging_metric" "jobs_failed" {
  name        = "${var.prefix}tpujobs/jobs_failed"
  description = "Jobs that ended FAILED, by what ended them (reason_class: command_failed, capacity_lost, time_limit_reached, hung, ...)."
  filter      = "${local.tpujobs_logs} AND jsonPayload.event=\"job_failed\""
  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
    labels {
      key         = "reason_class"
      description = "The observation that ended the job (an EventKind value)."
    }
    labels {
      key         = "family"
      description = "The TPU family (v4, v5p, ...)."
    }
  }
  label_extractors = {
    reason_class = "EXTRACT(jsonPayload.reason_class)"
    family       = "EXTRACT(jsonPayload.family)"
  }
}

resource "google_logging_metric" "preemptions" {
  name        = "${var.prefix}tpujobs/preemptions"
  description = "Attempts that lost their capacity: preemption, hardware, a lost host."
  filter      = "${local.tpujobs_logs} AND jsonPayload.event=\"preempted\""
  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
    labels {
      key         = "family"
      description = "The TPU family (v4, v5p, ...)."
    }
    labels {
      key         = "capacity"
      description = "spot or on-demand."
    }
    labels {
      key         = "source"
      description = "Who saw it: agent (the host's notice), tpu (the API's state) or reconciler."
    }
  }
  label_extractors = {
    family   = "EXTRACT(jsonPayload.family)"
    capacity = "EXTRACT(jsonPayload.capacity)"
    source   = "EXTRACT(jsonPayload.source)"
  }
}

resource "google_logging_metric" "rejections" {
  name        = "${var.prefix}tpujobs/rejections"
  description = "Messages refused and acknowledged (bad input, forged or unsigned, a job_id taken); a flood of forgeries writes one line a minute per topic and reason."
  filter      = "${local.tpujobs_logs} AND jsonPayload.event=\"rejected\""
  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
    labels {
      key         = "topic"
      description = "The topic the message came on."
    }
  }
  label_extractors = {
    topic = "EXTRACT(jsonPayload.topic)"
  }
}

resource "google_logging_metric" "dead_letters" {
  name        = "${var.prefix}tpujobs/dead_letters"
  description = "Messages Pub/Sub gave up delivering, recorded in Firestore's dead_letters."
  filter      = "${local.tpujobs_logs} AND jsonPayload.event=\"dead_lettered\""
  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
    labels {
      key         = "topic"
      description = "The topic the message was first published to."
    }
  }
  label_extractors = {
    topic = "EXTRACT(jsonPayload.topic)"
  }
}

resource "google_logging_metric" "stuck_jobs" {
  name        = "${var.prefix}tpujobs/stuck_jobs"
  description = "Jobs the reconciler found QUEUED or RECOVERING past the stuck limit (TPUJOBS_STUCK_AFTER_SECONDS) and converged."
  filter      = "${local.tpujobs_logs} AND jsonPayload.event=\"job_stuck\""
  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
    labels {
      key         = "state"
      description = "The state the job was stuck in."
    }
  }
  label_extractors = {
    state = "EXTRACT(jsonPayload.state)"
  }
}

resource "google_logging_metric" "function_errors" {
  name        = "${var.prefix}tpujobs/function_errors"
  description = "Entries of severity ERROR or worse from the tpujobs functions: a handler that raised, an export that failed."
  filter      = "${local.tpujobs_logs} AND severity>=ERROR"
  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
    labels {
      key         = "function"
      description = "The function's Cloud Run service."
    }
  }
  label_extractors = {
    function = "EXTRACT(resource.labels.service_name)"
  }
}

# -- distributions --------------------------------------------------------------------------

resource "google_logging_metric" "recovery_latency" {
  name            = "${var.prefix}tpujobs/recovery_latency"
  description     = "Seconds from an attempt losing its capacity to the next attempt running."
  filter          = "${local.tpujobs_logs} AND jsonPayload.event=\"recovered\""
  value_extractor = "EXTRACT(jsonPayload.recovery_seconds)"
  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "DISTRIBUTION"
    unit        = "s"
    labels {
      key         = "family"
      description = "The TPU family (v4, v5p, ...)."
    }
  }
  label_extractors = {
    family = "EXTRACT(jsonPayload.family)"
  }
  bucket_options {
    exponential_buckets { # 1 s to about 36 h
      num_finite_buckets = 36
      growth_factor      = 1.5
      scale              = 1
    }
  }
}

resource "google_logging_metric" "queue_wait" {
  name            = "${var.prefix}tpujobs/queue_wait"
  description     = "Seconds an attempt waited QUEUED before admission let it in."
  filter          = "${local.tpujobs_logs} AND jsonPayload.event=\"admitted\""
  value_extractor = "EXTRACT(jsonPayload.queue_wait_seconds)"
  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "DISTRIBUTION"
    unit        = "s"
    labels {
      key         = "family"
      description = "The TPU family (v4, v5p, ...)."
    }
  }
  label_extractors = {
    family = "EXTRACT(jsonPayload.family)"
  }
  bucket_options {
    exponential_buckets { # 0.1 s to about 5 days
      num_finite_buckets = 40
      growth_factor      = 1.6
      scale              = 0.1
    }
  }
}

resource "google_logging_metric" "chip_hours" {
  name            = "${var.prefix}tpujobs/chip_hours"
  description     = "Chip-hours of each ended job over all its attempts; the sum is what was paid for."
  filter          = "${local.tpujobs_logs} AND jsonPayload.event=(\"job_succeeded\" OR \"job_failed\" OR \"job_cancelled\")"
  value_extractor = "EXTRACT(jsonPayload.chip_hours)"
  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "DISTRIBUTION"
    unit        = "h"
    labels {
      key         = "owner"
      description = "Who submitted the job."
    }
    labels {
      key         = "family"
      description = "The TPU family (v4, v5p, ...)."
    }
  }
  label_extractors = {
    owner  = "EXTRACT(jsonPayload.owner)"
    family = "EXTRACT(jsonPayload.family)"
  }
  bucket_options {
    exponential_buckets { # 0.001 to about 67,000 chip-hours
      num_finite_buckets = 24
      growth_factor      = 2
      scale              = 0.001
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
      filter          = "resource.type=\"cloud_run_revision\" AND metric.type=\"${local.user_metric}/dead_letters\""
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
  depends_on = [google_logging_metric.dead_letters]
}

resource "google_monitoring_alert_policy" "stuck_jobs" {
  display_name          = "${var.prefix}tpujobs: a job stuck past its limit"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  conditions {
    display_name = "The reconciler found stuck jobs"
    condition_threshold {
      filter          = "resource.type=\"cloud_run_revision\" AND metric.type=\"${local.user_metric}/stuck_jobs\""
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
  depends_on = [google_logging_metric.stuck_jobs]
}

resource "google_monitoring_alert_policy" "recovery_latency" {
  display_name          = "${var.prefix}tpujobs: slow recovery"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  conditions {
    display_name = "Recovery latency p95 over ${var.recovery_latency_p95_alert_seconds} s"
    condition_threshold {
      filter          = "resource.type=\"cloud_run_revision\" AND metric.type=\"${local.user_metric}/recovery_latency\""
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
  depends_on = [google_logging_metric.recovery_latency]
}

resource "google_monitoring_alert_policy" "rejection_burst" {
  display_name          = "${var.prefix}tpujobs: burst of rejections"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  conditions {
    display_name = "More than ${var.rejection_burst_alert_count} rejections in 5 minutes"
    condition_threshold {
      filter          = "resource.type=\"cloud_run_revision\" AND metric.type=\"${local.user_metric}/rejections\""
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
  depends_on = [google_logging_metric.rejections]
}

resource "google_monitoring_alert_policy" "function_errors" {
  display_name          = "${var.prefix}tpujobs: function errors"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  conditions {
    display_name = "The tpujobs functions logged errors"
    condition_threshold {
      filter          = "resource.type=\"cloud_run_revision\" AND metric.type=\"${local.user_metric}/function_errors\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.function"]
      }
    }
  }
  alert_strategy {
    auto_close = "3600s"
  }
  documentation {
    subject   = "tpujobs: a function logged an error"
    content   = "Read the function's ERROR entries in Logs Explorer (the function label names it). ${local.alert_docs}"
    mime_type = "text/markdown"
  }
  depends_on = [google_logging_metric.function_errors]
}

# -- the dashboard --------------------------------------------------------------------------

resource "google_monitoring_dashboard" "tpujobs" {
  dashboard_json = templatefile("${path.module}/monitoring_dashboard.json.tftpl", {
    title  = "${var.prefix}tpujobs"
    metric = local.user_metric
  })
  depends_on = [
    google_logging_metric.jobs_submitted,
    google_logging_metric.jobs_succeeded,
    google_logging_metric.jobs_failed,
    google_logging_metric.preemptions,
    google_logging_metric.rejections,
    google_logging_metric.dead_letters,
    google_logging_metric.stuck_jobs,
    google_logging_metric.function_errors,
    google_logging_metric.recovery_latency,
    google_logging_metric.queue_wait,
    google_logging_metric.chip_hours,
  ]
}

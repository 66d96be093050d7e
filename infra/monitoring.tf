# Metrics, alerts and a dashboard, from the functions' own log lines.
#
# Each event that matters writes one structured line (tpujobs.engine.metric_events: the event
# names and fields are a table there). Cloud Functions (2nd gen) run on Cloud Run, so their
# entries have resource.type "cloud_run_revision" and the function's name as
# resource.labels.service_name. tests/e2e/test_metric_filters_e2e.py runs every filter and
# extractor below over the lines the local stack writes (tpujobs.local.log_filters reads the
# subset of the query language used here and refuses the rest): keep to that subset.
# The metrics are two maps in locals (counters, distributions), each one for_each resource:
# a new metric is a new entry; tests/infra/for_each.py expands them as Terraform plans them.
locals {
  tpujobs_logs = "resource.type=\"cloud_run_revision\" AND resource.labels.service_name=~\"^${var.prefix}tpujobs-\""
  # What a log-based metric of this file is called in Cloud Monitoring.
  user_metric = "logging.googleapis.com/user/${var.prefix}tpujobs"
  alert_docs  = "docs/operations.md, \"Metrics and alerts\", says what it means and what to do."

  # The labels the metrics share: each one's description and where an entry has it.
  family   = { description = "The TPU family (v4, v5p, ...).", extractor = "EXTRACT(jsonPayload.family)" }
  capacity = { description = "spot or on-demand.", extractor = "EXTRACT(jsonPayload.capacity)" }

  # Counters, NAME = {description, what the entries match (after local.tpujobs_logs), labels}.
  log_counters = {
    jobs_submitted = {
      description = "Jobs accepted and recorded QUEUED."
      match       = "jsonPayload.event=\"job_submitted\""
      labels      = { family = local.family, capacity = local.capacity }
    }
    jobs_succeeded = {
      description = "Jobs that ended SUCCEEDED."
      match       = "jsonPayload.event=\"job_succeeded\""
      labels      = { family = local.family }
    }
    jobs_failed = {
      description = "Jobs that ended FAILED, by what ended them (reason_class: command_failed, capacity_lost, time_limit_reached, hung, ...)."
      match       = "jsonPayload.event=\"job_failed\""
      labels = {
        reason_class = { description = "The observation that ended the job (an EventKind value).", extractor = "EXTRACT(jsonPayload.reason_class)" }
        family       = local.family
      }
    }
    preemptions = {
      description = "Attempts that lost their capacity: preemption, hardware, a lost host."
      match       = "jsonPayload.event=\"preempted\""
      labels = {
        family   = local.family
        capacity = local.capacity
        source   = { description = "Who saw it: agent (the host's notice), tpu (the API's state) or reconciler.", extractor = "EXTRACT(jsonPayload.source)" }
      }
    }
    rejections = {
      description = "Messages refused and acknowledged (bad input, forged or unsigned, a job_id taken); a flood of forgeries writes one line a minute per topic and reason."
      match       = "jsonPayload.event=\"rejected\""
      labels      = { topic = { description = "The topic the message came on.", extractor = "EXTRACT(jsonPayload.topic)" } }
    }
    dead_letters = {
      description = "Messages Pub/Sub gave up delivering, recorded in Firestore's dead_letters."
      match       = "jsonPayload.event=\"dead_lettered\""
      labels      = { topic = { description = "The topic the message was first published to.", extractor = "EXTRACT(jsonPayload.topic)" } }
    }
    stuck_jobs = {
      description = "Jobs the reconciler found QUEUED or RECOVERING past the stuck limit (TPUJOBS_STUCK_AFTER_SECONDS) and converged."
      match       = "jsonPayload.event=\"job_stuck\""
      labels      = { state = { description = "The state the job was stuck in.", extractor = "EXTRACT(jsonPayload.state)" } }
    }
    function_errors = {
      description = "Entries of severity ERROR or worse from the tpujobs functions: a handler that raised, an export that failed."
      match       = "severity>=ERROR"
      labels      = { function = { description = "The function's Cloud Run service.", extractor = "EXTRACT(resource.labels.service_name)" } }
    }
  }

  # Distributions: as counters, with the value an entry carries, its unit and exponential buckets.
  log_distributions = {
    recovery_latency = {
      description = "Seconds from an attempt losing its capacity to the next attempt running."
      match       = "jsonPayload.event=\"recovered\""
      value       = "EXTRACT(jsonPayload.recovery_seconds)"
      unit        = "s"
      buckets     = { count = 36, growth = 1.5, scale = 1 } # 1 s to about 36 h
      labels      = { family = local.family }
    }
    queue_wait = {
      description = "Seconds an attempt waited QUEUED before admission let it in."
      match       = "jsonPayload.event=\"admitted\""
      value       = "EXTRACT(jsonPayload.queue_wait_seconds)"
      unit        = "s"
      buckets     = { count = 40, growth = 1.6, scale = 0.1 } # 0.1 s to about 5 days
      labels      = { family = local.family }
    }
    chip_hours = {
      description = "Chip-hours of each ended job over all its attempts; the sum is what was paid for."
      match       = "jsonPayload.event=(\"job_succeeded\" OR \"job_failed\" OR \"job_cancelled\")"
      value       = "EXTRACT(jsonPayload.chip_hours)"
      unit        = "h"
      buckets     = { count = 24, growth = 2, scale = 0.001 } # 0.001 to about 67,000 chip-hours
      labels = {
        owner  = { description = "Who submitted the job.", extractor = "EXTRACT(jsonPayload.owner)" }
        family = local.family
      }
    }
  }
}

# -- metrics: google_logging_metric.counter["NAME"] and .distribution["NAME"] ----------------

resource "google_logging_metric" "counter" {
  for_each = local.log_counters

  name        = "${var.prefix}tpujobs/${each.key}"
  description = each.value.description
  filter      = "${local.tpujobs_logs} AND ${each.value.match}"
  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
    dynamic "labels" {
      for_each = each.value.labels
      content {
        key         = labels.key
        description = labels.value.description
      }
    }
  }
  label_extractors = { for key, label in each.value.labels : key => label.extractor }
}

resource "google_logging_metric" "distribution" {
  for_each = local.log_distributions

  name            = "${var.prefix}tpujobs/${each.key}"
  description     = each.value.description
  filter          = "${local.tpujobs_logs} AND ${each.value.match}"
  value_extractor = each.value.value
  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "DISTRIBUTION"
    unit        = each.value.unit
    dynamic "labels" {
      for_each = each.value.labels
      content {
        key         = labels.key
        description = labels.value.description
      }
    }
  }
  label_extractors = { for key, label in each.value.labels : key => label.extractor }
  bucket_options {
    exponential_buckets {
      num_finite_buckets = each.value.buckets.count
      growth_factor      = each.value.buckets.growth
      scale              = each.value.buckets.scale
    }
  }
}

# Where each metric was declared before the two maps: moved, not destroyed and made again.
moved {
  from = google_logging_metric.jobs_submitted
  to   = google_logging_metric.counter["jobs_submitted"]
}
moved {
  from = google_logging_metric.jobs_succeeded
  to   = google_logging_metric.counter["jobs_succeeded"]
}
moved {
  from = google_logging_metric.jobs_failed
  to   = google_logging_metric.counter["jobs_failed"]
}
moved {
  from = google_logging_metric.preemptions
  to   = google_logging_metric.counter["preemptions"]
}
moved {
  from = google_logging_metric.rejections
  to   = google_logging_metric.counter["rejections"]
}
moved {
  from = google_logging_metric.dead_letters
  to   = google_logging_metric.counter["dead_letters"]
}
moved {
  from = google_logging_metric.stuck_jobs
  to   = google_logging_metric.counter["stuck_jobs"]
}
moved {
  from = google_logging_metric.function_errors
  to   = google_logging_metric.counter["function_errors"]
}
moved {
  from = google_logging_metric.recovery_latency
  to   = google_logging_metric.distribution["recovery_latency"]
}
moved {
  from = google_logging_metric.queue_wait
  to   = google_logging_metric.distribution["queue_wait"]
}
moved {
  from = google_logging_metric.chip_hours
  to   = google_logging_metric.distribution["chip_hours"]
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
  depends_on = [google_logging_metric.counter]
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
  depends_on = [google_logging_metric.counter]
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
  depends_on = [google_logging_metric.distribution]
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
  depends_on = [google_logging_metric.counter]
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
  depends_on = [google_logging_metric.counter]
}

# -- the dashboard --------------------------------------------------------------------------

resource "google_monitoring_dashboard" "tpujobs" {
  dashboard_json = templatefile("${path.module}/monitoring_dashboard.json.tftpl", {
    title  = "${var.prefix}tpujobs"
    metric = local.user_metric
  })
  depends_on = [google_logging_metric.counter, google_logging_metric.distribution]
}

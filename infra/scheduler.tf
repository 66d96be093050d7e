# The reconcile tick: once a minute a message on tpujobs-reconcile (its content is ignored).
resource "google_cloud_scheduler_job" "reconcile" {
  name        = "${var.prefix}tpujobs-reconcile"
  region      = var.region
  description = "tpujobs reconciler tick: repair what events missed."
  schedule    = var.reconcile_schedule
  time_zone   = "Etc/UTC"

  pubsub_target {
    topic_name = google_pubsub_topic.topic["tpujobs-reconcile"].id
    data       = base64encode("{\"tick\": true}")
  }

  retry_config {
    retry_count = 0 # the next tick is a minute away
  }

  depends_on = [google_project_service.api]
}

# TPU audit logs of queued resources created or deleted, as they finish, to tpujobs-qr-state:
# a state change is seen at once instead of at the next reconcile tick. Admin-activity audit
# logs are always on, so nothing needs enabling.
resource "google_logging_project_sink" "qr_state" {
  name        = "${var.prefix}tpujobs-qr-state"
  description = "TPU queued-resource create and delete, finished, to the tpujobs-qr-state topic."
  destination = "pubsub.googleapis.com/${google_pubsub_topic.topic["tpujobs-qr-state"].id}"
  filter = join(" AND ", [
    "protoPayload.serviceName=\"tpu.googleapis.com\"",
    "protoPayload.methodName=~\"\\.(Create|Delete)QueuedResource$\"",
    "operation.last=true",
  ])
  unique_writer_identity = true
}

resource "google_pubsub_topic_iam_member" "qr_state_sink_publisher" {
  topic  = google_pubsub_topic.topic["tpujobs-qr-state"].id
  role   = "roles/pubsub.publisher"
  member = google_logging_project_sink.qr_state.writer_identity
}

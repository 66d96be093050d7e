# TPU audit logs of queued resources created or deleted, as they finish, to tpujobs-qr-state:
# a state change is seen at once instead of at the next reconcile tick. Admin-activity audit
# logs are always on, so nothing needs enabling.
# The filter pins logName to this project's admin-activity audit log, which only Google writes:
# every job account holds roles/logging.logWriter (job_output.tf), and an entry a job writes
# elsewhere, shaped like a TPU audit entry, must not reach the topic. on_qr_state checks the
# entry's log, project, holding and zone again (tpujobs.engine.jobs.audit_entries).
resource "google_logging_project_sink" "qr_state" {
  name        = "${var.prefix}tpujobs-qr-state"
  description = "TPU queued-resource create and delete, finished, to the tpujobs-qr-state topic."
  destination = "pubsub.googleapis.com/${google_pubsub_topic.topic["tpujobs-qr-state"].id}"
  filter = join(" AND ", [
    "logName=\"projects/${var.project}/logs/cloudaudit.googleapis.com%2Factivity\"",
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

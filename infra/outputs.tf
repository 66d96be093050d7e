output "topics" {
  description = "Every tpujobs topic: contract name -> deployed full name."
  value       = { for base, topic in google_pubsub_topic.topic : base => topic.id }
}

output "submit_topic" {
  description = "Where jobs are submitted (gcloud pubsub topics publish ...)."
  value       = google_pubsub_topic.topic["tpujobs-submit"].name
}

output "api_url" {
  description = "The jobs HTTP API (list, describe, cancel): TPUJOBS_API_URL for the CLI."
  value       = google_cloudfunctions2_function.function["jobs"].service_config[0].uri
}

output "logs_bucket" {
  description = "TPUJOBS_LOGS_BUCKET: job output, exported logs, checkpoints, uploaded code."
  value       = google_storage_bucket.logs.name
}

output "tpu_vm_service_account" {
  description = "The account TPU worker hosts run as."
  value       = google_service_account.tpu_vm.email
}

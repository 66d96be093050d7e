output "topics" {
  description = "Every tpujobs topic: base name -> deployed full name."
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

output "job_service_accounts" {
  description = "The accounts a job may name in its spec (`service_account`), id -> email: what config/service_accounts in Firestore allows owners to use."
  value       = { for id, account in google_service_account.job : id => account.email }
}

output "report_key_secret" {
  description = "The Secret Manager secret that holds the report-signing key; add its value with gcloud (infra/README.md)."
  value       = google_secret_manager_secret.report_key.secret_id
}

# The APIs tpujobs uses. Left enabled on destroy: other things in the project may need them.
locals {
  apis = [
    "artifactregistry.googleapis.com",     # function images
    "cloudbuild.googleapis.com",           # builds the functions from the bundle
    "cloudfunctions.googleapis.com",       # 2nd-gen functions
    "cloudresourcemanager.googleapis.com", # the project number
    "cloudscheduler.googleapis.com",       # the reconcile tick
    "compute.googleapis.com",              # TPU VMs as instances and MIGs (platform: compute)
    "firestore.googleapis.com",            # jobs, events, workers, rejections, dead letters
    "iam.googleapis.com",                  # service accounts
    "logging.googleapis.com",              # the TPU audit-log sink; job output (job_output.tf)
    "monitoring.googleapis.com",           # log-based metrics, alert policies, the dashboard
    "pubsub.googleapis.com",               # every topic and push subscription
    "run.googleapis.com",                  # 2nd-gen functions run on Cloud Run
    "secretmanager.googleapis.com",        # the report-signing key; jobs' own secrets
    "storage.googleapis.com",              # logs and staging buckets
    "tpu.googleapis.com",                  # queued resources
  ]
}

resource "google_project_service" "api" {
  for_each = toset(local.apis)

  project            = var.project
  service            = each.key
  disable_on_destroy = false
}

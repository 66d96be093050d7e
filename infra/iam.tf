# Least privilege: each function's account gets only what its code calls (the table in
# functions.tf), the TPU VMs get their own account, and nothing is granted to a default one.
locals {
  job_engine_functions = { for target, f in local.functions : target => f if f.job_engine }

  function_publishes = merge([
    for target, f in local.functions : {
      for topic in f.publishes : "${target}/${topic}" => { target = target, topic = topic }
    }
  ]...)

  # The worker agent reports and flushes output; nothing else runs as the TPU VMs' account.
  tpu_vm_publishes = ["tpujobs-worker-events", "tpujobs-preemption"]

  build_roles = [
    "roles/logging.logWriter",       # build logs
    "roles/artifactregistry.writer", # the function images
    "roles/storage.objectViewer",    # the source, copied by Cloud Functions to a bucket it names itself
  ]
}

# Firestore has project-level IAM only.
resource "google_project_iam_member" "function_firestore" {
  for_each = local.functions

  project = var.project
  role    = each.value.firestore
  member  = google_service_account.function[each.key].member
}

# Queued resources have no resource-level IAM: the functions that create and delete them get
# the TPU role for the project; no other function does.
resource "google_project_iam_member" "function_tpu" {
  for_each = local.job_engine_functions

  project = var.project
  role    = "roles/tpu.admin"
  member  = google_service_account.function[each.key].member
}

# Creating a queued resource whose nodes run as the TPU VM account needs actAs on that account.
resource "google_service_account_iam_member" "function_acts_as_tpu_vm" {
  for_each = local.job_engine_functions

  service_account_id = google_service_account.tpu_vm.id
  role               = "roles/iam.serviceAccountUser"
  member             = google_service_account.function[each.key].member
}

resource "google_pubsub_topic_iam_member" "function_publisher" {
  for_each = local.function_publishes

  topic  = google_pubsub_topic.topic[each.value.topic].id
  role   = "roles/pubsub.publisher"
  member = google_service_account.function[each.value.target].member
}

resource "google_storage_bucket_iam_member" "function_logs" {
  for_each = { for target, f in local.functions : target => f if f.logs != null }

  bucket = google_storage_bucket.logs.name
  role   = each.value.logs
  member = google_service_account.function[each.key].member
}

resource "google_service_account" "tpu_vm" {
  account_id   = "${var.prefix}tpujobs-tpu-vm"
  display_name = "tpujobs TPU VMs"
  description  = "The TPU worker hosts: report to tpujobs and keep output and checkpoints in the logs bucket, nothing else."
}

resource "google_pubsub_topic_iam_member" "tpu_vm_publisher" {
  for_each = toset(local.tpu_vm_publishes)

  topic  = google_pubsub_topic.topic[each.key].id
  role   = "roles/pubsub.publisher"
  member = google_service_account.tpu_vm.member
}

# objectUser, not objectCreator: the agent also reads the code the CLI uploaded, the job
# reads its checkpoints on resume, and a retried upload overwrites its object.
resource "google_storage_bucket_iam_member" "tpu_vm_logs" {
  bucket = google_storage_bucket.logs.name
  role   = "roles/storage.objectUser"
  member = google_service_account.tpu_vm.member
}

resource "google_project_iam_member" "build" {
  for_each = toset(local.build_roles)

  project = var.project
  role    = each.key
  member  = google_service_account.build.member
}

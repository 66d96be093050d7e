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

  # Every account a job's TPU VMs may run as, by account id (the local part of its email): the
  # deployment's default (tpu_vm) and each of var.job_service_accounts. Ids are unique, since
  # job account ids may not start with "tpujobs", and none holds "_" (secrets.tf relies on it).
  job_accounts = merge(
    { "${var.prefix}tpujobs-tpu-vm" = google_service_account.tpu_vm },
    { for id, account in google_service_account.job : "${var.prefix}${id}" => account },
  )

  # Each job account named in var.job_service_accounts publishes what the default one does.
  job_account_publishes = {
    for pair in setproduct(keys(var.job_service_accounts), local.tpu_vm_publishes) :
    "${pair[0]}/${pair[1]}" => { account = pair[0], topic = pair[1] }
  }

  # Each VM account may pull from each repository of var.image_repositories.
  image_pulls = {
    for pair in setproduct(keys(local.job_accounts), var.image_repositories) :
    "${pair[0]}/${pair[1]}" => { account = pair[0], location = split("/", pair[1])[0], repository = split("/", pair[1])[1] }
  }

  # Each job-engine function may attach each of them to the queued resources it creates.
  job_engine_acts_as = {
    for pair in setproduct(keys(local.job_engine_functions), keys(var.job_service_accounts)) :
    "${pair[0]}/${pair[1]}" => { target = pair[0], account = pair[1] }
  }

  # What the job-engine functions call on Cloud TPU (shared/tpujobs/adapters/tpu.py), and
  # nothing more. Queued resources have no permissions of their own: Cloud TPU checks the
  # node permissions for them (queuedResources.reset needs tpu.nodes.reset; roles/tpu.admin,
  # which is `tpu.*`, holds no tpu.queuedResources.* permission).
  tpu_permissions = [
    "tpu.nodes.create",   # create_queued_resource
    "tpu.nodes.delete",   # delete_queued_resource (force: its nodes go too)
    "tpu.nodes.get",      # get_queued_resource
    "tpu.nodes.list",     # list_queued_resources, list_nodes
    "tpu.nodes.update",   # update_node: a warm pool unit's assignment, in its node metadata
    "tpu.operations.get", # get_operation: the error of a create that failed (create_error)
  ]

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
# the TPU permissions they call, for the project; no other function does. Not roles/tpu.admin:
# it also starts, stops, reimages and updates nodes, and manages their tags.
resource "google_project_iam_custom_role" "tpu" {
  role_id     = "${replace(var.prefix, "-", "_")}tpujobsQueuedResources"
  title       = "tpujobs queued resources"
  description = "Create, read, list and delete TPU queued resources and their nodes: what the tpujobs functions call."
  permissions = local.tpu_permissions
}

resource "google_project_iam_member" "function_tpu" {
  for_each = local.job_engine_functions

  project = var.project
  role    = google_project_iam_custom_role.tpu.id
  member  = google_service_account.function[each.key].member
}

# Creating a queued resource whose nodes run as the TPU VM account needs actAs on that account.
resource "google_service_account_iam_member" "function_acts_as_tpu_vm" {
  for_each = local.job_engine_functions

  service_account_id = google_service_account.tpu_vm.id
  role               = "roles/iam.serviceAccountUser"
  member             = google_service_account.function[each.key].member
}

# The same for each account of var.job_service_accounts that a job may name.
resource "google_service_account_iam_member" "function_acts_as_job_account" {
  for_each = local.job_engine_acts_as

  service_account_id = google_service_account.job[each.value.account].id
  role               = "roles/iam.serviceAccountUser"
  member             = google_service_account.function[each.value.target].member
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

# Accounts a job may name (`service_account` in its spec): each reports like the default one,
# and keeps its objects under its own prefix of the logs bucket.
resource "google_service_account" "job" {
  for_each = var.job_service_accounts

  account_id   = "${var.prefix}${each.key}"
  display_name = "tpujobs jobs: ${each.key}"
  description  = each.value.description

  lifecycle {
    precondition {
      condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", "${var.prefix}${each.key}"))
      error_message = "The job service account id \"${var.prefix}${each.key}\" (prefix and id) must be 6 to 30 characters of ^[a-z][a-z0-9-]{4,28}[a-z0-9]$."
    }
  }
}

resource "google_pubsub_topic_iam_member" "job_account_publisher" {
  for_each = local.job_account_publishes

  topic  = google_pubsub_topic.topic[each.value.topic].id
  role   = "roles/pubsub.publisher"
  member = google_service_account.job[each.value.account].member
}

# The logs bucket, by managed folder (storage.tf says why): objectUser, not objectCreator, since
# the agent also reads its checkpoints on resume and a retried upload overwrites its object.
# The default account uses logs/jobs/ and checkpoints/jobs/, so every job on it shares them with
# every other.
resource "google_storage_managed_folder_iam_member" "tpu_vm_jobs" {
  for_each = google_storage_managed_folder.jobs

  bucket         = each.value.bucket
  managed_folder = each.value.name
  role           = "roles/storage.objectUser"
  member         = google_service_account.tpu_vm.member
}

# Each named account uses logs/accounts/{its email}/ and checkpoints/accounts/{its email}/ only.
resource "google_storage_managed_folder_iam_member" "job_account_folder" {
  for_each = local.job_account_folders

  bucket         = google_storage_managed_folder.account[each.key].bucket
  managed_folder = google_storage_managed_folder.account[each.key].name
  role           = "roles/storage.objectUser"
  member         = google_service_account.job[each.value.account].member
}

# Each VM account reads the code the CLI uploaded for jobs on it, and no other: the default
# account code/jobs/, each named one code/accounts/{its email}/ (content-addressed tarballs; the
# agent checks each one's SHA-256 against the job's), and writes none of it. Granted on managed
# folders, not as a bucket grant with an IAM condition on resource.name: storage.objects.list is
# checked on the bucket, where a condition on an object name never holds, so a conditioned
# objectViewer would either list every team's code (list granted unconditioned) or none (a
# custom role or legacyObjectReader without list). objectViewer on a managed folder lets its
# holder get and list inside that folder only (infra/README.md, "Storage isolation").
resource "google_storage_managed_folder_iam_member" "tpu_vm_code" {
  bucket         = google_storage_managed_folder.code.bucket
  managed_folder = google_storage_managed_folder.code.name
  role           = "roles/storage.objectViewer"
  member         = google_service_account.tpu_vm.member
}

resource "google_storage_managed_folder_iam_member" "job_account_code" {
  for_each = google_storage_managed_folder.account_code

  bucket         = each.value.bucket
  managed_folder = each.value.name
  role           = "roles/storage.objectViewer"
  member         = google_service_account.job[each.key].member
}

# Every VM account pulls jobs' images from the repositories of var.image_repositories
# ("LOCATION/REPOSITORY" of this project) with its host's own token, and pushes nothing.
resource "google_artifact_registry_repository_iam_member" "job_account_images" {
  for_each = local.image_pulls

  project    = var.project
  location   = each.value.location
  repository = each.value.repository
  role       = "roles/artifactregistry.reader"
  member     = local.job_accounts[each.value.account].member
}

resource "google_project_iam_member" "build" {
  for_each = toset(local.build_roles)

  project = var.project
  role    = each.key
  member  = google_service_account.build.member
}

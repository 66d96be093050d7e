# Least privilege: each function's account gets only what its code calls (the table in
# functions.tf), the TPU VMs get their own account, and nothing is granted to a default one.
locals {
  job_engine_functions = { for target, f in local.functions : target => f if f.job_engine }
  # The functions that read the report-signing master key (secrets.tf): the job engine, the
  # attempt_key function that derives each attempt's key, and jobs, whose `logs` checks signatures.
  master_key_functions = { for target, f in local.functions : target => f if f.master_key }

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
    "tpu.nodes.get",      # get_queued_resource; get_node (a unit's metadata, merged)
    "tpu.nodes.list",     # list_queued_resources, list_nodes
    "tpu.nodes.update",   # update_node: a warm pool unit's assignment, in its node metadata
    "tpu.operations.get", # get_operation: the error of a create that failed (create_error)
  ]

  # What the job-engine functions call on Compute Engine (platform: compute), and nothing more:
  # the REST reference's IAM block of each method (infra/README.md, "The Compute Engine role").
  # Templates, global or regional, are checked against compute.instanceTemplates.*: no
  # compute.regionInstanceTemplates.* permission exists. tests/infra/test_compute_iam.py pins the
  # list against the google-cloud-compute methods the adapter calls.
  compute_permissions = [
    "compute.disks.create",                  # instances.insert and the VMs a MIG makes: each one's boot disk
    "compute.globalOperations.get",          # globalOperations.get and .wait: a global instance template's insert or delete
    "compute.images.useReadOnly",            # the boot disk's image, from var.compute_image_project (instances.insert, the MIG's VMs)
    "compute.instanceGroupManagers.create",  # instanceGroupManagers.insert: a multi-host slice's MIG
    "compute.instanceGroupManagers.delete",  # instanceGroupManagers.delete: cleanup, MIG first (its VMs go with it)
    "compute.instanceGroupManagers.get",     # instanceGroupManagers.get, .listManagedInstances (lastAttempt.errors), resize requests' get
    "compute.instanceGroupManagers.list",    # instanceGroupManagers.list: the reconciler's tpujobs MIGs of a zone, by name
    "compute.instanceGroupManagers.update",  # instanceGroupManagers.resize, resize requests' insert, cancel and delete
    "compute.instanceGroups.delete",         # instanceGroupManagers.delete also deletes the MIG's instance group
    "compute.instanceTemplates.create",      # regionInstanceTemplates.insert (and instanceTemplates.insert): a slice's template
    "compute.instanceTemplates.delete",      # regionInstanceTemplates.delete: cleanup, after the MIG
    "compute.instanceTemplates.get",         # regionInstanceTemplates.get: a retried create adopts what exists
    "compute.instanceTemplates.list",        # regionInstanceTemplates.list: the reconciler's leftovers
    "compute.instanceTemplates.useReadOnly", # instanceGroupManagers.insert: a MIG made from the template
    "compute.instances.create",              # instances.insert (a single-host slice); instanceGroupManagers.insert checks it for the MIG's VMs
    "compute.instances.delete",              # instances.delete: a single-host slice's cleanup
    "compute.instances.get",                 # instances.get: status, upcomingMaintenance, a preempted host
    "compute.instances.list",                # instances.list: the reconciler's tpujobs instances of a zone, by name
    "compute.instances.setLabels",           # instances.insert with labels (the job's tpujobs labels)
    "compute.instances.setMetadata",         # instances.insert with metadata; instances.setMetadata: a warm pool unit's assignment
    "compute.instances.setServiceAccount",   # instances.insert with the job's service account (actAs: below)
    "compute.instances.setTags",             # instances.insert with network tags (the spec's or var.default_tags)
    "compute.networks.use",                  # instances.insert on a legacy network (a VPC checks compute.subnetworks.use)
    "compute.regionOperations.get",          # regionOperations.get and .wait: regional templates and resource policies
    "compute.reservations.get",              # reserved capacity: RESERVATION_BOUND with a specific reservation's affinity
    "compute.resourcePolicies.create",       # resourcePolicies.insert: a multi-host slice's workload policy
    "compute.resourcePolicies.delete",       # resourcePolicies.delete: cleanup, last (retried while still in use)
    "compute.resourcePolicies.get",          # resourcePolicies.get: a retried create adopts what exists
    "compute.resourcePolicies.list",         # resourcePolicies.list: the reconciler's leftovers
    "compute.resourcePolicies.use",          # instanceGroupManagers.insert: a MIG naming the workload policy
    "compute.subnetworks.use",               # instances.insert and the MIG's VMs: a network interface on the subnetwork
    "compute.subnetworks.useExternalIp",     # the same with an external IP (unless the spec asks for internal IPs only)
    "compute.zoneOperations.get",            # zoneOperations.get and .wait: instance and MIG operations
  ]

  # What the attempt_key function reads of capacity, and nothing more: a host's key (so its
  # command) waits for the attempt's slice to be ACTIVE, which it reads with the capacity port's
  # `status` (shared/tpujobs/adapters/tpu.py and compute.py). Read-only; it changes no holding.
  # tests/infra/test_key_function_capacity_read.py pins the list against the calls `status` makes.
  capacity_read_permissions = [
    "compute.instanceGroupManagers.get",  # instanceGroupManagers.listManagedInstances: each host of the slice's MIGs
    "compute.instanceGroupManagers.list", # instanceGroupManagers.list: the holding's MIGs, by name
    "compute.instanceTemplates.list",     # regionInstanceTemplates.list: what is left of a holding with no MIG
    "compute.instances.list",             # instances.list: the holding's VMs (upcoming maintenance)
    "compute.resourcePolicies.list",      # resourcePolicies.list: what is left of a holding with no MIG
    "tpu.nodes.get",                      # get_queued_resource: a TPU API holding's state
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

# Compute Engine likewise, for the project: every instance, template, workload policy and MIG is
# made per job, so no resource-level grant could name it beforehand. Not
# roles/compute.instanceAdmin.v1, which also starts, stops, resets and updates any VM of the
# project, manages its disks, snapshots and images, and sets project-wide metadata.
resource "google_project_iam_custom_role" "compute" {
  role_id     = "${replace(var.prefix, "-", "_")}tpujobsComputeSlices"
  title       = "tpujobs Compute Engine slices"
  description = "Create, read, list, resize and delete the instances, templates, workload policies and MIGs of TPU slices: what the tpujobs functions call."
  permissions = local.compute_permissions
}

resource "google_project_iam_member" "function_compute" {
  for_each = local.job_engine_functions

  project = var.project
  role    = google_project_iam_custom_role.compute.id
  member  = google_service_account.function[each.key].member
}

# The attempt_key function hands out an attempt's key only once its slice is ACTIVE: it reads one
# holding's state per key request, with these read permissions alone (not roles/compute.viewer
# nor roles/tpu.viewer, which read every resource of the project). No other function holds it;
# jobs and the dashboard hold no capacity role at all.
resource "google_project_iam_custom_role" "capacity_reader" {
  role_id     = "${replace(var.prefix, "-", "_")}tpujobsCapacityReader"
  title       = "tpujobs capacity reader"
  description = "Read whether a tpujobs holding of TPU slices (a queued resource, or Compute Engine MIGs and VMs) is ACTIVE: what the attempt_key function reads."
  permissions = local.capacity_read_permissions
}

resource "google_project_iam_member" "attempt_key_capacity_reader" {
  project = var.project
  role    = google_project_iam_custom_role.capacity_reader.id
  member  = google_service_account.function["attempt_key"].member
}

# Creating a queued resource whose nodes run as the TPU VM account needs actAs on that account.
# So do a Compute Engine instance or instance template that runs as it (instances.insert and
# instanceTemplates.insert check iam.serviceAccounts.actAs): roles/iam.serviceAccountUser holds it,
# and these two grants give it to the same functions as the TPU and Compute Engine roles
# (local.job_engine_functions), on exactly the accounts jobs run as, so the Compute Engine role
# holds no actAs of its own. A MIG's VMs are then created by the project's Google APIs service
# agent from the template, with its own rights.
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

# The functions write their metrics to Cloud Monitoring themselves (monitoring.tf): each function's
# account may write time series, and no job's or VM's account may, so a job cannot move a metric
# or an alert. For the project: timeSeries.create has no finer resource.
resource "google_project_iam_member" "function_metric_writer" {
  for_each = local.functions

  project = var.project
  role    = "roles/monitoring.metricWriter"
  member  = google_service_account.function[each.key].member
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

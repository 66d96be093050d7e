# One 2nd-gen function per target in functions/main.py (tpujobs.engine.topology.FUNCTIONS), each
# with its own service account. A cloudevent function is reached only by its topic's push
# subscription (pubsub.tf), not by an Eventarc trigger: the subscription's name must be
# `{prefix}{topic}--{target}` (topology.push_subscription_name), because record_dead_letter
# reads a dead letter's original topic from it, and only our own subscription can carry the
# retry and dead-letter policies. tests/infra checks this table against the code.
locals {
  functions = {
    submit_job = {
      signature  = "cloudevent"
      topic      = "tpujobs-submit"
      account    = "submit"
      timeout    = 60
      max        = 20
      concurrent = 8
      cpu        = "1"
      job_engine = true # creates and deletes queued resources, and Compute Engine slices
      master_key = true
      publishes  = ["tpujobs-status", "tpujobs-log-export"]
      firestore  = "roles/datastore.user"
      logs       = null
    }
    on_worker_event = {
      signature  = "cloudevent"
      topic      = "tpujobs-worker-events"
      account    = "worker-event"
      timeout    = 60
      max        = 20
      concurrent = 8
      cpu        = "1"
      job_engine = true
      master_key = true
      publishes  = ["tpujobs-status", "tpujobs-log-export"]
      firestore  = "roles/datastore.user"
      logs       = null
    }
    on_preemption = {
      signature  = "cloudevent"
      topic      = "tpujobs-preemption"
      account    = "preemption"
      timeout    = 60
      max        = 10
      concurrent = 8
      cpu        = "1"
      job_engine = true
      master_key = true
      publishes  = ["tpujobs-status", "tpujobs-log-export"]
      firestore  = "roles/datastore.user"
      logs       = null
    }
    on_qr_state = {
      signature  = "cloudevent"
      topic      = "tpujobs-qr-state"
      account    = "qr-state"
      timeout    = 60
      max        = 10
      concurrent = 8
      cpu        = "1"
      job_engine = true
      master_key = true
      publishes  = ["tpujobs-status", "tpujobs-log-export"]
      firestore  = "roles/datastore.user"
      logs       = null
    }
    on_control = {
      signature  = "cloudevent"
      topic      = "tpujobs-control"
      account    = "control"
      timeout    = 60
      max        = 5
      concurrent = 8
      cpu        = "1"
      job_engine = true
      master_key = true
      publishes  = ["tpujobs-status", "tpujobs-log-export"]
      firestore  = "roles/datastore.user"
      logs       = null
    }
    converge = { # the capacity work the jobs API hands off: a job's id or a pool's name, converged
      signature  = "cloudevent"
      topic      = "tpujobs-converge"
      account    = "converge"
      timeout    = 60
      max        = 20 # a burst of API submissions is admitted here, as submit_job admits the topic's
      concurrent = 8
      cpu        = "1"
      job_engine = true
      master_key = false # it signs and checks nothing: hosts fetch their keys from attempt_key
      publishes  = ["tpujobs-status", "tpujobs-log-export"]
      firestore  = "roles/datastore.user"
      logs       = null
    }
    reconcile = {
      signature = "cloudevent"
      topic     = "tpujobs-reconcile"
      account   = "reconcile"
      timeout   = 300
      # A tick fans out: the coordinator cuts the active jobs into shards (at most
      # TPUJOBS_RECONCILE_SHARD_SIZE active jobs of one zone) and each runs in its own instance,
      # at most max x concurrent - 1 at once (local.reconcile_env): Cloud Run holds a request
      # over that only seconds, then refuses it (429). More shards wait in lanes: each shard,
      # once run, publishes the next of its lane on this same topic. 20 runs a 10,000-job tick
      # (10 zones: about 20 shards of 500) in two waves. Every repair is idempotent and
      # compare-and-set, so a redelivered shard is safe.
      max        = 20
      concurrent = 1
      cpu        = "1"
      job_engine = true
      master_key = true
      publishes  = ["tpujobs-status", "tpujobs-log-export", "tpujobs-reconcile"]
      firestore  = "roles/datastore.user"
      logs       = null
    }
    record_dead_letter = {
      signature  = "cloudevent"
      topic      = "tpujobs-dead-letter"
      account    = "dead-letter"
      timeout    = 60
      max        = 2
      concurrent = 8
      cpu        = "1"
      job_engine = false
      master_key = false
      publishes  = [] # replays are published by the CLI, with its user's rights
      firestore  = "roles/datastore.user"
      logs       = null
    }
    export_logs = {
      signature  = "cloudevent"
      topic      = "tpujobs-log-export"
      account    = "export-logs"
      timeout    = 540
      max        = 5
      concurrent = 1
      cpu        = "1"
      job_engine = false
      master_key = false
      publishes  = []
      firestore  = "roles/datastore.user"
      logs       = "roles/storage.objectUser" # reads the chunks, writes (and rewrites) the merged logs
    }
    notify = {
      signature  = "cloudevent"
      topic      = "tpujobs-status"
      account    = "notify"
      timeout    = 60 # a job's targets (8 at most) are posted side by side, each within 10 s
      max        = 5
      concurrent = 16 # posts to one host take at most 4 of them (adapters/webhooks.py PER_HOST)
      cpu        = "1"
      job_engine = false
      master_key = false
      publishes  = []
      firestore  = "roles/datastore.user" # reads jobs and config/notify, writes jobs/*/notifications
      logs       = null
    }
    jobs = {
      signature  = "http"
      topic      = null
      account    = "jobs"
      timeout    = 60
      max        = 10
      concurrent = 8
      cpu        = "1"
      job_engine = false # internet-facing: it commits a change, and on_control does the capacity work
      master_key = true  # `logs` checks each entry's signature with its attempt's key
      publishes  = ["tpujobs-status", "tpujobs-log-export", "tpujobs-converge"]
      firestore  = "roles/datastore.user"
      logs       = null
    }
    attempt_key = { # a worker host's attempt key (TPUJOBS_KEY_URL): the one function the VMs' accounts invoke
      signature  = "http"
      topic      = null
      account    = "attempt-key"
      timeout    = 60
      max        = 10
      concurrent = 8
      cpu        = "1"
      job_engine = false
      master_key = true # each attempt's key is derived from it
      publishes  = []
      firestore  = "roles/datastore.user" # reads jobs; writes the first holder of each worker's key
      logs       = null
    }
    dashboard = { # the web dashboard behind IAP (dashboard.tf): it only reads
      signature  = "http"
      topic      = null
      account    = "dashboard"
      timeout    = 60
      max        = 5
      concurrent = 8
      cpu        = "1"
      job_engine = false
      master_key = false
      publishes  = []
      firestore  = "roles/datastore.viewer"
      logs       = null # reads only the logs/ folders, granted in dashboard.tf
    }
  }

  # What every function reads with tpujobs.engine.settings.Settings.from_env. Never a secret here, and
  # never TPUJOBS_LOCAL_STACK, TPUJOBS_TPU_ENDPOINT or TPUJOBS_COMPUTE_ENDPOINT: those belong to
  # the local stack only.
  function_env = {
    GOOGLE_CLOUD_PROJECT = var.project
    # Audit entries may name the project by number (tpujobs.engine.jobs.audit_entries).
    TPUJOBS_PROJECT_NUMBER = data.google_project.this.number
    TPUJOBS_DEFAULT_ZONE   = var.zones[0]
    TPUJOBS_PREFIX         = var.prefix
    TPUJOBS_LOGS_BUCKET    = google_storage_bucket.logs.name
    TPUJOBS_ADMINS         = join(",", var.admins)
    # The TPU VMs run as this account: worker events, preemption notices, logs; nothing else.
    # Always set, so a queued resource never runs as the Compute Engine default account.
    TPUJOBS_TPU_SERVICE_ACCOUNT = google_service_account.tpu_vm.email
    # VM options for specs that leave them out (vm_defaults.tf); empty: no default.
    TPUJOBS_DEFAULT_NETWORK         = var.default_network
    TPUJOBS_DEFAULT_SUBNETWORK      = var.default_subnetwork
    TPUJOBS_DEFAULT_INTERNAL_IPS    = var.default_internal_ips ? "true" : ""
    TPUJOBS_DEFAULT_TAGS            = join(",", var.default_tags)
    TPUJOBS_DEFAULT_DATA_DISKS      = join(",", [for disk in var.default_data_disks : "${disk.source_disk}:${disk.mode}"])
    TPUJOBS_DEFAULT_RUNTIME_VERSION = var.default_runtime_version
    # Compute Engine (compute.tf): the generations it runs when a spec names no platform, and the
    # boot images of its TPU VMs. Never TPUJOBS_COMPUTE_ENDPOINT: the simulator's, local only.
    TPUJOBS_COMPUTE_BY_DEFAULT     = join(",", var.compute_by_default)
    TPUJOBS_COMPUTE_IMAGE_PROJECT  = var.compute_image_project
    TPUJOBS_COMPUTE_IMAGE_FAMILIES = join(",", [for generation, family in var.compute_image_families : "${generation}=${family}"])
    # How long ended records are kept before Firestore's TTL (and the reconciler) delete them.
    TPUJOBS_RECORD_RETENTION_DAYS      = tostring(var.record_retention_days)
    TPUJOBS_REJECTION_RETENTION_DAYS   = tostring(var.rejection_retention_days)
    TPUJOBS_DEAD_LETTER_RETENTION_DAYS = tostring(var.dead_letter_retention_days)
    # Where worker hosts trade their VM's identity token for their attempt's key (the attempt_key
    # function's own URL, also the token's audience, which the jobs function refuses): its
    # cloudfunctions.net form, known before the function exists, so no function's environment
    # depends on another's.
    TPUJOBS_KEY_URL = "https://${var.region}-${var.project}.cloudfunctions.net/${var.prefix}tpujobs-attempt-key"
    # Job output in Cloud Logging (job_output.tf): on for jobs unless their spec opts out; per-host rate.
    TPUJOBS_CLOUD_LOGGING            = var.job_output_cloud_logging ? "true" : "false"
    TPUJOBS_LOGGING_LINES_PER_SECOND = tostring(var.job_output_lines_per_second)
    # The view of the job-output log that the jobs API reads `logs` through (job_output.tf).
    TPUJOBS_LOGGING_VIEW = var.job_output_cloud_logging ? "projects/${var.project}/locations/global/buckets/_Default/views/${var.prefix}tpujobs-job-output" : ""
  }

  # Only the job-engine functions and the jobs API: the accounts of var.job_service_accounts,
  # which the job engine (and no one else through it) may attach to queued resources (actAs,
  # iam.tf), and which the API checks a spec's `service_account` against.
  job_engine_env = {
    TPUJOBS_JOB_SERVICE_ACCOUNTS = join(",", [for id, account in google_service_account.job : account.email])
  }

  # Only reconcile: how many of a tick's shards may be in flight, from the numbers its scaling
  # uses (instances x requests each), less one request kept for the tick itself; never below 1.
  reconcile_env = {
    TPUJOBS_RECONCILE_SHARDS_IN_FLIGHT = tostring(max(1, lookup(var.max_instances, "reconcile", local.functions.reconcile.max) * local.functions.reconcile.concurrent - 1))
  }

  # Only the HTTP functions callers reach with an ID token (jobs, attempt_key): Cloud Run's IAM
  # check in front of them is guaranteed, because every function requires authentication and
  # run.invoker goes only to var.invokers (jobs) and the VMs' accounts (attempt_key), never
  # allUsers or allAuthenticatedUsers (variables.tf; tests/infra pin both).
  api_env = {
    TPUJOBS_API_PLATFORM_AUTH = "1"
  }

  # Mounted from Secret Manager into the functions with master_key = true only (secrets.tf): the master key
  # at var.report_key_version and, while a rotation lasts, the one before it (infra/README.md,
  # "Rotating the report key"). Each version's number goes in plain env beside it.
  report_key_env = "TPUJOBS_REPORT_KEY"
  report_key_mounts = merge(
    { (local.report_key_env) = var.report_key_version },
    var.report_key_previous_version == "" ? {} : { "${local.report_key_env}_PREVIOUS" = var.report_key_previous_version },
  )
  report_key_version_env = { for env, version in local.report_key_mounts : "${env}_VERSION" => version }

  cloudevent_functions = { for target, f in local.functions : target => f if f.topic != null }
}

resource "google_service_account" "function" {
  for_each = local.functions

  account_id   = "${var.prefix}tpujobs-${each.value.account}"
  display_name = "tpujobs ${each.key} function"
  description  = "Runs the ${each.key} function; holds only the roles that function needs (iam.tf)."
}

# Builds run as this account rather than the project's default compute account.
resource "google_service_account" "build" {
  account_id   = "${var.prefix}tpujobs-build"
  display_name = "tpujobs function builds"
}

resource "google_cloudfunctions2_function" "function" {
  for_each = local.functions

  name        = "${var.prefix}tpujobs-${replace(each.key, "_", "-")}"
  location    = var.region
  description = "tpujobs ${each.key} (functions/main.py)"

  build_config {
    runtime         = var.python_runtime
    entry_point     = each.key
    service_account = google_service_account.build.id
    source {
      storage_source {
        bucket = google_storage_bucket.staging.name
        object = google_storage_bucket_object.bundle.name
      }
    }
  }

  # Requests per instance, and its CPU (Cloud Run allows more than one request only with at
  # least 1 CPU). Google's guidance (cloud.google.com/functions/docs/configuring/concurrency):
  # start at about 8, and give Python as many THREADS as the concurrency. Measured locally
  # (bench/submit.py, docs/scale.md "Bursts"): a submission waits about 80 ms on Firestore, Pub/Sub
  # and the TPU API and uses about 20 ms of CPU, so one CPU keeps about 4 busy and 8 leaves
  # room for the slower calls; 20 instances of 8 take a 1,000-job burst in a few seconds. A
  # reconcile shard or a log export holds hundreds of jobs or a whole log at once: one each.
  service_config {
    available_memory                 = "512Mi"
    available_cpu                    = each.value.cpu
    max_instance_request_concurrency = each.value.concurrent
    timeout_seconds                  = each.value.timeout
    min_instance_count               = 0 # nothing runs, nothing is paid, at idle
    max_instance_count               = lookup(var.max_instances, each.key, each.value.max)
    service_account_email            = google_service_account.function[each.key].email
    all_traffic_on_latest_revision   = true
    environment_variables = merge(
      local.function_env,
      { THREADS = tostring(each.value.concurrent) }, # functions-framework's gunicorn threads
      each.value.job_engine || each.key == "jobs" ? local.job_engine_env : {},
      each.value.master_key ? local.report_key_version_env : {},
      contains(["jobs", "attempt_key"], each.key) ? local.api_env : {},
      each.key == "dashboard" ? local.dashboard_env : {},
      contains(local.notify_key_functions, each.key) ? local.notify_env : {},
      each.key == "reconcile" ? local.reconcile_env : {},
    )
    # Pub/Sub push counts as internal traffic; only the jobs API and attempt_key are called from
    # outside, and even there IAM admits only var.invokers (jobs) and the VMs' accounts (attempt_key).
    # The dashboard only through its load balancer, where IAP stands (dashboard.tf).
    ingress_settings = each.key == "dashboard" ? "ALLOW_INTERNAL_AND_GCLB" : (each.value.signature == "http" ? "ALLOW_ALL" : "ALLOW_INTERNAL_ONLY")

    # The report-signing master key (and, during a rotation, the previous one), each at a pinned
    # version read at the instance's start: never "latest", so adding a version changes nothing
    # until an apply names it. The project by number, as the API keeps it (a project id shows a
    # change at every plan).
    dynamic "secret_environment_variables" {
      for_each = each.value.master_key ? local.report_key_mounts : {}
      content {
        key        = secret_environment_variables.key
        project_id = data.google_project.this.number
        secret     = google_secret_manager_secret.report_key.secret_id
        version    = secret_environment_variables.value
      }
    }
    # The notify master key, for the notify function (it signs) and jobs (`notify-key`): notify.tf.
    dynamic "secret_environment_variables" {
      for_each = contains(local.notify_key_functions, each.key) ? local.notify_key_mounts : {}
      content {
        key        = secret_environment_variables.key
        project_id = data.google_project.this.number
        secret     = google_secret_manager_secret.notify_signing_key.secret_id
        version    = secret_environment_variables.value
      }
    }
  }

  lifecycle {
    precondition {
      condition     = alltrue([for target in keys(var.max_instances) : contains(keys(local.functions), target)])
      error_message = "max_instances names a function that does not exist: use the keys of local.functions in infra/functions.tf."
    }
    precondition {
      condition     = var.report_key_previous_version != var.report_key_version
      error_message = "report_key_previous_version must differ from report_key_version (or be \"\" when no rotation is under way)."
    }
  }

  # Deploying checks that the function's account can read the key's latest version.
  depends_on = [
    google_project_service.api,
    google_project_iam_member.build,
    google_secret_manager_secret_iam_member.report_key,
    google_secret_manager_secret_iam_member.notify_signing_key,
  ]
}

# Who may call what: the push account calls the cloudevent functions, var.invokers the API, and
# the TPU VMs' accounts the attempt_key function and no other (a worker host fetches its
# attempt's report key there; a token it mints can call nothing else).
resource "google_cloud_run_service_iam_member" "push_invoker" {
  for_each = local.cloudevent_functions

  location = var.region
  service  = google_cloudfunctions2_function.function[each.key].service_config[0].service
  role     = "roles/run.invoker"
  member   = google_service_account.push.member
}

resource "google_cloud_run_service_iam_member" "api_invoker" {
  for_each = toset(var.invokers)

  location = var.region
  service  = google_cloudfunctions2_function.function["jobs"].service_config[0].service
  role     = "roles/run.invoker"
  member   = each.key
}

# Every VM account (the default one and each of var.job_service_accounts): a worker host asks
# the attempt_key function for its attempt's report key with its VM's own token. This only lets
# the request past Cloud Run; which key a caller may have is the function's to decide.
resource "google_cloud_run_service_iam_member" "worker_invoker" {
  for_each = local.job_accounts

  location = var.region
  service  = google_cloudfunctions2_function.function["attempt_key"].service_config[0].service
  role     = "roles/run.invoker"
  member   = each.value.member
}

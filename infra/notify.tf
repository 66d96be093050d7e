# Notifications (tpujobs.engine.notifications): the notify function (functions.tf, its push
# subscription on tpujobs-status in pubsub.tf, with the same retry and dead-letter policies as
# the others) posts job state changes to webhooks, each team's signed with a key of its own,
# derived from the notify master key; the jobs function hands each team its key (`notify-key`).

locals {
  # The functions that hold the notify master key: notify signs with it, jobs derives a team's
  # key for the team's members (`tpujobs notify-key`).
  notify_key_functions = ["notify", "jobs"]
  notify_key_env       = "TPUJOBS_NOTIFY_SIGNING_KEY"
  # Pinned versions, as the report key's: the previous one signs beside the current one while a
  # rotation lasts (infra/README.md, "The notification signing key").
  notify_key_mounts = merge(
    { (local.notify_key_env) = var.notify_signing_key_version },
    var.notify_signing_key_previous_version == "" ? {} : { "${local.notify_key_env}_PREVIOUS" = var.notify_signing_key_previous_version },
  )
  # Each notification's `link` is `{TPUJOBS_DASHBOARD_URL}/jobs/{id}`: the dashboard's address
  # where it is served (dashboard.tf, behind IAP); without a dashboard, no link. Beside it, each
  # mounted key's version number, which every post names (X-Tpujobs-Key-Version).
  notify_env = merge(
    local.dashboard_on ? { TPUJOBS_DASHBOARD_URL = "https://${var.dashboard_domain}" } : {},
    { for env, version in local.notify_key_mounts : "${env}_VERSION" => version },
  )
}

variable "notify_signing_key_version" {
  description = "The version of the notify master key ({prefix}tpujobs-notify-signing-key) mounted into the notify and jobs functions as TPUJOBS_NOTIFY_SIGNING_KEY: a number, never \"latest\", so adding a version changes nothing until an apply names it. Each team's key is derived from it (`tpujobs notify-key`)."
  type        = string
  default     = "1"

  validation {
    condition     = can(regex("^[1-9][0-9]*$", var.notify_signing_key_version))
    error_message = "notify_signing_key_version is a version number, such as \"1\"."
  }
}

variable "notify_signing_key_previous_version" {
  description = "While the notify master key rotates, its previous version (TPUJOBS_NOTIFY_SIGNING_KEY_PREVIOUS): posts carry a second signature under it (X-Tpujobs-Signature-Previous) until receivers hold the new key. \"\" when no rotation is under way."
  type        = string
  default     = ""

  validation {
    condition     = var.notify_signing_key_previous_version == "" || can(regex("^[1-9][0-9]*$", var.notify_signing_key_previous_version))
    error_message = "notify_signing_key_previous_version is a version number, such as \"1\", or \"\"."
  }
}

# The notify master key. Its id does not start with local.job_secret_prefix ("{prefix}tpujobs_"),
# so no job account can read it; only the notify and jobs functions do. Terraform makes the
# secret, never its value (infra/README.md, "Secrets"; docs/operations.md, "Notifications").
resource "google_secret_manager_secret" "notify_signing_key" {
  secret_id           = "${var.prefix}tpujobs-notify-signing-key"
  deletion_protection = true # receivers hold its value to verify signatures

  replication {
    auto {}
  }

  depends_on = [google_project_service.api]
}

resource "google_secret_manager_secret_iam_member" "notify_signing_key" {
  for_each = toset(local.notify_key_functions)

  secret_id = google_secret_manager_secret.notify_signing_key.id
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.function[each.key].member

  lifecycle {
    precondition {
      condition     = var.notify_signing_key_previous_version != var.notify_signing_key_version
      error_message = "notify_signing_key_previous_version must differ from notify_signing_key_version (or be \"\" when no rotation is under way)."
    }
  }
}

# A job's `webhook_secret: NAME` is "{prefix}tpujobs_{account id}_notify-NAME", in the namespace
# of the account the job runs as (tpujobs.domain.notify): the notify function reads those, one
# grant per job account, and no other secret of any namespace (a job's own secrets stay its own).
resource "google_project_iam_member" "notify_webhook_secrets" {
  for_each = toset(keys(local.job_accounts)) # keyed by job account; granted to the notify function

  project = var.project
  role    = "roles/secretmanager.secretAccessor"
  member  = google_service_account.function["notify"].member

  condition {
    title       = "notify webhooks of ${each.key}"
    description = "Only secrets whose id starts with ${local.job_secret_prefix}${each.key}_notify-"
    expression  = "resource.name.startsWith(\"${local.project_secrets}${local.job_secret_prefix}${each.key}_notify-\")"
  }
}

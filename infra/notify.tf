# Notifications (tpujobs.engine.notifications): the notify function (functions.tf, its push
# subscription on tpujobs-status in pubsub.tf, with the same retry and dead-letter policies as
# the others) posts job state changes to webhooks, signed with a key of its own.

locals {
  # Each notification's `link` is `{TPUJOBS_DASHBOARD_URL}/jobs/{id}`: the dashboard's address
  # where it is served (dashboard.tf, behind IAP); without a dashboard, no link.
  notify_env = local.dashboard_on ? { TPUJOBS_DASHBOARD_URL = "https://${var.dashboard_domain}" } : {}
}

variable "notify_signing_key_version" {
  description = "The version of the notify signing key ({prefix}tpujobs-notify-signing-key) mounted into the notify function as TPUJOBS_NOTIFY_SIGNING_KEY: a number, never \"latest\", so adding a version changes nothing until an apply names it. Receivers verify X-Tpujobs-Signature with its value."
  type        = string
  default     = "1"

  validation {
    condition     = can(regex("^[1-9][0-9]*$", var.notify_signing_key_version))
    error_message = "notify_signing_key_version is a version number, such as \"1\"."
  }
}

# The key that signs every notification. Its id does not start with local.job_secret_prefix
# ("{prefix}tpujobs_"), so no job account can read it; only the notify function does. Terraform
# makes the secret, never its value (infra/README.md, "Secrets"; docs/operations.md, "Notifications").
resource "google_secret_manager_secret" "notify_signing_key" {
  secret_id           = "${var.prefix}tpujobs-notify-signing-key"
  deletion_protection = true # receivers hold its value to verify signatures

  replication {
    auto {}
  }

  depends_on = [google_project_service.api]
}

resource "google_secret_manager_secret_iam_member" "notify_signing_key" {
  secret_id = google_secret_manager_secret.notify_signing_key.id
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.function["notify"].member
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

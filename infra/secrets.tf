# Secret Manager: the report-signing key of the deployment, and the namespaces of the secrets
# jobs read. Terraform creates secrets and grants, never a secret's value: its state is plain
# text. infra/README.md, "Secrets", says how the value gets there and how names are made.
locals {
  # Secret ids of job secrets start with this, then the account id and "_": a short NAME in a
  # spec means "{prefix}tpujobs_{account id}_{NAME}" (tpujobs.domain.secrets). The report key
  # ("{prefix}tpujobs-report-key") does not start with it, so no job account can read it.
  job_secret_prefix = "${var.prefix}tpujobs_"

  # Secret Manager names secrets by project number in IAM conditions.
  project_secrets = "projects/${data.google_project.this.number}/secrets/"

  # What `tpujobs secret set` and `tpujobs secret list` call, in two roles: creating and listing
  # are checked on the project (so a condition on a secret's name cannot hold there), the rest
  # on each secret. No versions.access (reading values), no setIamPolicy (granting access).
  secret_creator_permissions = [
    "secretmanager.secrets.create",
    "secretmanager.secrets.list",
  ]
  secret_writer_permissions = [
    "secretmanager.secrets.delete",
    "secretmanager.secrets.get",
    "secretmanager.secrets.update",
    "secretmanager.versions.add",
    "secretmanager.versions.destroy",
    "secretmanager.versions.disable",
    "secretmanager.versions.enable",
    "secretmanager.versions.get",
    "secretmanager.versions.list",
  ]
}

# The master key the functions derive every attempt's report key from (tpujobs.domain.signing),
# mounted as TPUJOBS_REPORT_KEY at var.report_key_version (and TPUJOBS_REPORT_KEY_PREVIOUS at
# var.report_key_previous_version during a rotation) into the functions with master_key = true
# (functions.tf: the job engine, attempt_key and jobs; iam.tf local.master_key_functions). Its values are added with gcloud, never by Terraform (infra/README.md).
resource "google_secret_manager_secret" "report_key" {
  secret_id           = "${var.prefix}tpujobs-report-key"
  deletion_protection = true # without it every running attempt's reports are refused

  replication {
    auto {}
  }

  depends_on = [google_project_service.api]
}

resource "google_secret_manager_secret_iam_member" "report_key" {
  for_each = local.master_key_functions

  secret_id = google_secret_manager_secret.report_key.id
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.function[each.key].member
}

# Each job account reads the secrets of its own namespace and no other: the agent reads them on
# the host, with the VM's own token, at the start of each attempt.
resource "google_project_iam_member" "job_account_secrets" {
  for_each = local.job_accounts

  project = var.project
  role    = "roles/secretmanager.secretAccessor"
  member  = each.value.member

  condition {
    title       = "tpujobs secrets of ${each.key}"
    description = "Only secrets whose id starts with ${local.job_secret_prefix}${each.key}_"
    expression  = "resource.name.startsWith(\"${local.project_secrets}${local.job_secret_prefix}${each.key}_\")"
  }
}

# Who may run `tpujobs secret set` and `list`: platform admins (var.secret_managers) for every
# account's secrets, each team's managers (var.team_secret_managers) for their account's only.
# Both create secrets and list their names anywhere in the project; change, inspect or delete
# only secrets of tpujobs (admins) or of their account's namespace (teams).
resource "google_project_iam_custom_role" "secret_creator" {
  role_id     = "${replace(var.prefix, "-", "_")}tpujobsSecretCreator"
  title       = "tpujobs secret creator"
  description = "Create secrets and list secret names: the project-level half of tpujobs secret set and list."
  permissions = local.secret_creator_permissions
}

resource "google_project_iam_custom_role" "secret_writer" {
  role_id     = "${replace(var.prefix, "-", "_")}tpujobsSecretWriter"
  title       = "tpujobs secret writer"
  description = "Add, disable and destroy versions of tpujobs secrets and read their metadata, never their values; granted on the tpujobs secret namespace only."
  permissions = local.secret_writer_permissions
}

resource "google_project_iam_member" "secret_manager_create" {
  for_each = toset(var.secret_managers)

  project = var.project
  role    = google_project_iam_custom_role.secret_creator.id
  member  = each.key
}

resource "google_project_iam_member" "secret_manager_write" {
  for_each = toset(var.secret_managers)

  project = var.project
  role    = google_project_iam_custom_role.secret_writer.id
  member  = each.key

  condition {
    title       = "tpujobs secrets only"
    description = "Only secrets whose id starts with ${local.job_secret_prefix}"
    expression  = "resource.name.startsWith(\"${local.project_secrets}${local.job_secret_prefix}\")"
  }
}

# A team's managers: the writer role only on their account's namespace,
# "{prefix}tpujobs_{account id}_", the names tpujobs.domain.secrets.namespace makes, as the
# account's own secretAccessor grant above (the trailing "_" keeps team-a off team-ab's).
#
# The limit: secretmanager.secrets.create is checked on the project, the request's parent, not
# on the secret it makes (cloud.google.com/secret-manager/docs/reference/rest/v1/projects.secrets/create),
# so a condition on the new secret's name cannot hold there and the creator role stays
# project-wide. A team can therefore create an empty secret in another team's namespace (never
# add a version to it, read it or change it after). The owning team's managers can still add
# its versions, and inspect and change its settings (expiry, rotation, topics) with secrets.get
# and secrets.update, or delete it; a job reads only versions, which only they can add.
locals {
  team_secret_grants = {
    for pair in flatten([
      for id, members in var.team_secret_managers : [for member in members : { account = "${var.prefix}${id}", member = member }]
    ]) : "${pair.account}/${pair.member}" => pair
  }
  team_secret_creators = toset(flatten(values(var.team_secret_managers)))
}

resource "google_project_iam_member" "team_secret_manager_create" {
  for_each = setsubtract(local.team_secret_creators, var.secret_managers)

  project = var.project
  role    = google_project_iam_custom_role.secret_creator.id
  member  = each.key
}

resource "google_project_iam_member" "team_secret_manager_write" {
  for_each = local.team_secret_grants

  project = var.project
  role    = google_project_iam_custom_role.secret_writer.id
  member  = each.value.member

  condition {
    title       = "tpujobs secrets of ${each.value.account}"
    description = "Only secrets whose id starts with ${local.job_secret_prefix}${each.value.account}_"
    expression  = "resource.name.startsWith(\"${local.project_secrets}${local.job_secret_prefix}${each.value.account}_\")"
  }

  lifecycle {
    precondition {
      condition     = contains(keys(local.job_accounts), each.value.account)
      error_message = "team_secret_managers names ${each.value.account}, which is not a job account: use an id of job_service_accounts, or tpujobs-tpu-vm."
    }
  }
}

# The logs bucket (job output, exported logs, checkpoints, uploaded code) and the staging
# bucket the function bundle is uploaded to. Both private, uniform access, versioned.
locals {
  # The logs bucket's top-level prefixes, one per kind of object (tpujobs.domain.naming's
  # LOGS_PREFIX, CHECKPOINTS_PREFIX, CODE_PREFIX). Each kind has its own lifecycle rule whose
  # matches_prefix is its prefix, and none is a prefix of another, so deleting old logs never
  # reaches a checkpoint or the code of a job that may still resume
  # (tests/infra/test_storage_lifecycle.py).
  storage_prefixes = {
    logs        = "logs/"
    checkpoints = "checkpoints/"
    code        = "code/"
  }

  # The kinds a job writes, each under {kind}/jobs/{id}/ on the default account and under
  # {kind}/accounts/{email}/jobs/{id}/ on an account of its own (naming.job_prefix,
  # naming.checkpoint_prefix): one managed folder per kind and account.
  job_object_kinds = ["logs", "checkpoints"]

  job_account_folders = {
    for pair in setproduct(keys(var.job_service_accounts), local.job_object_kinds) :
    "${pair[0]}/${pair[1]}" => { account = pair[0], kind = pair[1] }
  }
}

resource "google_storage_bucket" "logs" {
  #checkov:skip=CKV_GCP_62:Usage logs need a third bucket that nothing reads; enable Cloud Audit Logs Data Access for storage.googleapis.com instead if object reads must be traced.
  name                        = "${var.project}-${var.prefix}tpujobs-logs"
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = false

  versioning {
    enabled = true # an overwritten or deleted object can be had back for a week
  }

  # Logs: output chunks and exported logs, var.logs_retention_days after each was written.
  lifecycle_rule {
    condition {
      age            = var.logs_retention_days
      matches_prefix = ["logs/"]
    }
    action {
      type = "Delete"
    }
  }

  # Checkpoints: none by default (0). Deleting a checkpoint loses the training it holds: a job
  # that resumes afterwards starts again from step 0.
  dynamic "lifecycle_rule" {
    for_each = var.checkpoint_retention_days > 0 ? [var.checkpoint_retention_days] : []
    content {
      condition {
        age            = lifecycle_rule.value
        matches_prefix = ["checkpoints/"]
      }
      action {
        type = "Delete"
      }
    }
  }

  # Code: var.code_retention_days after its custom time, which the CLI sets when it uploads or
  # re-uses a tarball and export_logs moves forward at every attempt's end: the code of a job
  # that ran within that time, and so may still resume, stays. A tarball without a custom
  # time (uploaded by an older CLI) is never matched.
  lifecycle_rule {
    condition {
      days_since_custom_time = var.code_retention_days
      matches_prefix         = ["code/"]
    }
    action {
      type = "Delete"
    }
  }

  # Versions that were overwritten or deleted (by a rule above, or by hand), of every kind: a
  # week to have them back. No live object matches.
  lifecycle_rule {
    condition {
      days_since_noncurrent_time = 7
    }
    action {
      type = "Delete"
    }
  }

  lifecycle_rule {
    condition {
      age = 1
    }
    action {
      type = "AbortIncompleteMultipartUpload"
    }
  }

  depends_on = [google_project_service.api]
}

resource "google_storage_bucket" "staging" {
  #checkov:skip=CKV_GCP_62:Holds only function bundles that Terraform uploads; writes are in the Admin Activity audit log already, and usage logs would need a third bucket.
  name                        = "${var.project}-${var.prefix}tpujobs-staging"
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = true # only rebuildable bundles live here

  versioning {
    enabled = true
  }

  # Old bundles: a function's build copied its source long ago; Terraform uploads the current
  # bundle again if it was removed.
  lifecycle_rule {
    condition {
      age = 30
    }
    action {
      type = "Delete"
    }
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = 1
    }
    action {
      type = "Delete"
    }
  }

  depends_on = [google_project_service.api]
}

# Named by content, so a new bundle redeploys the functions and an unchanged one does not
# (tools/bundle.py writes the zip byte-for-byte reproducibly).
resource "google_storage_bucket_object" "bundle" {
  name   = "function-${filemd5(var.function_zip)}.zip"
  bucket = google_storage_bucket.staging.name
  source = var.function_zip
}

# Managed folders of the logs bucket, one per identity that jobs run as, so each account's IAM
# reaches only its own prefix (iam.tf holds the grants). Managed folders rather than IAM
# conditions on resource.name: a grant on a managed folder also covers listing under that
# folder's name, whereas listing is checked on the bucket, where a condition on object names
# never holds (infra/README.md, "Storage isolation"). force_destroy removes only the folder and
# its grants: the objects stay.
resource "google_storage_managed_folder" "jobs" {
  for_each = toset(local.job_object_kinds)

  bucket        = google_storage_bucket.logs.name
  name          = "${each.key}/jobs/" # jobs on the default account (tpu_vm): logs/jobs/, checkpoints/jobs/
  force_destroy = true
}

# Code the CLI uploads, by account as well (naming.code_prefix): code/jobs/ for the default
# account, code/accounts/{email}/ for each named one. Each account reads only its own folder, so
# no team reads or lists another team's code (iam.tf).
resource "google_storage_managed_folder" "code" {
  bucket        = google_storage_bucket.logs.name
  name          = "code/jobs/" # tarballs of jobs on the default account (tpu_vm), named by content
  force_destroy = true
}

resource "google_storage_managed_folder" "account_code" {
  for_each = var.job_service_accounts

  bucket        = google_storage_bucket.logs.name
  name          = "code/accounts/${google_service_account.job[each.key].email}/" # tarballs of jobs on this account
  force_destroy = true
}

resource "google_storage_managed_folder" "account" {
  for_each = local.job_account_folders

  bucket        = google_storage_bucket.logs.name
  name          = "${each.value.kind}/accounts/${google_service_account.job[each.value.account].email}/" # jobs that name this account in their spec
  force_destroy = true
}

# The logs bucket (job output, exported logs, checkpoints, uploaded code) and the staging
# bucket the function bundle is uploaded to. Both private, uniform access, versioned.
resource "google_storage_bucket" "logs" {
  #checkov:skip=CKV_GCP_62:Usage logs need a third bucket that nothing reads; enable Cloud Audit Logs Data Access for storage.googleapis.com instead if object reads must be traced.
  name                        = "${var.project}-${var.prefix}tpujobs-logs"
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = false

  versioning {
    enabled = true # an overwritten checkpoint can be had back for a week
  }

  lifecycle_rule {
    condition {
      age = var.logs_retention_days
    }
    action {
      type = "Delete"
    }
  }

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
  bucket        = google_storage_bucket.logs.name
  name          = "jobs/" # jobs on the default account (tpu_vm): output chunks, checkpoints
  force_destroy = true
}

resource "google_storage_managed_folder" "code" {
  bucket        = google_storage_bucket.logs.name
  name          = "code/" # tarballs the CLI uploads, named by content; every job account reads
  force_destroy = true
}

resource "google_storage_managed_folder" "account" {
  for_each = google_service_account.job

  bucket        = google_storage_bucket.logs.name
  name          = "accounts/${each.value.email}/" # jobs that name this account in their spec
  force_destroy = true
}

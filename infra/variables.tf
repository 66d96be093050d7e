variable "project" {
  description = "The Google Cloud project id to deploy into."
  type        = string
}

variable "region" {
  description = "Region of the functions, the scheduler and the buckets, e.g. us-central1."
  type        = string
  default     = "us-central1"
}

variable "zones" {
  description = "TPU zones jobs may run in; the first is the default for a spec that names none (TPUJOBS_DEFAULT_ZONE)."
  type        = list(string)
  default     = ["us-central2-b"]

  validation {
    condition     = length(var.zones) > 0
    error_message = "Name at least one TPU zone."
  }
}

variable "prefix" {
  description = "Prepended to every topic, subscription, function, bucket and service account name (TPUJOBS_PREFIX), so several deployments can share a project. Empty, or up to 10 characters ending in '-', e.g. \"dev-\"."
  type        = string
  default     = ""

  validation {
    condition     = can(regex("^([a-z][a-z0-9-]{0,8}-)?$", var.prefix))
    error_message = "The prefix is empty or matches ^[a-z][a-z0-9-]{0,8}-$ (service account ids allow 30 characters)."
  }
}

variable "invokers" {
  description = "IAM members allowed to call the `jobs` HTTP API (list, describe, cancel), e.g. [\"group:ml-team@example.com\"]. Never allUsers: callers are identified by their Google ID token."
  type        = list(string)

  validation {
    condition     = alltrue([for m in var.invokers : !contains(["allUsers", "allAuthenticatedUsers"], m)])
    error_message = "The jobs API needs an identity: allUsers and allAuthenticatedUsers are not allowed."
  }
}

variable "admins" {
  description = "E-mail addresses that may cancel anyone's job (TPUJOBS_ADMINS)."
  type        = list(string)
  default     = []
}

variable "firestore_location" {
  description = "Location of the Firestore database, e.g. nam5 (multi-region) or us-central1. Cannot change after creation."
  type        = string
  default     = "nam5"
}

variable "function_zip" {
  description = "The function bundle built by `make bundle`, uploaded to the staging bucket."
  type        = string
  default     = "../dist/function.zip"
}

variable "python_runtime" {
  description = "Cloud Functions Python runtime of every function."
  type        = string
  default     = "python312"
}

variable "logs_retention_days" {
  description = "Days job output, exported logs and checkpoints are kept in the logs bucket."
  type        = number
  default     = 90
}

variable "reconcile_schedule" {
  description = "Cron schedule of the reconcile tick (Cloud Scheduler)."
  type        = string
  default     = "* * * * *"
}

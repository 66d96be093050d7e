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

variable "job_service_accounts" {
  description = "Service accounts a job may name in its spec (`service_account`), by account id without the prefix, e.g. { \"team-a\" = { description = \"Team A's jobs\" } }. Each is created as \"{prefix}{id}\", may report, keeps its objects under accounts/{its email}/ in the logs bucket and reads only its own tpujobs secrets. Which owner may use which account is config/service_accounts in Firestore."
  type = map(object({
    description = string
  }))
  default = {}

  validation {
    condition     = alltrue([for id in keys(var.job_service_accounts) : can(regex("^[a-z][a-z0-9-]*[a-z0-9]$", id)) && !startswith(id, "tpujobs")])
    error_message = "A job service account id has lower-case letters, digits and '-', starts with a letter, ends with a letter or digit, and does not start with \"tpujobs\" (the deployment's own accounts do)."
  }
}

variable "secret_managers" {
  description = "IAM members who may create and update the job secrets of every account (`tpujobs secret set`, `tpujobs secret list`), e.g. [\"group:ml-admins@example.com\"]: they may create secrets and list secret names in the project, and add versions to, read the metadata of and delete only secrets named {prefix}tpujobs_*. Never allUsers."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for m in var.secret_managers : !contains(["allUsers", "allAuthenticatedUsers"], m)])
    error_message = "Secret managers need an identity: allUsers and allAuthenticatedUsers are not allowed."
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

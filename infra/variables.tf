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
  description = "Service accounts a job may name in its spec (`service_account`), by account id without the prefix, e.g. { \"team-a\" = { description = \"Team A's jobs\" } }. Each is created as \"{prefix}{id}\", may report, keeps its objects under logs/accounts/{its email}/ and checkpoints/accounts/{its email}/ in the logs bucket and reads only its own tpujobs secrets. Which owner may use which account is config/service_accounts in Firestore."
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
  description = "Platform admins: IAM members who may create and update the job secrets of EVERY account (`tpujobs secret set`, `tpujobs secret list`), e.g. [\"group:platform-admins@example.com\"]: they may create secrets and list secret names in the project, and add versions to, read the metadata of and delete any secret named {prefix}tpujobs_*. A team's own managers go in team_secret_managers instead. Never allUsers."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for m in var.secret_managers : !contains(["allUsers", "allAuthenticatedUsers"], m)])
    error_message = "Secret managers need an identity: allUsers and allAuthenticatedUsers are not allowed."
  }
}

variable "team_secret_managers" {
  description = "Per team: IAM members who may create and update the secrets of one job account only, by account id as in job_service_accounts (\"tpujobs-tpu-vm\" for the default account), e.g. { \"team-a\" = [\"group:team-a-leads@example.com\"] }. They add versions to, read the metadata of and delete only secrets named {prefix}tpujobs_{prefix}{id}_*; creating secrets and listing names are checked on the project, so those two they hold project-wide (infra/secrets.tf says what that allows). Never allUsers."
  type        = map(list(string))
  default     = {}

  validation {
    condition     = alltrue([for members in values(var.team_secret_managers) : alltrue([for m in members : !contains(["allUsers", "allAuthenticatedUsers"], m)])])
    error_message = "Secret managers need an identity: allUsers and allAuthenticatedUsers are not allowed."
  }
}

variable "max_instances" {
  description = "Most instances of a function, by function (the keys of local.functions in infra/functions.tf), e.g. { submit_job = 40 }. A function not named keeps its default there (reconcile: 20, one reconcile shard an instance, and a tick keeps at most this less one shard in flight). It bounds what a burst or a loop can cost, and what it can load on Firestore and the TPU API."
  type        = map(number)
  default     = {}

  validation {
    condition     = alltrue([for n in values(var.max_instances) : n >= 1 && floor(n) == n])
    error_message = "Each of max_instances is a whole number of at least 1."
  }
}

variable "report_key_version" {
  description = "The version of the {prefix}tpujobs-report-key secret that signs and checks attempts' reports now: a number, never \"latest\" (a version added is used only once an apply names it). infra/README.md, \"Rotating the report key\"."
  type        = string
  default     = "1"

  validation {
    condition     = can(regex("^[1-9][0-9]*$", var.report_key_version))
    error_message = "report_key_version is a secret version number, e.g. \"2\"."
  }
}

variable "report_key_previous_version" {
  description = "During a rotation only: the version report_key_version replaced, still accepted for attempts that began under it. \"\" (the default) when no rotation is under way."
  type        = string
  default     = ""

  validation {
    condition     = var.report_key_previous_version == "" || can(regex("^[1-9][0-9]*$", var.report_key_previous_version))
    error_message = "report_key_previous_version is \"\" or a secret version number, e.g. \"1\"."
  }
}

variable "admins" {
  description = "E-mail addresses of the admins (TPUJOBS_ADMINS): they may cancel anyone's job, and only they may publish on tpujobs-control."
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
  description = "Days job output and exported logs (logs/ in the logs bucket) are kept after each was written. Checkpoints and code have their own retention."
  type        = number
  default     = 90

  validation {
    condition     = var.logs_retention_days >= 1 && floor(var.logs_retention_days) == var.logs_retention_days
    error_message = "logs_retention_days is a whole number of days, 1 or more."
  }
}

variable "checkpoint_retention_days" {
  description = "Days after it was written that a checkpoint (checkpoints/ in the logs bucket) is deleted; 0, the default, keeps checkpoints until someone deletes them. Deleting a checkpoint loses the training it holds: a job that resumes afterwards starts again from step 0."
  type        = number
  default     = 0

  validation {
    condition     = var.checkpoint_retention_days >= 0 && floor(var.checkpoint_retention_days) == var.checkpoint_retention_days
    error_message = "checkpoint_retention_days is a whole number of days: 0 keeps checkpoints, N deletes each N days after it was written."
  }
}

variable "code_retention_days" {
  description = "Days after its last use that an uploaded code tarball (code/ in the logs bucket) is deleted. Used means uploaded or submitted again by the CLI, or an attempt of a job running it ended. Keep it above the longest a job may wait for capacity plus run one attempt: a job that resumes after its code is gone fails at setup."
  type        = number
  default     = 90

  validation {
    condition     = var.code_retention_days >= 1 && floor(var.code_retention_days) == var.code_retention_days
    error_message = "code_retention_days is a whole number of days, 1 or more."
  }
}

variable "image_repositories" {
  description = "Artifact Registry repositories of this project that jobs' images come from, as \"LOCATION/REPOSITORY\", e.g. [\"us/trainers\"]. Every VM account (the default one and each of job_service_accounts) may pull from each (roles/artifactregistry.reader) with its host's own token."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for r in var.image_repositories : can(regex("^[a-z][a-z0-9-]*[a-z0-9]/[a-z]([a-z0-9-]{0,61}[a-z0-9])?$", r))])
    error_message = "Each of image_repositories is \"LOCATION/REPOSITORY\", e.g. \"us/trainers\" or \"us-central1/team-a\": lower-case letters, digits and '-'."
  }
}

variable "reconcile_schedule" {
  description = "Cron schedule of the reconcile tick (Cloud Scheduler). The functions take ticks to be a minute apart (TPUJOBS_RECONCILE_TICK_SECONDS, 60): a tick's shards stop handing on before the next tick would meet them."
  type        = string
  default     = "* * * * *"
}

variable "record_retention_days" {
  description = "Days an ended job's record (document, timeline, workers, attempts) is kept after it ends (TPUJOBS_RECORD_RETENTION_DAYS); then Firestore's TTL and the reconciler delete it."
  type        = number
  default     = 180

  validation {
    condition     = var.record_retention_days >= 1 && floor(var.record_retention_days) == var.record_retention_days
    error_message = "record_retention_days is a whole number of days, 1 or more."
  }
}

variable "rejection_retention_days" {
  description = "Days a rejection is kept after it was recorded (TPUJOBS_REJECTION_RETENTION_DAYS)."
  type        = number
  default     = 30

  validation {
    condition     = var.rejection_retention_days >= 1 && floor(var.rejection_retention_days) == var.rejection_retention_days
    error_message = "rejection_retention_days is a whole number of days, 1 or more."
  }
}

variable "dead_letter_retention_days" {
  description = "Days a dead letter is kept after it was recorded (TPUJOBS_DEAD_LETTER_RETENTION_DAYS)."
  type        = number
  default     = 30

  validation {
    condition     = var.dead_letter_retention_days >= 1 && floor(var.dead_letter_retention_days) == var.dead_letter_retention_days
    error_message = "dead_letter_retention_days is a whole number of days, 1 or more."
  }
}

variable "dashboard_domain" {
  description = "The domain the web dashboard is served on through Identity-Aware Proxy (a DNS A record to output dashboard_address), e.g. \"tpujobs.example.com\". Empty: no load balancer, and the dashboard function refuses every request."
  type        = string
  default     = ""

  validation {
    condition     = can(regex("^([a-z0-9]([a-z0-9-]*[a-z0-9])?\\.)+[a-z]{2,}$", var.dashboard_domain)) || var.dashboard_domain == ""
    error_message = "dashboard_domain is a host name such as \"tpujobs.example.com\": no scheme, port or path (notifications link to https://DOMAIN/jobs/ID)."
  }
}

variable "dashboard_members" {
  description = "IAM members who may open the web dashboard through IAP, e.g. [\"group:ml-team@example.com\"]. Never allUsers or allAuthenticatedUsers: each page is shown to the signed-in caller with the jobs API's rights."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for m in var.dashboard_members : !contains(["allUsers", "allAuthenticatedUsers"], m)])
    error_message = "The dashboard needs an identity: allUsers and allAuthenticatedUsers are not allowed."
  }
}

variable "alert_notification_channels" {
  description = "Cloud Monitoring notification channels every tpujobs alert policy notifies (infra/monitoring.tf), by id: \"projects/P/notificationChannels/N\". Empty: the policies open incidents that only the console shows."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.alert_notification_channels : can(regex("^projects/[^/]+/notificationChannels/[^/]+$", c))])
    error_message = "Each notification channel is an id: projects/PROJECT/notificationChannels/ID."
  }
}

variable "recovery_latency_p95_alert_seconds" {
  description = "Alert when the 95th percentile of recovery latency (a lost attempt's end to the next attempt running) over an hour is above this many seconds."
  type        = number
  default     = 1800

  validation {
    condition     = var.recovery_latency_p95_alert_seconds > 0
    error_message = "recovery_latency_p95_alert_seconds is a positive number of seconds."
  }
}

variable "rejection_burst_alert_count" {
  description = "Alert when more rejection lines than this are written in 5 minutes (bad input, forged or unsigned messages, a job_id taken)."
  type        = number
  default     = 20

  validation {
    condition     = var.rejection_burst_alert_count >= 1
    error_message = "rejection_burst_alert_count is 1 or more."
  }
}

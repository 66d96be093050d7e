# Job output in Cloud Logging (docs/operations.md#job-output-in-cloud-logging): the agent on each
# TPU VM writes every output line as an entry of projects/PROJECT/logs/PREFIXtpujobs-job-output,
# signed with its attempt's key, alongside the export to the logs bucket.

variable "job_output_cloud_logging" {
  description = "Write each job's output lines to Cloud Logging too (a job may opt out with `cloud_logging: false`)."
  type        = bool
  default     = true
}

variable "job_output_lines_per_second" {
  description = "The most output lines one TPU VM host writes to Cloud Logging per second; the rest are counted, not sent."
  type        = number
  default     = 200

  validation {
    condition     = var.job_output_lines_per_second >= 1 && floor(var.job_output_lines_per_second) == var.job_output_lines_per_second
    error_message = "job_output_lines_per_second is a whole number, 1 or more."
  }
}

# Every VM account (the default one and each of var.job_service_accounts) may write log entries,
# nothing more: logWriter holds logging.logEntries.create (and route), no read. Reading needs
# roles/logging.viewer, which tpujobs grants to no one: whoever runs `tpujobs logs` has it.
resource "google_project_iam_member" "vm_log_writer" {
  for_each = var.job_output_cloud_logging ? local.job_accounts : {}

  project = var.project
  role    = "roles/logging.logWriter"
  member  = each.value.member
}

# The jobs API's `logs` reads a job's entries, checks each one's signature (it holds the master
# key) and answers only verified lines, for the job's owner or an admin: users need no log access.
# It reads through a view of the _Default bucket that holds the job-output log alone, so the
# function may read that log (viewAccessor on the view) and none of the project's others.
resource "google_logging_log_view" "job_output" {
  count = var.job_output_cloud_logging ? 1 : 0

  parent      = "projects/${var.project}"
  location    = "global"
  bucket      = "projects/${var.project}/locations/global/buckets/_Default"
  name        = "${var.prefix}tpujobs-job-output"
  description = "Job output written by the tpujobs agents; read by the jobs API, which checks each entry's signature."
  filter      = "LOG_ID(\"${var.prefix}tpujobs-job-output\")"
}

resource "google_logging_log_view_iam_member" "jobs_api_output_reader" {
  count = var.job_output_cloud_logging ? 1 : 0

  parent   = "projects/${var.project}"
  location = "global"
  bucket   = "_Default"
  name     = google_logging_log_view.job_output[0].name
  role     = "roles/logging.viewAccessor"
  member   = google_service_account.function["jobs"].member
}

# The web dashboard (the `dashboard` function, tpujobs.engine.dashboard) behind Identity-Aware Proxy.
#
# How IAP is put in front, and why this way: provider 6.50 has no `iap_enabled` on
# google_cloud_run_v2_service, and the dashboard's Cloud Run service is made and owned by Cloud
# Functions (google_cloudfunctions2_function), so IAP cannot be switched on the service itself;
# google_iap_web_cloud_run_service_iam_member grants access on a service whose IAP is already on,
# which nothing here could turn on. The supported way is the documented one for serverless
# backends: an external HTTPS load balancer whose backend service (a serverless NEG on the
# function) has `iap { enabled = true }` (Google-managed OAuth client), access granted with
# roles/iap.httpsResourceAccessor on that backend service to var.dashboard_members only. The
# function takes traffic only from the load balancer (ingress ALLOW_INTERNAL_AND_GCLB, functions.tf)
# and run.invoker only from IAP's service agent, and the code trusts nothing but IAP's signed
# header, checked against this backend service's audience (TPUJOBS_DASHBOARD_IAP_AUDIENCE).
# Without var.dashboard_domain no load balancer is made: the function then answers 401 to all.

locals {
  dashboard_on = var.dashboard_domain != ""
  # What IAP puts in its signed header's `aud` for a backend service.
  dashboard_env = local.dashboard_on ? {
    TPUJOBS_DASHBOARD_IAP_AUDIENCE = "/projects/${data.google_project.this.number}/global/backendServices/${google_compute_backend_service.dashboard[0].generated_id}"
  } : {}
  iap_service_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-iap.iam.gserviceaccount.com"
}

resource "google_project_service" "iap" {
  count = local.dashboard_on ? 1 : 0

  project            = var.project
  service            = "iap.googleapis.com"
  disable_on_destroy = false
}

# The function by name, not by resource: the function's environment names this backend's id.
resource "google_compute_region_network_endpoint_group" "dashboard" {
  count = local.dashboard_on ? 1 : 0

  name                  = "${var.prefix}tpujobs-dashboard"
  region                = var.region
  network_endpoint_type = "SERVERLESS"
  cloud_function {
    function = "${var.prefix}tpujobs-dashboard"
  }
}

resource "google_compute_backend_service" "dashboard" {
  count = local.dashboard_on ? 1 : 0

  name                  = "${var.prefix}tpujobs-dashboard"
  protocol              = "HTTPS"
  load_balancing_scheme = "EXTERNAL_MANAGED"
  backend {
    group = google_compute_region_network_endpoint_group.dashboard[0].id
  }
  iap {
    enabled = true # Google-managed OAuth client: no client secret in Terraform's state
  }
  depends_on = [google_project_service.iap]
}

resource "google_compute_url_map" "dashboard" {
  count = local.dashboard_on ? 1 : 0

  name            = "${var.prefix}tpujobs-dashboard"
  default_service = google_compute_backend_service.dashboard[0].id
}

resource "google_compute_managed_ssl_certificate" "dashboard" {
  count = local.dashboard_on ? 1 : 0

  name = "${var.prefix}tpujobs-dashboard"
  managed {
    domains = [var.dashboard_domain]
  }
}

resource "google_compute_target_https_proxy" "dashboard" {
  count = local.dashboard_on ? 1 : 0

  name             = "${var.prefix}tpujobs-dashboard"
  url_map          = google_compute_url_map.dashboard[0].id
  ssl_certificates = [google_compute_managed_ssl_certificate.dashboard[0].id]
}

resource "google_compute_global_address" "dashboard" {
  count = local.dashboard_on ? 1 : 0

  name = "${var.prefix}tpujobs-dashboard"
}

# HTTPS only: no port 80 rule, so nothing is ever served in the clear.
resource "google_compute_global_forwarding_rule" "dashboard" {
  count = local.dashboard_on ? 1 : 0

  name                  = "${var.prefix}tpujobs-dashboard"
  target                = google_compute_target_https_proxy.dashboard[0].id
  ip_address            = google_compute_global_address.dashboard[0].id
  port_range            = "443"
  load_balancing_scheme = "EXTERNAL_MANAGED"
}

# Who may open it: IAP admits these members, and the pages show each of them what the jobs API would.
resource "google_iap_web_backend_service_iam_member" "dashboard" {
  for_each = local.dashboard_on ? toset(var.dashboard_members) : toset([])

  project             = var.project
  web_backend_service = google_compute_backend_service.dashboard[0].name
  role                = "roles/iap.httpsResourceAccessor"
  member              = each.key
}

# IAP calls the function as its service agent; no one else is an invoker.
# The agent must exist first: `gcloud beta services identity create --service=iap.googleapis.com`
# (docs/operations.md, "Dashboard"); provider 6.50 has no google_project_service_identity.
resource "google_cloud_run_service_iam_member" "dashboard_iap_invoker" {
  count = local.dashboard_on ? 1 : 0

  location = var.region
  service  = google_cloudfunctions2_function.function["dashboard"].service_config[0].service
  role     = "roles/run.invoker"
  member   = local.iap_service_agent
}

# A job page shows its workers' last output lines (to its owner and admins, the code decides):
# read-only on the output folders alone (logs/jobs/ and each account's logs/accounts/EMAIL/),
# never the checkpoints or code beside them, never bucket-wide.
resource "google_storage_managed_folder_iam_member" "dashboard_logs" {
  for_each = merge(
    { for kind, folder in google_storage_managed_folder.jobs : "jobs/${kind}" => folder.name if kind == "logs" },
    { for key, folder in google_storage_managed_folder.account : key => folder.name if endswith(key, "/logs") },
  )

  bucket         = google_storage_bucket.logs.name
  managed_folder = each.value
  role           = "roles/storage.objectViewer"
  member         = google_service_account.function["dashboard"].member
}

output "dashboard_address" {
  description = "The IP address var.dashboard_domain must point at (an A record); null without a domain."
  value       = local.dashboard_on ? google_compute_global_address.dashboard[0].address : null
}

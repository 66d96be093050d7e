# The deployment's Compute Engine options (issue 27): which generations run there when a spec names
# no platform, and the boot images of its TPU VMs. Each reaches every function as a TPUJOBS_COMPUTE_*
# variable (functions.tf) that tpujobs.engine.settings.Settings reads; what the functions may call
# on Compute Engine is the custom role in iam.tf. Variables only: tests/infra evaluates this file
# with `terraform console`, which needs no provider.

variable "compute_by_default" {
  description = "TPU generations that run on Compute Engine when a spec names no platform (TPUJOBS_COMPUTE_BY_DEFAULT), from [\"v5p\", \"v6e\"]: the two that both the Cloud TPU API and Compute Engine serve. TPU7x (v7x) always runs on Compute Engine and v2 to v5e always on the Cloud TPU API, whatever this says. Empty, the default: v5p and v6e stay on the Cloud TPU API."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for generation in var.compute_by_default : contains(["v5p", "v6e"], generation)])
    error_message = "compute_by_default holds only \"v5p\" and \"v6e\": the other generations are served by one platform alone."
  }
}

variable "compute_image_project" {
  description = "Project of the boot images of Compute Engine TPU VMs (TPUJOBS_COMPUTE_IMAGE_PROJECT): Google's accelerator images by default."
  type        = string
  default     = "ubuntu-os-accelerator-images"

  validation {
    condition     = can(regex("^([a-z][a-z0-9.-]*[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.compute_image_project))
    error_message = "compute_image_project is a project id, e.g. \"ubuntu-os-accelerator-images\"."
  }
}

variable "compute_image_families" {
  description = "Image family of the boot disk of Compute Engine TPU VMs, by generation (TPUJOBS_COMPUTE_IMAGE_FAMILIES, as generation=family), for the generations whose family should differ from the code's: ubuntu-accel-2404-amd64-tpu-tpu7x for v7x, ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e for v5p and v6e. Images come from compute_image_project. Empty, the default: the code's families."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for generation in keys(var.compute_image_families) : contains(["v5p", "v6e", "v7x"], generation)])
    error_message = "compute_image_families is keyed by the generations Compute Engine serves: \"v5p\", \"v6e\" and \"v7x\"."
  }
  validation {
    condition     = alltrue([for family in values(var.compute_image_families) : can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", family))])
    error_message = "Each image family is 1 to 63 lower-case letters, digits and '-', starting with a letter."
  }
}

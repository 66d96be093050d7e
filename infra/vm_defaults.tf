# The deployment's VM options for the job specs that leave them out, so a team sets its network
# once (tpujobs.engine.settings.vm_defaults_from_env reads them; domain.spec.with_deployment_defaults
# fills them in at submit, and a spec that gives an option, even empty, keeps its own).
# Each is passed to every function as a TPUJOBS_DEFAULT_* variable (functions.tf).

variable "default_network" {
  description = "Network of the TPU VMs of jobs that name none (TPUJOBS_DEFAULT_NETWORK): a name, or projects/PROJECT/global/networks/NAME for a shared VPC. Empty: the TPU API's own, \"default\"."
  type        = string
  default     = ""

  validation {
    condition     = can(regex("^(|[a-z]([-a-z0-9]{0,61}[a-z0-9])?|projects/[^/]+/global/networks/[a-z]([-a-z0-9]{0,61}[a-z0-9])?)$", var.default_network))
    error_message = "default_network is empty, a network name, or projects/PROJECT/global/networks/NAME."
  }
}

variable "default_subnetwork" {
  description = "Subnetwork of the TPU VMs of jobs that name none (TPUJOBS_DEFAULT_SUBNETWORK): a name, or projects/PROJECT/regions/REGION/subnetworks/NAME, in the region of the jobs' zones. Needs default_network."
  type        = string
  default     = ""

  validation {
    condition     = can(regex("^(|[a-z]([-a-z0-9]{0,61}[a-z0-9])?|projects/[^/]+/regions/[a-z]+-[a-z]+[0-9]+/subnetworks/[a-z]([-a-z0-9]{0,61}[a-z0-9])?)$", var.default_subnetwork))
    error_message = "default_subnetwork is empty, a subnetwork name, or projects/PROJECT/regions/REGION/subnetworks/NAME."
  }
  validation {
    condition     = var.default_subnetwork == "" || var.default_network != ""
    error_message = "default_subnetwork needs default_network: without one the TPU API uses the network \"default\"."
  }
}

variable "default_internal_ips" {
  description = "TPU VMs without external IPs for jobs that do not say (TPUJOBS_DEFAULT_INTERNAL_IPS). Their subnetwork then needs Private Google Access or Cloud NAT to reach Pub/Sub, Storage, Secret Manager and Artifact Registry."
  type        = bool
  default     = false
}

variable "default_tags" {
  description = "Network tags of the TPU VMs of jobs that give none (TPUJOBS_DEFAULT_TAGS), for firewall rules and routes."
  type        = list(string)
  default     = []

  validation {
    condition     = length(var.default_tags) <= 64 && alltrue([for tag in var.default_tags : can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", tag))])
    error_message = "default_tags holds at most 64 RFC 1035 labels (lowercase letters, digits and hyphens, starting with a letter)."
  }
}

variable "default_data_disks" {
  description = "Existing persistent disks attached to the TPU VMs of jobs that give none (TPUJOBS_DEFAULT_DATA_DISKS): source_disk projects/PROJECT/zones/ZONE/disks/NAME and mode read-only (the default) or read-write. A disk is zonal: jobs in another zone are refused."
  type = list(object({
    source_disk = string
    mode        = optional(string, "read-only")
  }))
  default = []

  validation {
    condition = alltrue([
      for disk in var.default_data_disks :
      can(regex("^projects/[^/]+/zones/[a-z]+-[a-z]+[0-9]+-[a-z]/disks/[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", disk.source_disk))
      && contains(["read-only", "read-write"], disk.mode)
    ])
    error_message = "Each default_data_disks entry has source_disk projects/PROJECT/zones/ZONE/disks/NAME and mode read-only or read-write."
  }
}

variable "default_runtime_version" {
  description = "TPU runtime (software) version of jobs that name none (TPUJOBS_DEFAULT_RUNTIME_VERSION). Empty: tpujobs' own default, tpu-ubuntu2204-base."
  type        = string
  default     = ""
}

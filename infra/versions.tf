# Terraform and the Google provider. State lives in a GCS bucket you create once and name
# at init: terraform init -backend-config="bucket=YOUR_STATE_BUCKET".
# The provider is pinned to the version whose schema tests/infra/test_provider_schema.py holds
# infra/ against (@cdktf/provider-google 16.12.1, the last release of those bindings): change
# both together.
terraform {
  required_version = ">= 1.5"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = "6.50.0"
    }
  }

  backend "gcs" {
    prefix = "tpujobs"
  }
}

provider "google" {
  project = var.project
  region  = var.region
}

data "google_project" "this" {
  project_id = var.project
}

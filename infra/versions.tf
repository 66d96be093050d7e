# Terraform and the Google provider. State lives in a GCS bucket you create once and name
# at init: terraform init -backend-config="bucket=YOUR_STATE_BUCKET".
terraform {
  required_version = ">= 1.5"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 6.0, < 8.0"
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

"""What runs on the TPU VMs. Standard library only: it must run on stock TPU VM images."""

"""tpujobs: an event-driven, serverless control plane for training jobs on Cloud TPUs."""

__version__ = "0.1.0"

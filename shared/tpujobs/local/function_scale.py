"""How many requests each function serves at once in production, for the local stack to match.

infra/functions.tf deploys each function with at most `max` instances (var.max_instances may
change it per deployment) of `concurrent` requests each. Locally the pusher (`tpujobs.local.pusher`)
delivers each subscription up to that many messages at once, and each function's server runs as
many threads, so a burst meets the limits it meets in production. tests/infra holds the table to
functions.tf.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FunctionScale:
    """One function's scaling as infra/functions.tf sets it."""

    max_instances: int
    concurrency: int  # requests per instance (max_instance_request_concurrency)

    @property
    def requests_at_once(self) -> int:
        """What Cloud Run serves at once before it refuses (429): instances x requests each."""
        return self.max_instances * self.concurrency


SCALES: dict[str, FunctionScale] = {
    "submit_job": FunctionScale(20, 8),
    "on_worker_event": FunctionScale(20, 8),
    "on_preemption": FunctionScale(10, 8),
    "on_qr_state": FunctionScale(10, 8),
    "on_control": FunctionScale(5, 8),
    "converge": FunctionScale(20, 8),
    "reconcile": FunctionScale(20, 1),
    "record_dead_letter": FunctionScale(2, 8),
    "export_logs": FunctionScale(5, 1),
    "notify": FunctionScale(5, 16),
    "jobs": FunctionScale(10, 8),
    "attempt_key": FunctionScale(10, 8),
    "dashboard": FunctionScale(5, 8),
}
"""Function target -> its scaling in infra/functions.tf (`max`, `concurrent`)."""


def requests_at_once(target: str) -> int:
    """How many requests of the function `target` production serves at once."""
    return SCALES[target].requests_at_once

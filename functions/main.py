"""Every Cloud Functions target of tpujobs. Each one decodes its event and calls the service.

Deployed with `--source functions/` (the bundle also carries the tpujobs package), and run
locally by `tpujobs dev up` under functions-framework with Pub/Sub push subscriptions.
A handler that returns acknowledges its message; one that raises TransientError gets it
redelivered. Bad input is recorded and acknowledged, never retried.
"""

from __future__ import annotations

import functions_framework
from cloudevents.http.event import CloudEvent

from tpujobs import runtime
from tpujobs.inbound import from_cloud_event


@functions_framework.cloud_event
def submit_job(event: CloudEvent) -> None:
    """tpujobs-submit: a job spec becomes a job document and a queued-resource request."""
    message = from_cloud_event(event["id"], event["source"], event.data)
    runtime.job_service().submit(message)

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
from tpujobs.inbound import InboundMessage, from_cloud_event


def _message(event: CloudEvent) -> InboundMessage:
    return from_cloud_event(event["id"], event["source"], event.data)


@functions_framework.cloud_event
def submit_job(event: CloudEvent) -> None:
    """tpujobs-submit: a job spec becomes a job document and a queued-resource request."""
    runtime.job_service().submit(_message(event))


@functions_framework.cloud_event
def on_worker_event(event: CloudEvent) -> None:
    """tpujobs-worker-events: workers started, beat, exited or checkpointed."""
    runtime.job_service().on_worker_report(_message(event))


@functions_framework.cloud_event
def on_preemption(event: CloudEvent) -> None:
    """tpujobs-preemption: a worker got its preemption notice; recover by the job's rules."""
    runtime.job_service().on_preemption(_message(event))


@functions_framework.cloud_event
def on_qr_state(event: CloudEvent) -> None:
    """tpujobs-qr-state: a queued resource was observed in some state."""
    runtime.job_service().on_qr_state(_message(event))


@functions_framework.cloud_event
def on_control(event: CloudEvent) -> None:
    """tpujobs-control: a user's cancel request."""
    runtime.job_service().on_control(_message(event))


@functions_framework.cloud_event
def reconcile(event: CloudEvent) -> None:
    """tpujobs-reconcile: the scheduler's tick; compare what is with what should be, repair."""
    runtime.reconciler().tick()

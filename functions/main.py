"""Every Cloud Functions target of tpujobs. Each one decodes its event and calls the service of its use case.

Deployed with `--source functions/` (the bundle also carries the tpujobs package), and run
locally by `tpujobs dev up` under functions-framework with Pub/Sub push subscriptions.
A handler that returns acknowledges its message; one that raises TransientError gets it
redelivered. Bad input is recorded and acknowledged, never retried.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import flask
import functions_framework
from cloudevents.http.event import CloudEvent

from tpujobs.engine import process_log
from tpujobs.engine.inbound import InboundMessage, from_cloud_event, subscription_of
from tpujobs.runtime import instances

process_log.configure()


def _traced(event: CloudEvent) -> process_log.Handling:
    """Every log line while handling `event` carries its trace (W3C traceparent)."""
    project = os.environ.get("GOOGLE_CLOUD_PROJECT", "")
    return process_log.handling(trace=process_log.trace_from_traceparent(event.get("traceparent"), project))


def _handle(event: CloudEvent, target: str, handler: Callable[[InboundMessage], object]) -> None:
    """Decode the Pub/Sub message, with its topic, and hand it over.

    A push to the bare function URL (production's, and the local stack's) names no topic:
    functions-framework drops the envelope's subscription when it builds the CloudEvent, so
    it is read from the request body here, and the topic from its name (tpujobs.engine.inbound).
    """
    body = flask.request.get_json(silent=True) if flask.has_request_context() else None
    message = from_cloud_event(
        event["id"],
        event["source"],
        event.data,
        push_subscription=subscription_of(body),
        prefix=instances.settings().prefix,
        target=target,
    )
    with _traced(event):
        handler(message)


@functions_framework.cloud_event
def submit_job(event: CloudEvent) -> None:
    """tpujobs-submit: a job spec becomes a job document and a queued-resource request."""
    _handle(event, "submit_job", instances.engine().submission.submit)


@functions_framework.cloud_event
def on_worker_event(event: CloudEvent) -> None:
    """tpujobs-worker-events: workers started, beat, exited or checkpointed."""
    _handle(event, "on_worker_event", instances.engine().worker_events.on_worker_report)


@functions_framework.cloud_event
def on_preemption(event: CloudEvent) -> None:
    """tpujobs-preemption: a worker got its preemption notice; recover by the job's rules."""
    _handle(event, "on_preemption", instances.engine().capacity_events.on_preemption)


@functions_framework.cloud_event
def on_qr_state(event: CloudEvent) -> None:
    """tpujobs-qr-state: a queued resource was observed in some state."""
    _handle(event, "on_qr_state", instances.engine().capacity_events.on_qr_state)


@functions_framework.cloud_event
def on_control(event: CloudEvent) -> None:
    """tpujobs-control: a user's cancel, resume or rerun request."""
    _handle(event, "on_control", instances.engine().controls.on_control)


@functions_framework.cloud_event
def converge(event: CloudEvent) -> None:
    """tpujobs-converge: the jobs API committed a change; do the capacity work it asks (a job's id or a pool's name)."""
    _handle(event, "converge", instances.engine().convergence.on_converge)


@functions_framework.cloud_event
def reconcile(event: CloudEvent) -> None:
    """tpujobs-reconcile: the scheduler's tick cuts the work into shards and publishes them on the
    same topic; each shard message compares and repairs its part (a malformed one is recorded)."""
    _handle(event, "reconcile", instances.reconciler().handle)


@functions_framework.cloud_event
def record_dead_letter(event: CloudEvent) -> None:
    """tpujobs-dead-letter: keep a message that failed too many deliveries, to read and replay."""
    _handle(event, "record_dead_letter", instances.dead_letters().record)


@functions_framework.cloud_event
def export_logs(event: CloudEvent) -> None:
    """tpujobs-log-export: an ended attempt's output chunks become worker-K.log and attempt.log."""
    _handle(event, "export_logs", instances.output_exporter().handle)


@functions_framework.cloud_event
def notify(event: CloudEvent) -> None:
    """tpujobs-status: post a job's state change to the webhooks that asked for it (tpujobs.engine.notifications)."""
    _handle(event, "notify", instances.notifier().handle)


@functions_framework.http
def jobs(request: flask.Request) -> tuple[str, int, dict[str, str]]:
    """HTTP POST {"action": "list" | "describe" | "cancel", ...}: see tpujobs.engine.api. It holds no
    capacity: what changes capacity is committed, then handed to `converge` (tpujobs-converge)."""
    project = os.environ.get("GOOGLE_CLOUD_PROJECT", "")
    with process_log.handling(trace=process_log.trace_from_traceparent(request.headers.get("traceparent"), project)):
        answer = instances.jobs_api().handle(
            request.method, request.url, request.headers, request.get_data(cache=False)
        )
    return json.dumps(answer.body), answer.status, {"Content-Type": "application/json", **answer.headers}


@functions_framework.http
def attempt_key(request: flask.Request) -> tuple[str, int, dict[str, str]]:
    """HTTP POST {"action": "attempt-key", ...}: a worker host's attempt key, for its VM's identity
    token (tpujobs.engine.key_api). The only function the VMs' accounts may invoke."""
    project = os.environ.get("GOOGLE_CLOUD_PROJECT", "")
    with process_log.handling(trace=process_log.trace_from_traceparent(request.headers.get("traceparent"), project)):
        answer = instances.key_api().handle(request.method, request.url, request.headers, request.get_data(cache=False))
    return json.dumps(answer.body), answer.status, {"Content-Type": "application/json", **answer.headers}


@functions_framework.http
def dashboard(request: flask.Request) -> tuple[str, int, dict[str, str]]:
    """HTTP GET: the web dashboard's pages, for the caller IAP signed for (tpujobs.engine.dashboard)."""
    page = instances.dashboard().handle(request.method, request.path, request.args, request.headers)
    return page.body, page.status, dict(page.headers)

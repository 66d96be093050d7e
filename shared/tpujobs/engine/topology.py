"""Which topic feeds which function: one table for the local stack, tests and infra.

Production (infra/pubsub.tf) wires each inbound topic to its function with a push
subscription of our own, named `{prefix}{topic}--{target}`, that posts to the function's
bare URL; `tpujobs dev up` builds the same wiring with the Pub/Sub emulator. A push to a
bare URL names no topic, so a function learns its topic back from that name
(`route_of_subscription`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

SUBMIT = "tpujobs-submit"
CONTROL = "tpujobs-control"
CONVERGE = "tpujobs-converge"  # the jobs API's hand-offs: a job's id or a pool's name (engine.converge_requests)
QR_STATE = "tpujobs-qr-state"
PREEMPTION = "tpujobs-preemption"
WORKER_EVENTS = "tpujobs-worker-events"
RECONCILE = "tpujobs-reconcile"
LOG_EXPORT = "tpujobs-log-export"
STATUS = "tpujobs-status"
DEAD_LETTER = "tpujobs-dead-letter"

ALL_TOPICS = (
    SUBMIT,
    CONTROL,
    CONVERGE,
    QR_STATE,
    PREEMPTION,
    WORKER_EVENTS,
    RECONCILE,
    LOG_EXPORT,
    STATUS,
    DEAD_LETTER,
)


_SUBSCRIPTION = re.compile(r"(?:projects/[^/]+/subscriptions/)?(?P<name>[^/]+)")
MAX_ACK_DEADLINE_S = 600  # Pub/Sub's own limit on a subscription's ack deadline


@dataclass(frozen=True)
class FunctionRoute:
    """One function target in functions/main.py and the topic that triggers it (None: HTTP).

    `timeout_s` is the function's deadline as infra/functions.tf deploys it: its push
    subscription waits that long (at most MAX_ACK_DEADLINE_S) before counting a failure.
    """

    target: str
    signature: Literal["cloudevent", "http"]
    topic: str | None
    timeout_s: int = 60


FUNCTIONS: tuple[FunctionRoute, ...] = (
    FunctionRoute("submit_job", "cloudevent", SUBMIT),
    FunctionRoute("on_worker_event", "cloudevent", WORKER_EVENTS),
    FunctionRoute("on_preemption", "cloudevent", PREEMPTION),
    FunctionRoute("on_qr_state", "cloudevent", QR_STATE),
    FunctionRoute("on_control", "cloudevent", CONTROL),
    FunctionRoute("converge", "cloudevent", CONVERGE),  # the capacity work the jobs API hands off
    FunctionRoute("reconcile", "cloudevent", RECONCILE, timeout_s=300),
    FunctionRoute("record_dead_letter", "cloudevent", DEAD_LETTER),
    FunctionRoute("export_logs", "cloudevent", LOG_EXPORT, timeout_s=540),
    FunctionRoute("notify", "cloudevent", STATUS),  # webhooks (tpujobs.engine.notifications)
    FunctionRoute("jobs", "http", None),  # list, describe, cancel (tpujobs.engine.api)
    FunctionRoute("attempt_key", "http", None),  # a host's attempt key, at TPUJOBS_KEY_URL (tpujobs.engine.key_api)
    FunctionRoute("dashboard", "http", None),  # the web dashboard, behind IAP (tpujobs.engine.dashboard)
)


def topic_name(base: str, prefix: str = "") -> str:
    """The deployed name of a topic: the optional deployment prefix, then its base name (`SUBMIT`, ...)."""
    return f"{prefix}{base}"


def push_subscription_name(route: FunctionRoute, prefix: str = "") -> str:
    """The push subscription that delivers a route's topic to its function."""
    assert route.topic is not None, f"{route.target} is an HTTP function and has no subscription"
    return f"{prefix}{route.topic}--{route.target}"


def route_of_subscription(subscription: str, prefix: str = "") -> FunctionRoute | None:
    """The route whose push subscription this is (`projects/P/subscriptions/NAME`, or NAME
    alone) in the deployment with `prefix`; None for any other subscription. Names are
    compared whole, so another deployment's subscriptions never match."""
    match = _SUBSCRIPTION.fullmatch(subscription)
    if match is None:
        return None
    for route in FUNCTIONS:
        if route.topic is not None and push_subscription_name(route, prefix) == match["name"]:
            return route
    return None


def route_of_target(target: str) -> FunctionRoute:
    """The route of a function target of functions/main.py."""
    for route in FUNCTIONS:
        if route.target == target:
            return route
    raise KeyError(f"no function target {target!r} in topology.FUNCTIONS")


def ack_deadline_s(route: FunctionRoute) -> int:
    """How long a push waits for the function before Pub/Sub counts a failed delivery."""
    return min(route.timeout_s, MAX_ACK_DEADLINE_S)


def push_service_account(project: str, prefix: str = "") -> str:
    """The account Pub/Sub signs push requests as (infra/pubsub.tf `google_service_account.push`)."""
    return f"{prefix}tpujobs-push@{project}.iam.gserviceaccount.com"

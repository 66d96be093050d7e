"""Which topic feeds which function: one table for the local stack, tests and infra.

Production wires each inbound topic to its function with a push (Eventarc) subscription;
`tpujobs dev up` builds the same wiring with the Pub/Sub emulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SUBMIT = "tpujobs-submit"
CONTROL = "tpujobs-control"
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
    QR_STATE,
    PREEMPTION,
    WORKER_EVENTS,
    RECONCILE,
    LOG_EXPORT,
    STATUS,
    DEAD_LETTER,
)


@dataclass(frozen=True)
class FunctionRoute:
    """One function target in functions/main.py and the topic that triggers it (None: HTTP)."""

    target: str
    signature: Literal["cloudevent", "http"]
    topic: str | None


FUNCTIONS: tuple[FunctionRoute, ...] = (
    FunctionRoute("submit_job", "cloudevent", SUBMIT),
    FunctionRoute("on_worker_event", "cloudevent", WORKER_EVENTS),
    FunctionRoute("on_preemption", "cloudevent", PREEMPTION),
    FunctionRoute("on_qr_state", "cloudevent", QR_STATE),
    FunctionRoute("on_control", "cloudevent", CONTROL),
    FunctionRoute("reconcile", "cloudevent", RECONCILE),
    FunctionRoute("record_dead_letter", "cloudevent", DEAD_LETTER),
    FunctionRoute("export_logs", "cloudevent", LOG_EXPORT),
    FunctionRoute("jobs", "http", None),  # list, describe, cancel (tpujobs.api)
)


def topic_name(base: str, prefix: str = "") -> str:
    """The deployed name of a topic: the optional deployment prefix, then the contract name."""
    return f"{prefix}{base}"


def push_subscription_name(route: FunctionRoute, prefix: str = "") -> str:
    """The push subscription that delivers a route's topic to its function."""
    assert route.topic is not None, f"{route.target} is an HTTP function and has no subscription"
    return f"{prefix}{route.topic}--{route.target}"

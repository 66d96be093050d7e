"""The events that matter, each written where the change is committed: one per event.

`EVENTS` and `FIELDS` are the contract, kept as data. `emit` hands each event to the sinks of
this process (`add_sink`: the function instance's `engine.metrics.MetricsRecorder`, which writes
the metrics of infra/monitoring.tf to Cloud Monitoring), and writes one structured line for
people reading the logs; no metric reads that line, since any holder of logging.logEntries.create
can write its copy. Rename nothing here without `engine.metrics.METRICS` and the Terraform.
Each event is emitted where the change is committed (`jobs.journal`, `jobs.submission`,
`jobs.rejections`, `dead_letters`, the reconciler), never before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from tpujobs.domain.accounting import account
from tpujobs.domain.job import Job
from tpujobs.domain.states import ATTEMPT_LIVE, EventKind, JobState
from tpujobs.domain.transitions import Decision, Observation
from tpujobs.engine import process_log

Value = str | int | float

_JOB = ("job_id", "owner", "family", "capacity", "attempt")
EVENTS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "job_submitted": ("A job was accepted and recorded QUEUED.", _JOB),
    "admitted": ("Admission let a job in; its queue wait is over.", (*_JOB, "queue_wait_seconds")),
    "preempted": (
        "An attempt lost its capacity (preemption, hardware, a lost host).",
        (*_JOB, "capacity_state", "source", "to_state"),
    ),
    "recovered": ("A job runs again after an attempt lost its capacity.", (*_JOB, "recovery_seconds")),
    "job_succeeded": ("A job ended SUCCEEDED.", (*_JOB, "reason_class", "chip_hours")),
    "job_failed": ("A job ended FAILED; `reason_class` says what ended it.", (*_JOB, "reason_class", "chip_hours")),
    "job_cancelled": ("A job ended CANCELLED.", (*_JOB, "reason_class", "chip_hours")),
    "job_stuck": (
        "The reconciler found a job in a state past its limit and converged it.",
        ("job_id", "owner", "state", "stuck_seconds"),
    ),
    "rejected": ("A message was refused and acknowledged (bad input, forged, a job_id taken).", ("topic", "count")),
    "dead_lettered": ("Pub/Sub gave up delivering a message; it was recorded.", ("topic", "delivery_attempts")),
}
"""Event name -> (what it means, the fields its line carries besides `event`)."""

FIELDS: Mapping[str, str] = {
    "job_id": "the job",
    "owner": "who submitted it (an email)",
    "family": "the TPU family of its accelerator_type (v4, v5p, ...)",
    "capacity": "spot or on-demand",
    "attempt": "the attempt the change concerns",
    "queue_wait_seconds": "admitted: seconds the attempt waited QUEUED",
    "capacity_state": "preempted: the holding's state that said so (LOSING, LOST, GONE, ...; - when a host said it)",
    "source": "preempted: who saw it (agent: the host's notice; tpu: the API's state; reconciler)",
    "to_state": "preempted: where the job went (RECOVERING, FAILED, QUEUED)",
    "recovery_seconds": "recovered: seconds from the lost attempt's end to the next one running",
    "reason_class": "terminal events: the observation that ended the job (an EventKind value)",
    "chip_hours": "terminal events: chip-hours over every attempt",
    "state": "job_stuck: the state it was stuck in",
    "stuck_seconds": "job_stuck: seconds since its last change",
    "topic": "rejected: the topic it came on (deployed name); dead_lettered: the original topic (base name)",
    "count": "rejected: how many messages the line stands for (forgeries are counted per minute)",
    "delivery_attempts": "dead_lettered: deliveries Pub/Sub tried (-1: not said)",
}
"""Field name -> what it holds. Low-cardinality fields only may become metric labels."""

_TERMINAL_EVENTS = {
    JobState.SUCCEEDED: "job_succeeded",
    JobState.FAILED: "job_failed",
    JobState.CANCELLED: "job_cancelled",
}


@dataclass(frozen=True)
class MetricEvent:
    """One line: its event name and fields, checked against the table when built."""

    name: str
    fields: Mapping[str, Value] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in EVENTS:
            raise ValueError(f"unknown metric event {self.name!r}; known: {sorted(EVENTS)}")
        unknown = set(self.fields) - set(EVENTS[self.name][1])
        if unknown:
            raise ValueError(f"metric event {self.name!r} has no field(s) {sorted(unknown)}")

    def payload(self) -> dict[str, Value]:
        return {"event": self.name, **self.fields}

    def text(self) -> str:
        """`job_failed job_id=x reason_class=command_failed`: the readable message."""
        return " ".join([self.name, *(f"{k}={v}" for k, v in self.fields.items())])


MetricSink = Callable[[MetricEvent], None]
_sinks: list[MetricSink] = []  # this process's: the runtime adds the function instance's recorder


def add_sink(sink: MetricSink) -> Callable[[], None]:
    """Hand every event emitted from now on to `sink` too; the callable returned removes it."""
    _sinks.append(sink)
    return lambda: _sinks.remove(sink) if sink in _sinks else None


def emit(logger: logging.Logger, event: MetricEvent, level: int = logging.INFO) -> None:
    """Hand the event to this process's sinks, and write its line for people reading the logs:
    its text as the message, its fields as the JSON payload's."""
    for sink in list(_sinks):
        try:
            sink(event)
        except Exception:  # a metric must never fail the handler that committed the change
            logger.warning("metric event %s not recorded", event.name, exc_info=True)
    logger.log(level, event.text(), extra={process_log.EVENT_FIELDS: event.payload()})


def _job_fields(job: Job, attempt: int) -> dict[str, Value]:
    return {
        "job_id": job.job_id,
        "owner": job.owner,
        "family": job.spec.accelerator_type.partition("-")[0],
        "capacity": "on-demand" if job.on_demand else str(job.spec.capacity),
        "attempt": attempt,
    }


def submitted(job: Job) -> MetricEvent:
    return MetricEvent("job_submitted", _job_fields(job, job.attempt))


def for_change(seen: Observation, decision: Decision) -> list[MetricEvent]:
    """The lines a committed change writes (none for most): pure, from the observation and the job after it."""
    job, event = decision.job, decision.event
    base = _job_fields(job, event.attempt)
    found: list[MetricEvent] = []
    if seen.kind is EventKind.ADMITTED and event.from_state is JobState.QUEUED:
        usage = next((u for u in job.usage if u.attempt == event.attempt), None)
        waited = (event.at - usage.waiting_since).total_seconds() if usage else 0.0
        found.append(MetricEvent("admitted", {**base, "queue_wait_seconds": round(max(0.0, waited), 3)}))
    if seen.kind is EventKind.CAPACITY_LOST and event.from_state in ATTEMPT_LIVE:
        fields = {
            **base,
            "capacity_state": seen.capacity_state or "-",
            "source": seen.source,
            "to_state": event.to_state.value,
        }
        found.append(MetricEvent("preempted", fields))
    if event.to_state is JobState.RUNNING and event.from_state is not JobState.RUNNING:
        lost_at = _previous_attempt_lost_at(job, event.attempt)
        if lost_at is not None:
            seconds = round(max(0.0, (event.at - lost_at).total_seconds()), 3)
            found.append(MetricEvent("recovered", {**base, "recovery_seconds": seconds}))
    name = _TERMINAL_EVENTS.get(event.to_state)
    if name is not None and event.from_state is not event.to_state:
        chip_hours = round(account(job.usage, event.at).chip_hours, 6)
        found.append(MetricEvent(name, {**base, "reason_class": seen.kind.value, "chip_hours": chip_hours}))
    return found


def _previous_attempt_lost_at(job: Job, attempt: int) -> datetime | None:
    """When the attempt before `attempt` ended, if it ended because its capacity went away."""
    previous = next((u for u in job.usage if u.attempt == attempt - 1), None)
    if previous is None or not previous.capacity_lost or previous.ended_at is None:
        return None
    return previous.ended_at


def stuck(job: Job, now: datetime) -> MetricEvent:
    since = job.updated_at or job.created_at or now
    fields: dict[str, Value] = {
        "job_id": job.job_id,
        "owner": job.owner,
        "state": job.state.value,
        "stuck_seconds": round(max(0.0, (now - since).total_seconds()), 3),
    }
    return MetricEvent("job_stuck", fields)


def rejected(topic: str, count: int = 1) -> MetricEvent:
    return MetricEvent("rejected", {"topic": topic, "count": count})


def dead_lettered(topic: str, delivery_attempts: int | None) -> MetricEvent:
    attempts = -1 if delivery_attempts is None else delivery_attempts
    return MetricEvent("dead_lettered", {"topic": topic or "unknown", "delivery_attempts": attempts})

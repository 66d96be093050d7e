"""Logging for the functions: Cloud Logging's JSON on GCP, one readable line locally.

Cloud Functions (2nd gen) turn each JSON line on stdout into a structured entry:
`severity` and `message` become the entry's, `logging.googleapis.com/labels` its
labels (job_id, so one job's story is one filter away), and
`logging.googleapis.com/trace` ties it to the request's trace; a metric event's fields
(`engine.metric_events`) are top-level keys, so its jsonPayload's. Locally the same
records print as `12:00:01.234 INFO  job=train-1 message`. `TPUJOBS_LOG_FORMAT=json`
(or `text`) overrides the choice: the local stack then writes what production writes.

The job and trace of the event being handled live in context variables set by
`handling(...)`, so no call site has to pass them along.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone

EVENT_FIELDS = "tpujobs_event"  # a record's attribute holding a metric event's fields (`engine.metric_events`)

_job_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("tpujobs_job_id", default=None)
_trace: contextvars.ContextVar[str | None] = contextvars.ContextVar("tpujobs_trace", default=None)


Handling = contextlib.AbstractContextManager[None]


@contextlib.contextmanager
def handling(job_id: str | None = None, trace: str | None = None) -> Iterator[None]:
    """Label every record logged inside with the job and the trace of the event being handled."""
    job_token = _job_id.set(job_id)
    trace_token = _trace.set(trace)
    try:
        yield
    finally:
        _job_id.reset(job_token)
        _trace.reset(trace_token)


def bind_job(job_id: str) -> None:
    """Name the job once the handler has decoded it (the event alone does not say)."""
    _job_id.set(job_id)


def trace_from_traceparent(traceparent: str | None, project: str) -> str | None:
    """`projects/P/traces/T` from a W3C traceparent header (`00-T-S-01`), as Cloud Logging wants."""
    if not traceparent:
        return None
    parts = traceparent.split("-")
    if len(parts) < 3 or len(parts[1]) != 32:
        return None
    return f"projects/{project}/traces/{parts[1]}"


class CloudLoggingFormatter(logging.Formatter):
    """One JSON object per record, in the shape Cloud Logging's agent parses."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "severity": record.levelname,
            "message": record.getMessage(),
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
            "logger": record.name,
        }
        labels = {"component": "tpujobs"}
        job_id = getattr(record, "job_id", None) or _job_id.get()
        if job_id:
            labels["job_id"] = job_id
        entry["logging.googleapis.com/labels"] = labels
        trace = _trace.get()
        if trace:
            entry["logging.googleapis.com/trace"] = trace
        fields = getattr(record, EVENT_FIELDS, None)  # a metric event's (`engine.metric_events`): jsonPayload's
        if isinstance(fields, dict):
            entry.update({k: v for k, v in fields.items() if k not in entry})
        if record.exc_info:
            entry["message"] = f"{entry['message']}\n{self.formatException(record.exc_info)}"
        return json.dumps(entry, ensure_ascii=False)


class LocalFormatter(logging.Formatter):
    """`12:00:01.234 INFO  job=train-1 the message`: what a person reads in a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]
        job_id = getattr(record, "job_id", None) or _job_id.get()
        job = f"job={job_id} " if job_id else ""
        line = f"{when} {record.levelname:<7} {job}{record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(environ: Mapping[str, str] | None = None) -> None:
    """Install the formatter that fits where we run; idempotent."""
    env = os.environ if environ is None else environ
    on_gcp = bool(env.get("K_SERVICE") or env.get("FUNCTION_TARGET")) and env.get("TPUJOBS_LOCAL_STACK") != "1"
    chosen = env.get("TPUJOBS_LOG_FORMAT", "").strip().lower()  # json or text: the local stack's functions as on GCP
    if chosen not in ("", "json", "text"):
        raise ValueError(f"TPUJOBS_LOG_FORMAT is {chosen!r}: json, text or unset (json on GCP, text elsewhere)")
    as_json = chosen == "json" or (on_gcp and chosen != "text")
    formatter: logging.Formatter = CloudLoggingFormatter() if as_json else LocalFormatter()
    root = logging.getLogger()
    for handler in root.handlers:
        if getattr(handler, "_tpujobs", False):
            handler.setFormatter(formatter)
            return
    handler = logging.StreamHandler(sys.stdout)
    handler._tpujobs = True  # type: ignore[attr-defined]
    handler.setFormatter(formatter)
    root.addHandler(handler)
    root.setLevel(env.get("TPUJOBS_LOG_LEVEL", "INFO"))

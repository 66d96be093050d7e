"""Structured logs: Cloud Logging's JSON shape on GCP, one readable line locally."""

from __future__ import annotations

import contextvars
import json
import logging

import pytest

from tpujobs.engine import process_log


def record(message: str = "moved", level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("tpujobs.engine.job_service", level, __file__, 1, message, None, None)


def test_a_record_on_gcp_is_one_json_object_with_severity_labels_and_trace():
    """severity, message, the job as a label and the trace as Cloud Logging names them."""
    trace = process_log.trace_from_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "proj")
    with process_log.handling(trace=trace):
        process_log.bind_job("train-1")
        entry = json.loads(process_log.CloudLoggingFormatter().format(record("job moved", logging.WARNING)))
    assert entry["severity"] == "WARNING" and entry["message"] == "job moved"
    assert entry["logging.googleapis.com/labels"] == {"component": "tpujobs", "job_id": "train-1"}
    assert entry["logging.googleapis.com/trace"] == "projects/proj/traces/4bf92f3577b34da6a3ce929d0e0e4736"


def test_the_job_label_does_not_leak_past_the_event_that_set_it():
    """After `handling` ends, records carry no job: a worker thread's next event starts clean."""

    def one_thread() -> dict:
        with process_log.handling():
            process_log.bind_job("train-1")
        return json.loads(process_log.CloudLoggingFormatter().format(record()))

    entry = contextvars.Context().run(one_thread)  # a fresh thread's context, whatever ran before
    assert "job_id" not in entry["logging.googleapis.com/labels"]
    assert "logging.googleapis.com/trace" not in entry


def test_locally_a_record_is_one_readable_line():
    """Time, level, job and message on one line."""
    with process_log.handling(job_id="train-2"):
        line = process_log.LocalFormatter().format(record("queued resource requested"))
    assert line.endswith("INFO    job=train-2 queued resource requested")
    assert "\n" not in line


def test_a_malformed_traceparent_gives_no_trace():
    """Anything but a W3C traceparent is ignored rather than logged as a bogus trace."""
    assert process_log.trace_from_traceparent("garbage", "p") is None
    assert process_log.trace_from_traceparent(None, "p") is None


def test_configure_picks_json_on_cloud_functions_and_lines_in_the_local_stack():
    """K_SERVICE means Cloud Functions; the local stack always prints lines."""
    root = logging.getLogger()
    try:
        process_log.configure({"K_SERVICE": "submit-job"})
        mine = [h for h in root.handlers if getattr(h, "_tpujobs", False)]
        assert len(mine) == 1 and isinstance(mine[0].formatter, process_log.CloudLoggingFormatter)
        process_log.configure({"K_SERVICE": "submit-job", "TPUJOBS_LOCAL_STACK": "1"})
        mine = [h for h in root.handlers if getattr(h, "_tpujobs", False)]
        assert len(mine) == 1 and isinstance(mine[0].formatter, process_log.LocalFormatter)
    finally:
        for handler in [h for h in root.handlers if getattr(h, "_tpujobs", False)]:
            root.removeHandler(handler)


def test_a_metric_events_fields_become_the_json_payloads_and_its_text_the_local_line():
    """What Cloud Monitoring's filters read (`jsonPayload.event`, ...) is top-level JSON; a person reads k=v."""
    from tpujobs.engine import metric_events

    event = metric_events.rejected("tpujobs-submit", 3)
    line = record(event.text(), logging.WARNING)
    setattr(line, process_log.EVENT_FIELDS, event.payload())
    entry = json.loads(process_log.CloudLoggingFormatter().format(line))
    assert (entry["event"], entry["topic"], entry["count"], entry["severity"]) == (
        "rejected",
        "tpujobs-submit",
        3,
        "WARNING",
    )
    assert process_log.LocalFormatter().format(line).endswith("rejected topic=tpujobs-submit count=3")


def test_tpujobs_log_format_chooses_json_or_lines_and_refuses_anything_else():
    """json makes the local stack write production's lines; text the reverse; a typo is an error."""
    root = logging.getLogger()

    def formatter() -> logging.Formatter | None:
        mine = [h for h in root.handlers if getattr(h, "_tpujobs", False)]
        assert len(mine) == 1
        return mine[0].formatter

    try:
        process_log.configure({"K_SERVICE": "s", "TPUJOBS_LOCAL_STACK": "1", "TPUJOBS_LOG_FORMAT": "json"})
        assert isinstance(formatter(), process_log.CloudLoggingFormatter)
        process_log.configure({"K_SERVICE": "s", "TPUJOBS_LOG_FORMAT": "text"})
        assert isinstance(formatter(), process_log.LocalFormatter)
        with pytest.raises(ValueError, match="TPUJOBS_LOG_FORMAT"):
            process_log.configure({"TPUJOBS_LOG_FORMAT": "yaml"})
    finally:
        for handler in [h for h in root.handlers if getattr(h, "_tpujobs", False)]:
            root.removeHandler(handler)

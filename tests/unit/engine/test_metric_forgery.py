"""Who can move a metric (issue 37, item 5): only the functions, never a job.

A job's account holds roles/logging.logWriter, so its code can write an entry shaped like a
function's line, field for field; the local Cloud Logging stand-in keeps who wrote each entry, as
Google knows the caller of entries:write, and shows that no field tells the copy apart. The metrics
used to be log-based, and counted such a copy. Now the functions write their metrics to Cloud
Monitoring themselves (`engine.metrics`, `adapters.monitoring`) and infra/ declares no log-based
metric, so the copy moves nothing; and a job's credentials writing a time series are refused, as
only the functions' accounts hold roles/monitoring.metricWriter (infra/iam.tf).
"""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from support.cloud_logging import logging_stand_in
from tpujobs.adapters.monitoring import CloudMonitoringWriter, Task
from tpujobs.engine import metric_events, process_log
from tpujobs.engine.errors import PermanentError
from tpujobs.engine.metrics import MetricsRecorder, Point, metric_type
from tpujobs.local.function_accounts import function_account
from tpujobs.local.log_filters import entry_from_line
from tpujobs.local.simulator.cloud_logging import PLATFORM, LoggingServer
from tpujobs.local.simulator.cloud_monitoring import MonitoringServer

INFRA = Path(__file__).resolve().parents[3] / "infra"
PROJECT = "demo"
JOB_ACCOUNT = "tpujobs-tpu-vm@demo.iam.gserviceaccount.com"
FUNCTION_ACCOUNT = function_account("record_dead_letter", PROJECT)
FUNCTION = {"type": "cloud_run_revision", "labels": {"service_name": "tpujobs-dead-letters"}}
DEAD_LETTERS = metric_type("", "dead_letters")
log = logging.getLogger("tpujobs.test_metric_forgery")


def function_line() -> str:
    """The JSON line the dead_letters function prints for one dead letter, as on Cloud Run."""
    record = logging.LogRecord("tpujobs", logging.WARNING, __file__, 1, "x", None, None)
    event = metric_events.dead_lettered("tpujobs-submit", 5)
    record.msg = event.text()
    setattr(record, process_log.EVENT_FIELDS, event.payload())
    return process_log.CloudLoggingFormatter().format(record)


@pytest.fixture
def logs() -> Iterator[LoggingServer]:
    with logging_stand_in() as server:
        yield server


@pytest.fixture
def monitoring() -> Iterator[MonitoringServer]:
    server = MonitoringServer([FUNCTION_ACCOUNT])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def writer(server: MonitoringServer, account: str) -> CloudMonitoringWriter:
    task = Task(PROJECT, "global", "tpujobs", "tpujobs-dead-letter", account.partition("@")[0])
    return CloudMonitoringWriter(task, "", server.endpoint, f"simulated:{account}")


def function_records_a_dead_letter(logs: LoggingServer, monitoring: MonitoringServer) -> None:
    """The dead_letters function emits its event: its instance's recorder writes the metric with the
    function's account, and Cloud Run's platform writes its stdout line to Cloud Logging."""
    recorder = MetricsRecorder(
        writer(monitoring, FUNCTION_ACCOUNT), lambda: datetime.now(timezone.utc), lambda *_: None
    )
    remove = metric_events.add_sink(recorder.add)
    try:
        metric_events.emit(log, metric_events.dead_lettered("tpujobs-submit", 5), logging.WARNING)
    finally:
        remove()
    entry: dict[str, Any] = entry_from_line(function_line(), FUNCTION)
    entry["logName"] = f"projects/{PROJECT}/logs/run.googleapis.com%2Fstdout"
    logs.store.write({"entries": [entry]}, PLATFORM)


def job_writes_like_a_function(server: LoggingServer) -> None:
    """A job's code, with its VM account's token (logWriter), writes the function's entry field for field."""
    entry: dict[str, Any] = entry_from_line(function_line(), FUNCTION)
    entry["logName"] = f"projects/{PROJECT}/logs/run.googleapis.com%2Fstdout"
    body = json.dumps({"entries": [entry]}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer simulated:{JOB_ACCOUNT}"}
    request = urllib.request.Request(server.url + "/v2/entries:write", body, headers, method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


def dead_letters(server: MonitoringServer) -> int:
    """The metric as Cloud Monitoring sums it: each series' latest CUMULATIVE total, over every instance."""
    return sum(series.points[-1].value.int64_value for series in server.store.latest(DEAD_LETTERS))


def test_the_stand_in_knows_who_wrote_each_entry_and_no_field_tells_the_copy_apart(logs: LoggingServer) -> None:
    """The platform's entry and the job's copy differ only in who wrote them, which no filter sees."""
    entry: dict[str, Any] = entry_from_line(function_line(), FUNCTION)
    entry["logName"] = f"projects/{PROJECT}/logs/run.googleapis.com%2Fstdout"
    logs.store.write({"entries": [entry]}, PLATFORM)
    job_writes_like_a_function(logs)
    assert [writer for writer, _ in logs.store.written()] == [PLATFORM, JOB_ACCOUNT]
    (first, second) = [entry for _, entry in logs.store.written()]
    assert {k: v for k, v in first.items() if k not in ("insertId", "timestamp", "receiveTimestamp")} == {
        k: v for k, v in second.items() if k not in ("insertId", "timestamp", "receiveTimestamp")
    }


def test_an_entry_a_job_writes_shaped_like_a_functions_moves_no_metric(
    logs: LoggingServer, monitoring: MonitoringServer
) -> None:
    """Written with a job's credentials, the function's dead-letter line leaves the metric at the function's one."""
    function_records_a_dead_letter(logs, monitoring)
    assert dead_letters(monitoring) == 1
    job_writes_like_a_function(logs)
    job_writes_like_a_function(logs)
    assert [writer for writer, _ in logs.store.written()] == [PLATFORM, JOB_ACCOUNT, JOB_ACCOUNT]
    assert dead_letters(monitoring) == 1
    # Nothing counts log entries any more: infra/ declares no log-based metric.
    assert not [
        p.name for p in INFRA.glob("*.tf") if 'resource "google_logging_metric"' in p.read_text(encoding="utf-8")
    ]


def test_a_jobs_credentials_writing_a_time_series_are_refused(monitoring: MonitoringServer) -> None:
    """The job's account holds no metricWriter: its timeSeries.create is 403 and the metric does not move."""
    now = datetime.now(timezone.utc)
    forged = Point("dead_letters", {"topic": "tpujobs-submit"}, now - timedelta(minutes=1), now, 1000)
    with pytest.raises(PermanentError, match="403"):
        writer(monitoring, JOB_ACCOUNT).write([forged])
    assert dead_letters(monitoring) == 0
    assert monitoring.store.refused == [JOB_ACCOUNT]

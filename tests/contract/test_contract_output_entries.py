"""The contract of `job_output.OutputEntries`: `InMemoryOutputEntries` over a Cloud Logging store,
and `CloudLoggingEntries` posting `entries.list` to the local stand-in that serves the same store,
read the same entries in the same pages, and refuse alike: a missing log view is OutputUnreadable,
a page token never given is StaleToken."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pytest

from tpujobs.domain.job_output import RawEntry
from tpujobs.engine.errors import OutputUnreadable
from tpujobs.engine.jobs_api.job_output import StaleToken
from tpujobs.local.fakes.output_entries import InMemoryOutputEntries
from tpujobs.local.simulator.cloud_logging import LoggingServer, LoggingStore

PROJECT = "tpujobs-test"
LOG = f"projects/{PROJECT}/logs/tpujobs-output"
VIEW = f"projects/{PROJECT}/locations/global/buckets/tpujobs/views/output"
QUERY = 'labels.tpujobs_job="train-1"'


@dataclass
class Output:
    """The store the entries are written to, and `reader(view)`: an OutputEntries over it."""

    store: LoggingStore
    reader: Callable[[str], Any]


@pytest.fixture(params=["memory", "http"])
def output(request: pytest.FixtureRequest) -> Iterator[Output]:
    store = LoggingStore()
    if request.param == "memory":
        yield Output(store, lambda view: InMemoryOutputEntries(store, PROJECT, view))
        return
    from tpujobs.adapters.job_output_logs import CloudLoggingEntries

    server = LoggingServer(store=store)
    server.start()
    try:
        yield Output(store, lambda view: CloudLoggingEntries(PROJECT, server.url, view))
    finally:
        server.stop()


def write(store: LoggingStore, job_id: str, when: str, **payload: Any) -> None:
    store.write({"logName": LOG, "entries": [{"labels": {"tpujobs_job": job_id}, "timestamp": when, **payload}]})


def at(seconds: int, micros: int = 0) -> datetime:
    return datetime(2026, 11, 22, 12, 0, seconds, micros, tzinfo=timezone.utc)


def test_the_querys_entries_come_oldest_first_a_page_at_a_time(output):
    """Only the entries the query finds, by time (equal times in writing order), `size` a page, each
    page's token leading to the next; text or a JSON payload's sorted JSON; time to the microsecond."""
    write(output.store, "train-1", "2026-11-22T12:00:02.123456789Z", textPayload="step 2")
    write(output.store, "train-1", "2026-11-22T12:00:01Z", jsonPayload={"b": 1, "a": "x"})
    write(output.store, "train-2", "2026-11-22T12:00:01Z", textPayload="another job")
    write(output.store, "train-1", "2026-11-22T12:00:02.123456789Z", textPayload="step 2, again")
    reader = output.reader("")
    first = reader.page(QUERY, None, 2)
    assert first.entries == (
        RawEntry({"tpujobs_job": "train-1"}, at(1), '{"a": "x", "b": 1}'),
        RawEntry({"tpujobs_job": "train-1"}, at(2, 123456), "step 2"),
    )
    assert first.next_token is not None
    last = reader.page(QUERY, first.next_token, 2)
    assert [e.text for e in last.entries] == ["step 2, again"] and last.next_token is None


def test_a_missing_log_view_is_unreadable_output(output):
    """The deployment's view is not there: OutputUnreadable (the deployment's to mend), whatever the query."""
    with pytest.raises(OutputUnreadable):
        output.reader(VIEW).page(QUERY, None, 10)


def test_a_log_view_shows_its_one_log(output):
    """Read through a view, only the log it holds is read."""
    output.store.add_view(VIEW, "tpujobs-output")
    write(output.store, "train-1", "2026-11-22T12:00:01Z", textPayload="kept")
    output.store.write({"logName": f"projects/{PROJECT}/logs/other", "entries": [
        {"labels": {"tpujobs_job": "train-1"}, "timestamp": "2026-11-22T12:00:01Z", "textPayload": "other log"}
    ]})  # fmt: skip
    assert [e.text for e in output.reader(VIEW).page(QUERY, None, 10).entries] == ["kept"]


def test_a_page_token_never_given_is_stale(output):
    """A token Cloud Logging refuses: StaleToken, so the reader starts again from its cursor's time."""
    write(output.store, "train-1", "2026-11-22T12:00:01Z", textPayload="x")
    with pytest.raises(StaleToken):
        output.reader("").page(QUERY, "not-a-token", 10)

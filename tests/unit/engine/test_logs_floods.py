"""`logs` under a flood of unsigned entries (issue 37, item 5): entries are checked as they are
read, unsigned ones cost reading but never room for lines, an answer ends exactly where it stopped
(a cursor inside one microsecond if need be), and output cut short is said, in the answer and by
the CLI. Entries go through the local Cloud Logging stand-in and the real adapter where it matters."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from support.cloud_logging import FixedTokens, logging_stand_in
from tpujobs.adapters.job_output_logs import CloudLoggingEntries
from tpujobs.agent.cloud_logging import CloudLogSink, EntryIdentity
from tpujobs.agent.rest import GoogleApi
from tpujobs.agent.wire import (
    ATTEMPT_LABEL,
    JOB_CREATED_ATTRIBUTE,
    JOB_CREATED_LABEL,
    JOB_LABEL,
    KEY_VERSION_ATTRIBUTE,
    KEY_VERSION_LABEL,
    SEQ_LABEL,
    SIGNATURE_LABEL,
    SLICE_LABEL,
    WORKER_LABEL,
    log_name,
    sign_entry,
)
from tpujobs.cli import commands
from tpujobs.cli.cloud_output import MAX_PAGES, read_through_api
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.job_output import RawEntry
from tpujobs.domain.signing import MasterKeys, created_micros
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.api import CALLER_HEADER, JobsApi
from tpujobs.engine.jobs_api.job_output import Cursor, EntriesPage, Limits, page_json, read_page, verifying_keys
from tpujobs.engine.settings import Settings
from tpujobs.local.fakes import InMemoryJobStore
from tpujobs.local.simulator.cloud_logging import LoggingServer

PROJECT = "demo"
PREFIX = "t-"
MASTER = "m" * 48
CREATED = datetime(2026, 1, 1, tzinfo=timezone.utc)
OWNER = "ada@example.com"
FLOOD = 12_000  # more than the old reader's 10,000 entries of one time, fewer than an answer's 20,000 read


@pytest.fixture
def stand_in() -> Iterator[LoggingServer]:
    with logging_stand_in() as server:
        yield server


def a_job() -> Job:
    spec = parse_spec(
        {"job_id": "train-1", "name": "train", "owner": OWNER, "accelerator_type": "v4-8", "command": "x"}
    )
    return new_job(spec, "us-central2-b", CREATED)[0]


def settings() -> Settings:
    return Settings(project=PROJECT, prefix=PREFIX, report_key=MASTER, cloud_logging=True, local_stack=True)


def write_line(url: str, job: Job, text: str) -> None:
    """What worker 0's agent writes: one entry signed with its attempt's key."""
    key = MasterKeys.of(MASTER).attempt_key(job.job_id, created_micros(CREATED), job.attempt)
    names = {KEY_VERSION_ATTRIBUTE: "1", JOB_CREATED_ATTRIBUTE: str(created_micros(CREATED))}
    identity = EntryIdentity(job.job_id, job.attempt, 0, 0, key, names)
    resource: dict[str, object] = {"type": "gce_instance", "labels": {"project_id": PROJECT}}
    sink = CloudLogSink(GoogleApi(url, FixedTokens(), direct=True), log_name(PROJECT, PREFIX), resource, identity, 1000)
    sink.write(f"{text}\n".encode())
    sink.close()


def flood_before(server: LoggingServer, count: int) -> None:
    """A job's code copies the real entry's labels and time `count` times with made-up signatures and
    insertIds that sort first, so Cloud Logging lists the copies before the real line."""
    (real,) = list(server.store.entries)
    labels = {**real["labels"], SIGNATURE_LABEL: "v1=" + "0" * 64}
    forged = [
        {"textPayload": "fake", "labels": labels, "timestamp": real["timestamp"], "insertId": f"0-{i:06d}"}
        for i in range(count)
    ]
    body = json.dumps({"logName": real["logName"], "entries": forged}).encode()
    headers = {"Content-Type": "application/json", "Authorization": "Bearer simulated:job@demo.iam.gserviceaccount.com"}
    request = urllib.request.Request(server.url + "/v2/entries:write", body, headers, method="POST")
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert answer.status == 200


def ask(api: JobsApi, **body: Any) -> dict[str, Any]:
    answer = api.handle("POST", "http://127.0.0.1/jobs", {CALLER_HEADER: OWNER}, json.dumps(body).encode())
    assert answer.status == 200, answer.body
    return dict(answer.body)


def test_a_flood_of_unsigned_entries_at_a_real_lines_time_does_not_hide_it(stand_in: LoggingServer) -> None:
    """12,000 unsigned copies listed before a real line of the same microsecond: the line is answered."""
    job = a_job()
    write_line(stand_in.url, job, "the real line")
    flood_before(stand_in, FLOOD)
    store = InMemoryJobStore()
    store.create(job, new_job(job.spec, job.zone, CREATED)[1])
    service = SimpleNamespace(warm=None, access=None)
    api = JobsApi(service, store, settings(), output_entries=CloudLoggingEntries(PROJECT, stand_in.url))  # type: ignore[arg-type]
    answers = [ask(api, action="logs", job_id=job.job_id)]
    while answers[-1]["after"] and len(answers) < 5:
        answers.append(ask(api, action="logs", job_id=job.job_id, after=answers[-1]["after"]))
    assert [line["text"] for answer in answers for line in answer["lines"]] == ["the real line"]
    assert sum(answer["forged"] for answer in answers) == FLOOD
    assert answers[-1]["cut"] is None and answers[-1]["after"] is None


def listed(entries: list[RawEntry]) -> Any:
    """OutputEntries over a list, in pages whose token is the next offset."""

    def page(query: str, token: str | None, size: int) -> EntriesPage:
        start = int(token or 0)
        return EntriesPage(entries[start : start + size], str(start + size) if start + size < len(entries) else None)

    return SimpleNamespace(page=page)


def test_unsigned_entries_cost_reading_not_lines_and_the_next_answer_resumes_inside_the_flood() -> None:
    """A bounded read stops inside one microsecond, says `cut: entries`, and the next answer goes on from there."""
    job = a_job()
    key_for = verifying_keys(settings(), job)
    assert key_for is not None
    key = MasterKeys.of(MASTER).attempt_key(job.job_id, created_micros(CREATED), 1)
    at = CREATED + timedelta(seconds=5)
    signature = sign_entry(key, job.job_id, 1, "0-0", 7, created_micros(at), "real")
    real = RawEntry(
        {
            JOB_LABEL: job.job_id,
            ATTEMPT_LABEL: "1",
            SLICE_LABEL: "0",
            WORKER_LABEL: "0",
            SEQ_LABEL: "7",
            JOB_CREATED_LABEL: str(created_micros(CREATED)),
            KEY_VERSION_LABEL: "1",
            SIGNATURE_LABEL: signature,
        },
        at,
        "real",
    )
    forged = RawEntry({**real.labels, SIGNATURE_LABEL: "v1=" + "0" * 64}, at, "fake")
    entries = listed([forged] * 25 + [real])
    limits = Limits(lines=1, entries=10, page_size=4)
    page = read_page(entries, "q", job, key_for, limits=limits)
    assert (page.lines, page.forged, page.cut, page.after) == ([], 10, "entries", Cursor("8", 2))
    answer = page_json(page)
    assert answer["cut"] == {
        "reason": "entries",
        "why": "the answer read its most entries; those without a valid signature were skipped",
    }
    texts: list[str] = []
    while page.after is not None:
        page = read_page(entries, "q", job, key_for, after=page.after, limits=limits)
        texts += [line.text for line in page.lines]
    assert texts == ["real"]


def endless(request: dict[str, Any]) -> dict[str, Any]:
    """An API whose every answer is a flood's: no line, more to read, cut for the entries read."""
    return {
        "cloud_logging": True,
        "attempt": 1,
        "lines": [],
        "forged": 20_000,
        "read": 20_000,
        "after": "abc",
        "cut": {"reason": "entries", "why": "..."},
    }


def test_the_cli_stops_after_its_most_answers_and_says_the_output_was_cut() -> None:
    """read_through_api's result names the cut and why; the logs command prints it."""
    found = read_through_api(endless, "train-1", None, None, lambda data: None)
    assert found is not None and found.cut is not None
    assert f"after {MAX_PAGES} answers" in found.cut and "read its most entries" in found.cut
    assert found.read == MAX_PAGES * 20_000


def test_the_logs_command_prints_that_output_was_cut(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tpujobs logs` through the API ends with the cut sentence on stderr, not silently."""
    monkeypatch.setattr(commands, "ask_api", lambda config, url, request, who: endless(request))
    monkeypatch.setattr(commands, "_write_raw", lambda data: None)
    assert commands._api_output(settings(), "http://api.invalid", "train-1", None, None, OWNER)
    assert "Output cut: stopped after 200 answers" in " ".join(capsys.readouterr().err.split())

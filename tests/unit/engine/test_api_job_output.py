"""The jobs API's `logs`: a job's Cloud Logging output, each entry's signature checked by the API
(which holds the master key), answered to its owner or an admin only, page by page; and the CLI's
reader of those pages. Entries go through the local Cloud Logging stand-in and the real adapter."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from support.cloud_logging import FixedTokens, logging_stand_in
from tpujobs.adapters.job_output_logs import CloudLoggingEntries
from tpujobs.agent.cloud_logging import CloudLogSink, EntryIdentity
from tpujobs.agent.rest import GoogleApi
from tpujobs.agent.wire import JOB_CREATED_ATTRIBUTE, KEY_VERSION_ATTRIBUTE, LOG_ID, SIGNATURE_LABEL, log_name
from tpujobs.cli.cloud_output import OutputRead, read_through_api
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.job_output import RawEntry
from tpujobs.domain.signing import MasterKeys, created_micros
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.api import CALLER_HEADER, JobsApi
from tpujobs.engine.jobs_api.job_output import Cursor, EntriesPage, Limits, read_page, verifying_keys
from tpujobs.engine.settings import Settings
from tpujobs.local.fakes import InMemoryJobStore
from tpujobs.local.simulator.cloud_logging import LoggingServer

PROJECT = "demo"
PREFIX = "t-"
MASTER = "m" * 48
CREATED = datetime(2026, 1, 1, tzinfo=timezone.utc)
OWNER = "ada@example.com"
ADMIN = "root@example.com"


@pytest.fixture
def stand_in() -> Iterator[LoggingServer]:
    with logging_stand_in() as server:
        yield server


def a_job(**changes: Any) -> Job:
    spec = parse_spec(
        {"job_id": "train-1", "name": "train", "owner": OWNER, "accelerator_type": "v4-16", "command": "x", **changes}
    )
    job, _ = new_job(spec, "us-central2-b", CREATED)
    return job


def settings(**changes: Any) -> Settings:
    given: dict[str, Any] = {
        "project": PROJECT,
        "prefix": PREFIX,
        "report_key": MASTER,
        "cloud_logging": True,
        "local_stack": True,
        "admins": (ADMIN,),
    }
    return Settings(**{**given, **changes})


def write_lines(url: str, job: Job, worker_id: int, lines: list[str]) -> None:
    """What worker `worker_id` of slice 0's agent writes: entries signed with its attempt's key."""
    key = MasterKeys.of(MASTER).attempt_key(job.job_id, created_micros(CREATED), job.attempt)
    names = {KEY_VERSION_ATTRIBUTE: "1", JOB_CREATED_ATTRIBUTE: str(created_micros(CREATED))}
    identity = EntryIdentity(job.job_id, job.attempt, 0, worker_id, key, names)
    resource: dict[str, object] = {"type": "gce_instance", "labels": {"project_id": PROJECT}}
    api = GoogleApi(url, FixedTokens(), direct=True)
    sink = CloudLogSink(api, log_name(PROJECT, PREFIX), resource, identity, 1000, batch_seconds=0.05)
    sink.write("".join(f"{line}\n" for line in lines).encode())
    sink.close()


def forge_a_copy(url: str, text: str) -> None:
    """Another job's code writes an entry with this job's labels and a signature it made up."""
    request = json.dumps({"resourceNames": [f"projects/{PROJECT}"]}).encode()
    import urllib.request

    def post(path: str, body: bytes) -> dict[str, Any]:
        headers = {"Content-Type": "application/json", "Authorization": "Bearer t"}
        with urllib.request.urlopen(urllib.request.Request(url + path, body, headers, method="POST"), timeout=10) as r:
            return dict(json.loads(r.read()))

    labels = dict(post("/v2/entries:list", request)["entries"][0]["labels"])
    labels[SIGNATURE_LABEL] = "v1=" + "0" * 64
    forged = {"logName": log_name(PROJECT, PREFIX), "entries": [{"textPayload": text, "labels": labels}]}
    post("/v2/entries:write", json.dumps(forged).encode())


def api_on(url: str, job: Job, view: str = "", **changes: Any) -> JobsApi:
    store = InMemoryJobStore()
    store.create(job, new_job(job.spec, job.zone, CREATED)[1])
    service = SimpleNamespace(warm=None, access=None)
    entries = CloudLoggingEntries(PROJECT, url, view)
    return JobsApi(service, store, settings(**changes), output_entries=entries)  # type: ignore[arg-type]


def ask(api: JobsApi, caller: str, **body: Any) -> tuple[int, dict[str, Any]]:
    answer = api.handle("POST", "http://127.0.0.1/jobs", {CALLER_HEADER: caller}, json.dumps(body).encode())
    return answer.status, dict(answer.body)


def test_the_owner_gets_only_the_lines_the_jobs_agents_signed(stand_in: LoggingServer) -> None:
    """A forged entry with the job's labels is dropped and counted; the signed lines come in order."""
    job = a_job()
    write_lines(stand_in.url, job, 0, ["step 1", "step 2"])
    forge_a_copy(stand_in.url, "SUCCESS: all tests passed")
    status, answer = ask(api_on(stand_in.url, job), OWNER, action="logs", job_id=job.job_id)
    assert status == 200, answer
    assert [line["text"] for line in answer["lines"]] == ["step 1", "step 2"]
    assert (answer["forged"], answer["cloud_logging"], answer["attempt"], answer["after"]) == (1, True, 1, None)


def test_an_admin_may_read_and_anyone_else_is_refused(stand_in: LoggingServer) -> None:
    """Output, like env values, is its owner's and admins': another user gets 403 and no line."""
    job = a_job()
    write_lines(stand_in.url, job, 0, ["secret-ish step"])
    api = api_on(stand_in.url, job)
    assert ask(api, ADMIN, action="logs", job_id=job.job_id)[1]["lines"][0]["text"] == "secret-ish step"
    status, answer = ask(api, "eve@example.com", action="logs", job_id=job.job_id)
    assert status == 403 and "lines" not in answer
    assert "only its owner or an admin" in answer["error"]


def test_one_workers_lines_and_bad_attempts_or_workers(stand_in: LoggingServer) -> None:
    """`worker` picks one host's lines (v4-16: workers 0 and 1); an attempt or worker the job lacks is a 400."""
    job = a_job()
    write_lines(stand_in.url, job, 0, ["from 0"])
    write_lines(stand_in.url, job, 1, ["from 1"])
    api = api_on(stand_in.url, job)
    status, answer = ask(api, OWNER, action="logs", job_id=job.job_id, worker=1)
    assert status == 200 and [(line["worker_id"], line["text"]) for line in answer["lines"]] == [(1, "from 1")]
    assert ask(api, OWNER, action="logs", job_id=job.job_id, attempt=2)[0] == 400
    assert ask(api, OWNER, action="logs", job_id=job.job_id, worker=2)[0] == 400
    assert ask(api, OWNER, action="logs", job_id=job.job_id, after="yesterday")[0] == 400
    assert ask(api, OWNER, action="logs", job_id="nope-1")[0] == 404


def test_a_job_whose_output_is_not_in_cloud_logging_says_so(stand_in: LoggingServer) -> None:
    """Switched off for the job (or the deployment): `cloud_logging: false`, so the CLI reads Cloud Storage."""
    job = a_job(cloud_logging=False)
    status, answer = ask(api_on(stand_in.url, job), OWNER, action="logs", job_id=job.job_id)
    assert (status, answer["cloud_logging"], answer["lines"]) == (200, False, [])
    assert read_through_api(lambda request: answer, job.job_id, None, None, lambda data: None) is None


def test_an_api_without_the_master_key_refuses_instead_of_answering_unchecked_lines(stand_in: LoggingServer) -> None:
    """No key, no verification: 503, never the entries as they are."""
    job = a_job()
    write_lines(stand_in.url, job, 0, ["step 1"])
    status, answer = ask(api_on(stand_in.url, job, report_key=""), OWNER, action="logs", job_id=job.job_id)
    assert status == 503 and "master key" in answer["error"]


def entry(job: Job, at: datetime, text: str) -> RawEntry:
    return RawEntry({"tpujobs_job": job.job_id}, at, text)


class ListedEntries:
    """OutputEntries over a list, oldest first, in pages whose token is the next offset (as the
    stand-in's); it records each query and token."""

    def __init__(self, entries: list[RawEntry]) -> None:
        self.entries = entries
        self.asked: list[tuple[str, str | None]] = []

    def page(self, query: str, token: str | None, size: int) -> EntriesPage:
        self.asked.append((query, token))
        start = int(token or 0)
        following = str(start + size) if start + size < len(self.entries) else None
        return EntriesPage(self.entries[start : start + size], following)


def test_an_answer_ends_where_it_stopped_and_the_next_starts_at_the_next_entry() -> None:
    """Answers of at most N entries read, cut anywhere, even inside one time: each entry is read once."""
    job = a_job()
    t = [CREATED + timedelta(seconds=s) for s in range(4)]
    entries = ListedEntries(
        [entry(job, t[0], "a"), entry(job, t[1], "b"), entry(job, t[1], "c"), entry(job, t[2], "d")]
    )

    def key_for(attempt: int, created: int, version: str) -> bytes | None:
        return None  # every entry counts as forged: this test is about the pages, not the signatures

    limits = Limits(entries=2, page_size=3)
    page = read_page(entries, "q", job, key_for, limits=limits)
    assert (page.forged, page.read, page.cut, page.after) == (2, 2, "entries", Cursor("", 2))
    page = read_page(entries, "q", job, key_for, after=page.after, limits=limits)
    assert (page.forged, page.read, page.cut, page.after) == (2, 2, None, None)
    assert entries.asked == [("q", None), ("q", None), ("q", "3")]


def test_a_cursor_is_opaque_text_and_anything_else_is_refused() -> None:
    """`after` round-trips through its text; a made-up one is a ValueError (the API's 400)."""
    cursor = Cursor("token/with+odd=chars", 17)
    assert Cursor.parse(cursor.text()) == cursor
    for bad in ("yesterday", "e30", Cursor("x", 1).text()[:-2] + "!!"):
        with pytest.raises(ValueError):
            Cursor.parse(bad)


def test_the_cli_reads_every_page_the_api_answers(stand_in: LoggingServer) -> None:
    """read_through_api follows `after` until the last page, on the same attempt, and writes each line."""
    pages = [
        {
            "cloud_logging": True,
            "attempt": 1,
            "lines": [{"text": "one"}],
            "forged": 1,
            "after": "2026-01-01T00:00:01+00:00",
        },
        {"cloud_logging": True, "attempt": 1, "lines": [{"text": "two"}], "forged": 0, "after": None},
    ]
    asked: list[dict[str, Any]] = []

    def ask_api(request: dict[str, Any]) -> dict[str, Any]:
        asked.append(dict(request))
        return pages[len(asked) - 1]

    written: list[bytes] = []
    assert read_through_api(ask_api, "train-1", None, 1, written.append) == OutputRead(2, 1)
    assert written == [b"one\n", b"two\n"]
    assert asked == [
        {"action": "logs", "job_id": "train-1", "worker": 1},
        {"action": "logs", "job_id": "train-1", "worker": 1, "after": "2026-01-01T00:00:01+00:00", "attempt": 1},
    ]


def test_the_key_source_needs_the_master_key() -> None:
    """A process without TPUJOBS_REPORT_KEY (a user's machine) has no key source at all."""
    assert verifying_keys(Settings(project=PROJECT), a_job()) is None
    assert verifying_keys(settings(), a_job()) is not None


VIEW = f"projects/{PROJECT}/locations/global/buckets/_Default/views/{PREFIX}tpujobs-job-output"


def test_through_its_log_view_the_api_reads_the_job_output(stand_in: LoggingServer) -> None:
    """The view holds the job-output log alone (infra/logging.tf), and the API reads through it."""
    job = a_job()
    write_lines(stand_in.url, job, 0, ["step 1"])
    stand_in.store.add_view(VIEW, f"{PREFIX}{LOG_ID}")
    status, answer = ask(api_on(stand_in.url, job, VIEW), OWNER, action="logs", job_id=job.job_id)
    assert status == 200, answer
    assert ([line["text"] for line in answer["lines"]], answer["forged"]) == (["step 1"], 0)


def test_a_missing_log_view_is_a_clear_503_not_a_failure_of_the_api(stand_in: LoggingServer) -> None:
    """Cloud Logging says NOT_FOUND: the deployment's view is missing. The caller learns that, and
    the CLI reads the Cloud Storage copy instead (it falls back on 503)."""
    job = a_job()
    write_lines(stand_in.url, job, 0, ["step 1"])
    status, answer = ask(api_on(stand_in.url, job, VIEW), OWNER, action="logs", job_id=job.job_id)
    assert status == 503 and "lines" not in answer
    assert "cannot read job output from Cloud Logging" in answer["error"] and "log view" in answer["error"]


def test_another_refusal_of_cloud_logging_stays_a_failure_of_the_api(stand_in: LoggingServer) -> None:
    """Only NOT_FOUND and PERMISSION_DENIED mean the deployment's view is missing or not its own;
    a request Cloud Logging calls invalid is the API's own fault: a 500, not the view's 503."""
    job = a_job()
    write_lines(stand_in.url, job, 0, ["step 1"])
    status, answer = ask(
        api_on(stand_in.url, job, f"projects/{PROJECT}/buckets/_Default"), OWNER, action="logs", job_id=job.job_id
    )
    assert status == 500 and "log view" not in answer["error"]

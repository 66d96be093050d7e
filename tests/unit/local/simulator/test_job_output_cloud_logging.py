"""Job output in Cloud Logging: the local stand-in against the real google-cloud-logging client,
the reader that drops forged entries, the switch, and the Logs Explorer link."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import logging as cloud_logging

from support.cloud_logging import FixedTokens, logging_stand_in
from tpujobs.adapters.job_output_logs import read_entries
from tpujobs.agent.cloud_logging import CloudLogSink, EntryIdentity
from tpujobs.agent.rest import GoogleApi
from tpujobs.agent.wire import JOB_CREATED_ATTRIBUTE, KEY_VERSION_ATTRIBUTE, SIGNATURE_LABEL, log_name
from tpujobs.cli.cloud_output import explorer_link, verifying_keys
from tpujobs.domain import job_output
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.signing import MasterKeys, created_micros
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.settings import Settings
from tpujobs.engine.startup_script import agent_config
from tpujobs.local.simulator.cloud_logging import LoggingServer

PROJECT = "demo"
LOG = log_name(PROJECT, "t-")
MASTER = "m" * 48
CREATED = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.fixture
def stand_in() -> Iterator[LoggingServer]:
    with logging_stand_in() as server:
        yield server


def a_job(**changes: Any) -> Job:
    spec = parse_spec({"job_id": "train-1", "name": "train", "owner": "ada", "accelerator_type": "v4-8", **changes})
    job, _ = new_job(spec, "us-central2-b", CREATED)
    return job


def agent_sink(url: str, job: Job, worker_id: int = 0) -> CloudLogSink:
    key = MasterKeys.of(MASTER).attempt_key(job.job_id, created_micros(CREATED), job.attempt)
    names = {KEY_VERSION_ATTRIBUTE: "1", JOB_CREATED_ATTRIBUTE: str(created_micros(CREATED))}
    identity = EntryIdentity(job.job_id, job.attempt, 0, worker_id, key, names)
    resource: dict[str, object] = {"type": "gce_instance", "labels": {"project_id": PROJECT}}
    return CloudLogSink(GoogleApi(url, FixedTokens(), direct=True), LOG, resource, identity, 1000, batch_seconds=0.05)


def client(url: str) -> cloud_logging.Client:
    return cloud_logging.Client(
        project=PROJECT, credentials=AnonymousCredentials(), _use_grpc=False, client_options={"api_endpoint": url}
    )


def post(url: str, path: str, body: dict[str, Any], token: str | None = "t") -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url + path, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_lines_the_agent_writes_are_read_back_by_the_client_page_by_page(stand_in: LoggingServer) -> None:
    """entries:write as the agent sends it; the real client lists them by label, in order, over pages."""
    job = a_job(command="x")
    sink = agent_sink(stand_in.url, job)
    sink.write(b"".join(b"step %d\n" % n for n in range(7)))
    sink.close()
    other = agent_sink(stand_in.url, a_job(command="x", job_id="other-1"))
    other.write(b"not mine\n")
    other.close()
    query = job_output.job_filter(PROJECT, "t-", "train-1", attempt=1, since=CREATED)
    found = list(client(stand_in.url).list_entries(filter_=query, order_by=cloud_logging.ASCENDING, page_size=3))
    assert [entry.payload for entry in found] == [f"step {n}" for n in range(7)]
    assert {entry.labels["tpujobs_worker"] for entry in found} == {"0"}
    assert {entry.severity for entry in found} == {"INFO"}


def test_the_stand_in_answers_googles_errors(stand_in: LoggingServer) -> None:
    """No token: 401 UNAUTHENTICATED on write; a filter outside its subset: the client's BadRequest."""
    status, body = post(stand_in.url, "/v2/entries:write", {"logName": LOG, "entries": [{"textPayload": "x"}]}, None)
    assert (status, body["error"]["status"]) == (401, "UNAUTHENTICATED")
    status, body = post(stand_in.url, "/v2/entries:write", {"logName": "nope", "entries": [{"textPayload": "x"}]})
    assert (status, body["error"]["status"]) == (400, "INVALID_ARGUMENT")
    with pytest.raises(exceptions.BadRequest):
        list(client(stand_in.url).list_entries(filter_="NOT (a OR b)"))


def test_a_log_view_shows_only_its_log_and_a_missing_view_is_not_found(stand_in: LoggingServer) -> None:
    """entries:list on a view (the jobs API's `TPUJOBS_LOGGING_VIEW`) reads that view's log alone,
    whatever the filter; a view that does not exist is NOT_FOUND, a name of neither kind INVALID_ARGUMENT."""
    view = f"projects/{PROJECT}/locations/global/buckets/_Default/views/job-output"
    for log, text in ((LOG, "job line"), (f"projects/{PROJECT}/logs/other", "other line")):
        assert post(stand_in.url, "/v2/entries:write", {"logName": log, "entries": [{"textPayload": text}]})[0] == 200
    stand_in.store.add_view(view, LOG.rsplit("/", 1)[1])
    read = client(stand_in.url)
    assert [e.payload for e in read.list_entries(resource_names=[view])] == ["job line"]
    assert len(list(read.list_entries(resource_names=[f"projects/{PROJECT}"]))) == 2
    with pytest.raises(exceptions.NotFound):
        list(read.list_entries(resource_names=[view + "-gone"]))
    with pytest.raises(exceptions.BadRequest):
        list(read.list_entries(resource_names=[f"projects/{PROJECT}/buckets/_Default"]))


def test_the_reader_drops_an_entry_forged_with_the_jobs_labels(stand_in: LoggingServer) -> None:
    """Another job's code writes an entry with this job's labels: it is counted, never shown."""
    job = a_job(command="x")
    sink = agent_sink(stand_in.url, job)
    sink.write(b"real line\n")
    sink.close()
    _, written = post(stand_in.url, "/v2/entries:list", {"resourceNames": [f"projects/{PROJECT}"]})
    labels = dict(written["entries"][0]["labels"])
    labels[SIGNATURE_LABEL] = "v1=" + "0" * 64
    forged = {"logName": LOG, "entries": [{"textPayload": "SUCCESS: all tests passed", "labels": labels}]}
    assert post(stand_in.url, "/v2/entries:write", forged)[0] == 200
    config = Settings(project=PROJECT, prefix="t-", report_key=MASTER, cloud_logging=True)
    key_for = verifying_keys(config, job)
    assert key_for is not None
    query = job_output.job_filter(PROJECT, "t-", job.job_id, 1, since=CREATED)
    verified = job_output.verify(job.job_id, read_entries(PROJECT, query, stand_in.url), key_for)
    assert [line.text for line in verified.lines] == ["real line"]
    assert verified.forged == 1


def test_without_the_master_key_nothing_is_called_verified() -> None:
    """A machine without TPUJOBS_REPORT_KEY cannot check entries: no key source at all."""
    assert verifying_keys(Settings(project=PROJECT), a_job(command="x")) is None


def test_the_switch_is_the_deployments_unless_the_spec_says_false() -> None:
    """Deployment off: never; on: each job's unless `cloud_logging: false`; the config says where and how fast."""
    on = Settings(project=PROJECT, prefix="t-", cloud_logging=True, logging_lines_per_second=50)
    assert agent_config(a_job(command="x"), Settings(project=PROJECT))["cloud_logging"] is None
    assert agent_config(a_job(command="x", cloud_logging=True), Settings(project=PROJECT))["cloud_logging"] is None
    assert agent_config(a_job(command="x", cloud_logging=False), on)["cloud_logging"] is None
    assert agent_config(a_job(command="x"), on)["cloud_logging"] == {"log_name": LOG, "lines_per_second": 50}


def test_the_explorer_link_carries_the_jobs_filter() -> None:
    """One link, built in one place: the project and the job's label filter, URL-encoded."""
    on = Settings(project=PROJECT, prefix="t-", cloud_logging=True)
    link = explorer_link(on, "train-1")
    assert link is not None and link.startswith("https://console.cloud.google.com/logs/query;query=")
    assert "labels.tpujobs_job%3D%22train-1%22" in link and link.endswith("?project=demo")
    assert explorer_link(on, "train-1", False) is None
    assert explorer_link(Settings(project=PROJECT), "train-1") is None

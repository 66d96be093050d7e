"""`tpujobs describe` through the `jobs` HTTP function when TPUJOBS_API_URL is set.

The API (tpujobs.api on the Firestore emulator and the TPU simulator) is served on 127.0.0.1
as the local stack serves it, trusting the X-Tpujobs-Caller header. The CLI is pointed at
another project, so the only way it can find the job is the API.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from typer.testing import CliRunner

from tpujobs import api_client
from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.adapters.tpu import CloudTpu
from tpujobs.api import CALLER_HEADER, JobsApi
from tpujobs.cli import app
from tpujobs.service import JobService
from tpujobs.testing import inbound, local_settings

pytestmark = pytest.mark.emulator

OWNER = "ada@example.com"
STRANGER = "eve@example.com"


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@pytest.fixture
def service(firestore_client, tpu_client, project_id, simulator_url) -> JobService:
    settings = local_settings(project=project_id, tpu_endpoint=simulator_url, logs_bucket="logs")
    return JobService(FirestoreJobStore(firestore_client), CloudTpu(tpu_client, project_id), settings, utc_now)


@pytest.fixture
def api(service) -> Iterator[tuple[str, list[str]]]:
    """The jobs API on loopback, as functions-framework serves it in the local stack; the callers
    it was told of."""
    jobs = JobsApi(service, local_settings(local_stack=True))
    callers: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            callers.append(self.headers.get(CALLER_HEADER, ""))
            answer = jobs.handle("POST", f"http://{self.headers['Host']}{self.path}", dict(self.headers), body)
            data = json.dumps(answer.body).encode()
            self.send_response(answer.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", callers
    server.shutdown()
    server.server_close()


def describe(monkeypatch, tmp_path, *args: str, api_url: str | None, project: str) -> Any:
    monkeypatch.setenv("TPUJOBS_STATE_DIR", str(tmp_path))  # no running stack's settings leak in
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", project)
    monkeypatch.setenv("TPUJOBS_LOCAL_STACK", "1")
    if api_url:
        monkeypatch.setenv("TPUJOBS_API_URL", api_url)
    else:
        monkeypatch.delenv("TPUJOBS_API_URL", raising=False)
    return CliRunner().invoke(app, ["describe", *args], env={"COLUMNS": "160"})


def ended_job(service: JobService, firestore_client) -> str:
    """A job that asked for capacity, was cancelled, and whose attempt's logs were exported."""
    spec = {
        "job_id": "train-1",
        "name": "train",
        "owner": OWNER,
        "accelerator_type": "v4-8",
        "command": "python t.py",
    }
    service.submit(inbound("tpujobs-submit", spec))
    service.cancel("train-1", f"Cancelled by {OWNER}.")
    firestore_client.collection("jobs").document("train-1").collection("attempts").document("1").set(
        {
            "attempt": 1,
            "log_uri": "gs://logs/jobs/train-1/attempt-1/attempt.log",
            "worker_logs": {"0": "gs://logs/jobs/train-1/attempt-1/worker-0.log"},
            "exported_at": utc_now(),
        }
    )
    return "train-1"


def test_describe_over_the_api_renders_what_firestore_renders(
    service, firestore_client, api, project_id, monkeypatch, tmp_path
):
    """The same tables, from the API's JSON as from Firestore, for a job with attempts and a
    timeline; the CLI names its --owner in the caller header."""
    api_url, callers = api
    job_id = ended_job(service, firestore_client)
    direct = describe(monkeypatch, tmp_path, job_id, api_url=None, project=project_id)
    assert direct.exit_code == 0, direct.output
    over_api = describe(monkeypatch, tmp_path, job_id, "--owner", OWNER, api_url=api_url, project="no-such-project")
    assert over_api.exit_code == 0, over_api.output
    assert over_api.output == direct.output
    assert "CANCELLED" in over_api.output and "attempt-1/attempt.log" in over_api.output
    assert callers == [OWNER]


def test_describe_over_the_api_says_why_it_was_refused(service, api, monkeypatch, tmp_path):
    """A missing job: exit 1 with the API's sentence."""
    api_url, _ = api
    result = describe(monkeypatch, tmp_path, "no-such-job", "--owner", STRANGER, api_url=api_url, project="x")
    assert result.exit_code == 1 and "No such job" in result.output and "no-such-job" in result.output


def test_described_reads_times_back_and_skips_unexported_attempts():
    """RFC 3339 strings in *_at, *_since and *_from fields become datetimes; other strings stay."""
    answer = {
        "job": {
            "job_id": "job-1",
            "name": "train",
            "owner": OWNER,
            "state": "QUEUED",
            "zone": "us-central2-b",
            "created_at": "2026-01-02T03:04:05.123456Z",
            "usage": [
                {
                    "attempt": 1,
                    "chips": 4,
                    "waiting_since": "2026-01-02T03:04:05Z",
                    "zone": "us-central2-b",
                }
            ],
            "spec": {
                "job_id": "job-1",
                "name": "train",
                "owner": OWNER,
                "accelerator_type": "v4-8",
                "command": "x",
            },
        },
        "events": [],
        "attempts": [{"id": "1", "attempt": 1, "log_uri": "gs://x"}],
    }
    job, events, logs = api_client.described(answer)
    assert job.created_at == datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc)
    assert job.usage[0].waiting_since == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert job.usage[0].zone == "us-central2-b" and events == [] and logs == {}

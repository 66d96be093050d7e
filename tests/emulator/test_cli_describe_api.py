"""`tpujobs describe`, `list`, `rejections`, `dead-letters` and `quota show` through the `jobs`
HTTP function when TPUJOBS_API_URL is set, and from Firestore when not.

The API (tpujobs.engine.api on the Firestore emulator and the TPU simulator) is served on 127.0.0.1
as the local stack serves it, trusting the X-Tpujobs-Caller header. The CLI is pointed at
another project, so the only way it can find the job is the API.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tpujobs.cli import api_client, app
from tpujobs.engine.api import CALLER_HEADER, JobsApi
from tpujobs.engine.services import Engine
from tpujobs.local.testing import inbound, local_settings

pytestmark = pytest.mark.emulator

OWNER = "ada@example.com"
STRANGER = "eve@example.com"


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@pytest.fixture
def service(job_service) -> Engine:
    return job_service(sleep=time.sleep)


@contextlib.contextmanager
def serving(jobs: JobsApi) -> Iterator[tuple[str, list[str]]]:
    """`jobs` on loopback, as functions-framework serves it in the local stack; the callers it was told of."""
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
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", callers
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def api(service) -> Iterator[tuple[str, list[str]]]:
    """The jobs API of the local stack on loopback, and the callers it was told of."""
    with serving(JobsApi(service, service.store, local_settings(local_stack=True))) as served:
        yield served


def describe(monkeypatch, tmp_path, *args: str, api_url: str | None, project: str) -> Any:
    monkeypatch.setenv("TPUJOBS_STATE_DIR", str(tmp_path))  # no running stack's settings leak in
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", project)
    monkeypatch.setenv("TPUJOBS_LOCAL_STACK", "1")
    # The API's deployment here has no Cloud Logging: nor has the CLI's, whatever an earlier test exported.
    monkeypatch.delenv("TPUJOBS_CLOUD_LOGGING", raising=False)
    if api_url:
        monkeypatch.setenv("TPUJOBS_API_URL", api_url)
    else:
        monkeypatch.delenv("TPUJOBS_API_URL", raising=False)
    return CliRunner().invoke(app, ["describe", *args], env={"COLUMNS": "160"})


def ended_job(service: Engine, firestore_client) -> str:
    """A job that asked for capacity, was cancelled, and whose attempt's logs were exported."""
    spec = {
        "job_id": "train-1",
        "name": "train",
        "owner": OWNER,
        "accelerator_type": "v4-8",
        "command": "python t.py",
    }
    service.submission.submit(inbound("tpujobs-submit", spec))
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


# --- list, rejections, dead letters and quotas through the API ---------------------------------

ADMIN = "root@example.com"


def tpujobs(monkeypatch, tmp_path, *args: str, api_url: str | None, project: str) -> Any:
    """The CLI as a script runs it (output piped), pointed at `api_url` or at Firestore only."""
    monkeypatch.setenv("TPUJOBS_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", project)
    monkeypatch.setenv("TPUJOBS_LOCAL_STACK", "1")
    if api_url:
        monkeypatch.setenv("TPUJOBS_API_URL", api_url)
    else:
        monkeypatch.delenv("TPUJOBS_API_URL", raising=False)
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "80"})


@pytest.fixture
def admin_api(service, firestore_client) -> Iterator[tuple[str, list[str]]]:
    """The jobs API with an admin, the deployment's dead letters and its pools."""
    from tpujobs.adapters.firestore_dead_letters import FirestoreDeadLetters
    from tpujobs.adapters.firestore_pools import FirestorePools

    with_pools = Engine(
        service.store, service.capacity, service.settings, utc_now, pools=FirestorePools(firestore_client)
    )
    settings = local_settings(local_stack=True, admins=(ADMIN,))
    jobs = JobsApi(with_pools, with_pools.store, settings, dead_letters=FirestoreDeadLetters(firestore_client))
    with serving(jobs) as served:
        yield served


def test_list_over_the_api_prints_what_firestore_prints(service, api, project_id, monkeypatch, tmp_path):
    """Piped at 80 columns: every header, every job; `-o json` is the API's documents, parseable."""
    api_url, callers = api
    for number in (1, 2):
        spec = {
            "job_id": f"train-{number}",
            "name": "train",
            "owner": OWNER,
            "accelerator_type": "v4-8",
            "command": "x",
        }
        service.submission.submit(inbound("tpujobs-submit", spec))
    direct = tpujobs(monkeypatch, tmp_path, "list", api_url=None, project=project_id)
    over_api = tpujobs(monkeypatch, tmp_path, "list", "--as", OWNER, api_url=api_url, project="no-such-project")
    assert direct.exit_code == 0 and over_api.exit_code == 0, over_api.output
    for header in ("JOB", "STATE", "ATTEMPT", "ACCELERATOR", "ZONE", "OWNER", "AGE", "CHIP-H", "GOODPUT"):
        assert header in over_api.stdout
    row = next(line for line in over_api.stdout.splitlines() if " train-1 " in line)
    assert OWNER in row and "1 x v4-8" in row and "us-central2-b" in row
    as_json = tpujobs(monkeypatch, tmp_path, "list", "-o", "json", "--as", OWNER, api_url=api_url, project="x")
    direct_json = tpujobs(monkeypatch, tmp_path, "list", "-o", "json", api_url=None, project=project_id)
    documents = json.loads(as_json.stdout)
    assert [job["job_id"] for job in documents["jobs"]] == ["train-2", "train-1"]
    assert documents == json.loads(direct_json.stdout)
    assert set(callers) == {OWNER}


def test_admins_read_rejections_dead_letters_and_quotas_through_the_api(
    service, admin_api, firestore_client, monkeypatch, tmp_path
):
    """As an admin: each read gives what Firestore holds, in tables and as JSON. Anyone else is
    refused by the API and reads with their own credentials (here: another, empty project)."""
    from tpujobs.adapters.firestore_dead_letters import FirestoreDeadLetters
    from tpujobs.adapters.firestore_pools import FirestorePools
    from tpujobs.engine.ports import DeadLetter

    api_url, _ = admin_api
    service.submission.submit(inbound("tpujobs-submit", {"name": "train", "owner": OWNER}, message_id="4242"))
    FirestoreDeadLetters(firestore_client).add(
        DeadLetter("777", utc_now(), "tpujobs-submit", "projects/p/subscriptions/s", 5, '{"broken": true}')
    )
    FirestorePools(firestore_client).set_quota("us-central2-b", "v4", "on-demand", 64)
    FirestorePools(firestore_client).set_quota("us-central2", "v4", "spot", 128)

    def run(*args: str, who: str = ADMIN) -> Any:
        return tpujobs(monkeypatch, tmp_path, *args, "--owner", who, api_url=api_url, project="no-such-project")

    rejections = json.loads(run("rejections", "-o", "json").stdout)["rejections"]
    assert [r["message_id"] for r in rejections] == ["4242"] and "accelerator_type" in rejections[0]["reason"]
    table = run("rejections")
    assert table.exit_code == 0 and "4242" in table.stdout and "accelerator_type" in table.stdout
    letters = yaml.safe_load(run("dead-letters", "-o", "yaml").stdout)["dead_letters"]
    assert [(d["message_id"], d["delivery_attempts"]) for d in letters] == [("777", 5)]
    assert "777" in run("dead-letters").stdout
    quotas = json.loads(run("quota", "show", "-o", "json").stdout)
    nothing_held = {"reservation": "", "held": 0, "holders": 0, "waiting": 0}
    assert quotas == {
        "pools": [
            {"pool": "v4@us-central2", "location": "us-central2-b", "scope": "zone", "family": "v4",
             "tier": "on-demand", "quota": 64, **nothing_held},
            {"pool": "v4@us-central2:spot", "location": "us-central2", "scope": "region", "family": "v4",
             "tier": "spot", "quota": 128, **nothing_held},
        ],
        "problems": [],
    }  # fmt: skip
    assert "us-central2-b" in run("quota", "show").stdout
    for verb in (["rejections"], ["dead-letters"], ["quota", "show"]):  # refused by the API: their own Firestore
        stranger = run(*verb, "-o", "json", who=STRANGER)
        assert stranger.exit_code == 0, stranger.output
        assert "4242" not in stranger.stdout and "777" not in stranger.stdout and "v4@" not in stranger.stdout


def test_rejections_from_firestore_come_newest_first_with_their_reasons(service, project_id, monkeypatch, tmp_path):
    """Without an API: the `rejections` collection, newest first."""
    service.submission.submit(inbound("tpujobs-submit", b"not json", message_id="1001"))
    service.submission.submit(inbound("tpujobs-submit", {"name": "x"}, message_id="1002"))
    result = tpujobs(monkeypatch, tmp_path, "rejections", "-o", "json", api_url=None, project=project_id)
    found = json.loads(result.stdout)["rejections"]
    assert [r["message_id"] for r in found] == ["1002", "1001"]
    assert all(r["reason"] for r in found)


def test_submit_wait_stops_with_the_reason_when_the_message_was_refused(service, project_id, monkeypatch, tmp_path):
    """`submit --wait` on the topic: the job never comes; the rejection of its message ends the wait, exit 1."""
    from tpujobs.cli.commands import follow
    from tpujobs.cli.common import Stop

    service.submission.submit(
        inbound("tpujobs-submit", {"name": "train", "owner": OWNER, "command": "x"}, message_id="5150")
    )
    monkeypatch.setenv("TPUJOBS_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("TPUJOBS_API_URL", raising=False)
    with pytest.raises(Stop) as stopped:
        follow(local_settings(project=project_id), "train-never", lambda job: True, timeout=30, message_id="5150")
    assert stopped.value.message.startswith("Refused: ") and "accelerator_type" in stopped.value.message


@pytest.mark.parametrize(
    ("request_body", "caller", "status", "words"),
    [
        ({"action": "rejections", "limit": 0}, ADMIN, 400, "'limit'"),
        ({"action": "dead_letters", "topic": ""}, ADMIN, 400, "'topic'"),
        ({"action": "quotas", "zone": "x"}, ADMIN, 400, "Unknown field 'zone'"),
        ({"action": "rejections"}, STRANGER, 403, "only an admin"),
        ({"action": "quotas"}, "", 401, "No caller"),
    ],
)
def test_the_admin_reads_refuse_bad_requests_and_non_admins(service, request_body, caller, status, words):
    """Each refusal is its status and a sentence naming what is wrong; nothing is read."""
    jobs = JobsApi(service, service.store, local_settings(local_stack=True, admins=(ADMIN,)))
    answer = jobs.handle("POST", "http://127.0.0.1/", {CALLER_HEADER: caller}, json.dumps(request_body).encode())
    assert answer.status == status and words in answer.body["error"]

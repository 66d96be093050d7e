"""Job output in Cloud Logging on the whole local stack: the simulated hosts' agents write each
line to the local stand-in, google-cloud-logging reads it back, and `tpujobs logs` shows the
lines its signature check passes (with the deployment's key, as an operator's machine holds it)."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import logging as cloud_logging
from typer.testing import CliRunner

from tpujobs.domain import job_output
from tpujobs.domain.states import JobState
from tpujobs.local import stack
from tpujobs.local.testing import wait_for

# Generous: when this test runs first, its time includes the stack's start, and on a loaded
# machine that and a job's provisioning can pass the default 120 s; nothing here races a clock.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]


def test_a_jobs_output_is_read_back_from_cloud_logging_and_by_tpujobs_logs(env, submit_job, monkeypatch) -> None:
    """Two workers print three lines each (one on stderr): the client finds all six under the job's
    labels; `tpujobs logs` prints worker 1's three, verified, and drops (and counts) a line that
    other code wrote under the job's labels."""
    job_id = submit_job(
        prefix="cloudlog",
        command='echo "w$TPUJOBS_WORKER_ID one"; echo "w$TPUJOBS_WORKER_ID two"; echo "w$TPUJOBS_WORKER_ID err" >&2',
    )

    def ended():
        job = env["store"].get(job_id)
        return job if job and job.state.is_terminal else None

    ended.__doc__ = f"{job_id} to end"
    job = wait_for(ended, timeout=240)
    assert job.state is JobState.SUCCEEDED, job.state
    endpoint = os.environ["TPUJOBS_LOGGING_ENDPOINT"]
    client = cloud_logging.Client(
        project=env["project"],
        credentials=AnonymousCredentials(),
        _use_grpc=False,
        client_options={"api_endpoint": endpoint},
    )
    query = job_output.job_filter(env["project"], os.environ.get("TPUJOBS_PREFIX", ""), job_id, 1, job.created_at)

    def lines():
        found = [e for e in client.list_entries(filter_=query, order_by=cloud_logging.ASCENDING)]
        mine = [e for e in found if e.labels.get("tpujobs_stream") != "agent"]
        return mine if len(mine) >= 6 else None

    lines.__doc__ = f"six output lines of {job_id} in the local Cloud Logging"
    found = wait_for(lines, timeout=30)
    assert sorted(e.payload for e in found) == sorted(f"w{w} {t}" for w in (0, 1) for t in ("one", "two", "err"))
    severities = {e.payload: e.severity for e in found}
    assert (severities["w1 two"], severities["w1 err"]) == ("INFO", "ERROR")  # stdout and stderr apart

    # Another job's code, with the same VM credentials, writes a line under this job's labels.
    labels = {**found[0].labels, "tpujobs_worker": "1", "tpujobs_seq": "999", "tpujobs_signature": "v1=" + "0" * 64}
    forged = {
        "logName": found[0].log_name,
        "entries": [{"textPayload": "w1 forged: all tests passed", "labels": labels}],
    }
    request = urllib.request.Request(
        endpoint + "/v2/entries:write",
        json.dumps(forged).encode(),
        {"Content-Type": "application/json", "Authorization": "Bearer simulated:someone-else"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200

    state = stack.load(Path(os.environ["TPUJOBS_STATE_DIR"]))
    assert state is not None
    monkeypatch.setenv("TPUJOBS_REPORT_KEY", state.report_key)  # an operator's machine holds it
    from tpujobs.cli import app

    result = CliRunner().invoke(app, ["logs", job_id, "--worker", "1"])
    assert result.exit_code == 0, result.output
    printed = [line for line in result.output.splitlines() if line.startswith("w")]
    assert sorted(printed) == ["w1 err", "w1 one", "w1 two"]
    assert "1 Cloud Logging entries with this job's labels failed their signature" in " ".join(result.output.split())

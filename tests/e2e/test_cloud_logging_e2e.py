"""Job output in Cloud Logging on the whole local stack: the simulated hosts' agents write each
line to the local stand-in, google-cloud-logging reads it back, and `tpujobs logs` shows the
lines its signature check passes (with the deployment's key, as an operator's machine holds it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from owner_cli import ended
from typer.testing import CliRunner

from support.cloud_logging import forge_like, stack_output_entries
from tpujobs.domain.states import JobState
from tpujobs.local import stack

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

    job = ended(env, job_id, timeout=240)
    assert job.state is JobState.SUCCEEDED, job.state
    found = stack_output_entries(env["project"], job_id, job.created_at, at_least=6)
    assert sorted(e.payload for e in found) == sorted(f"w{w} {t}" for w in (0, 1) for t in ("one", "two", "err"))
    severities = {e.payload: e.severity for e in found}
    assert (severities["w1 two"], severities["w1 err"]) == ("INFO", "ERROR")  # stdout and stderr apart

    # Another job's code, with the same VM credentials, writes a line under this job's labels.
    forge_like(found[0], "w1 forged: all tests passed", tpujobs_worker="1")

    state = stack.load(Path(os.environ["TPUJOBS_STATE_DIR"]))
    assert state is not None
    monkeypatch.setenv("TPUJOBS_REPORT_KEY", state.report_key)  # an operator's machine holds it
    from tpujobs.cli import app

    result = CliRunner().invoke(app, ["logs", job_id, "--worker", "1"])
    assert result.exit_code == 0, result.output
    printed = [line for line in result.output.splitlines() if line.startswith("w")]
    assert sorted(printed) == ["w1 err", "w1 one", "w1 two"]
    assert "1 Cloud Logging entries with this job's labels failed their signature" in " ".join(result.output.split())

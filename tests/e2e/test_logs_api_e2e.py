"""`tpujobs logs` for a user without the master key, on the whole local stack: the jobs API's `logs`
reads the job's entries from the local Cloud Logging, checks their signatures, and answers the
owner only verified lines; anyone else is refused there and reads the Cloud Storage copy directly."""

from __future__ import annotations

import os

import pytest
from owner_cli import ended
from typer.testing import CliRunner

from support.cloud_logging import forge_like, stack_output_entries
from tpujobs.domain.states import JobState

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]  # alone, it starts the stack too
OWNER = "ada@example.com"  # conftest's submit_job
FORGED_WARNING = "1 Cloud Logging entries with this job's labels failed their signature"


def test_the_owner_reads_verified_output_through_the_api_without_the_master_key(env, submit_job, monkeypatch):
    """The owner gets the two lines and the count of the forged one; another user, refused by the
    API, gets the Cloud Storage copy (the same two lines, no Cloud Logging entry in it)."""
    job_id = submit_job(prefix="logsapi", accelerator_type="v4-8", command="echo api-one; echo api-two")

    job = ended(env, job_id, timeout=240)
    assert job.state is JobState.SUCCEEDED, job.state
    real = stack_output_entries(env["project"], job_id, job.created_at, at_least=2)[0]
    forge_like(real, "forged: all tests passed")
    monkeypatch.delenv("TPUJOBS_REPORT_KEY", raising=False)  # a user's machine: no master key
    assert os.environ.get("TPUJOBS_API_URL")
    from tpujobs.cli import app

    mine = CliRunner().invoke(app, ["logs", job_id], env={"TPUJOBS_OWNER": OWNER})
    assert mine.exit_code == 0, mine.output
    assert [line for line in mine.output.splitlines() if line.startswith(("api-", "forged"))] == ["api-one", "api-two"]
    assert FORGED_WARNING in " ".join(mine.output.split())

    theirs = CliRunner().invoke(app, ["logs", job_id], env={"TPUJOBS_OWNER": "eve@example.com"})
    assert theirs.exit_code == 0, theirs.output
    copy = [line for line in theirs.output.splitlines() if line.startswith("[worker") or "forged" in line]
    assert copy == ["[worker 0] api-one", "[worker 0] api-two"], theirs.output  # the Cloud Storage copy's form
    assert FORGED_WARNING not in " ".join(theirs.output.split())

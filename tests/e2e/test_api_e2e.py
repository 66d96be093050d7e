"""The `jobs` HTTP function in the running local stack: plain HTTP POSTs and `tpujobs cancel`."""

from __future__ import annotations

import os

import pytest
import requests

from tpujobs.domain.states import JobState
from tpujobs.engine.api import CALLER_HEADER
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

OWNER = "ada@example.com"  # the owner tests/e2e/conftest.py submits as
STRANGER = "eve@example.com"


@pytest.fixture(scope="module")
def http() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # loopback: never through a proxy from the environment
    return session


def post(http: requests.Session, body: dict, caller: str | None = None) -> requests.Response:
    headers = {CALLER_HEADER: caller} if caller is not None else {}
    return http.post(os.environ["TPUJOBS_API_URL"], json=body, headers=headers, timeout=30)


def provisioned(env, job_id: str):
    def probe():
        job = env["store"].get(job_id)
        return job if job and job.state is not JobState.QUEUED else None

    probe.__doc__ = f"{job_id} past QUEUED"
    return wait_for(probe)


def cli(*args: str):
    from typer.testing import CliRunner

    from tpujobs.cli import app

    return CliRunner().invoke(app, list(args))


def test_the_stack_exports_the_jobs_function_url(local_stack, http):
    """TPUJOBS_API_URL is the jobs function; a GET there is 405, a POST without identity 401."""
    assert local_stack["TPUJOBS_API_URL"].startswith("http://127.0.0.1:")
    assert http.get(local_stack["TPUJOBS_API_URL"], timeout=10).status_code == 405
    answer = post(http, {"action": "list"})
    assert answer.status_code == 401 and CALLER_HEADER in answer.json()["error"]


def test_only_the_owner_cancels_over_http(env, submit_job, http):
    """No identity 401, a stranger 403, an unknown job 404, the owner 200 with CANCELLED."""
    job_id = submit_job(prefix="api", command="sleep 600")
    provisioned(env, job_id)
    assert post(http, {"action": "cancel", "job_id": job_id}).status_code == 401
    refused = post(http, {"action": "cancel", "job_id": job_id}, caller=STRANGER)
    assert refused.status_code == 403 and refused.headers["Content-Type"] == "application/json"
    assert "only its owner or an admin" in refused.json()["error"]
    assert post(http, {"action": "cancel", "job_id": "api-no-such"}, caller=OWNER).status_code == 404
    assert env["store"].get(job_id).state is not JobState.CANCELLED

    done = post(http, {"action": "cancel", "job_id": job_id}, caller=OWNER)
    assert done.status_code == 200, done.text
    assert done.json()["state"] == "CANCELLED"
    assert env["store"].get(job_id).state is JobState.CANCELLED


def test_list_and_describe_over_http(env, submit_job, http):
    """list finds the job by owner and state; describe returns its document and timeline."""
    job_id = submit_job(prefix="api", command="sleep 600")
    job = provisioned(env, job_id)
    listed = post(http, {"action": "list", "owner": OWNER, "state": job.state.value}, caller=STRANGER)
    assert listed.status_code == 200
    assert job_id in [j["job_id"] for j in listed.json()["jobs"]]
    described = post(http, {"action": "describe", "job_id": job_id}, caller=STRANGER).json()
    assert described["job"]["owner"] == OWNER
    assert described["events"][0]["to_state"] == "QUEUED"
    assert post(http, {"action": "cancel", "job_id": job_id}, caller=OWNER).status_code == 200


def test_tpujobs_cancel_goes_through_the_api_and_says_why_not(env, submit_job):
    """The CLI: a stranger is told 'Not allowed', a typo 'No such job', the owner cancels at once."""
    job_id = submit_job(prefix="api", command="sleep 600")
    provisioned(env, job_id)

    stranger = cli("cancel", job_id, "--owner", STRANGER)
    assert stranger.exit_code == 1 and "Not allowed" in stranger.output
    missing = cli("cancel", "api-no-such", "--owner", OWNER)
    assert missing.exit_code == 1 and "No such job" in missing.output
    assert env["store"].get(job_id).state is not JobState.CANCELLED

    owner = cli("cancel", job_id, "--owner", OWNER, "--no-wait")
    assert owner.exit_code == 0, owner.output
    assert f"Cancelled {job_id}" in owner.output
    assert env["store"].get(job_id).state is JobState.CANCELLED  # at once: no waiting needed
    again = cli("cancel", job_id, "--owner", OWNER)
    assert again.exit_code == 0 and "already CANCELLED" in again.output

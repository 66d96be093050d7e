"""Labels and list filters through the CLI on the running local stack, and the stack's tick
deleting a record past its `expire_at` as Firestore's TTL would."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from google.cloud import firestore

from tpujobs.adapters.firestore_store import EVENTS, JOBS
from tpujobs.domain.states import JobState
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

OWNER = "ada@example.com"  # the owner tests/e2e/conftest.py submits as


def cli(*args: str):
    from typer.testing import CliRunner

    from tpujobs.cli import app

    return CliRunner().invoke(app, list(args))


def in_state(env, job_id: str, wanted: set[JobState], timeout: float = 90.0):
    def probe():
        job = env["store"].get(job_id)
        return job if job is not None and job.state in wanted else None

    probe.__doc__ = f"{job_id} in {sorted(s.value for s in wanted)}"
    return wait_for(probe, timeout=timeout)


def test_list_finished_with_a_label_shows_exactly_the_matching_jobs(env, submit_job):
    """Ended jobs with team=T (one labelled after submission, through `tpujobs label`) are listed;
    a running one with the label, an ended one with another team and an unlabelled one are not."""
    team = f"t{uuid.uuid4().hex[:8]}"
    succeeded = submit_job(prefix="lbl", command="true", labels={"team": team})
    failed = submit_job(prefix="lbl", command="exit 3", labels={"team": team})
    other = submit_job(prefix="lbl", command="true", labels={"team": f"{team}-other"})
    running = submit_job(prefix="lbl", command="sleep 600", labels={"team": team})
    later = submit_job(prefix="lbl", command="sleep 600")
    in_state(env, later, {JobState.PROVISIONING, JobState.RUNNING})

    refused = cli("label", later, f"team={team}", "--owner", "eve@example.com")
    assert refused.exit_code == 1 and "Not allowed" in refused.output
    labelled = cli("label", later, f"team={team}", "--owner", OWNER)
    assert labelled.exit_code == 0, labelled.output
    assert f"team={team}" in labelled.output
    # Its timeline holds the change; not always last: the job may reach RUNNING meanwhile.
    changes = [e.reason for e in env["store"].events(later) if f"Labels changed by {OWNER}" in e.reason]
    assert len(changes) == 1 and "keeps its old labels" in changes[0], changes
    assert cli("cancel", later, "--owner", OWNER, "--no-wait").exit_code == 0

    in_state(env, succeeded, {JobState.SUCCEEDED})
    in_state(env, failed, {JobState.FAILED})
    in_state(env, other, {JobState.SUCCEEDED})
    in_state(env, running, {JobState.RUNNING})

    listed = cli("list", "--finished", "--label", f"team={team}", "-o", "json", "--as", OWNER)
    assert listed.exit_code == 0, listed.output
    assert {job["job_id"] for job in json.loads(listed.output)["jobs"]} == {succeeded, failed, later}
    table = cli("list", "--finished", "--label", f"team={team}", "--as", OWNER)
    assert table.exit_code == 0 and all(job_id in table.output for job_id in (succeeded, failed, later))
    assert running not in table.output and other not in table.output
    active = cli("list", "--active", "--label", f"team={team}", "-o", "json", "--as", OWNER)
    assert [job["job_id"] for job in json.loads(active.output)["jobs"]] == [running]
    assert cli("cancel", running, "--owner", OWNER, "--no-wait").exit_code == 0


def test_the_stack_tick_deletes_a_job_past_its_expire_at(env, submit_job):
    """The emulator has no TTL: the local scheduler's tick deletes the ended job and its timeline."""
    job_id = submit_job(prefix="ttl", command="true")
    ended = in_state(env, job_id, {JobState.SUCCEEDED})
    assert ended.expire_at is not None and ended.expire_at - ended.ended_at == timedelta(days=180)
    client = firestore.Client(project=env["project"])
    ref = client.collection(JOBS).document(job_id)
    ref.update({"expire_at": datetime.now(timezone.utc) - timedelta(seconds=1)})

    def gone():
        """the job's document and timeline deleted by the tick"""
        return not ref.get().exists and not list(ref.collection(EVENTS).stream())

    wait_for(gone, timeout=60)

"""Teams share a zone's chips on the local stack: issue 39's "Done when", end to end.

A zone's 16 on-demand v4 chips (`tpujobs quota set`) are split 8/8 between team-a and team-b
(`tpujobs team set`, through the jobs API as the stack's admin). Jobs go through the jobs API as
their owners, as `tpujobs submit` sends them with TPUJOBS_API_URL set: a job's team is its
*verified* owner's team, so no topic owner is trusted. Team-a's four v4-8 jobs borrow team-b's
idle chips; team-b's two jobs take them back at their submit, and once they end, team-a's
reclaimed jobs resume.

Teams reach every job of a stack (each job's admission reads config/teams), so this runs on the
fault tests' stack, one test at a time (faults/conftest.py); a region of its own (europe-west4) and
owners no other test submits as all the same, and the quota and teams are removed at the end.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from stack_reads import worker_output
from typer.testing import CliRunner

from tpujobs.cli import app
from tpujobs.domain.states import JobState
from tpujobs.local.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e-faults"), pytest.mark.timeout(600)]

ZONE = "europe-west4-b"
LIMIT = f"{ZONE}/v4"
ALICE = "alice@example.com"  # team-a
BOB = "bob@example.com"  # team-b
TIMEOUT = 120.0  # seconds any one wait may take: hosts boot, and a loaded machine is slow
# Says which attempt runs and whether it resumes; then runs until cancelled or taken back.
COMMAND = 'echo "attempt $TPUJOBS_ATTEMPT resume $TPUJOBS_RESUME"; sleep 600'


def tpujobs(who: str, *args: str) -> str:
    """`tpujobs ARGS` as `who` (through the jobs API: TPUJOBS_API_URL is the stack's); its output,
    the command checked to have succeeded."""
    result = CliRunner().invoke(app, list(args), env={"TPUJOBS_OWNER": who}, terminal_width=200)
    assert result.exit_code == 0, f"tpujobs {' '.join(args)} as {who}: {result.output}"
    return result.output


def submitted(tmp_path: Path, owner: str, prefix: str) -> str:
    """`tpujobs submit` of an on-demand v4-8 (4 chips, one host) in ZONE as `owner`; its id."""
    job_id = f"{prefix}-{uuid.uuid4().hex[:6]}"
    spec = {
        "job_id": job_id,
        "name": prefix,
        "owner": owner,
        "accelerator_type": "v4-8",
        "capacity": "on-demand",
        "zone": ZONE,
        "command": COMMAND,
    }
    path = tmp_path / f"{job_id}.json"
    path.write_text(json.dumps(spec))
    assert job_id in tpujobs(owner, "submit", str(path))
    return job_id


def described(owner: str, job_id: str) -> dict[str, Any]:
    """`tpujobs describe JOB -o json`: the job's document and its timeline."""
    return dict(json.loads(tpujobs(owner, "describe", job_id, "-o", "json")))


def is_reclaim(event: dict[str, Any]) -> bool:
    """Whether a timeline entry is a reclaim (the `reclaimed` observation's transition)."""
    return str(event.get("reason", "")).startswith("Reclaimed by ")


def in_state(env, wanted: JobState, *job_ids: str) -> list[Any]:
    """The jobs, once every one is in `wanted`."""

    def probe():
        jobs = [env["store"].get(job_id) for job_id in job_ids]
        return jobs if all(job is not None and job.state is wanted for job in jobs) else None

    probe.__doc__ = f"{', '.join(job_ids)} {wanted.value}"
    try:
        return wait_for(probe, timeout=TIMEOUT)
    except AssertionError as error:
        now = {job_id: (job.state.value, job.state_reason) if job else None for job_id in job_ids
               for job in [env["store"].get(job_id)]}  # fmt: skip
        raise AssertionError(f"{error}; they are {now}") from None


def positions(admin: str) -> dict[str, dict[str, int]]:
    """Per team, its chips under LIMIT now, as `tpujobs team show -o json` says them."""
    shown = json.loads(tpujobs(admin, "team", "show", "-o", "json"))
    assert shown["problems"] == [], shown["problems"]
    found = {}
    for team in shown["teams"]:
        for limit in team["limits"]:
            if f"{limit['location']}/{limit['family']}" == LIMIT and limit["tier"] == "on-demand":
                found[team["name"]] = {key: limit[key] for key in ("nominal", "held", "borrowed", "lent", "waiting")}
    return found


def positions_become(admin: str, wanted: dict[str, dict[str, int]]) -> None:
    """Wait for `team show` to say `wanted` (the holds change in the same write as the states,
    but a job's state is read first); the last answer in the failure."""
    seen: list[dict[str, dict[str, int]]] = []

    def probe() -> bool:
        seen.append(positions(admin))
        return seen[-1] == wanted

    try:
        wait_for(probe, timeout=30, interval=0.5, what="team show to say the teams' chips")
    except AssertionError:
        assert seen[-1] == wanted  # pytest shows what differs


@pytest.fixture
def shared_zone(stack_admin: str) -> Iterator[str]:
    """ZONE's 16 on-demand v4 chips, 8 the nominal of team-a (ALICE), 8 of team-b (BOB); the
    quota and both teams removed afterwards."""
    shown = json.loads(tpujobs(stack_admin, "team", "show", "-o", "json"))
    assert not {"team-a", "team-b"} & {team["name"] for team in shown["teams"]}, "left over from another run"
    try:
        tpujobs(stack_admin, "quota", "set", ZONE, "v4", "16")
        tpujobs(stack_admin, "team", "set", "team-a", "--member", ALICE, "--chips", f"{LIMIT}=8")
        tpujobs(stack_admin, "team", "set", "team-b", "--member", BOB, "--chips", f"{LIMIT}=8")
        yield ZONE
    finally:
        tpujobs(stack_admin, "team", "unset", "team-a")
        tpujobs(stack_admin, "team", "unset", "team-b")
        tpujobs(stack_admin, "quota", "unset", ZONE, "v4")


@pytest.fixture
def cancel_at_end(stack_admin: str) -> Iterator[list[str]]:
    """Job ids to cancel (as the admin) when the test ends, before the quota and teams go."""
    job_ids: list[str] = []
    yield job_ids
    for job_id in job_ids:
        tpujobs(stack_admin, "cancel", job_id, "--no-wait")


def test_a_team_takes_back_its_lent_chips_at_its_submit_and_the_reclaimed_jobs_resume_after(
    env, tmp_path, stack_admin, shared_zone, cancel_at_end
):
    """Team-a's four v4-8 jobs all run on 16 chips while team-b is idle (team-a borrows 8, team-b
    lends 8). Team-b's two jobs run; exactly two of team-a's are reclaimed, QUEUED again with no
    restart and the reason in their timeline, the other two still running; each team then holds
    its 8. Team-b's jobs cancelled, the reclaimed jobs run again: attempt 2, resuming."""
    a_jobs = [submitted(tmp_path, ALICE, "share-a") for _ in range(4)]
    cancel_at_end.extend(a_jobs)
    assert {job.team for job in in_state(env, JobState.RUNNING, *a_jobs)} == {"team-a"}
    positions_become(
        stack_admin,
        {
            "team-a": {"nominal": 8, "held": 16, "borrowed": 8, "lent": 0, "waiting": 0},
            "team-b": {"nominal": 8, "held": 0, "borrowed": 0, "lent": 8, "waiting": 0},
        },
    )

    b_jobs = [submitted(tmp_path, BOB, "share-b") for _ in range(2)]
    cancel_at_end.extend(b_jobs)
    assert {job.team for job in in_state(env, JobState.RUNNING, *b_jobs)} == {"team-b"}

    def two_queued():
        jobs = [env["store"].get(job_id) for job_id in a_jobs]
        queued = [job for job in jobs if job.state is JobState.QUEUED]
        return queued if len(queued) >= 2 else None

    two_queued.__doc__ = "two of team-a's jobs back in QUEUED"
    reclaimed = {job.job_id for job in wait_for(two_queued, timeout=TIMEOUT)}
    kept = [job_id for job_id in a_jobs if job_id not in reclaimed]
    assert len(reclaimed) == 2
    assert [job.state for job in (env["store"].get(job_id) for job_id in kept)] == [JobState.RUNNING] * 2
    for job_id in reclaimed:
        document = described(ALICE, job_id)
        job, events = document["job"], document["events"]
        assert job["state"] == "QUEUED" and job["restarts"] == 0 and job["attempt"] == 2, job
        (taken,) = [event for event in events if is_reclaim(event)]
        assert taken["from_state"] == "RUNNING" and taken["to_state"] == "QUEUED", taken
        assert taken["reason"].startswith(
            tuple(
                f"Reclaimed by team-b (its nominal share), for {b_job}; attempt 2 waits for quota and will "
                "resume from its checkpoint."
                for b_job in b_jobs
            )
        ), taken
    for job_id in kept:
        assert not [event for event in described(ALICE, job_id)["events"] if is_reclaim(event)]
    positions_become(
        stack_admin,
        {
            "team-a": {"nominal": 8, "held": 8, "borrowed": 0, "lent": 0, "waiting": 8},
            "team-b": {"nominal": 8, "held": 8, "borrowed": 0, "lent": 0, "waiting": 0},
        },
    )

    for job_id in b_jobs:
        tpujobs(BOB, "cancel", job_id, "--no-wait")
    in_state(env, JobState.CANCELLED, *b_jobs)
    for job in in_state(env, JobState.RUNNING, *reclaimed):
        assert job.attempt == 2 and job.restarts == 0 and job.resume_next
        wait_for(
            lambda job_id=job.job_id: "attempt 2 resume 1" in worker_output(env, job_id, attempt=2),
            timeout=TIMEOUT,
            what=f"{job.job_id}'s attempt 2 to say it resumes",
        )
    assert [job.attempt for job in (env["store"].get(job_id) for job_id in kept)] == [1, 1]

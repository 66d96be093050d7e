"""Teams share a limit by their nominal shares (`engine/jobs/admission.py` on `domain.fair_share`):
an idle team's chips are borrowed, and taken back at the submit of the team that owns them."""

from __future__ import annotations

from typing import Any

import pytest
from engine_harness import ZONE, Engine

from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.states import JobState
from tpujobs.domain.team_edits import with_team
from tpujobs.engine.startup_script import STOP_REQUEST_KEY
from tpujobs.local.fakes.capacity import InMemoryCapacity

P, Q = JobState.PROVISIONING, JobState.QUEUED
POOL = "v4@us-central2"
LIMIT = f"{ZONE}/v4"


@pytest.fixture
def jobs(engine: Any) -> Engine:
    """A zone's 16 v4 chips split 8/8 between team-a (ada) and team-b (bob)."""
    jobs: Engine = engine()
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 16)
    for team, member in (("team-a", "ada@example.com"), ("team-b", "bob@example.com")):
        jobs.teams.edit_team(team, lambda d, t=team, m=member: with_team(d, t, members=[m], chips={LIMIT: 8}))
    return jobs


def submit(jobs: Engine, job_id: str, owner: str, verified: bool = True, **changes: Any) -> str:
    spec = {"job_id": job_id, "name": "train", "owner": owner, "accelerator_type": "v4-8", "command": "python t.py"}
    outcome = (jobs.submit_verified if verified else jobs.submit)({**spec, **changes})
    assert outcome.kind != "rejected", outcome.reason
    return job_id


def states(jobs: Engine, *job_ids: str) -> list[JobState]:
    return [jobs.job(j).state for j in job_ids]


def test_a_team_under_its_nominal_takes_back_exactly_what_it_needs_at_its_submit(jobs: Engine) -> None:
    """The issue's case: team-a's four 4-chip jobs run while team-b is idle; team-b's two jobs run
    at their submit, and exactly two of team-a's, the latest, are reclaimed, saying by whom."""
    a_jobs = [submit(jobs, f"a-{n}", "ada@example.com") for n in range(4)]
    assert states(jobs, *a_jobs) == [P] * 4
    assert {jobs.job(j).team for j in a_jobs} == {"team-a"}
    b_jobs = [submit(jobs, f"b-{n}", "bob@example.com") for n in range(2)]
    assert states(jobs, *b_jobs) == [P, P]
    assert states(jobs, *a_jobs) == [P, P, Q, Q]
    for job_id in ("a-2", "a-3"):
        reclaimed = jobs.job(job_id)
        assert reclaimed.restarts == 0
        assert sum(e.reason.startswith("Reclaimed by team-b") for e in jobs.events(job_id)) == 1
        assert reclaimed.state_reason.startswith(("Reclaimed by team-b", "Waiting for quota"))
    holders = {h.job_id: h.team for h in jobs.pools.view(POOL).holders}
    assert holders == {"a-0": "team-a", "a-1": "team-a", "b-0": "team-b", "b-1": "team-b"}
    assert jobs.live_capacity() == {jobs.job(j).queued_resource for j in ("a-0", "a-1", "b-0", "b-1")}


def test_a_reclaimed_job_runs_again_when_the_lender_gives_its_chips_back(jobs: Engine) -> None:
    for n in range(4):
        submit(jobs, f"a-{n}", "ada@example.com")
    submit(jobs, "b-0", "bob@example.com")
    assert states(jobs, "a-3") == [Q]
    jobs.cancel("b-0", "Cancelled by bob.")
    assert states(jobs, "a-3") == [P]
    assert jobs.job("a-3").attempt == 2


def test_a_waiting_borrower_says_where_its_team_stands(jobs: Engine) -> None:
    jobs.teams.edit_team("team-a", lambda d: with_team(d, "team-a", borrowing_limit=4))
    for n in range(4):
        submit(jobs, f"a-{n}", "ada@example.com")
    assert states(jobs, "a-3") == [Q]
    assert jobs.job("a-3").state_reason.endswith("team-a holds 12 chips, 4 past its 8 nominal and may borrow 0 more.")


def test_a_claimed_owner_on_the_topic_is_in_no_team_and_draws_only_on_unassigned_chips(jobs: Engine) -> None:
    """Without `trust_topic_owners` a topic's owner is a claim: the job is in no team, and every
    chip of this limit is some team's nominal."""
    submit(jobs, "claimed", "ada@example.com", verified=False)
    assert jobs.job("claimed").team == ""
    assert states(jobs, "claimed") == [Q]
    assert "jobs of no team draw only on the 0 chips no team holds as nominal" in jobs.job("claimed").state_reason


def test_a_team_past_its_monthly_budget_waits_until_an_admin_lifts_it(jobs: Engine) -> None:
    jobs.teams.edit_team("team-b", lambda d: with_team(d, "team-b", budget_chip_hours=10))
    month = jobs.clock().strftime("%Y-%m")
    jobs.budget_tally.record("team-b", month, "old-job:1", 12)
    submit(jobs, "b-0", "bob@example.com")
    assert states(jobs, "b-0") == [Q]
    assert "team-b has used 12 of its 10 chip-hour budget" in jobs.job("b-0").state_reason
    submit(jobs, "a-0", "ada@example.com")  # another team is not held back
    assert states(jobs, "a-0") == [P]
    jobs.teams.edit_team("team-b", lambda d: with_team(d, "team-b", budget_chip_hours=100))
    jobs.tick()
    assert states(jobs, "b-0") == [P]


def test_a_running_job_taken_back_is_asked_to_stop_and_its_chips_go_once_its_hosts_stopped(engine: Any) -> None:
    """A reclaimed running attempt keeps its holding, counted, while its hosts stop the command
    with their grace (the stop asked in their metadata); the reclaiming job is admitted the moment
    every host has said `stopped`, not at the grace's end."""
    capacity = InMemoryCapacity(initial_state=HoldingState.ACTIVE)
    jobs: Engine = engine(capacity=capacity)
    jobs.pools.set_quota(ZONE, "v4", "on-demand", 8)
    for team, member in (("team-a", "ada@example.com"), ("team-b", "bob@example.com")):
        jobs.teams.edit_team(team, lambda d, t=team, m=member: with_team(d, t, members=[m], chips={LIMIT: 4}))
    for n in range(2):
        submit(jobs, f"a-{n}", "ada@example.com")
        jobs.report("started", 1, job_id=f"a-{n}")
    assert states(jobs, "a-0", "a-1") == [JobState.RUNNING] * 2
    submit(jobs, "b-0", "bob@example.com")
    reclaimed = jobs.job("a-1")
    assert reclaimed.state is Q and [h.holding for h in reclaimed.held_over] == ["a-1-a1"]
    assert "a-1-a1" in {name for _, name in capacity.holdings}  # not released: its hosts are saving
    stop_asked = next(iter(capacity.holdings[(ZONE, "a-1-a1")].metadata.values()))
    assert stop_asked[STOP_REQUEST_KEY].startswith("Reclaimed by team-b (its nominal share), for b-0")
    assert states(jobs, "b-0") == [Q]
    assert "4 chips are still held by jobs stopping within their grace" in jobs.job("b-0").state_reason
    assert "held:a-1-a1" in {h.job_id for h in jobs.pools.view(POOL).holders}
    jobs.report("stopped", 1, job_id="a-1")
    assert states(jobs, "b-0") == [P]
    assert jobs.job("a-1").held_over == ()
    assert ("release", ZONE, "a-1-a1") in capacity.calls
    assert {h.job_id for h in jobs.pools.view(POOL).holders} == {"a-0", "b-0"}

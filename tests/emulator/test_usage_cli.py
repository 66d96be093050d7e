"""`tpujobs usage` and `tpujobs usage lift` on the Firestore emulator (no jobs API): the month's
sums per group as a table and as JSON, and a lift written where admission reads it."""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from tpujobs.adapters.firestore_budgets import FirestoreBudgetTally
from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.domain.accounting import AttemptUsage
from tpujobs.domain.job import new_job
from tpujobs.domain.spec import parse_spec

pytestmark = pytest.mark.emulator


@pytest.fixture
def run(cli_without_api):
    return functools.partial(cli_without_api, "usage")


def test_usage_sums_this_months_jobs_per_team_and_per_label(run, firestore_client):
    """One v6e job of team-a, held an hour on 8 chips, this month: 8 chip-hours at the shipped price."""
    now = datetime.now(timezone.utc)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    spec = parse_spec({"job_id": "job-1", "name": "train", "owner": "ada@example.com", "accelerator_type": "v6e-8",
                       "command": "true", "labels": {"project": "llm"}})  # fmt: skip
    job, event = new_job(spec, "us-east5-b", start)
    usage = AttemptUsage(1, 8, start, held_from=start, ended_at=start + timedelta(hours=1), zone="us-east5-b")
    FirestoreJobStore(firestore_client).create(replace(job, team="team-a", usage=(usage,)), event)

    result = run("-o", "json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["scope"] == "all" and answer["groups"][0]["group"] == "team-a"
    assert answer["groups"][0]["estimated_cost_usd"] == pytest.approx(8 * 2.70)
    table = run("--by", "label:project")
    assert table.exit_code == 0 and "llm" in table.output and "21.60" in table.output
    assert run("--by", "zone").exit_code != 0


def test_lift_is_written_for_the_month_and_undone(run, firestore_client):
    """`lift` names who lifted; `--undo` holds the team again."""
    result = run("lift", "team-a", "--month", "2026-12", "--owner", "root@example.com")
    assert result.exit_code == 0, result.output
    tally = FirestoreBudgetTally(firestore_client)
    assert tally.read(["team-a"], "2026-12")["team-a"].lifted_by == "root@example.com"
    assert run("lift", "team-a", "--month", "2026-12", "--undo").exit_code == 0
    assert tally.read(["team-a"], "2026-12")["team-a"].lifted_by == ""

"""The jobs API's `usage` (`engine/jobs_api/usage_actions.py`): an admin's sums cover every job,
anyone else's their own jobs only; and `tpujobs usage`'s table of the answer."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from tpujobs.cli.usage import usage_sheet
from tpujobs.domain.accounting import AttemptUsage
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import JobState
from tpujobs.engine.api import CALLER_HEADER, JobsApi
from tpujobs.engine.settings import Settings
from tpujobs.engine.usage_report import FixedPrices, MonthlyUsage
from tpujobs.local.fakes import InMemoryJobStore
from tpujobs.local.fakes.usage_jobs import InMemoryUsageJobs

NOW = datetime(2026, 12, 20, tzinfo=UTC)


def ended(job_id: str, owner: str, team: str, hours: float) -> Job:
    spec = parse_spec(
        {"job_id": job_id, "name": "train", "owner": owner, "accelerator_type": "v6e-8", "command": "true"}
    )
    job, _ = new_job(spec, "us-east5-b", NOW - timedelta(days=3))
    start = NOW - timedelta(days=1)
    usage = AttemptUsage(1, 8, start, held_from=start, ended_at=start + timedelta(hours=hours), zone="us-east5-b")
    return replace(job, team=team, usage=(usage,), state=JobState.SUCCEEDED, ended_at=usage.ended_at)


def api() -> JobsApi:
    store = InMemoryJobStore()
    for job in (ended("job-a", "ada@example.com", "team-a", 1), ended("job-b", "bob@example.com", "team-b", 2)):
        store.create(job, new_job(job.spec, job.zone, job.created_at or NOW)[1])
    settings = Settings(project="p", local_stack=True, admins=("root@example.com",))
    usage = MonthlyUsage(InMemoryUsageJobs(store), FixedPrices(), lambda: NOW)
    return JobsApi(SimpleNamespace(warm=None, access=None), store, settings, usage=usage)  # type: ignore[arg-type]


def ask(caller: str, **fields: object) -> tuple[int, dict[str, object]]:
    body = json.dumps({"action": "usage", **fields}).encode()
    answer = api().handle("POST", "http://jobs", {CALLER_HEADER: caller}, body)
    return answer.status, answer.body


def test_an_admin_sees_every_teams_chip_hours_and_estimated_cost() -> None:
    """Both teams, the biggest first, priced at the shipped v6e price."""
    status, body = ask("root@example.com", month="2026-12")
    assert status == 200 and body["scope"] == "all" and body["estimate"] is True
    groups = body["groups"]
    assert isinstance(groups, list)
    assert [(g["group"], g["chip_hours"], g["estimated_cost_usd"]) for g in groups] == [
        ("team-b", 16.0, 43.2),
        ("team-a", 8.0, 21.6),
    ]


def test_anyone_else_sees_only_their_own_jobs() -> None:
    """A non-admin's sums hold their jobs alone, and say so."""
    status, body = ask("ada@example.com", by="owner")
    assert status == 200 and body["scope"] == "owner ada@example.com"
    assert [g["group"] for g in body["groups"]] == ["ada@example.com"]  # type: ignore[index, union-attr]


def test_a_bad_grouping_or_month_is_refused_with_a_sentence() -> None:
    """400s naming what is wrong."""
    assert ask("root@example.com", by="zone")[0] == 400
    assert ask("root@example.com", month="2026-13")[0] == 400


def test_the_table_shows_each_group_with_its_goodput_and_cost() -> None:
    """The CLI's table: one row per group, costs to the cent, goodput as a percentage."""
    answer = {"month": "2026-12", "by": "team", "scope": "all", "groups": [
        {"group": "team-a", "chip_hours": 8.0, "goodput": 0.95, "estimated_cost_usd": 21.6,
         "unpriced_chip_hours": 0.0, "jobs": 1},
    ]}  # fmt: skip
    sheet = usage_sheet(answer)
    assert sheet.rows == [["team-a", "8.0", "95.0%", "21.60", "0.0", "1"]]

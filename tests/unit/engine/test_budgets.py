"""Teams' monthly budgets (`engine/budgets.py`): the tally an ended attempt adds to once, who is
over, and the notices at 80% and 100%, each sent once a month to the members' and admins' targets."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tpujobs.domain.access import AccessPolicies
from tpujobs.domain.accounting import AttemptUsage
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.notify import NotifyTarget
from tpujobs.domain.notify_delivery import KEY_ID_HEADER, NotifyKeys
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.teams import TeamBook
from tpujobs.engine.budget_notices import WebhookBudgetNotices
from tpujobs.engine.budgets import TeamBudgets, attempt_months
from tpujobs.engine.errors import TransientError
from tpujobs.engine.notifications import Notifier, NotifySettings
from tpujobs.local.fakes.budgets import InMemoryBudgetTally
from tpujobs.local.fakes.notifications import (
    InMemoryDeliveryRecords,
    InMemoryNotifyConfig,
    InMemoryWebhookSecrets,
    RecordingPoster,
)
from tpujobs.local.fakes.teams import FakeTeams
from tpujobs.local.testing import inbound

NOW = datetime(2026, 12, 20, tzinfo=UTC)
TEAM_HOOK, ADMIN_HOOK = "https://hooks.example.com/team-a", "https://hooks.example.com/admins"


def teams_document(budget: float | None = 100.0) -> dict[str, Any]:
    fields: dict[str, object] = {"members": ["alice@example.com"]}
    if budget is not None:
        fields["budget_chip_hours"] = budget
    return {"team-a": fields, "team-b": {"members": ["bob@example.com"]}}


def book(budget: float | None = 100.0) -> TeamBook:
    return TeamBook(teams_document(budget))


def ended_job(job_id: str, hours: float, chips: int = 4, attempt: int = 1, start: datetime | None = None) -> Job:
    spec = parse_spec({"job_id": job_id, "name": "train", "owner": "alice@example.com", "accelerator_type": "v4-8",
                       "command": "true"})  # fmt: skip
    job, _ = new_job(spec, "us-central2-b", NOW - timedelta(days=30))
    began = start or NOW - timedelta(hours=hours)
    usage = AttemptUsage(attempt, chips, began, held_from=began, ended_at=began + timedelta(hours=hours))
    return replace(job, team="team-a", usage=(usage,), attempt=attempt)


def budgets(tally: InMemoryBudgetTally, poster: RecordingPoster | None = None) -> TeamBudgets:
    config = InMemoryNotifyConfig(
        defaults={
            "group:ml": [NotifyTarget(webhook=TEAM_HOOK, on=["FAILED"])],
            "root@example.com": [NotifyTarget(webhook=ADMIN_HOOK)],
            "carol@example.com": [NotifyTarget(webhook="https://hooks.example.com/carol")],
        },
        access=AccessPolicies(groups={"ml": ("alice@example.com",)}),
    )
    settings = NotifySettings("p", "", "tpu@p.iam.gserviceaccount.com", NotifyKeys.of(b"k" * 32))
    notices = WebhookBudgetNotices(InMemoryWebhookSecrets(), poster or RecordingPoster(), settings, lambda: NOW)
    teams = FakeTeams(document=teams_document())
    return TeamBudgets(tally, lambda: NOW, notices, config, admins=("root@example.com",), teams=teams)


def test_a_redelivered_attempt_end_adds_nothing_more() -> None:
    """The tally is keyed by job and attempt: the same end twice counts once, another attempt counts."""
    tally = InMemoryBudgetTally()
    service = budgets(tally)
    team = book().get("team-a")
    assert team is not None
    service.record_attempt(ended_job("job-1", 5), 1)
    service.record_attempt(ended_job("job-1", 5), 1)
    assert service.standing(team) == (pytest.approx(20.0), 100.0)
    service.record_attempt(ended_job("job-1", 5, attempt=2), 2)
    assert service.standing(team)[0] == pytest.approx(40.0)


def test_an_attempt_across_months_adds_each_months_part_to_that_month() -> None:
    """Nov 30 22:00 to Dec 1 03:00 on 4 chips: 8 chip-hours in November, 12 in December."""
    job = ended_job("job-1", 5, start=datetime(2026, 11, 30, 22, tzinfo=UTC))
    assert attempt_months(job.usage[0]) == pytest.approx({"2026-11": 8.0, "2026-12": 12.0})
    tally = InMemoryBudgetTally()
    service = budgets(tally)
    service.record_attempt(job, 1)
    team = book().get("team-a")
    assert team is not None
    assert service.standing(team, "2026-11")[0] == pytest.approx(8.0)
    assert service.standing(team, "2026-12")[0] == pytest.approx(12.0)


def test_notices_go_once_at_80_and_once_at_100_percent() -> None:
    """Crossing 80% tells the member's group and the admin once; 100% once more; later ends, nothing."""
    poster = RecordingPoster()
    service = budgets(InMemoryBudgetTally(), poster)
    for job_id, hours in (("job-1", 10), ("job-2", 10.5), ("job-3", 1), ("job-4", 4), ("job-5", 1), ("job-6", 1)):
        service.record_attempt(ended_job(job_id, hours), 1)  # 40, 82, 86, 102, 106, 110 chip-hours
    sent = [(post.url, json.loads(post.body)["threshold"]) for post in poster.posts]
    assert sorted(sent) == sorted([(TEAM_HOOK, 80), (ADMIN_HOOK, 80), (TEAM_HOOK, 100), (ADMIN_HOOK, 100)])
    assert all(post.headers[KEY_ID_HEADER] == "team:team-a" for post in poster.posts)
    assert "used 82 of its 100 chip-hour budget for 2026-12" in json.loads(poster.posts[0].body)["text"]


def test_a_notice_that_could_not_be_delivered_is_tried_at_the_next_attempt_end() -> None:
    """A passing failure releases the claim: the next end sends it, and only once."""
    poster = RecordingPoster(failures={ADMIN_HOOK: [TransientError("503")]})
    service = budgets(InMemoryBudgetTally(), poster)
    with pytest.raises(TransientError):
        service.record_attempt(ended_job("job-1", 21), 1)  # 84 chip-hours
    service.record_attempt(ended_job("job-2", 0.25), 1)
    service.record_attempt(ended_job("job-3", 0.25), 1)
    assert sorted(post.url for post in poster.posts) == sorted([TEAM_HOOK, TEAM_HOOK, ADMIN_HOOK])


def test_over_budget_names_each_team_at_its_budget_until_an_admin_lifts_it() -> None:
    """At 100% the team's new jobs wait with a reason; a lift for the month, or no budget, frees it."""
    tally = InMemoryBudgetTally()
    service = budgets(tally)
    service.record_attempt(ended_job("job-1", 25), 1)
    reads = tally.reads
    assert service.over_budget(book()) == {
        "team-a": "team-a has used 100 of its 100 chip-hour budget for 2026-12; an admin may lift it "
        "(tpujobs usage lift team-a)"
    }
    assert tally.reads == reads + 1  # one round trip for every team with a budget
    assert service.over_budget(book(budget=101)) == {}
    assert service.over_budget(book(budget=None)) == {}
    service.lift("team-a", by="root@example.com")
    assert service.over_budget(book()) == {}
    assert service.over_budget(book(), month="2027-01") == {}


def test_a_job_of_no_team_adds_to_no_tally() -> None:
    """No team, nothing to count against."""
    tally = InMemoryBudgetTally()
    service = budgets(tally)
    service.record_attempt(replace(ended_job("job-1", 5), team=""), 1)
    assert tally.read(["team-a", ""], "2026-12")["team-a"].chip_hours == 0


class OneJob:
    """NotifyJobs holding one job."""

    def __init__(self, job: Job) -> None:
        self.job = job

    def get(self, job_id: str) -> Job | None:
        return self.job if job_id == self.job.job_id else None


def test_the_notify_function_counts_an_attempt_end_once_however_often_it_is_delivered() -> None:
    """The status change that ended attempt 1, delivered twice: the team's month grows once."""
    tally = InMemoryBudgetTally()
    service = budgets(tally)
    job = ended_job("job-1", 5)
    settings = NotifySettings("p", "", "tpu@p.iam.gserviceaccount.com", NotifyKeys.of(b"k" * 32))
    notifier = Notifier(
        OneJob(job), InMemoryNotifyConfig(), InMemoryWebhookSecrets(), RecordingPoster(), InMemoryDeliveryRecords(),
        settings, lambda: NOW, budgets=service,
    )  # fmt: skip
    change = {"job_id": job.job_id, "from_state": "RUNNING", "to_state": "SUCCEEDED", "attempt": 1, "seq": 4}
    for _ in range(2):
        notifier.handle(inbound("tpujobs-status", change, message_id="m-1"))
    assert tally.read(["team-a"], "2026-12")["team-a"].chip_hours == pytest.approx(20.0)

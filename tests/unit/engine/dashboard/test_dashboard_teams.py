"""The dashboard's teams page on fakes: each team's chips under its limits and its month against
its budget, every team for an admin and only their own for anyone else, drawn to scale."""

from __future__ import annotations

import dataclasses
import re
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from tpujobs.domain.admission import Holder
from tpujobs.domain.job import new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.api import JobsApi
from tpujobs.engine.dashboard import charts
from tpujobs.engine.dashboard.caller import DashboardCaller
from tpujobs.engine.dashboard.views import DashboardViews
from tpujobs.engine.settings import Settings
from tpujobs.local.fakes import InMemoryJobStore, InMemoryPools
from tpujobs.local.fakes.budgets import InMemoryBudgetTally
from tpujobs.local.fakes.teams import FakeTeams
from tpujobs.local.fakes.usage_jobs import InMemoryUsageJobs
from tpujobs.runtime.dashboard_site import DashboardSite

NOW = datetime(2026, 3, 14, 9, 0, tzinfo=timezone.utc)
ZONE = "us-central2-b"
POOL = "v4@us-central2"
ROOT, ALICE, CI, EVE = "root@example.com", "alice@example.com", "ci@p.iam.gserviceaccount.com", "eve@example.com"
TEAMS = {
    "team-a": {"members": [ALICE], "limits": {f"{ZONE}/v4": {"nominal": 8, "borrowing_limit": 8}},
               "budget_chip_hours": 1000},
    "team-b": {"accounts": [CI], "limits": {f"{ZONE}/v4": {"nominal": 8}}},
    "team-c": {"limits": {"us-east5-a/v5p": {"nominal": 4}}},
}  # fmt: skip


@dataclasses.dataclass
class Deployment:
    store: InMemoryJobStore
    pools: InMemoryPools
    teams: FakeTeams | None
    tally: InMemoryBudgetTally

    def views(self) -> DashboardViews:
        service = SimpleNamespace(warm=None, access=None, teams=self.teams, pools=self.pools)
        api = JobsApi(service, self.store, Settings(project="p", admins=(ROOT,)))  # type: ignore[arg-type]
        return DashboardViews(api, lambda: NOW, InMemoryUsageJobs(self.store), budgets=self.tally)

    def site(self, caller: str) -> DashboardSite:
        who = DashboardCaller(lambda token, audiences: {}, "", local_stack=True, local_user=caller)
        return DashboardSite(self.views(), who)


@pytest.fixture
def deployment() -> Deployment:
    """A zone's 16 v4 chips split 8/8: team-a holds 12 (4 borrowed, lent by team-b, idle), team-b
    waits for 4; team-a has used 900 of its 1,000 chip-hours this month, team-b 10 (no budget);
    team-c's limit is not in config/quotas (a problem)."""
    store = InMemoryJobStore()
    pools = InMemoryPools(store)
    pools.set_quota(ZONE, "v4", "on-demand", 16)
    holders = [Holder(f"a-{i}", 4, 1, "medium", NOW, zone=ZONE, team="team-a") for i in range(3)]
    assert pools.change(pools.view(POOL), add=holders)
    spec = parse_spec({"job_id": "b-1", "name": "b-1", "owner": CI, "accelerator_type": "v4-8", "command": "x",
                       "zone": ZONE})  # fmt: skip
    job, event = new_job(spec, ZONE, NOW)
    assert store.create(dataclasses.replace(job, team="team-b"), event)
    tally = InMemoryBudgetTally()
    tally.record("team-a", "2026-03", "a-0:1", 900.0)
    tally.record("team-b", "2026-03", "b-0:1", 10.0)
    tally.record("team-a", "2026-02", "a-9:1", 5000.0)  # last month's: not this page's
    return Deployment(store, pools, FakeTeams(pools, TEAMS), tally)


def test_an_admin_sees_every_team_its_chips_now_and_its_month(deployment):
    """Positions as `team show` gives them, the month's tally against the budget (one read for
    every team), and config/teams' problems."""
    page = deployment.views().teams(ROOT)
    assert page.everyone and page.kept and page.month == "2026-03"
    teams = {team.name: team for team in page.teams}
    assert sorted(teams) == ["team-a", "team-b", "team-c"]
    (a,) = teams["team-a"].limits
    assert (a.limit, a.nominal, a.held, a.borrowed, a.lent, a.waiting) == (f"{ZONE}/v4", 8, 12, 4, 0, 0)
    assert (a.borrowing_limit, a.lending_limit) == (8, None)
    (b,) = teams["team-b"].limits
    assert (b.held, b.borrowed, b.lent, b.waiting) == (0, 0, 4, 4)
    assert teams["team-c"].limits == []
    month_a, month_b = teams["team-a"].month, teams["team-b"].month
    assert month_a is not None and month_b is not None
    assert (month_a.used, month_a.budget, month_a.share) == (900.0, 1000, 0.9)
    assert (month_b.used, month_b.budget, month_b.share) == (10.0, None, None)
    assert deployment.tally.reads == 1
    assert page.problems == ["team-c.limits.us-east5-a/v5p: config/quotas has no such limit; skipped"]


def test_anyone_else_sees_only_the_team_that_lists_them(deployment):
    """A member (any case) or an account sees their own team and no problems; one in no team sees
    no team, and their page reads no tally."""
    member = deployment.views().teams("Alice@Example.com")
    assert [team.name for team in member.teams] == ["team-a"] and not member.everyone and member.problems == []
    assert [team.name for team in deployment.views().teams(CI).teams] == ["team-b"]
    reads = deployment.tally.reads
    outsider = deployment.views().teams(EVE)
    assert outsider.teams == [] and outsider.kept
    assert deployment.tally.reads == reads


def test_a_deployment_without_teams_or_tally_says_so(deployment):
    """No Teams port: nothing kept; no tally: each team's month is None rather than a made-up 0."""
    assert not dataclasses.replace(deployment, teams=None).views().teams(ROOT).kept
    service = SimpleNamespace(warm=None, access=None, teams=deployment.teams, pools=deployment.pools)
    api = JobsApi(service, deployment.store, Settings(project="p", admins=(ROOT,)))  # type: ignore[arg-type]
    untallied = DashboardViews(api, lambda: NOW, InMemoryUsageJobs(deployment.store)).teams(ROOT)
    assert [team.month for team in untallied.teams] == [None, None, None]


def test_a_limits_plot_draws_the_nominal_and_what_is_held_to_one_scale():
    """Nominal 8, held 12 (4 borrowed): 12 chips span SHARE_WIDTH (45 units a chip); the nominal
    row is all its own, the held row its own 8 then 4 borrowed, the nominal marked at 360."""
    plot = charts.share_plot(nominal=8, held=12, borrowed=4, lent=0)
    nominal, held = plot.rows
    assert [(p.kind, p.x, p.width) for p in nominal.pieces] == [("own", 0.0, 360.0)]
    assert [(p.kind, p.x, p.width) for p in held.pieces] == [("own", 0.0, 360.0), ("borrowed", 360.0, 180.0)]
    assert (nominal.total, held.total, held.end, plot.nominal_x) == (8, 12, charts.SHARE_WIDTH, 360.0)


def test_a_lenders_plot_shows_what_it_lent_and_what_is_idle():
    """Nominal 8, holding 2, lending 4: own 2, lent 4, idle 2 on a scale of 8 chips."""
    plot = charts.share_plot(nominal=8, held=2, borrowed=0, lent=4, width=80)
    nominal, held = plot.rows
    assert [(p.kind, p.x, p.width) for p in nominal.pieces] == [("own", 0.0, 20.0), ("lent", 20.0, 40.0),
                                                                 ("idle", 60.0, 20.0)]  # fmt: skip
    assert [(p.kind, p.width) for p in held.pieces] == [("own", 20.0)]
    assert plot.nominal_x == 80.0
    empty = charts.share_plot(nominal=0, held=0, borrowed=0, lent=0)
    assert [row.pieces for row in empty.rows] == [(), ()]


def test_a_budget_plot_marks_the_budget_and_what_went_past_it():
    """Under: the budget spans the width, 80% marked; over (1,200 of 1,000): the bar spans it, the
    budget line at 5/6 of it and the 200 past it drawn apart; no budget: the bar alone."""
    under = charts.budget_plot(900.0, 1000.0, width=100)
    assert [(p.kind, p.width) for p in under.row.pieces] == [("spent", 90.0)]
    assert (under.budget_x, under.notice_x) == (100.0, 80.0)
    over = charts.budget_plot(1200.0, 1000.0, width=120)
    assert [(p.kind, p.x, p.width) for p in over.row.pieces] == [("spent", 0.0, 100.0), ("over", 100.0, 20.0)]
    assert over.budget_x == 100.0
    alone = charts.budget_plot(10.0, None, width=100)
    assert (alone.row.end, alone.budget_x, alone.notice_x) == (100.0, None, None)


def test_the_teams_page_has_plots_tables_and_a_strict_policy(deployment):
    """Linked in the nav; per limit a plot of nominal and held, per team its month against the
    budget line; every number in a table; no script; another team's name never on a member's page."""
    page = deployment.site(ROOT).handle("GET", "/teams", {}, {})
    assert page.status == 200 and "script-src" not in page.headers["Content-Security-Policy"]
    body = page.body
    assert '<a href="/teams" class="on">Teams</a>' in body and "<script" not in body
    assert 'class="share borrowed"' in body and 'class="share lent"' in body and 'class="mark notice"' in body
    assert f'aria-label="{ZONE}/v4: nominal 8 chips, held 12, borrowed 4, lent 0"' in body
    row = re.search(rf'<tr><th scope="row">{ZONE}/v4</th>((?:<td class="num">[^<]*</td>)+)', body)
    assert row is not None and re.findall(r">([^<]*)</td>", row[1]) == ["8", "12", "4", "0", "0", "8", "all"]
    assert "900.000" in body and "90.0%" in body and "config/quotas has no such limit" in body
    member = deployment.site(ALICE).handle("GET", "/teams", {}, {}).body
    assert "team-a" in member and "team-b" not in member and "You see your own team" in member
    outsider = deployment.site(EVE).handle("GET", "/teams", {}, {}).body
    assert "No team lists you" in outsider

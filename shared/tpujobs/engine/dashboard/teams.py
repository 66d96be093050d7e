"""The teams page: each team's chips under each of its limits now, and its month's chip-hours
against its budget.

The chips are `tpujobs team show`'s positions (`jobs_api.team_answers`), read as admission reads
them: `config/teams`, `config/quotas`, and each pool of a shared limit once (its holders and its
waiting jobs). The month is the budget tally (`engine.budgets.BudgetTally`), one round trip for
every team shown; it counts an attempt once it has ended, as the budget itself does.

Who sees what: an admin sees every team, and `config/teams`' problems. Anyone else sees only the
team that lists them (as a member, or as an account): `team show` is the admins', and the API's
`usage` keeps other teams' spend from non-admins, so this page does too; a team's own standing is
no secret from its members, whom its budget notices already tell. This is narrower than the usage
page, which shows every owner's chip-hours to anyone because `list` shows every job's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tpujobs.domain.teams import limit_key
from tpujobs.domain.usage import Month
from tpujobs.engine.dashboard import charts
from tpujobs.engine.jobs_api.team_answers import book_document

if TYPE_CHECKING:
    from tpujobs.engine.budgets import BudgetTally, MonthTally
    from tpujobs.engine.ports import Pools, Teams


@dataclass(frozen=True)
class LimitView:
    """One team's share of one limit, and its chips under it now."""

    limit: str  # LOCATION/FAMILY[/TIER], as `tpujobs team set --chips` names it
    nominal: int
    held: int
    borrowed: int
    lent: int
    waiting: int
    borrowing_limit: int | None
    lending_limit: int | None
    plot: charts.SharePlot


@dataclass(frozen=True)
class MonthView:
    """A team's chip-hours of the month, as its budget counts them."""

    used: float
    budget: float | None
    lifted_by: str  # the admin who let the team past its budget this month; "": not lifted
    plot: charts.BudgetPlot

    @property
    def share(self) -> float | None:
        """Used over budget (1.0 at the budget); None without a budget."""
        return self.used / self.budget if self.budget else None


@dataclass(frozen=True)
class TeamView:
    name: str
    members: list[str]
    accounts: list[str]
    limits: list[LimitView]
    month: MonthView | None  # None: this dashboard reads no budget tally


@dataclass(frozen=True)
class TeamsPage:
    teams: list[TeamView]
    month: str  # YYYY-MM, UTC
    everyone: bool  # the caller is an admin: every team is shown
    kept: bool  # the deployment keeps teams at all
    problems: list[str]  # config/teams' problems, for admins only


def teams_page(
    teams: Teams | None,
    pools: Pools | None,
    tally: BudgetTally | None,
    caller: str,
    admins: Sequence[str],
    now: datetime,
) -> TeamsPage:
    """Every team for an admin, the caller's own for anyone else; a caller in no team reads
    nothing past `config/teams`."""
    month, everyone = str(Month.of(now)), caller in admins
    if teams is None:
        return TeamsPage([], month, everyone, kept=False, problems=[])
    book = teams.teams()
    own = book.team_of(caller)
    if not everyone and not own:
        return TeamsPage([], month, everyone, kept=True, problems=[])
    document = book_document(book, pools)
    shown = [team for team in document["teams"] if everyone or team["name"] == own]
    tallies = tally.read([team["name"] for team in shown], month) if tally is not None and shown else {}
    views = [_team(team, tallies[team["name"]] if tally is not None else None) for team in shown]
    return TeamsPage(views, month, everyone, kept=True, problems=list(document["problems"]) if everyone else [])


def _team(team: Mapping[str, Any], tally: MonthTally | None) -> TeamView:
    budget = team.get("budget_chip_hours")
    month = None
    if tally is not None:
        month = MonthView(tally.chip_hours, budget, tally.lifted_by, charts.budget_plot(tally.chip_hours, budget))
    return TeamView(
        name=team["name"],
        members=list(team["members"]),
        accounts=list(team["accounts"]),
        limits=[_limit(limit) for limit in team["limits"]],
        month=month,
    )


def _limit(limit: Mapping[str, Any]) -> LimitView:
    nominal, held, borrowed, lent = limit["nominal"], limit["held"], limit["borrowed"], limit["lent"]
    return LimitView(
        limit=limit_key(limit["location"], limit["family"], limit["tier"]),
        nominal=nominal,
        held=held,
        borrowed=borrowed,
        lent=lent,
        waiting=limit["waiting"],
        borrowing_limit=limit["borrowing_limit"],
        lending_limit=limit["lending_limit"],
        plot=charts.share_plot(nominal, held, borrowed, lent),
    )

"""`tpujobs team`: teams and their shares of the chip quotas (`config/teams`, docs/teams.md).

A team has members (people) and accounts (service accounts that submit jobs), and per quota
limit of `config/quotas` a nominal share, a borrowing limit, a lending limit and a weight. Admins
only: with TPUJOBS_API_URL set every verb asks the `jobs` API (which answers admins alone);
without it, `config/teams` is read and written in Firestore directly (IAM decides who may), by
compare-and-set, as `tpujobs quota` writes `config/quotas`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpujobs.cli.common import Format, Output, Stop, api_url, ask_api, caller, err, out, print_document, settings
from tpujobs.cli.tables import Col, Sheet
from tpujobs.cli.tables import show as show_sheet
from tpujobs.cli.terminal import shown

if TYPE_CHECKING:
    from tpujobs.engine.ports import Pools, Teams

team_app = typer.Typer(
    help="Teams: members, accounts and each team's share of the chip quotas (config/teams).",
    no_args_is_help=True,
)

Name = Annotated[str, typer.Argument(help="The team: lowercase letters, digits and dashes, starting with a letter.")]
Who = Annotated[str | None, typer.Option(help="Who asks, locally, when TPUJOBS_API_URL is set.")]


def _stores() -> tuple[Teams, Pools]:
    from google.cloud import firestore

    from tpujobs.adapters.firestore_pools import FirestorePools
    from tpujobs.adapters.firestore_teams import FirestoreTeams

    client = firestore.Client(project=settings().project)
    return FirestoreTeams(client), FirestorePools(client)


def _ask(request: dict[str, Any], owner: str | None) -> dict[str, Any] | None:
    """The API's answer when TPUJOBS_API_URL is set; None: go to Firestore directly."""
    config, url = settings(), api_url()
    return (ask_api(config, url, request, caller(owner)) or {}) if url else None


def parse_chips(given: list[str]) -> dict[str, int]:
    """`LOCATION/FAMILY[/TIER]=N` options as {limit: chips}; BadParameter naming the one that is not."""
    chips: dict[str, int] = {}
    for option in given:
        limit, equals, number = option.partition("=")
        if not equals or not number.strip().isdigit():
            raise typer.BadParameter(f"{option!r}: give LOCATION/FAMILY[/TIER]=CHIPS, e.g. us-central2-b/v4=8")
        chips[limit.strip()] = int(number)
    return chips


def _warn(problems: list[str]) -> None:
    for problem in problems:
        err.print(f"[yellow]Warning:[/yellow] {shown(problem)}")


@team_app.command("set")
def set_team(
    name: Name,
    member: Annotated[list[str], typer.Option("--member", help="A person's e-mail (repeat); replaces the list.")] = [],  # noqa: B006
    account: Annotated[
        list[str], typer.Option("--account", help="A service account that submits jobs (repeat); replaces the list.")
    ] = [],  # noqa: B006
    chips: Annotated[
        list[str],
        typer.Option("--chips", help="LOCATION/FAMILY\\[/TIER]=N: the team's nominal chips under that limit (repeat)."),
    ] = [],  # noqa: B006
    borrowing_limit: Annotated[
        int | None, typer.Option(min=0, help="Chips past its nominal it may hold on others' idle chips.")
    ] = None,
    lending_limit: Annotated[int | None, typer.Option(min=0, help="Chips of its idle nominal others may hold.")] = None,
    weight: Annotated[float | None, typer.Option(min=0.0, help="Its weight among borrowers (above 0).")] = None,
    budget_chip_hours: Annotated[float | None, typer.Option(min=0.0, help="Chip-hours a calendar month.")] = None,
    owner: Who = None,
) -> None:
    """Create or change a team, e.g. `tpujobs team set team-a --member ada@example.com --chips us-central2-b/v4=8`.

    Only what is given changes; --borrowing-limit, --lending-limit and --weight apply to the
    limits named by --chips, or to all of the team's limits when none is named."""
    fields: dict[str, Any] = {
        "members": member or None,
        "accounts": account or None,
        "chips": parse_chips(chips) or None,
        "borrowing_limit": borrowing_limit,
        "lending_limit": lending_limit,
        "weight": weight,
        "budget_chip_hours": budget_chip_hours,
    }
    fields = {k: v for k, v in fields.items() if v is not None}
    answer = _ask({"action": "team-set", "team": name, **fields}, owner)
    if answer is not None:
        problems = list(answer.get("problems") or [])
    else:
        from tpujobs.engine.jobs_api.team_actions import set_team as set_directly

        try:
            problems = set_directly(_stores()[0], name, **fields)
        except ValueError as error:
            raise Stop(f"Refused: {error}") from None
    _warn(problems)
    out.print(f"Team {shown(name)} set.")


@team_app.command("unset")
def unset_team(name: Name, owner: Who = None) -> None:
    """Remove a team: its people and accounts are then in none, and its shares free."""
    answer = _ask({"action": "team-unset", "team": name}, owner)
    if answer is not None:
        removed = bool(answer.get("removed"))
    else:
        from tpujobs.engine.jobs_api.team_actions import unset_team as unset_directly

        try:
            removed = unset_directly(_stores()[0], name)
        except ValueError as error:
            raise Stop(f"Refused: {error}") from None
    out.print(f"Team {shown(name)} removed." if removed else f"No team {shown(name)}: nothing to remove.")


@team_app.command("show")
def show(output: Output = Format.table, owner: Who = None) -> None:
    """Every team: members, accounts, budget, and under each limit its share and its chips now."""
    answer = _ask({"action": "team-show"}, owner)
    if answer is None:
        from tpujobs.engine.jobs_api.team_answers import team_document

        answer = team_document(*_stores())
    if output is not Format.table:
        print_document(answer, output)
        return
    _warn(list(answer.get("problems") or []))
    teams = answer.get("teams") or []
    if not teams:
        out.print("No teams: every job draws on chips no team holds.")
        return
    show_sheet(out, teams_sheet(teams))
    limits = limits_sheet(teams)
    if limits.rows:
        out.print()
        show_sheet(out, limits)


def teams_sheet(teams: list[dict[str, Any]]) -> Sheet:
    """One row per team: who is in it, and its budget."""
    sheet = Sheet([Col("TEAM"), Col("MEMBERS", fit="wrap"), Col("ACCOUNTS", keep=1, fit="wrap"), Col("BUDGET CHIP-H")])
    for team in teams:
        budget = team.get("budget_chip_hours")
        sheet.add(
            team.get("name"),
            ", ".join(team.get("members") or []) or None,
            ", ".join(team.get("accounts") or []) or None,
            "none" if budget is None else f"{budget:g}",
        )
    return sheet


def limits_sheet(teams: list[dict[str, Any]]) -> Sheet:
    """One row per team and limit: its share (nominal, how far it may borrow and lend, its weight)
    and its chips now (held, borrowed past its nominal, lent of its nominal, asked for by its waiting jobs)."""
    sheet = Sheet(
        [
            Col("TEAM"),
            Col("LIMIT"),
            Col("NOMINAL", justify="right"),
            Col("MAY BORROW", keep=2, justify="right"),
            Col("MAY LEND", keep=2, justify="right"),
            Col("WEIGHT", keep=1, justify="right"),
            Col("HELD", justify="right"),
            Col("BORROWED", justify="right"),
            Col("LENT", justify="right"),
            Col("WAITING", justify="right"),
        ]
    )
    for team in teams:
        for limit in team.get("limits") or []:
            tier = limit.get("tier")
            where = f"{limit.get('location')}/{limit.get('family')}" + ("" if tier == "on-demand" else f"/{tier}")
            borrow, lend = limit.get("borrowing_limit"), limit.get("lending_limit")
            sheet.add(
                team.get("name"),
                where,
                limit.get("nominal"),
                "no limit" if borrow is None else borrow,
                "all" if lend is None else lend,
                f"{limit.get('weight'):g}",
                limit.get("held"),
                limit.get("borrowed"),
                limit.get("lent"),
                limit.get("waiting"),
            )
    return sheet

"""`tpujobs usage`: a month's chip-hours, goodput and estimated cost per team, owner or label.

Through the jobs API when TPUJOBS_API_URL is set (an admin sees every job, anyone else their own),
else Firestore with the caller's credentials. Costs are estimates from `config/prices` over the
shipped list prices (`tpujobs.domain.prices`), never a bill. `tpujobs usage lift TEAM` lets a team
past its chip-hour budget for a month (admins: it writes Firestore, IAM decides). docs/usage.md.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any

import typer

from tpujobs.cli.common import Format, Output, api_url, ask_api, caller, err, out, print_document, settings, shown
from tpujobs.cli.tables import Col, Sheet
from tpujobs.cli.tables import show as show_sheet
from tpujobs.domain.usage import Month, check_by

usage_app = typer.Typer(help="Chip-hours, goodput and estimated cost per team, owner or label, by month.")

By = Annotated[str, typer.Option("--by", help="team, owner or label:KEY (the value of label KEY).")]
MonthOption = Annotated[str | None, typer.Option("--month", help="YYYY-MM (UTC); default: this month.")]


def _checked(by: str, month: str | None) -> None:
    try:
        check_by(by)
        if month:
            Month.parse(month)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def _report(by: str, month: str | None, owner: str | None) -> dict[str, Any]:
    config = settings()
    url = api_url()
    request: dict[str, Any] = {"action": "usage", "by": by, **({"month": month} if month else {})}
    if url:
        return ask_api(config, url, request, caller(owner)) or {}
    from google.cloud import firestore

    from tpujobs.adapters.firestore_prices import FirestorePrices
    from tpujobs.adapters.firestore_usage import FirestoreUsageJobs
    from tpujobs.engine.usage_report import MonthlyUsage

    client = firestore.Client(project=config.project)
    now = lambda: datetime.now(timezone.utc)  # noqa: E731 - the clock the report sums up to
    return MonthlyUsage(FirestoreUsageJobs(client), FirestorePrices(client), now).report(by, month)


@usage_app.callback(invoke_without_command=True)
def usage(
    ctx: typer.Context,
    by: By = "team",
    month: MonthOption = None,
    output: Output = Format.table,
    owner: Annotated[str | None, typer.Option(help="Who asks, locally, when TPUJOBS_API_URL is set.")] = None,
) -> None:
    """The month's chip-hours, goodput and estimated cost per group, e.g. `tpujobs usage --by label:project`."""
    if ctx.invoked_subcommand is not None:
        return
    _checked(by, month)
    answer = _report(by, month, owner)
    if output is not Format.table:
        print_document(answer, output)
        return
    for problem in (answer.get("prices") or {}).get("problems") or []:
        err.print(f"[yellow]Warning:[/yellow] config/prices: {shown(problem)}")
    groups = answer.get("groups") or []
    if not groups:
        out.print(f"No chip time in {shown(answer.get('month', month or ''))}.")
        return
    show_sheet(out, usage_sheet(answer))


def usage_sheet(answer: dict[str, Any]) -> Sheet:
    """One row per group: its chip-hours, goodput, estimated cost, and chip-hours with no price."""
    by = str(answer.get("by", "team")).upper()
    sheet = Sheet(
        [
            Col(by, fit="cut"),
            Col("CHIP-HOURS", justify="right"),
            Col("GOODPUT", justify="right"),
            Col("EST. COST (USD)", justify="right"),
            Col("UNPRICED CHIP-H", keep=1, justify="right"),
            Col("JOBS", keep=2, justify="right"),
        ],
        title=f"{answer.get('month')}, {answer.get('scope', 'all')} (costs are estimates from list prices)",
    )
    for group in answer.get("groups") or []:
        goodput = group.get("goodput")
        sheet.add(
            group.get("group"),
            f"{group.get('chip_hours', 0):,.1f}",
            "-" if goodput is None else f"{goodput:.1%}",
            f"{group.get('estimated_cost_usd', 0):,.2f}",
            f"{group.get('unpriced_chip_hours', 0):,.1f}",
            group.get("jobs", 0),
        )
    return sheet


@usage_app.command("lift")
def lift(
    team: Annotated[str, typer.Argument(help="The team to let past its chip-hour budget.")],
    month: MonthOption = None,
    undo: Annotated[bool, typer.Option("--undo", help="Hold the team to its budget again.")] = False,
    owner: Annotated[str | None, typer.Option(help="Who lifts it, as the record names them.")] = None,
) -> None:
    """Let a team past its budget for one month (admins): its new jobs no longer wait for it."""
    _checked("team", month)
    from google.cloud import firestore

    from tpujobs.adapters.firestore_budgets import FirestoreBudgetTally

    config = settings()
    wanted = month or str(Month.of(datetime.now(timezone.utc)))
    FirestoreBudgetTally(firestore.Client(project=config.project)).lift(team, wanted, "" if undo else caller(owner))
    verb = "held to its budget again" if undo else "lifted past its budget"
    out.print(f"Team {shown(team)} {verb} for {wanted}.")

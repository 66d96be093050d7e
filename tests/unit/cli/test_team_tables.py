"""What the CLI prints of teams: `list`'s TEAM column and `describe`'s team row, where a job has
one, and `team show`'s two tables from the API's document."""

from __future__ import annotations

import dataclasses
import io
from datetime import datetime, timezone

import pytest
import typer
from rich.console import Console

from tpujobs.cli import tables
from tpujobs.cli.teams import limits_sheet, parse_chips, teams_sheet
from tpujobs.domain.job import new_job
from tpujobs.domain.spec import parse_spec

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)


def a_job(job_id: str, team: str = ""):
    spec = parse_spec({"job_id": job_id, "name": job_id, "owner": "ada@example.com", "accelerator_type": "v4-8",
                       "command": "x"})  # fmt: skip
    return dataclasses.replace(new_job(spec, "us-central2-b", T0)[0], team=team)


def rendered(renderable) -> str:
    console = Console(file=io.StringIO(), width=250, color_system=None)
    tables.show(console, renderable)
    return console.file.getvalue()


def test_list_has_a_team_column_only_where_a_job_has_a_team():
    """No team anywhere: no column; one job in team-a: the column, '-' for the other."""
    assert "TEAM" not in rendered(tables.jobs_sheet([a_job("j-1")], T0))
    text = rendered(tables.jobs_sheet([a_job("j-1"), a_job("j-2", "team-a")], T0))
    assert "TEAM" in text and "team-a" in text


def test_describe_names_the_team():
    """A row `team`, '-' for none."""
    assert "team-a" in rendered(tables.describe_tables(a_job("j-1", "team-a"), []))
    lines = rendered(tables.describe_tables(a_job("j-2"), [])).splitlines()
    assert [line.split() for line in lines if line.split()[:1] == ["team"]] == [["team", "-"]]


def test_team_show_tables_say_each_share_and_position():
    """Absent limits read 'no limit' and 'all'; no budget reads 'none'."""
    teams = [
        {"name": "team-a", "members": ["alice@example.com"], "accounts": [], "budget_chip_hours": None,
         "limits": [{"location": "us-east5", "family": "v5p", "tier": "spot", "nominal": 8, "borrowing_limit": None,
                     "lending_limit": None, "weight": 1.0, "held": 12, "borrowed": 4, "lent": 0, "waiting": 8}]},
    ]  # fmt: skip
    assert "alice@example.com" in rendered(teams_sheet(teams)) and "none" in rendered(teams_sheet(teams))
    (row,) = limits_sheet(teams).rows
    assert row == ["team-a", "us-east5/v5p/spot", "8", "no limit", "all", "1", "12", "4", "0", "8"]


def test_chips_options_are_limit_equals_chips():
    """`LIMIT=N` pairs; anything else is a bad parameter before anything is sent."""
    assert parse_chips(["us-central2-b/v4=8", "us-east5/v5p/spot=0"]) == {"us-central2-b/v4": 8, "us-east5/v5p/spot": 0}
    for bad in ("us-central2-b/v4", "us-central2-b/v4=-1", "us-central2-b/v4=x"):
        with pytest.raises(typer.BadParameter):
            parse_chips([bad])

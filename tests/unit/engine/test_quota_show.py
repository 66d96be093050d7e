"""`tpujobs quota show` without I/O: the API's answer (`quota_document`) built from the pools in
memory, one row per limit as Google counts it, and the table the CLI prints from it; and the
edits' refusals, which come before anything is written."""

from __future__ import annotations

import io
import re
from datetime import datetime, timezone

import pytest
from rich.console import Console
from typer.testing import CliRunner

from tpujobs.cli import app, tables
from tpujobs.domain.admission import Holder
from tpujobs.domain.job import new_job
from tpujobs.domain.quotas import QuotaBook
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.api import quota_document
from tpujobs.local.fakes.job_store import InMemoryJobStore
from tpujobs.local.fakes.pools import InMemoryPools

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
SPOT = "v5p@us-east5:spot"
TEAM_A = "v5p@us-east5:reserved:team-a"
COLUMNS = ["LOCATION", "SCOPE", "FAMILY", "TIER", "QUOTA", "HELD", "HOLDERS", "WAITING"]


def queued(jobs: InMemoryJobStore, name: str, zone: str, capacity: str = "spot", **fields: object) -> None:
    """A QUEUED v5p-8 job (4 chips) of `capacity` in `zone`, stored as submission stores it."""
    spec = parse_spec(
        {"job_id": name, "name": name, "owner": "ada@example.com", "accelerator_type": "v5p-8", "command": "x",
         "zone": zone, "capacity": capacity, **fields}
    )  # fmt: skip
    assert jobs.create(*new_job(spec, "us-central2-b", T0))


class HandEdited(InMemoryPools):
    """The pools, with `config/quotas` as an admin may type it in the console: entries no edit
    through `set_quota` could write."""

    def __init__(self, jobs: InMemoryJobStore, typed: dict) -> None:
        super().__init__(jobs)
        self.typed = typed

    def quotas(self) -> QuotaBook:
        book = super().quotas()
        book.problems.extend(QuotaBook(self.typed).problems)  # all it typed is skipped
        return book


def hold(pools: InMemoryPools, pool: str, job_id: str, chips: int, zone: str) -> None:
    assert pools.change(pools.view(pool), add=Holder(job_id, chips, 1, "medium", T0, zone=zone))


@pytest.fixture
def pools() -> HandEdited:
    """v5p in us-east5: on-demand 64 in zone a; spot 512 in the region and 256 in zone a, 96
    held (32 in a, 64 in b) and a job waiting in b; reservation team-a (128), 16 held; team-b
    (64) unused; spot v4 in us-central2 and reservation team-c held without a limit; one pool document of the old
    per-zone format; and two entries the book skips."""
    jobs = InMemoryJobStore()
    store = HandEdited(jobs, {"us-central2-b": {"v9": 8, "v4": {"preemptible": 4}}})
    store.set_quota("us-east5-a", "v5p", "on-demand", 64)
    store.set_quota("us-east5-a", "v5p", "spot", 256)
    store.set_quota("us-east5", "v5p", "spot", 512)
    store.set_reservation("team-a", 128)
    store.set_reservation("team-b", 64)
    hold(store, SPOT, "spot-a", 32, "us-east5-a")
    hold(store, SPOT, "spot-b", 64, "us-east5-b")
    queued(jobs, "wait-b", "us-east5-b")
    hold(store, TEAM_A, "reserved-1", 16, "us-east5-a")
    queued(jobs, "wait-r", "us-east5-a", capacity="reserved", reservation="team-a")
    hold(store, "v4@us-central2:spot", "free-1", 8, "us-central2-b")
    hold(store, "v5p@us-east5:reserved:team-c", "reserved-2", 4, "us-east5-b")
    hold(store, "v4@us-central2-b", "old-1", 8, "")
    return store


def rows_by_limit(answer: dict) -> dict[tuple[str, str, str], dict]:
    return {(row["pool"], row["scope"], row["location"]): row for row in answer["pools"]}


def test_each_limit_is_a_row_with_the_chips_held_and_the_jobs_waiting_under_it(pools: InMemoryPools) -> None:
    """A zone's quota counts only that zone's holders and waiting jobs, the region's all of them."""
    rows = rows_by_limit(quota_document(pools))
    region = rows[(SPOT, "region", "us-east5")]
    assert region == {
        "pool": SPOT, "location": "us-east5", "scope": "region", "family": "v5p", "tier": "spot",
        "reservation": "", "quota": 512, "held": 96, "holders": 2, "waiting": 1,
    }  # fmt: skip
    zone_a = rows[(SPOT, "zone", "us-east5-a")]
    assert (zone_a["quota"], zone_a["held"], zone_a["holders"], zone_a["waiting"]) == (256, 32, 1, 0)
    on_demand = rows[("v5p@us-east5", "zone", "us-east5-a")]
    assert (on_demand["tier"], on_demand["quota"], on_demand["held"]) == ("on-demand", 64, 0)


def test_reservations_unlimited_pools_and_the_order_of_rows(pools: InMemoryPools) -> None:
    """A reservation's row is its pool's, or an empty one when no job used it yet; a pool with
    holders and no limit shows quota None; a pool's widest limit comes first."""
    answer = quota_document(pools)
    rows = rows_by_limit(answer)
    team_a = rows[(TEAM_A, "reservation", "us-east5")]
    assert (team_a["reservation"], team_a["tier"], team_a["quota"], team_a["held"], team_a["waiting"]) == (
        "team-a", "reserved", 128, 16, 1,
    )  # fmt: skip
    team_b = rows[("", "reservation", "")]
    assert (team_b["reservation"], team_b["family"], team_b["quota"], team_b["held"]) == ("team-b", "", 64, 0)
    free = rows[("v4@us-central2:spot", "region", "us-central2")]
    assert (free["quota"], free["held"], free["holders"]) == (None, 8, 1)
    team_c = rows[("v5p@us-east5:reserved:team-c", "reservation", "us-east5")]
    assert (team_c["reservation"], team_c["quota"], team_c["held"]) == ("team-c", None, 4)
    order = [(row["pool"], row["scope"]) for row in answer["pools"]]
    assert order.index((SPOT, "region")) + 1 == order.index((SPOT, "zone"))
    assert len(answer["pools"]) == 7  # the old per-zone document is no row


def test_what_the_book_skipped_and_old_pool_documents_are_problems(pools: InMemoryPools) -> None:
    """An entry that makes no sense, and a pool document from before pools were regional while it
    still holds chips, are said."""
    problems = quota_document(pools)["problems"]
    assert any("v9" in p and "no such TPU family" in p for p in problems)
    assert any("preemptible" in p and "no such tier" in p for p in problems)
    assert any("quota_pools/v4@us-central2-b" in p and "8 chips" in p and "reconciler" in p for p in problems)
    old = pools.view("v4@us-central2-b")
    assert pools.change(old, remove=frozenset({"old-1"}))  # as the reconciler empties it
    assert not any("v4@us-central2-b" in p for p in quota_document(pools)["problems"])


def test_no_pools_port_answers_no_rows() -> None:
    """A deployment built without admission has no limits and no problems."""
    assert quota_document(None) == {"pools": [], "problems": []}


def piped(sheet: tables.Sheet) -> str:
    console = Console(file=io.StringIO(), width=80)  # a pipe: not a terminal
    tables.show(console, sheet)
    return console.file.getvalue()


def terminal(width: int, sheet: tables.Sheet) -> str:
    console = Console(file=io.StringIO(), force_terminal=True, color_system=None, width=width)
    tables.show(console, sheet)
    return console.file.getvalue()


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"[│┃]", line)[1:-1]]


def test_the_table_shows_location_scope_family_and_tier_of_each_limit(pools: InMemoryPools) -> None:
    """Piped: every column; a reservation's tier names it, an unused one has no location."""
    text = piped(tables.quotas_sheet(quota_document(pools)["pools"]))
    lines = text.splitlines()
    assert cells(next(line for line in lines if "LOCATION" in line)) == COLUMNS
    rows = [cells(line) for line in lines if line.startswith("│")]
    assert ["us-east5", "region", "v5p", "spot", "512", "96", "2", "1"] in rows
    assert ["us-east5-a", "zone", "v5p", "spot", "256", "32", "1", "0"] in rows
    assert ["us-east5", "reservation", "v5p", "reserved: team-a", "128", "16", "1", "1"] in rows
    assert ["-", "reservation", "-", "reserved: team-b", "64", "0", "0", "0"] in rows
    assert ["us-central2", "region", "v4", "spot", "none", "8", "1", "0"] in rows


@pytest.mark.parametrize(("width", "dropped"), [(80, {"SCOPE"}), (60, {"SCOPE", "HOLDERS"})])
def test_a_narrow_table_drops_scope_then_holders_and_keeps_the_numbers(pools, width, dropped) -> None:
    """SCOPE goes first (a location's shape and the tier say it), then HOLDERS; the quota, held
    and waiting numbers stay, and at 80 columns a reservation's name is whole on its line."""
    text = terminal(width, tables.quotas_sheet(quota_document(pools)["pools"]))
    assert all(len(line) <= width for line in text.splitlines())
    header = cells(next(line for line in text.splitlines() if "LOCATION" in line))
    assert set(header) == set(COLUMNS) - dropped
    if width == 80:
        assert "reserved: team-a" in text


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (("set", "us-east5", "v5p", "8", "--tier", "reserved"), "reservations are zonal"),
        (("set", "east", "v5p", "8"), "neither a zone"),
        (("set", "us-east5-a", "v9", "8"), "no TPU family"),
        (("unset", "us-east5-a", "v5p", "--tier", "preemptible"), "preemptible"),
        (("set-reservation", "bad name!", "8"), "not a reservation name"),
    ],
)
def test_edits_that_config_quotas_cannot_hold_are_refused_naming_what_is_wrong(args, complaint) -> None:
    """Refused before any client is built: no project, no Firestore is needed to say why."""
    result = CliRunner().invoke(app, ["quota", *args], env={"COLUMNS": "200", "GOOGLE_CLOUD_PROJECT": ""})
    assert result.exit_code == 2, result.output
    assert complaint in result.output

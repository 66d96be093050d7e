"""What `tpujobs pool` prints (from the API's pool documents), the POOL of `tpujobs list` and
`describe`, and `pool create`'s checks before anything is sent. No I/O: pools are built with
the domain's own changes, at chosen times, and shown as the API would show them."""

from __future__ import annotations

import io
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from support.job_timelines import a_job, at, move
from tpujobs.cli import app, tables
from tpujobs.domain import pools
from tpujobs.domain.job import Job
from tpujobs.domain.states import EventKind
from tpujobs.engine.api import to_json
from tpujobs.engine.warm_pools.summary import pool_summary

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)


def a_pool() -> pools.Pool:
    """Two units of v4-8 (4 chips): both ready at T0; unit 0 idle an hour, then busy with ada-1.
    At T0 + 2 h: busy 4 chip-hours, idle 4 + 8 = 12, so a utilisation of 25%."""
    request, _ = pools.parse_pool_request(
        {"name": "demo", "owner": "ada@example.com", "accelerator_type": "v4-8", "count": 2, "users": ["bob@x.org"]},
        "us-central2-b",
    )
    pool = pools.new_pool(request, T0)
    for index in (0, 1):
        pool = pools.active(pools.requested(pool, index, T0), index, T0)
    return pools.assigned(pool, 0, "ada-1", 1, T0 + HOUR)


def waiting_job() -> Job:
    return a_job().evolve(job_id="bob-1")


def summary(show_jobs: bool = True) -> dict:
    return to_json(pool_summary(a_pool(), T0 + 2 * HOUR, [waiting_job()], show_jobs=show_jobs))


def piped(renderable) -> str:
    console = Console(file=io.StringIO(), width=80)  # a pipe: not a terminal
    tables.show(console, renderable)
    return console.file.getvalue()


def terminal(width: int, renderable) -> str:
    console = Console(file=io.StringIO(), force_terminal=True, color_system=None, width=width)
    tables.show(console, renderable)
    return console.file.getvalue()


def row_of(text: str, first_cell: str) -> list[str]:
    """The cells of the first table row (or header) whose first cell is `first_cell`."""
    rows = ([cell.strip() for cell in re.split(r"[│┃]", line)[1:-1]] for line in text.splitlines())
    return next(row for row in rows if row and row[0] == first_cell)


def test_pool_list_shows_shape_units_by_state_waiting_and_the_days_utilisation() -> None:
    """One row a pool: count x slices x accelerator, units counted by state, 25.0% busy."""
    text = piped(tables.pools_sheet([summary()]))
    header = row_of(text, "NAME")
    row = dict(zip(header, row_of(text, "demo"), strict=True))
    assert row["SHAPE"] == "2 x 1 x v4-8"
    assert row["UNITS"] == "1 idle, 1 busy"
    assert row["WAITING"] == "1" and row["UTIL(24h)"] == "25.0%"
    assert row["OWNER"] == "ada@example.com" and row["STATE"] == "ACTIVE"


def test_pool_list_counts_waiting_jobs_it_may_not_name() -> None:
    """A caller the pool is not for gets a count of waiting jobs, and the same count shows."""
    hidden = summary(show_jobs=False)
    assert hidden["waiting"] == 1
    assert row_of(piped(tables.pools_sheet([hidden])), "demo")[4] == "1"


def test_pool_list_fits_80_columns_keeping_name_shape_and_units() -> None:
    text = terminal(80, tables.pools_sheet([summary(), {**summary(), "name": "another-pool-with-a-long-name"}]))
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "another-pool-with-a-long-name" in text and "2 x 1 x v4-8" in text and "1 idle, 1 busy" in text


def test_pool_describe_shows_units_the_queue_and_chip_hours() -> None:
    """Each unit's queued resource and job; the waiting job by name; busy and idle chip-hours."""
    text = piped(tables.pool_tables(summary(), T0 + 2 * HOUR))
    unit0 = row_of(text, "0")
    assert unit0[:3] == ["0", "BUSY", "demo-u0-g1"] and "ada-1 (attempt 1)" in unit0
    assert unit0[-1] == "1h"  # busy for an hour
    assert row_of(text, "1")[1:3] == ["IDLE", "demo-u1-g1"]
    assert "Waiting, in the pool's order: bob-1" in text
    assert "4.00 busy (charged to its jobs), 12.00 idle (the pool's own)" in text
    assert "utilisation 25.0%" in text
    assert "bob@x.org" in text and "kept while the pool lives" in text


def test_pool_describe_hides_the_jobs_from_others() -> None:
    text = piped(tables.pool_tables(summary(show_jobs=False), T0 + 2 * HOUR))
    assert "ada-1" not in text and "bob-1" not in text
    assert "(hidden)" in text and "1 job(s) wait" in text


def test_a_unit_being_removed_says_so() -> None:
    pool = pools.resized(a_pool(), 1, T0 + 2 * HOUR)
    text = piped(tables.pool_tables(to_json(pool_summary(pool, T0 + 2 * HOUR, [])), T0 + 2 * HOUR))
    assert row_of(text, "1")[1] == "IDLE (removing)" and "No job waits." in text


# --- the pool of a job in `tpujobs list` and `describe` ----------------------------------------


def on_pool(job: Job, pool: str = "demo") -> Job:
    """The job, asking for `pool`, admitted onto its unit 0 (as the warm pool service records it)."""
    job = job.evolve(spec=job.spec.model_copy(update={"pool": pool}), warm_pool=pool)
    return move(job, 1, EventKind.ADMITTED, capacity_state="ACTIVE", unit=f"{pool}-u0-g1", zone="us-central2-b")


def test_list_has_a_pool_column_only_when_a_job_ran_on_one() -> None:
    """No pool anywhere: no POOL column. A job on a pool shows it; so does one that has left it
    since (its last attempt's usage says where it ran); a job of its own capacity shows none."""
    plain = piped(tables.jobs_sheet([a_job()], at(30)))
    assert "POOL" not in plain
    running = on_pool(a_job()).evolve(job_id="on-pool")
    left = on_pool(a_job()).evolve(job_id="left-pool", warm_pool="")
    own = a_job().evolve(job_id="own-capacity")
    text = piped(tables.jobs_sheet([running, left, own], at(30)))
    header = row_of(text, "JOB")
    assert "POOL" in header
    column = header.index("POOL")
    assert row_of(text, "on-pool")[column] == "demo"
    assert row_of(text, "left-pool")[column] == "demo"
    assert row_of(text, "own-capacity")[column] == "-"


def test_describe_shows_the_pool_of_each_attempt_beside_its_zone() -> None:
    job = on_pool(a_job())
    text = piped(tables.describe_tables(job, [], {}, at(30)))
    attempts = row_of(text, "#")
    assert attempts[1:3] == ["ZONE", "POOL"]
    assert row_of(text, "1")[1:3] == ["us-central2-b", "demo"]
    assert "pool             demo (pool_fallback: wait)" in text
    assert "queued resource  demo-u0-g1 [ACTIVE]" in text  # the unit, not a resource of its own
    assert "pool" not in piped(tables.describe_tables(a_job(), [], {}, at(30))).split("Attempts")[-1].lower()


# --- pool create's checks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--accelerator", "v4-9"], "accelerator_type"),
        (["--accelerator", "v4-8", "--count", "0"], "count must be a whole number from 1 to 64"),
        (["--accelerator", "v4-8", "--zone", "a", "--zones", "b,c"], "give --zone or --zones, not both"),
        (["--accelerator", "v4-8", "--idle-minutes", "0"], "idle_minutes"),
    ],
)
def test_create_says_what_is_wrong_before_sending_anything(tmp_path: Path, args: list[str], words: str) -> None:
    """Exit 2 with the field named, and nothing asked of any API, topic or store."""
    env = {
        "GOOGLE_CLOUD_PROJECT": "some-project",
        "TPUJOBS_STATE_DIR": str(tmp_path),
        "TPUJOBS_API_URL": "http://127.0.0.1:9/never-asked",
        "FIRESTORE_EMULATOR_HOST": None,
        "PUBSUB_EMULATOR_HOST": None,
    }
    result = CliRunner().invoke(app, ["pool", "create", "demo", *args], env=env)
    assert result.exit_code == 2, result.output
    assert words in result.output
    assert "Could not reach" not in result.output

"""What the CLI prints for people and for scripts: jobs, a job's story, dead letters, rejections, pools.

Every table is a `Sheet`: columns in order of importance and plain-text cells. In a terminal
it becomes a Rich table fitted to the width: each column is as wide as its content, the least
important are dropped (never printed empty) and the shortenable ones end in an ellipsis, so an
80-column terminal still shows ATTEMPT, AGE, CHIP-H and GOODPUT. Piped, it is plain text with
every column and nothing cut (`-o json` is the format for scripts). Every cell goes through
`uncontrolled()` and is a `rich.text.Text`: data is never read as markup nor reaches the
terminal as a control sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.table import Column, Table
from rich.text import Text

from tpujobs.cli.api_client import parse_time
from tpujobs.cli.terminal import uncontrolled
from tpujobs.domain.job import Job, JobEvent
from tpujobs.domain.states import JobState

STATE_STYLE = {
    JobState.QUEUED: "yellow",
    JobState.PROVISIONING: "cyan",
    JobState.RUNNING: "green",
    JobState.RECOVERING: "magenta",
    JobState.SUCCEEDED: "bold green",
    JobState.FAILED: "bold red",
    JobState.CANCELLED: "dim",
}
WIDE = 250  # the width of text that is not a terminal: nothing is dropped nor cut


@dataclass(frozen=True)
class Col:
    """One column: `keep` 0 is never dropped, higher numbers go first when space is short;
    `fit` says what a column narrower than its content does: nothing (`whole`, for ids people
    copy), an ellipsis (`cut`) or more lines (`wrap`)."""

    header: str
    keep: int = 0
    justify: Literal["left", "right"] = "left"
    fit: Literal["whole", "cut", "wrap"] = "whole"
    min_width: int = 6
    style: Callable[[str], str] | None = None


@dataclass
class Sheet:
    """A table as data, rendered by `table(width)` for a terminal of that width."""

    columns: Sequence[Col]
    rows: list[list[str]] = field(default_factory=list)
    title: str | None = None
    caption: str | None = None

    def add(self, *cells: object) -> None:
        self.rows.append([uncontrolled("-" if cell is None else cell) for cell in cells])

    def natural(self, index: int) -> int:
        return max([cell_len(self.columns[index].header), *(cell_len(row[index]) for row in self.rows)])

    def least(self, index: int) -> int:
        column = self.columns[index]
        if column.fit == "whole":
            return self.natural(index)
        return min(self.natural(index), max(cell_len(column.header), column.min_width))

    def fitted(self, width: int) -> list[tuple[int, int]]:
        """(column index, width) of the columns shown at `width`: the least important dropped
        until the rest fit at their least widths, then what is left shared out."""
        shown = list(range(len(self.columns)))

        def needed(indexes: list[int]) -> int:
            return sum(self.least(i) for i in indexes) + 3 * len(indexes) + 1  # padding and borders

        while needed(shown) > width and any(self.columns[i].keep for i in shown):
            shown.remove(max(reversed(shown), key=lambda i: self.columns[i].keep))
        widths = {i: self.least(i) for i in shown}
        spare = width - needed(shown)
        for i in shown:  # in order of importance: the first shortened columns get their room back first
            extra = min(spare, self.natural(i) - widths[i])
            if extra > 0:
                widths[i] += extra
                spare -= extra
        return [(i, widths[i]) for i in shown]

    def table(self, width: int = WIDE) -> Table:
        """A Rich table at most `width` wide."""
        fitted = self.fitted(width)
        table = Table(
            *(
                Column(
                    self.columns[i].header,
                    justify=self.columns[i].justify,
                    width=w,
                    no_wrap=self.columns[i].fit != "wrap",
                    overflow="fold" if self.columns[i].fit == "wrap" else "ellipsis",
                )
                for i, w in fitted
            ),
            title=self.title,
            title_justify="left",
            caption=self.caption,
            caption_justify="left",
        )
        for row in self.rows:
            table.add_row(*(self._cell(i, row[i]) for i, _ in fitted))
        return table

    def _cell(self, index: int, value: str) -> Text:
        style = self.columns[index].style
        return Text(value, style=style(value) if style else "")

    def full_width(self) -> int:
        """The width at which nothing is dropped nor cut."""
        return sum(self.natural(i) for i in range(len(self.columns))) + 3 * len(self.columns) + 1


def show(console: Console, renderable: Sheet | RenderableType, full_width: int = WIDE) -> None:
    """A table fitted to the terminal; piped, the whole of it without colour (every column,
    nothing cut), for grep and for people reading a log."""
    if console.is_terminal:
        console.print(renderable.table(console.width) if isinstance(renderable, Sheet) else renderable)
        return
    if isinstance(renderable, Sheet):
        full_width, renderable = max(80, renderable.full_width()), renderable.table(WIDE)
    plain = Console(file=console.file, width=full_width, color_system=None, highlight=False, emoji=False)
    plain.print(renderable)


def state_style(value: str) -> str:
    return STATE_STYLE[JobState(value)] if value in JobState.__members__ else ""


# --- jobs --------------------------------------------------------------------------------


def jobs_sheet(jobs: list[Job], now: datetime) -> Sheet:
    """One row per job; chip-hours count a running attempt up to `now`."""
    counts = {s: sum(job.state is s for job in jobs) for s in JobState}
    summary = "  ".join(f"{s.value} {n}" for s, n in counts.items() if n)
    pooled = any(job_pool(job) for job in jobs)  # a POOL column only where some job ran on one
    teamed = any(job.team for job in jobs)  # a TEAM column only where some job is in a team
    sheet = Sheet(
        [
            Col("JOB"),  # what people copy into other commands: never cut
            Col("STATE", style=state_style),
            Col("ATTEMPT", keep=2, justify="right"),
            Col("ACCELERATOR", keep=4, fit="cut", min_width=8),
            Col("ZONE", keep=5, fit="cut", min_width=8),
            *([Col("POOL", keep=5, fit="cut", min_width=6)] if pooled else []),
            Col("PRIORITY", keep=6, fit="cut", min_width=8),
            Col("OWNER", keep=3, fit="cut", min_width=8),
            *([Col("TEAM", keep=5, fit="cut", min_width=6)] if teamed else []),
            Col("AGE", keep=1, justify="right"),
            Col("CHIP-H", keep=2, justify="right"),
            Col("GOODPUT", keep=2, justify="right"),
            # Why the job is where it is: the first line, cut to what is left of the width.
            Col("REASON", keep=2, fit="cut", min_width=12),
        ],
        caption=f"{summary}   as of {when(now)[:19]} UTC",
    )
    for job in jobs:
        totals = job.accounting(now=None if job.state.is_terminal else now)
        sheet.add(
            job.job_id,
            job.state.value,
            job.attempt,
            f"{job.spec.slices} x {job.spec.accelerator_type}",
            job.zone,
            *([job_pool(job) or None] if pooled else []),
            job.spec.priority,
            job.owner,
            *([job.team or None] if teamed else []),
            age(job.created_at, now),
            chip_hours(totals.chip_hours),
            share(totals.goodput),
            one_line(job.state_reason) or None,
        )
    return sheet


def job_pool(job: Job) -> str:
    """The warm pool the job runs on or waits for, else the one its last attempt ran on ("" for none)."""
    return job.warm_pool or (job.usage[-1].pool if job.usage else "")


def jobs_table(jobs: list[Job], now: datetime, width: int = WIDE) -> Table:
    """`tpujobs list` in a terminal `width` columns wide."""
    return jobs_sheet(jobs, now).table(width)


# --- one job -----------------------------------------------------------------------------


def describe_tables(
    job: Job, events: list[JobEvent], logs: dict[int, Any] | None = None, now: datetime | None = None, width: int = WIDE
) -> RenderableType:
    """The job's fields, its attempts (chip-hours, lost time, logs) and its timeline."""
    until = None if job.state.is_terminal else now
    grid = Table.grid(padding=(1, 0))
    grid.add_row(_fields(job, until))
    if job.usage:
        grid.add_row(attempts_sheet(job, logs or {}, until).table(width))
    grid.add_row(timeline_sheet(events).table(width))
    return grid


def _fields(job: Job, until: datetime | None) -> Table:
    totals = job.accounting(now=until)
    spec = job.spec
    fields = Table(show_header=False, box=None, title=f"Job {uncontrolled(job.job_id)}", title_justify="left")
    fields.add_column(style="bold", no_wrap=True)
    fields.add_column(overflow="fold")
    rows: list[tuple[str, object]] = [
        ("name", job.name),
        ("state", job.state.value),
        ("reason", job.state_reason),
        ("owner", job.owner),
        ("team", job.team or "-"),
        ("accelerator", f"{spec.slices} x {spec.accelerator_type} ({spec.chips} chips, {spec.capacity})"),
        ("zone", job.zone),
        *_pool_rows(job),
        ("attempt", f"{job.attempt} (restarts {job.restarts} of {spec.max_restarts})"),
        ("queued resource", f"{job.warm_pool_unit or job.queued_resource} [{job.capacity_state or '-'}]"),
        ("command", spec.command),
        *_image_rows(job),
        ("rules", f"on_preemption={spec.on_preemption} on_error={spec.on_error}"),
        ("labels", ", ".join(f"{k}={v}" for k, v in sorted(spec.labels.items())) or "-"),
        ("env", ", ".join(f"{k}={v}" for k, v in sorted(spec.env.items())) or "-"),
        ("created", when(job.created_at)),
        ("started", when(job.started_at)),
        ("ended", when(job.ended_at)),
        *(
            [("record expires", f"{when(job.expire_at)} (kept {job.record_retention_days} days)")]
            if job.expire_at
            else []
        ),
        ("exit code", "-" if job.exit_code is None else job.exit_code),
        (
            "chip-hours",
            f"{chip_hours(totals.chip_hours)} ({chip_hours(totals.useful_chip_hours)} useful, "
            f"{chip_hours(totals.lost_chip_hours)} lost to preemption)",
        ),
        ("goodput", share(totals.goodput)),
        ("queue wait", duration(totals.queue_wait_seconds)),
        ("time lost", duration(totals.lost_seconds)),
        ("logs", job.log_uri or "-"),
    ]
    for name, value in rows:
        text = uncontrolled(value)
        fields.add_row(name, Text(text, style=state_style(text) if name == "state" else ""))
    return fields


def _pool_rows(job: Job) -> list[tuple[str, object]]:
    """The warm pool the job asks for, and whether it may leave it (its unit is its queued resource)."""
    if not job.spec.pool:
        return []
    left = "" if job.warm_pool else "; left it for capacity of its own"
    return [("pool", f"{job.spec.pool} (pool_fallback: {job.spec.pool_fallback}{left})")]


def _image_rows(job: Job) -> list[tuple[str, object]]:
    """The image and its pull policy, the digest each attempt ran, and the code's git commit,
    for those the job has. A digest is whole (it is what to pull again), so it gets its own row."""
    spec = job.spec
    rows: list[tuple[str, object]] = []
    if spec.image:
        rows.append(("image", f"{spec.image} (pull {spec.pull_policy})"))
    for usage in job.usage:
        if usage.image_digest:
            other = f", and {usage.other_image_digest} on another host" if usage.other_image_digest else ""
            rows.append((f"image, attempt {usage.attempt}", f"{usage.image_digest}{other}"))
    if spec.code_git_commit:
        rows.append(
            ("code commit", spec.code_git_commit + (" (with uncommitted changes)" if spec.code_git_dirty else ""))
        )
    return rows


def attempts_sheet(job: Job, logs: dict[int, Any], until: datetime | None) -> Sheet:
    """One row per attempt: where it waited and held capacity, what it cost, where its logs are."""
    pooled = any(usage.pool for usage in job.usage)  # the pool beside the zone, where one was used
    sheet = Sheet(
        [
            Col("#", justify="right"),
            Col("ZONE", keep=4, fit="cut", min_width=8),
            *([Col("POOL", keep=4, fit="cut", min_width=6)] if pooled else []),
            Col("WAITED", keep=2, justify="right"),
            Col("HELD FROM (UTC)", keep=3),
            Col("ENDED (UTC)", keep=3),
            Col("CHIP-H", keep=1, justify="right"),
            Col("LAST CHECKPOINT", keep=5),
            Col("LOST", keep=2, justify="right"),
            Col("LOGS", keep=1, fit="wrap", min_width=12),
        ],
        title="Attempts",
    )
    for usage in job.usage:
        at = usage.ended_at or until or job.updated_at or usage.waiting_since
        exported = logs.get(usage.attempt)
        lost = duration(usage.lost_seconds()) if usage.capacity_lost else "-"
        if usage.capacity_lost and not usage.work_kept:
            lost += " (rerun)"
        sheet.add(
            usage.attempt,
            usage.zone or job.zone,
            *([usage.pool or None] if pooled else []),
            duration(usage.queue_wait_seconds(at)),
            when(usage.held_from)[5:19] if usage.held_from else "-",
            when(usage.ended_at)[5:19] if usage.ended_at else "-",
            chip_hours(usage.chip_hours(at)),
            when(usage.last_checkpoint_at)[5:19] if usage.last_checkpoint_at else "-",
            lost,
            exported.log_uri if exported else ("not exported yet" if usage.ended_at else "running"),
        )
    return sheet


def timeline_sheet(events: list[JobEvent]) -> Sheet:
    """One row per transition; a narrow terminal keeps the reason, which says the rest."""
    sheet = Sheet(
        [
            Col("#", justify="right"),
            Col("AT (UTC)"),  # the time of day: the date is in `created`
            Col("FROM", keep=2),
            Col("TO", style=state_style),
            Col("SOURCE", keep=1),
            Col("ATTEMPT", keep=1, justify="right"),
            Col("REASON", fit="wrap", min_width=30),
        ],
        title="Timeline",
    )
    for event in events:
        sheet.add(
            event.seq,
            when(event.at)[11:],
            event.from_state.value if event.from_state else "-",
            event.to_state.value,
            event.source,
            event.attempt,
            event.reason,
        )
    return sheet


# --- messages that did not become jobs ------------------------------------------------------


def one_line(text: str) -> str:
    """Newlines and runs of spaces folded: a payload's excerpt on one line."""
    return " ".join(text.split())


def dead_letters_sheet(letters: list[dict[str, Any]]) -> Sheet:
    """Dead letters (the API's documents): ids and topics whole, the payload cut to fit."""
    sheet = Sheet(
        [
            Col("ID"),
            Col("WHEN (UTC)", keep=1),
            Col("TOPIC"),
            Col("ATTEMPTS", keep=2, justify="right"),
            Col("PAYLOAD", keep=1, fit="cut", min_width=8),
            Col("REPLAYED", keep=3),
        ]
    )
    for letter in letters:
        attempts = letter.get("delivery_attempts")
        replayed = parse_time(letter.get("replayed_at"))
        sheet.add(
            letter.get("message_id"),
            when(parse_time(letter.get("at")))[:16],
            letter.get("topic") or "?",
            "-" if attempts is None else attempts,
            one_line(str(letter.get("payload") or ""))[:200],
            when(replayed)[:16] if replayed else "-",
        )
    return sheet


def rejections_sheet(rejections: list[dict[str, Any]]) -> Sheet:
    """Messages refused as jobs (the API's documents), with the sentence saying why."""
    sheet = Sheet(
        [
            Col("ID", keep=2),
            Col("WHEN (UTC)", keep=1),
            Col("TOPIC", keep=3),
            Col("REASON", fit="wrap", min_width=30),
            Col("PAYLOAD", keep=4, fit="cut", min_width=8),
        ]
    )
    for rejection in rejections:
        sheet.add(
            rejection.get("message_id"),
            when(parse_time(rejection.get("at")))[:19],
            rejection.get("topic") or "?",
            one_line(str(rejection.get("reason") or "")),
            one_line(str(rejection.get("payload") or ""))[:200],
        )
    return sheet


def quotas_sheet(pools: list[dict[str, Any]]) -> Sheet:
    """`tpujobs quota show`: one row per limit as Google counts it (the API's `quota_document`
    rows), the chips held under it and how many jobs wait for it."""
    sheet = Sheet(
        [
            Col("LOCATION"),
            Col("SCOPE", keep=2),  # the first to go: LOCATION's shape and TIER say it too
            Col("FAMILY"),
            Col("TIER", fit="wrap"),
            Col("QUOTA", justify="right"),
            Col("HELD", justify="right"),
            Col("HOLDERS", keep=1, justify="right"),
            Col("WAITING", justify="right"),
        ]
    )
    for pool in pools:
        quota, reservation = pool.get("quota"), pool.get("reservation")
        sheet.add(
            pool.get("location") or "-",
            pool.get("scope"),
            pool.get("family") or "-",
            f"reserved: {reservation}" if reservation else pool.get("tier"),
            "none" if quota is None else quota,
            pool.get("held"),
            pool.get("holders"),
            pool.get("waiting"),
        )
    return sheet


# --- warm pools (`tpujobs pool`; the API's `pool_summary` documents) ---------------------------

# Unit states in the order the UNITS cell counts them, and the word it uses for each.
UNIT_WORDS = {"IDLE": "idle", "BUSY": "busy", "REQUESTED": "requested", "WAITING_FOR_QUOTA": "quota-wait",
              "RELEASED": "released"}  # fmt: skip
UNIT_STYLE = {"IDLE": "green", "BUSY": "cyan", "REQUESTED": "yellow", "WAITING_FOR_QUOTA": "yellow", "RELEASED": "dim"}


def pool_shape(pool: dict[str, Any]) -> str:
    """count x slices x accelerator: `2 x 1 x v4-32`."""
    return f"{pool.get('count')} x {pool.get('slices')} x {pool.get('accelerator_type')}"


def unit_counts(units: list[dict[str, Any]]) -> str:
    """How many units are in each state, those in none left out: `1 idle, 2 busy`."""
    counts = {state: sum(u.get("state") == state for u in units) for state in UNIT_WORDS}
    return ", ".join(f"{n} {UNIT_WORDS[state]}" for state, n in counts.items() if n) or "none"


def waiting_count(pool: dict[str, Any]) -> int:
    """The pool's waiting jobs: named (a list) for those who may see them, else counted."""
    waiting = pool.get("waiting")
    return len(waiting) if isinstance(waiting, list) else int(waiting or 0)


def pools_sheet(pools: list[dict[str, Any]]) -> Sheet:
    """`tpujobs pool list`: one row per pool, its units by state and its last day's utilisation."""
    sheet = Sheet(
        [
            Col("NAME"),  # what people copy into other commands: never cut
            Col("OWNER", keep=3, fit="cut", min_width=8),
            Col("SHAPE"),
            Col("UNITS", fit="cut", min_width=10),
            Col("WAITING", keep=1, justify="right"),
            Col("UTIL(24h)", keep=1, justify="right"),
            Col("STATE", keep=2),
        ]
    )
    for pool in pools:
        day = pool.get("last_day") or {}
        sheet.add(
            pool.get("name"),
            pool.get("owner"),
            pool_shape(pool),
            unit_counts(pool.get("units") or []),
            waiting_count(pool),
            share(day.get("utilisation")),
            pool.get("state"),
        )
    return sheet


def pool_tables(pool: dict[str, Any], now: datetime, width: int = WIDE) -> RenderableType:
    """`tpujobs pool describe`: its settings and chip-hours, its units, and the jobs waiting."""
    grid = Table.grid(padding=(1, 0))
    grid.add_row(_pool_fields(pool))
    grid.add_row(units_sheet(pool.get("units") or [], now).table(width))
    waiting = pool.get("waiting")
    if isinstance(waiting, list):
        line = f"Waiting, in the pool's order: {', '.join(waiting)}" if waiting else "No job waits."
    else:
        line = f"{waiting or 0} job(s) wait (only the pool's owner, its users and admins see which)."
    grid.add_row(Text(uncontrolled(line)))
    return grid


def _pool_fields(pool: dict[str, Any]) -> Table:
    day = pool.get("last_day") or {}
    capacity = str(pool.get("capacity"))
    if pool.get("reservation"):
        capacity += f" (reservation {pool['reservation']})"
    idle = pool.get("idle_minutes")
    rows: list[tuple[str, object]] = [
        ("state", pool.get("state")),
        ("reason", pool.get("reason")),
        ("owner", pool.get("owner")),
        ("users", ", ".join(pool.get("users") or []) or "-"),
        ("shape", f"{pool_shape(pool)} ({pool.get('chips_per_unit')} chips a unit)"),
        ("capacity", capacity),
        ("zones", ", ".join(pool.get("zones") or [])),
        ("image", pool.get("image") or "-"),
        ("idle units", f"released after {idle} idle minute(s)" if idle else "kept while the pool lives"),
        ("service account", pool.get("service_account") or "the deployment's"),
        ("created", when(parse_time(pool.get("created_at")))),
        (
            "chip-hours",
            f"{chip_hours(pool.get('busy_chip_hours') or 0.0)} busy (charged to its jobs), "
            f"{chip_hours(pool.get('idle_chip_hours') or 0.0)} idle (the pool's own)",
        ),
        (
            "last day",
            f"{chip_hours(day.get('busy_chip_hours') or 0.0)} busy, {chip_hours(day.get('idle_chip_hours') or 0.0)} "
            f"idle: utilisation {share(day.get('utilisation'))}",
        ),
    ]
    fields = Table(show_header=False, box=None, title=f"Pool {uncontrolled(pool.get('name'))}", title_justify="left")
    fields.add_column(style="bold", no_wrap=True)
    fields.add_column(overflow="fold")
    for name, value in rows:
        fields.add_row(name, Text(uncontrolled("-" if value is None else value)))
    return fields


def units_sheet(units: list[dict[str, Any]], now: datetime) -> Sheet:
    """One row per unit: its state, queued resource, zone, the job on it and since when."""
    sheet = Sheet(
        [
            Col("#", justify="right"),
            Col("STATE", style=lambda value: UNIT_STYLE.get(value.split()[0], "")),
            Col("QUEUED RESOURCE"),
            Col("ZONE", keep=3, fit="cut", min_width=8),
            Col("CAPACITY", keep=4, fit="cut", min_width=8),
            Col("JOB", keep=1),
            Col("SINCE (UTC)", keep=2),
            Col("FOR", keep=2, justify="right"),
        ],
        title="Units",
    )
    for unit in units:
        since = parse_time(unit.get("since"))
        job = unit.get("job_id")
        if job and unit.get("attempt"):
            job = f"{job} (attempt {unit['attempt']})"
        sheet.add(
            unit.get("index"),
            f"{unit.get('state')}{' (removing)' if unit.get('removing') else ''}",
            unit.get("queued_resource"),
            unit.get("zone"),
            unit.get("capacity_state"),
            job,
            when(since)[:19],
            age(since, now),
        )
    return sheet


# --- how values read -----------------------------------------------------------------------


def chip_hours(value: float) -> str:
    return f"{value:.2f}" if value >= 0.01 or value == 0 else f"{value:.4f}"


def share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def age(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "-"
    seconds = int((now - moment).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"

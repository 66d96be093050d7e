"""The usage page: chip-hours and goodput per owner and per label, per day, over a window of days.

Every job that overlaps the window counts, however many there are: the `UsageJobs` port reads
them a page at a time (each job not yet ended, then each that ended inside the window), and each
page is summed and dropped, so memory grows with owners, labels, days and the jobs not yet ended,
never with the ended ones. The work grows with the jobs of the window, which is why the window is at most MAX_DAYS days.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from tpujobs.domain.states import TERMINAL
from tpujobs.engine.dashboard import charts
from tpujobs.engine.jobs_api.answers import ApiError
from tpujobs.engine.usage_report import UsageJobs

if TYPE_CHECKING:
    from tpujobs.domain.job import Job

DEFAULT_DAYS = 14
MAX_DAYS = 31  # the widest window a page sums: the bound on one page's reads


@dataclass(frozen=True)
class UsageRow:
    group: str  # "owner alice@x" or "label team=a"
    day: str
    chip_hours: float
    goodput: float | None


@dataclass(frozen=True)
class UsagePage:
    days: list[charts.Bar]
    owners: list[charts.Bar]
    labels: list[charts.Bar]
    rows: list[UsageRow] = field(default_factory=list)
    window_days: int = DEFAULT_DAYS
    jobs: int = 0  # jobs summed


def window_days(query_value: str | None) -> int:
    """The `days` a caller asked for (DEFAULT_DAYS when none): a whole number 1..MAX_DAYS, else a 400."""
    if query_value is None or not query_value.strip():
        return DEFAULT_DAYS
    text = query_value.strip()
    if not text.isdigit() or not 1 <= int(text) <= MAX_DAYS:
        raise ApiError(400, f"days is a whole number from 1 to {MAX_DAYS}.")
    return int(text)


def usage_page(jobs: UsageJobs, now: datetime, days: int = DEFAULT_DAYS) -> UsagePage:
    """The sums of the last `days` UTC days (today's so far included), over every job in them."""
    first_day = (now - timedelta(days=days - 1)).replace(hour=0, minute=0, second=0, microsecond=0)
    since = first_day.strftime("%Y-%m-%d")
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    active: set[str] = set()  # read while not ended: only these can come again, ended
    summed = 0
    for page in jobs.overlapping(first_day):
        for job in page:
            if job.state in TERMINAL and job.job_id in active:
                continue
            if job.state not in TERMINAL:
                active.add(job.job_id)
            summed += 1
            _add(sums, job, now, since)
    rows = [
        UsageRow(group, day, total, (total - lost) / total if total > 0 else None)
        for (group, day), (total, lost) in sorted(sums.items())
    ]
    return _page(rows, days, summed)


def _add(sums: dict[tuple[str, str], list[float]], job: Job, now: datetime, since: str) -> None:
    groups = [f"owner {job.owner}", *(f"label {k}={v}" for k, v in sorted((job.spec.labels or {}).items()))]
    for day, (total, lost) in charts.daily_chip_hours(job.usage, now).items():
        if day < since:
            continue
        for group in groups:
            sums[(group, day)][0] += total
            sums[(group, day)][1] += lost


def _page(rows: Iterable[UsageRow], days: int, jobs: int) -> UsagePage:
    rows = list(rows)
    per_day: dict[str, float] = defaultdict(float)
    per_group: dict[str, float] = defaultdict(float)
    for row in rows:
        per_group[row.group] += row.chip_hours
        if row.group.startswith("owner "):
            per_day[row.day] += row.chip_hours
    return UsagePage(
        days=charts.bars(sorted(per_day.items())),
        owners=charts.bars((g.removeprefix("owner "), v) for g, v in per_group.items() if g.startswith("owner ")),
        labels=charts.bars((g.removeprefix("label "), v) for g, v in per_group.items() if g.startswith("label ")),
        rows=rows,
        window_days=days,
        jobs=jobs,
    )

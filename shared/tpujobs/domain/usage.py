"""A calendar month's chip-hours, goodput and estimated cost per group (team, owner or a label).

Pure: the caller hands in job outlines (owner, team, labels, accelerator type, capacity, usage)
page by page, the month, the prices and `now`. Chip-hours are `domain.accounting`'s: each
attempt's held time, clipped to the month (UTC), so an attempt that spans two months counts in
each by its time; its lost time (the tail since its last checkpoint) is clipped alike, so goodput
(useful / all chip-hours) is the month's own. A running attempt counts up to `now`. Cost is
chip-hours times `domain.prices`' price of the attempt's family, tier and region; chip-hours with
no price are counted apart (`unpriced_chip_hours`), never priced at a guess. See docs/usage.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from tpujobs.domain.accelerators import UnknownAcceleratorType, parse_accelerator_type
from tpujobs.domain.accounting import SECONDS_PER_HOUR, AttemptUsage
from tpujobs.domain.quotas import TIER_OF_CAPACITY, region_of
from tpujobs.domain.states import TERMINAL

if TYPE_CHECKING:
    from tpujobs.domain.job import Job
    from tpujobs.domain.prices import Prices

NO_TEAM = "(no team)"
NO_LABEL = "(none)"
_MONTH = re.compile(r"^(?P<year>[0-9]{4})-(?P<month>0[1-9]|1[0-2])$")
_LABEL_BY = re.compile(r"^label:(?P<key>[a-z][a-z0-9_-]{0,62})$")


@dataclass(frozen=True)
class Month:
    """A calendar month in UTC: [start, end)."""

    year: int
    month: int

    @classmethod
    def parse(cls, text: str) -> Month:
        """`YYYY-MM`, else ValueError with a sentence."""
        found = _MONTH.fullmatch(text.strip())
        if not found:
            raise ValueError(f"month {text[:32]!r} is not YYYY-MM (e.g. 2026-12)")
        return cls(int(found["year"]), int(found["month"]))

    @classmethod
    def of(cls, at: datetime) -> Month:
        at = at.astimezone(timezone.utc) if at.tzinfo else at
        return cls(at.year, at.month)

    @property
    def start(self) -> datetime:
        return datetime(self.year, self.month, 1, tzinfo=timezone.utc)

    @property
    def end(self) -> datetime:
        return (self.start + timedelta(days=32)).replace(day=1)

    def __str__(self) -> str:
        return f"{self.year:04d}-{self.month:02d}"


def check_by(by: str) -> str:
    """`team`, `owner` or `label:KEY`; ValueError with a sentence for anything else."""
    if by in ("team", "owner") or _LABEL_BY.fullmatch(by):
        return by
    raise ValueError(f"--by {by[:40]!r}: use team, owner or label:KEY")


def group_of(job: Job, by: str) -> str:
    """The group a job's chip time counts in."""
    if by == "team":
        return job.team or NO_TEAM
    if by == "owner":
        return job.owner
    key = by.removeprefix("label:")
    return (job.spec.labels or {}).get(key) or NO_LABEL


def month_chip_hours(usage: AttemptUsage, month: Month, now: datetime) -> tuple[float, float]:
    """(chip-hours, lost chip-hours) of one attempt inside `month`."""
    if usage.held_from is None:
        return 0.0, 0.0
    end = usage.ended_at or now
    total = _overlap_seconds(usage.held_from, end, month)
    lost_seconds = usage.lost_seconds()
    lost = _overlap_seconds(end - timedelta(seconds=lost_seconds), end, month) if lost_seconds else 0.0
    return usage.chips * total / SECONDS_PER_HOUR, usage.chips * lost / SECONDS_PER_HOUR


def _overlap_seconds(start: datetime, end: datetime, month: Month) -> float:
    return max(0.0, (min(end, month.end) - max(start, month.start)).total_seconds())


@dataclass
class UsageGroup:
    """One group's sums over the month."""

    group: str
    chip_hours: float = 0.0
    lost_chip_hours: float = 0.0
    cost_usd: float = 0.0
    unpriced_chip_hours: float = 0.0  # chip time of a family, tier and region with no price
    jobs: int = 0

    @property
    def goodput(self) -> float | None:
        if self.chip_hours <= 0:
            return None
        return (self.chip_hours - self.lost_chip_hours) / self.chip_hours

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "chip_hours": round(self.chip_hours, 6),
            "useful_chip_hours": round(self.chip_hours - self.lost_chip_hours, 6),
            "goodput": None if self.goodput is None else round(self.goodput, 6),
            "estimated_cost_usd": round(self.cost_usd, 2),
            "unpriced_chip_hours": round(self.unpriced_chip_hours, 6),
            "jobs": self.jobs,
        }


@dataclass(frozen=True)
class UsageReport:
    month: Month
    by: str
    groups: list[UsageGroup]
    jobs: int  # jobs summed

    def as_dict(self) -> dict[str, Any]:
        return {
            "month": str(self.month),
            "by": self.by,
            "currency": "USD",
            "estimate": True,
            "groups": [group.as_dict() for group in self.groups],
            "jobs": self.jobs,
        }


def usage_report(pages: Iterable[Iterable[Job]], month: Month, by: str, prices: Prices, now: datetime) -> UsageReport:
    """Sum every job of `pages` into its group, for `month`. A job read while active and again
    once ended (the reads run one after the other) counts once: its ended copy is skipped."""
    check_by(by)
    groups: dict[str, UsageGroup] = {}
    active: set[str] = set()
    summed = 0
    for page in pages:
        for job in page:
            if job.state in TERMINAL and job.job_id in active:
                continue
            if job.state not in TERMINAL:
                active.add(job.job_id)
            if _add(groups, job, month, by, prices, now):
                summed += 1
    ordered = sorted(groups.values(), key=lambda g: (-g.chip_hours, g.group))
    return UsageReport(month, by, ordered, summed)


def _add(groups: dict[str, UsageGroup], job: Job, month: Month, by: str, prices: Prices, now: datetime) -> bool:
    """Add the job's chip time in `month` to its group; False when it had none there."""
    family = _family(job.spec.accelerator_type)
    tier = TIER_OF_CAPACITY.get(job.capacity, "on-demand")
    found = False
    for attempt in job.usage:
        total, lost = month_chip_hours(attempt, month, now)
        if total <= 0:
            continue
        group = groups.setdefault(group_of(job, by), UsageGroup(group_of(job, by)))
        if not found:
            group.jobs += 1
            found = True
        group.chip_hours += total
        group.lost_chip_hours += lost
        region = region_of(attempt.zone or job.zone)
        price = prices.per_chip_hour(family, tier, region) if family else None
        if price is None:
            group.unpriced_chip_hours += total
        else:
            group.cost_usd += total * price
    return found


def _family(accelerator_type: str | None) -> str:
    try:
        return parse_accelerator_type(accelerator_type or "").family
    except UnknownAcceleratorType:
        return ""

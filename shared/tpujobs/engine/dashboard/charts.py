"""Geometry of the dashboard's SVG plots, computed here so that it is tested as numbers.

Pure: times and sums in, rectangles out (x, width in the plot's own units); the templates only
draw what they are given. `now` is always passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from tpujobs.domain.accounting import AttemptUsage
from tpujobs.engine.budgets import THRESHOLDS

PLOT_WIDTH = 600.0  # the viewBox width of every plot; the CSS scales it to the screen
LANE_HEIGHT = 22.0  # one attempt's row in the attempts timeline
BAR_HEIGHT = 160.0  # the tallest bar of a bar chart
MAX_BAR_WIDTH = 80.0  # a chart of one or two bars keeps slim bars, centred in their slots


@dataclass(frozen=True)
class Segment:
    """One phase of one attempt, placed on the timeline."""

    phase: str  # waiting, provisioning, running, lost
    x: float
    width: float
    seconds: float


@dataclass(frozen=True)
class Lane:
    """One attempt's row: its phases left to right."""

    attempt: int
    y: float
    segments: tuple[Segment, ...]


@dataclass(frozen=True)
class Bar:
    """One bar of a bar chart: its label, value and place."""

    label: str
    value: float
    x: float
    width: float
    height: float  # y of its top is BAR_HEIGHT - height


def attempt_phases(usage: AttemptUsage, now: datetime) -> list[tuple[str, datetime, datetime]]:
    """(phase, start, end) of one attempt: waiting for capacity, provisioning (capacity held,
    no worker started yet), running, and the time its loss threw away (`lost_seconds`)."""
    end = usage.ended_at or now
    phases: list[tuple[str, datetime, datetime]] = []
    held = usage.held_from
    phases.append(("waiting", usage.waiting_since, min(held or end, end)))
    if held is None:
        return [p for p in phases if p[2] > p[1]]
    started = usage.started_at if usage.started_at is not None and usage.started_at < end else None
    phases.append(("provisioning", held, started or end))
    if started is not None:
        lost = usage.lost_seconds()
        lost_from = max(started, end - timedelta(seconds=lost)) if lost > 0 else end
        phases.append(("running", started, lost_from))
        phases.append(("lost", lost_from, end))
    return [p for p in phases if p[2] > p[1]]


def attempts_timeline(usage: Sequence[AttemptUsage], now: datetime, width: float = PLOT_WIDTH) -> list[Lane]:
    """Every attempt on one time axis, from the first attempt's wait to the last end (or `now`)."""
    if not usage:
        return []
    start = min(u.waiting_since for u in usage)
    end = max([u.ended_at or now for u in usage] + [start + timedelta(seconds=1)])
    scale = width / (end - start).total_seconds()
    lanes = []
    for row, attempt in enumerate(usage):
        segments = tuple(
            Segment(
                phase,
                round((a - start).total_seconds() * scale, 2),
                round((b - a).total_seconds() * scale, 2),
                (b - a).total_seconds(),
            )
            for phase, a, b in attempt_phases(attempt, now)
        )
        lanes.append(Lane(attempt.attempt, row * LANE_HEIGHT, segments))
    return lanes


def bars(values: Iterable[tuple[str, float]], width: float = PLOT_WIDTH) -> list[Bar]:
    """Bars side by side, the largest BAR_HEIGHT tall; each at most four fifths of its slot wide."""
    items = list(values)
    if not items:
        return []
    slot = width / len(items)
    bar = min(slot * 0.8, MAX_BAR_WIDTH)
    top = max((v for _, v in items), default=0.0) or 1.0
    return [
        Bar(label, value, round(i * slot + (slot - bar) / 2, 2), round(bar, 2), round(BAR_HEIGHT * value / top, 2))
        for i, (label, value) in enumerate(items)
    ]


def hourly_utilisation(
    usage_since: Callable[[datetime], tuple[float, float]], now: datetime, hours: int = 24
) -> list[tuple[str, float]]:
    """(hour label, busy share 0..1) for each of the last `hours` hours (the current one so far).

    `usage_since(t)` is a pool's (busy, idle) chip-hours from t to now, its open stretches
    included (`domain.pools.usage_since`): an hour's own is the difference between its start's
    and the next hour's. 0 when nothing was held in the hour."""
    first = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours - 1)
    starts = [first + timedelta(hours=i) for i in range(hours)]
    cumulative = [usage_since(start) for start in starts] + [(0.0, 0.0)]
    out = []
    for i, start in enumerate(starts):
        busy = cumulative[i][0] - cumulative[i + 1][0]
        held = busy + cumulative[i][1] - cumulative[i + 1][1]
        out.append((start.strftime("%H:00"), busy / held if held > 1e-9 else 0.0))
    return out


def daily_chip_hours(usage: Iterable[AttemptUsage], now: datetime) -> dict[str, tuple[float, float]]:
    """Day (YYYY-MM-DD, UTC) -> (chip-hours, lost chip-hours) of these attempts: each attempt's held
    time split at midnight; its lost time counted on the day it ended."""
    days: dict[str, tuple[float, float]] = {}
    for u in usage:
        if u.held_from is None:
            continue
        start, end = u.held_from, u.ended_at or now
        while start < end:
            midnight = (start + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
            piece = min(end, midnight)
            day = start.strftime("%Y-%m-%d")
            total, lost = days.get(day, (0.0, 0.0))
            days[day] = (total + u.chips * (piece - start).total_seconds() / 3600.0, lost)
            start = piece
        if u.lost_chip_hours() > 0:
            day = end.strftime("%Y-%m-%d")
            total, lost = days.get(day, (0.0, 0.0))
            days[day] = (total, lost + u.lost_chip_hours())
    return days


SHARE_WIDTH = 540.0  # the longest bar of a team's plots; the rest of PLOT_WIDTH holds the number at its end
NOTICE_PERCENT = THRESHOLDS[0]  # the first budget notice, marked on the budget plot


@dataclass(frozen=True)
class Piece:
    """One part of a horizontal bar: chips (or chip-hours) of one kind, placed."""

    kind: str  # own, lent, idle, borrowed (a limit's plot); spent, over (a budget's)
    x: float
    width: float
    amount: float


@dataclass(frozen=True)
class Row:
    """One horizontal bar, its pieces left to right; its total is written at its end."""

    label: str
    y: float
    total: float
    end: float
    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class SharePlot:
    """A team's chips under one limit: its nominal and what it holds, on one scale."""

    rows: tuple[Row, ...]
    nominal_x: float  # the nominal, marked across both rows


@dataclass(frozen=True)
class BudgetPlot:
    """A team's chip-hours of the month, with its budget (and the first notice) marked."""

    row: Row
    budget_x: float | None  # None: the team has no budget
    notice_x: float | None


def _row(label: str, y: float, parts: Sequence[tuple[str, float]], scale: float) -> Row:
    """Pieces end to end from 0; one of nothing is left out."""
    pieces, x = [], 0.0
    for kind, amount in parts:
        if amount > 0:
            pieces.append(Piece(kind, round(x, 2), round(amount * scale, 2), amount))
            x += amount * scale
    return Row(label, y, sum(amount for _, amount in parts), round(x, 2), tuple(pieces))


def share_plot(nominal: int, held: int, borrowed: int, lent: int, width: float = SHARE_WIDTH) -> SharePlot:
    """Two rows on one scale, the longer `width` long: the nominal (the part the team holds
    itself, the part lent to others, the idle rest) and what the team holds (its own, then what
    it borrowed past its nominal). `borrowed` and `lent` are `domain.team_positions.Position`'s: a team
    lends only chips it leaves idle, so own + lent never pass the nominal."""
    scale = width / max(nominal, held, 1)
    own = held - borrowed
    nominal_row = _row("nominal", 0.0, [("own", own), ("lent", lent), ("idle", nominal - own - lent)], scale)
    held_row = _row("held", LANE_HEIGHT, [("own", own), ("borrowed", borrowed)], scale)
    return SharePlot((nominal_row, held_row), round(nominal * scale, 2))


def budget_plot(used: float, budget: float | None, width: float = SHARE_WIDTH) -> BudgetPlot:
    """One bar of chip-hours used, on a scale of the larger of it and the budget: spent up to the
    budget, over past it; the budget and its first notice marked. No budget: the bar alone."""
    scale = width / (max(used, budget or 0.0) or 1.0)
    spent = min(used, budget) if budget is not None else used
    row = _row("used", 0.0, [("spent", spent), ("over", used - spent)], scale)
    if budget is None:
        return BudgetPlot(row, None, None)
    return BudgetPlot(row, round(budget * scale, 2), round(budget * NOTICE_PERCENT / 100 * scale, 2))

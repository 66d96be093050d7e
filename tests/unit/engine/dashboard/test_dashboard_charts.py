"""The dashboard's SVG geometry, as numbers: attempt phases, bars, pool utilisation, daily chip-hours."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tpujobs.domain.accounting import AttemptUsage
from tpujobs.domain.pools import Stretch
from tpujobs.engine.dashboard import charts

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def test_a_preempted_attempt_then_a_running_one_are_drawn_to_scale():
    """Attempt 1 waits 10 min, provisions 10, runs 30, and its last 10 (since the checkpoint) are
    lost; attempt 2 waits 20 and runs until now: 100 minutes over 600 units, 6 units a minute."""
    usage = (
        AttemptUsage(
            1,
            8,
            at(0),
            held_from=at(10),
            started_at=at(20),
            ended_at=at(60),
            last_checkpoint_at=at(50),
            capacity_lost=True,
        ),
        AttemptUsage(2, 8, at(60), held_from=at(80), started_at=at(80)),
    )
    lanes = charts.attempts_timeline(usage, now=at(100))
    first, second = lanes
    assert [(s.phase, s.x, s.width) for s in first.segments] == [
        ("waiting", 0.0, 60.0),
        ("provisioning", 60.0, 60.0),
        ("running", 120.0, 180.0),
        ("lost", 300.0, 60.0),
    ]
    assert [(s.phase, s.x, s.width) for s in second.segments] == [("waiting", 360.0, 120.0), ("running", 480.0, 120.0)]
    assert (first.y, second.y) == (0.0, charts.LANE_HEIGHT)


def test_an_attempt_still_waiting_is_one_waiting_segment_up_to_now():
    """No capacity yet: only waiting, from its start to now."""
    (lane,) = charts.attempts_timeline((AttemptUsage(1, 4, at(0)),), now=at(5))
    assert [(s.phase, s.x, s.width, s.seconds) for s in lane.segments] == [("waiting", 0.0, 600.0, 300.0)]


def test_bars_scale_to_the_largest_value():
    """The largest is BAR_HEIGHT tall, the others in proportion, each in its own slot."""
    bars = charts.bars([("a", 2.0), ("b", 1.0)], width=200)
    assert [(b.label, b.x, b.width, b.height) for b in bars] == [
        ("a", 10.0, 80.0, charts.BAR_HEIGHT),
        ("b", 110.0, 80.0, charts.BAR_HEIGHT / 2),
    ]
    assert charts.bars([]) == []
    (alone,) = charts.bars([("only", 3.0)], width=600)  # one bar: slim, in the middle
    assert (alone.x, alone.width) == (260.0, charts.MAX_BAR_WIDTH)


def test_hourly_utilisation_is_busy_chip_time_over_held_chip_time():
    """In the hour 09:00 a unit was busy 30 min and idle 30 min (50%); in the hour 10:00 one
    unit half busy and another idle (25%); 11:00 so far (5 min) all busy, an open stretch;
    an hour with nothing held is 0."""
    stretches = [
        Stretch(0, "busy", at(0), at(30), 8),
        Stretch(0, "idle", at(30), at(60), 8),
        Stretch(0, "busy", at(60), at(90), 8),
        Stretch(0, "idle", at(90), at(120), 8),
        Stretch(1, "idle", at(60), at(120), 8),
        Stretch(0, "busy", at(120), at(125), 8),  # open now: as domain.pools.usage_since counts it
    ]

    def usage_since(start: datetime) -> tuple[float, float]:
        busy = sum(s.chip_hours(start) for s in stretches if s.kind == "busy" and s.end > start)
        idle = sum(s.chip_hours(start) for s in stretches if s.kind == "idle" and s.end > start)
        return busy, idle

    hours = dict(charts.hourly_utilisation(usage_since, now=at(125), hours=4))
    assert hours == pytest.approx({"08:00": 0.0, "09:00": 0.5, "10:00": 0.25, "11:00": 1.0})


def test_daily_chip_hours_split_at_midnight_and_lost_time_counts_on_the_end_day():
    """Held from 23:00 to 01:00 on 8 chips: 8 chip-hours each day; 30 lost minutes on the second."""
    late = datetime(2026, 3, 1, 23, 0, tzinfo=timezone.utc)
    usage = AttemptUsage(
        1,
        8,
        late,
        held_from=late,
        ended_at=late + timedelta(hours=2),
        capacity_lost=True,
        last_checkpoint_at=late + timedelta(minutes=90),
    )
    days = charts.daily_chip_hours([usage], now=late + timedelta(hours=3))
    assert days == {"2026-03-01": (8.0, 0.0), "2026-03-02": (8.0, 4.0)}

"""A month's chip-hours, goodput and estimated cost per group (`domain/usage.py`), and the price
table they are priced from (`domain/prices.py`): shipped defaults, `config/prices` over them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from tpujobs.domain.accounting import AttemptUsage
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.prices import DEFAULT_PRICES, Prices, prices_from_document
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import JobState
from tpujobs.domain.usage import NO_LABEL, NO_TEAM, Month, check_by, month_chip_hours, usage_report

DEC = Month(2026, 12)
NOW = datetime(2026, 12, 20, tzinfo=UTC)


def a_job(
    job_id: str, *, owner: str = "ada@example.com", team: str = "", accelerator: str = "v6e-8",
    capacity: str = "on-demand", labels: dict[str, str] | None = None, usage: Iterable[AttemptUsage] = (),
) -> Job:  # fmt: skip
    spec = parse_spec({
        "job_id": f"job-{job_id}", "name": "train", "owner": owner, "accelerator_type": accelerator, "command": "true",
        "capacity": capacity, "labels": labels or {},
    })  # fmt: skip
    job, _ = new_job(spec, "us-east5-b", datetime(2026, 11, 1, tzinfo=UTC))
    return replace(job, team=team, usage=tuple(usage), state=JobState.SUCCEEDED)


def held(start: datetime, hours: float, chips: int = 8, attempt: int = 1, **fields: object) -> AttemptUsage:
    end = start + timedelta(hours=hours)
    return AttemptUsage(attempt, chips, start, held_from=start, ended_at=end, zone="us-east5-b", **fields)  # type: ignore[arg-type]


def test_an_attempt_across_the_month_boundary_counts_in_each_month_by_its_time() -> None:
    """Ten hours from Nov 30 20:00: four in November, six in December."""
    attempt = held(datetime(2026, 11, 30, 20, tzinfo=UTC), 10, chips=4)
    assert month_chip_hours(attempt, Month(2026, 11), NOW) == pytest.approx((16.0, 0.0))
    assert month_chip_hours(attempt, DEC, NOW) == pytest.approx((24.0, 0.0))
    assert month_chip_hours(attempt, Month(2027, 1), NOW) == (0.0, 0.0)


def test_lost_time_is_clipped_to_the_month_it_fell_in() -> None:
    """Preempted 2 h after midnight, 3 h after its last checkpoint: 2 h lost in December, 1 h in November."""
    start = datetime(2026, 11, 30, 12, tzinfo=UTC)
    attempt = held(start, 14, chips=1, capacity_lost=True, last_checkpoint_at=start + timedelta(hours=11))
    assert month_chip_hours(attempt, DEC, NOW) == pytest.approx((2.0, 2.0))
    assert month_chip_hours(attempt, Month(2026, 11), NOW) == pytest.approx((12.0, 1.0))


def test_a_running_attempt_counts_up_to_now() -> None:
    """No end yet: its December hours run to `now`."""
    attempt = replace(held(datetime(2026, 12, 19, tzinfo=UTC), 1, chips=2), ended_at=None)
    assert month_chip_hours(attempt, DEC, NOW)[0] == pytest.approx(48.0)


def test_usage_by_team_sums_chip_hours_goodput_and_cost() -> None:
    """Two jobs of team-a and one of no team: each group's sums, the biggest first, priced at v6e's default."""
    d1 = datetime(2026, 12, 1, tzinfo=UTC)
    lost = held(d1, 10, capacity_lost=True, last_checkpoint_at=d1 + timedelta(hours=8))
    jobs = [
        a_job("a-1", team="team-a", usage=[held(d1, 10)]),
        a_job("a-2", team="team-a", usage=[lost]),
        a_job("x-1", usage=[held(d1, 1)]),
    ]
    report = usage_report([jobs], DEC, "team", prices_from_document(None), NOW)
    rows = {g.group: g.as_dict() for g in report.groups}
    assert [g.group for g in report.groups] == ["team-a", NO_TEAM]
    assert rows["team-a"]["chip_hours"] == pytest.approx(160.0)
    assert rows["team-a"]["goodput"] == pytest.approx((160.0 - 16.0) / 160.0)
    assert rows["team-a"]["estimated_cost_usd"] == pytest.approx(160.0 * 2.70)
    assert rows["team-a"]["jobs"] == 2 and report.jobs == 3


def test_usage_by_owner_and_by_label() -> None:
    """Owner groups by the job's owner; label:KEY by the label's value, `(none)` without it."""
    d1 = datetime(2026, 12, 2, tzinfo=UTC)
    jobs = [
        a_job("a", owner="ada@example.com", labels={"project": "llm"}, usage=[held(d1, 1)]),
        a_job("b", owner="bob@example.com", labels={"project": "llm"}, usage=[held(d1, 2)]),
        a_job("c", owner="bob@example.com", usage=[held(d1, 4)]),
    ]
    by_owner = {g.group: g.chip_hours for g in usage_report([jobs], DEC, "owner", Prices(), NOW).groups}
    by_label = {g.group: g.chip_hours for g in usage_report([jobs], DEC, "label:project", Prices(), NOW).groups}
    assert by_owner == pytest.approx({"ada@example.com": 8.0, "bob@example.com": 48.0})
    assert by_label == pytest.approx({"llm": 24.0, NO_LABEL: 32.0})


def test_a_job_read_active_then_ended_counts_once() -> None:
    """The two reads run one after the other: a job that ended in between comes twice, and counts once."""
    d1 = datetime(2026, 12, 2, tzinfo=UTC)
    ended = a_job("a", team="t", usage=[held(d1, 1)])
    running = replace(ended, state=JobState.RUNNING)
    report = usage_report([[running], [ended]], DEC, "team", Prices(), NOW)
    assert report.groups[0].chip_hours == pytest.approx(8.0) and report.jobs == 1


def test_chip_time_without_a_price_is_counted_apart_never_priced_at_a_guess() -> None:
    """v4 has no shipped price: its chip-hours are `unpriced`, and the cost stays 0."""
    d1 = datetime(2026, 12, 2, tzinfo=UTC)
    report = usage_report([[a_job("a", accelerator="v4-8", usage=[held(d1, 1, chips=4)])]], DEC, "owner", Prices(), NOW)
    row = report.groups[0].as_dict()
    assert row["unpriced_chip_hours"] == pytest.approx(4.0) and row["estimated_cost_usd"] == 0


def test_the_shipped_defaults_name_only_published_prices() -> None:
    """v6e's published prices are shipped; families without one have no estimate (None)."""
    prices = Prices()
    assert prices.per_chip_hour("v6e", "on-demand", "us-east5") == pytest.approx(2.70)
    assert prices.per_chip_hour("v6e", "spot", "us-east5") is None
    assert all(prices.per_chip_hour(f, "on-demand", "us-east5") is None for f in ("v2", "v3", "v4", "v5p", "v7x"))
    assert all(price is None or price > 0 for price in DEFAULT_PRICES.values())


def test_config_prices_override_the_defaults_by_region_family_and_tier() -> None:
    """A region's own price beats `*`; a bare number is on-demand; null removes an estimate."""
    prices = prices_from_document({
        "us-east5": {"v5p": {"on-demand": 4.2, "spot": 1.5}, "v6e": None},
        "*": {"v4": 3.0},
    })  # fmt: skip
    assert prices.per_chip_hour("v5p", "spot", "us-east5") == pytest.approx(1.5)
    assert prices.per_chip_hour("v5p", "spot", "us-east1") is None
    assert prices.per_chip_hour("v4", "on-demand", "us-central2") == pytest.approx(3.0)
    assert prices.per_chip_hour("v6e", "on-demand", "us-east5") is None
    assert prices.per_chip_hour("v6e", "on-demand", "europe-west4") == pytest.approx(2.70)
    assert prices.overridden and not prices.problems


def test_a_price_that_makes_no_sense_is_a_problem_never_fatal() -> None:
    """A zone, an unknown family or tier, a negative or textual price: each skipped and said."""
    prices = prices_from_document({
        "us-east5-a": {"v5p": 1.0}, "*": {"v9": 1.0, "v5p": {"preemptible": 1.0, "spot": -1, "on-demand": "4"}},
    })  # fmt: skip
    assert len(prices.problems) == 5
    assert "drop the zone's letter" in prices.problems[0]
    assert prices.per_chip_hour("v5p", "on-demand", "us-east5") is None


def test_a_spot_job_is_priced_at_the_spot_tier() -> None:
    """The tier is the job's quota tier."""
    d1 = datetime(2026, 12, 2, tzinfo=UTC)
    prices = prices_from_document({"*": {"v5p": {"spot": 2.0}}})
    jobs = [a_job("s", accelerator="v5p-8", capacity="spot", usage=[held(d1, 1, chips=4)])]
    assert usage_report([jobs], DEC, "owner", prices, NOW).groups[0].cost_usd == pytest.approx(8.0)


def test_months_and_groupings_are_checked() -> None:
    """YYYY-MM and team|owner|label:KEY, else a sentence."""
    assert str(Month.parse("2026-02")) == "2026-02" and Month.parse("2026-12").end == datetime(2027, 1, 1, tzinfo=UTC)
    for bad in ("2026-13", "26-01", "2026-1"):
        with pytest.raises(ValueError, match="YYYY-MM"):
            Month.parse(bad)
    assert check_by("label:project") == "label:project"
    with pytest.raises(ValueError, match="team, owner or label:KEY"):
        check_by("zone")

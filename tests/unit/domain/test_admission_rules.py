"""The pure admission rules: pools by family, tier and region, limits per region and zone,
queue order, and whom eviction picks."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from tpujobs.domain.admission import (
    Holder,
    blocked_by,
    job_pool,
    pool_id,
    pool_of,
    queue_key,
    refusal_when_oversized,
    victims_for,
)
from tpujobs.domain.job import new_job
from tpujobs.domain.quotas import Limits, QuotaBook
from tpujobs.domain.spec import JobSpec, parse_spec

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
ZONE_A, ZONE_B = "us-central2-a", "us-central2-b"


def holder(job_id: str, chips: int, priority: str, minute: int, evictable: bool = True, zone: str = ZONE_B) -> Holder:
    return Holder(job_id, chips, 1, priority, T0 + timedelta(minutes=minute), evictable, zone)


def a_spec(accelerator_type: str = "v4-8", **fields: Any) -> JobSpec:
    return parse_spec(
        {"job_id": "aa", "name": "aa", "owner": "ada", "accelerator_type": accelerator_type, "command": "x", **fields}
    )


def test_a_pool_is_the_family_and_tier_in_the_region_or_a_named_reservation() -> None:
    """On-demand, spot and reserved chips of one zone are three pools; flex-start draws on spot."""
    assert pool_id(a_spec("v5litepod-16"), "us-west4-a") == "v5litepod@us-west4"
    assert pool_id(a_spec(capacity="spot"), ZONE_B) == "v4@us-central2:spot"
    assert pool_id(a_spec(capacity="reserved"), ZONE_B) == "v4@us-central2:reserved"
    assert pool_id(a_spec(capacity="reserved", reservation="team-a"), ZONE_B) == "v4@us-central2:reserved:team-a"
    assert pool_id(a_spec(capacity="spot"), ZONE_B, "on-demand") == "v4@us-central2"


def test_a_flex_start_job_counts_in_the_spot_pool() -> None:
    """Flex-start VMs consume preemptible quota."""
    spec = a_spec("v7x-16", capacity="flex-start", time_limit="4h")
    assert pool_id(spec, "us-central1-c") == "v7x@us-central1:spot"


def test_a_spot_job_continued_on_on_demand_counts_as_on_demand() -> None:
    """`job_pool` follows `Job.capacity`, not the spec."""
    job, _ = new_job(a_spec(capacity="spot", zones=[ZONE_B]), ZONE_B, T0, "gs://logs/aa", "topic")
    assert job_pool(job).id == "v4@us-central2:spot"
    assert job_pool(replace(job, on_demand=True)).id == "v4@us-central2"


def test_the_regions_quota_counts_every_zone_and_a_zones_only_its_own() -> None:
    """16 in the region and 8 in zone b: zone a's holders fill the region; zone b's own quota binds first."""
    limits = QuotaBook({"us-central2": {"v4": 16}, ZONE_B: {"v4": 8}}).limits(pool_of(a_spec(), ZONE_B))
    assert limits == Limits(16, {ZONE_B: 8})
    in_a = [holder("a1", 12, "low", 0, zone=ZONE_A)]
    assert blocked_by(limits, in_a, ZONE_A, 4) is None
    assert blocked_by(limits, in_a, ZONE_B, 8) == "region"  # zone b is empty, the region is not
    assert blocked_by(limits, [holder("b1", 4, "low", 0)], ZONE_B, 8) == "zone"
    assert blocked_by(limits, [holder("b1", 4, "low", 0)], ZONE_A, 8) is None


def test_queue_order_is_priority_then_submission() -> None:
    jobs = [("late-high", "high", 5), ("early-low", "low", 0), ("early-high", "high", 1), ("medium", "medium", 0)]
    ordered = sorted(jobs, key=lambda j: queue_key(j[1], T0 + timedelta(minutes=j[2])))
    assert [j[0] for j in ordered] == ["early-high", "late-high", "medium", "early-low"]


def test_eviction_takes_the_lowest_priority_newest_first_and_no_more_than_needed() -> None:
    held = [
        holder("low-old", 4, "low", 0),
        holder("low-new", 4, "low", 9),
        holder("very-low", 4, "very-low", 5),
        holder("medium", 4, "medium", 1),
    ]
    limits = Limits(16)
    assert [v.job_id for v in victims_for(limits, held, ZONE_B, 4, "high") or []] == ["very-low"]
    assert [v.job_id for v in victims_for(limits, held, ZONE_B, 8, "high") or []] == ["very-low", "low-new"]
    everyone = victims_for(limits, held, ZONE_B, 16, "very-high") or []
    assert [v.job_id for v in everyone] == ["very-low", "low-new", "low-old", "medium"]


def test_a_zones_quota_is_freed_only_by_evicting_holders_of_that_zone() -> None:
    """Zone b's quota is full; the newest low job is in zone a, so the older one in b goes."""
    held = [holder("low-b", 8, "low", 0), holder("low-a", 8, "low", 9, zone=ZONE_A)]
    victims = victims_for(Limits(32, {ZONE_B: 8}), held, ZONE_B, 8, "high")
    assert [v.job_id for v in victims or []] == ["low-b"]
    assert (
        victims_for(Limits(None, {ZONE_B: 8}), [holder("low-a", 8, "low", 0, zone=ZONE_A)], ZONE_B, 16, "high") is None
    )


def test_no_eviction_below_high_of_equal_priority_or_of_jobs_that_cannot_come_back() -> None:
    held = [holder("a", 4, "high", 0), holder("b", 4, "low", 1, evictable=False)]
    assert victims_for(Limits(8), held, ZONE_B, 4, "medium") is None
    assert victims_for(Limits(8), held, ZONE_B, 4, "high") is None  # equal priority is never evicted; b may not be
    assert victims_for(Limits(8), [holder("c", 2, "low", 0)], ZONE_B, 12, "very-high") is None  # all would not do


def test_a_job_over_the_quota_of_its_only_zone_is_refused_with_a_sentence() -> None:
    """64 chips against a quota of 32: refused, naming the chips, the family, the tier, the zone and the quota."""
    spec = a_spec("v4-128", job_id="big", name="big")
    assert spec.chips == 64
    refusal = refusal_when_oversized(spec, [ZONE_B], QuotaBook({ZONE_B: {"v4": 32}}))
    assert refusal == (
        "job 'big' asks for 64 chips, more than the quota of v4 on-demand chips in us-central2-b (32): it could "
        "never run; ask an admin to raise the quota, or ask for fewer chips"
    )
    assert refusal_when_oversized(spec, [ZONE_B], QuotaBook({ZONE_B: {"v4": 64}})) is None
    assert refusal_when_oversized(spec, [ZONE_B], QuotaBook({ZONE_B: {"v5p": 8}})) is None  # no v4 quota
    assert refusal_when_oversized(spec, [ZONE_B], QuotaBook({ZONE_B: {"v4": {"spot": 8}}})) is None  # another tier


def test_a_regional_quota_refuses_in_the_regions_words() -> None:
    """A region's quota under the job's chips names the region."""
    spec = a_spec("v4-128", job_id="big", name="big")
    refusal = refusal_when_oversized(spec, [ZONE_A, ZONE_B], QuotaBook({"us-central2": {"v4": 32}}))
    assert refusal is not None
    assert "more than the quota of v4 on-demand chips in region us-central2 (32)" in refusal


def test_a_job_is_refused_only_when_it_fits_in_none_of_its_zones() -> None:
    """One zone that can take it is enough; refused, the sentence names every zone's quota."""
    spec = a_spec("v4-128", job_id="big", name="big")
    zones = [ZONE_B, "us-east5-a"]
    assert refusal_when_oversized(spec, zones, QuotaBook({ZONE_B: {"v4": 32}})) is None
    refusal = refusal_when_oversized(spec, zones, QuotaBook({ZONE_B: {"v4": 32}, "us-east5-a": {"v4": 16}}))
    assert refusal is not None
    assert "in us-central2-b (32)" in refusal and "in us-east5-a (16)" in refusal


def test_never_fits_is_only_beyond_a_whole_limit() -> None:
    """Equal to the limit fits (alone); no limit, or a limit of 0 (a paused pool), never refuses."""
    assert Limits(32).never_fits(ZONE_B, 33) == "region"
    assert Limits(32).never_fits(ZONE_B, 32) is None
    assert Limits(None, {ZONE_B: 8}).never_fits(ZONE_B, 16) == "zone"
    assert Limits(None, {ZONE_B: 8}).never_fits(ZONE_A, 16) is None
    assert Limits().never_fits(ZONE_B, 10_000) is None
    assert Limits(0).never_fits(ZONE_B, 4) is None

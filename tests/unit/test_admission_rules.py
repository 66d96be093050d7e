"""The pure admission rules: pools, quotas, fitting, queue order, and whom eviction picks."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tpujobs.domain.admission import (
    Holder,
    fits,
    never_fits,
    pool_id,
    queue_key,
    quota_of,
    refusal_when_oversized,
    victims_for,
)
from tpujobs.domain.spec import parse_spec

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def holder(job_id: str, chips: int, priority: str, minute: int, evictable: bool = True) -> Holder:
    return Holder(job_id, chips, 1, priority, T0 + timedelta(minutes=minute), evictable)


def test_a_pool_is_the_family_in_the_zone_and_a_missing_quota_means_no_limit() -> None:
    spec = parse_spec(
        {"job_id": "aa", "name": "aa", "owner": "ada", "accelerator_type": "v5litepod-16", "command": "x"}
    )
    assert pool_id(spec, "us-west4-a") == "v5litepod@us-west4-a"
    quotas = {"us-west4-a": {"v5litepod": 64}}
    assert quota_of(quotas, "v5litepod@us-west4-a") == 64
    assert quota_of(quotas, "v4@us-west4-a") is None
    assert quota_of({}, "v5litepod@us-west4-a") is None


def test_fits_counts_every_holder() -> None:
    held = [holder("a", 8, "low", 0), holder("b", 4, "low", 1)]
    assert fits(16, held, 4)
    assert not fits(16, held, 5)
    assert fits(None, held, 10_000)


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
    assert [v.job_id for v in victims_for(16, held, 4, "high")] == ["very-low"]
    assert [v.job_id for v in victims_for(16, held, 8, "high")] == ["very-low", "low-new"]
    assert [v.job_id for v in victims_for(16, held, 16, "very-high")] == ["very-low", "low-new", "low-old", "medium"]


def test_no_eviction_below_high_of_equal_priority_or_of_jobs_that_cannot_come_back() -> None:
    held = [holder("a", 4, "high", 0), holder("b", 4, "low", 1, evictable=False)]
    assert victims_for(8, held, 4, "medium") is None
    assert victims_for(8, held, 4, "high") is None  # equal priority is never evicted; b may not be
    assert victims_for(8, [holder("c", 2, "low", 0)], 12, "very-high") is None  # even all would not do


def test_a_job_over_the_quota_of_its_only_zone_is_refused_with_a_sentence() -> None:
    """64 chips against a quota of 32: refused, naming the chips, the family, the zone and the quota."""
    spec = parse_spec({"job_id": "big", "name": "big", "owner": "ada", "accelerator_type": "v4-128", "command": "x"})
    assert spec.chips == 64
    refusal = refusal_when_oversized(spec, ["us-central2-b"], {"us-central2-b": {"v4": 32}})
    assert refusal == (
        "job 'big' asks for 64 chips of v4 in us-central2-b, whose quota is 32: it could never run; "
        "ask an admin to raise the quota, or ask for fewer chips"
    )
    assert refusal_when_oversized(spec, ["us-central2-b"], {"us-central2-b": {"v4": 64}}) is None
    assert refusal_when_oversized(spec, ["us-central2-b"], {"us-central2-b": {"v5p": 8}}) is None  # no v4 quota


def test_a_job_is_refused_only_when_it_fits_in_none_of_its_zones() -> None:
    """One zone that can take it is enough; refused, the sentence lists every zone's quota."""
    spec = parse_spec({"job_id": "big", "name": "big", "owner": "ada", "accelerator_type": "v4-128", "command": "x"})
    zones = ["us-central2-b", "us-east5-a"]
    assert refusal_when_oversized(spec, zones, {"us-central2-b": {"v4": 32}}) is None
    refusal = refusal_when_oversized(spec, zones, {"us-central2-b": {"v4": 32}, "us-east5-a": {"v4": 16}})
    assert refusal is not None
    assert "more than the quota of each of its zones (us-central2-b: 32, us-east5-a: 16)" in refusal


def test_never_fits_is_only_beyond_the_whole_quota() -> None:
    """Equal to the quota fits (alone); no quota, or a quota of 0 (a paused pool), never refuses."""
    assert never_fits(32, 33) and not never_fits(32, 32) and not never_fits(None, 10_000)
    assert not never_fits(0, 4)

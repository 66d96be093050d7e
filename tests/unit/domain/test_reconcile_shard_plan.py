"""Cutting a reconcile tick into shards (tpujobs.domain.shards): pure, so tested exhaustively here."""

from __future__ import annotations

import json
import random
import string

import pytest

from tpujobs.domain.shards import Placement, Shard, ShardError, decode, plan

A, B = "us-central2-b", "us-east5-a"


def placed(zone: str, *ids: str) -> list[Placement]:
    return [Placement(job_id, zone) for job_id in ids]


def owners(shards: list[Shard], zone: str, job_id: str) -> list[Shard]:
    return [s for s in shards if s.zone == zone and s.holds(job_id)]


def test_a_zone_is_cut_into_ranges_of_at_most_the_size_that_cover_every_id():
    """Five ids, shards of two: (, b] (b, d] (d, ): each id in exactly one, none over two."""
    shards = plan(placed(A, "e", "a", "c", "b", "d"), (), size=2, tick="t")
    assert shards == [Shard(A, "", "b", "t"), Shard(A, "b", "d", "t"), Shard(A, "d", "", "t")]
    for job_id in "abcde":
        assert len(owners(shards, A, job_id)) == 1


def test_a_zone_that_fits_one_shard_gets_the_whole_range():
    """As many ids as the size: one shard, open at both ends (so a leftover named after any id
    falls in it)."""
    assert plan(placed(A, "a", "b"), (), size=2) == [Shard(A)]


def test_zones_without_active_jobs_get_one_whole_shard_each_and_zones_are_kept_apart():
    """A zone named only by `also` (a preferred zone, a warm pool, the default) gets ("", "");
    a job's id counts in its own zone only."""
    shards = plan(placed(A, "a", "b", "c"), (B, A), size=2)
    assert shards == [Shard(A, "", "b"), Shard(A, "b", ""), Shard(B)]
    assert owners(shards, B, "a") == [Shard(B)]


@pytest.mark.parametrize("seed", range(20))
def test_any_name_falls_in_exactly_one_shard_of_its_zone(seed):
    """Random ids in three zones and random sizes: every active id, and any other id (a queued
    resource's owner that is no longer active), is held by exactly one shard of each zone, and
    no shard holds more than `size` active ids."""
    rng = random.Random(seed)
    alphabet = string.ascii_lowercase + string.digits + "-"

    def name() -> str:
        return rng.choice(string.ascii_lowercase) + "".join(rng.choices(alphabet, k=rng.randint(0, 12)))

    zones = [A, B, "europe-west4-a"]
    jobs = [Placement(name(), rng.choice(zones)) for _ in range(rng.randint(0, 300))]
    size = rng.randint(1, 40)
    shards = plan(jobs, zones, size)
    for job in jobs:
        assert len(owners(shards, job.zone, job.job_id)) == 1, job
    for other in [name() for _ in range(100)]:
        assert all(len(owners(shards, zone, other)) == 1 for zone in zones), other
    for shard in shards:
        held = {j.job_id for j in jobs if j.zone == shard.zone and shard.holds(j.job_id)}
        assert len(held) <= size


def test_a_shard_size_below_one_is_refused():
    """Size 0 would loop for ever or drop jobs: a ValueError naming the size."""
    with pytest.raises(ValueError, match="shard size must be at least 1, got 0"):
        plan([], (A,), size=0)


@pytest.mark.parametrize(
    "data",
    [None, b"", b"not json", b"\xff\xfe", b'{"tick": "2026-11-24T10:00:00Z"}', b"[1, 2]", b'"shard"', b"{}"],
)
def test_anything_without_a_shard_key_is_the_schedulers_tick(data):
    """Cloud Scheduler's body, the local scheduler's, an empty or undecodable one: not a shard."""
    assert decode(data) is None


def test_a_shard_round_trips_through_its_message():
    """What the coordinator publishes is what the shard decodes."""
    shard = Shard(A, "job-a", "job-k", "2026-11-24T10:00:00.000+00:00")
    assert decode(json.dumps(shard.message()).encode()) == shard
    assert decode(json.dumps({"shard": {"zone": B}}).encode()) == Shard(B)


@pytest.mark.parametrize(
    ("shard", "field"),
    [
        ("us-central2-b", "shard"),
        ({"zone": ""}, "shard.zone"),
        ({"zone": 5}, "shard.zone"),
        ({"after": "a"}, "shard.zone"),
        ({"zone": A, "after": "A/../b"}, "shard.after"),
        ({"zone": A, "through": None}, "shard.through"),
        ({"zone": A, "after": "job-b", "through": "job-b"}, "shard.through"),
        ({"zone": A, "tick": "; rm -rf /"}, "shard.tick"),
        ({"zone": A, "size": 3}, "shard.size"),
    ],
)
def test_a_malformed_shard_is_refused_with_a_sentence_naming_the_field(shard, field):
    """Each bad part of a shard message: ShardError, one sentence, the field named."""
    with pytest.raises(ShardError) as raised:
        decode(json.dumps({"shard": shard}).encode())
    message = str(raised.value)
    assert f"'{field}'" in message and "\n" not in message

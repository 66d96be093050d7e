"""Admission by share (`domain/fair_share.py`): who goes first, who is taken back, and why a job waits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tpujobs.domain.admission import Holder
from tpujobs.domain.fair_share import Limit, Waiting, plan_round, pool_limits, team_shares
from tpujobs.domain.quotas import Limits, PoolKey
from tpujobs.domain.team_positions import limit_positions
from tpujobs.domain.teams import Share

ZONE = "us-central2-b"
OTHER_ZONE = "us-central2-c"
POOL = PoolKey("v4", "on-demand", "us-central2")
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def share(nominal: int, borrowing: int | None = None, lending: int | None = None, weight: float = 1.0) -> Share:
    return Share(ZONE, "v4", "on-demand", nominal, borrowing, lending, weight)


def zone_limit(chips: int, **shares: Share) -> list[Limit]:
    return pool_limits(
        Limits(zones={ZONE: chips}), POOL.region, {ZONE: {k.replace("_", "-"): v for k, v in shares.items()}}
    )


def held(job_id: str, team: str, chips: int = 4, minute: int = 0, priority: str = "medium", zone: str = ZONE) -> Holder:
    return Holder(job_id, chips, 1, priority, T0 + timedelta(minutes=minute), True, zone, team)


def waiting(
    job_id: str, team: str, chips: int = 4, minute: int = 0, priority: str = "medium", zone: str = ZONE
) -> Waiting:
    return Waiting(job_id, team, zone, chips, priority, T0 + timedelta(minutes=minute), 1)


def admitted(round_: object) -> list[str]:
    return [a.job.job_id for a in round_.admitted]  # type: ignore[attr-defined]


def test_a_team_under_its_nominal_takes_back_exactly_what_it_needs_from_the_newest_borrowers() -> None:
    """The issue's case: 16 chips split 8/8; team-a holds all 16; team-b's two 4-chip jobs reclaim
    exactly two of team-a's jobs, the most recently started."""
    limits = zone_limit(16, team_a=share(8), team_b=share(8))
    holders = [held(f"a{n}", "team-a", minute=n) for n in range(4)]
    plan = plan_round(POOL, limits, holders, [waiting("b0", "team-b", minute=10), waiting("b1", "team-b", minute=11)])
    assert admitted(plan) == ["b0", "b1"]
    assert [h.job_id for a in plan.admitted for h in a.reclaimed] == ["a3", "a2"]
    assert not plan.held_back


def test_an_idle_teams_nominal_is_borrowed_and_a_borrowing_limit_stops_it() -> None:
    free = plan_round(
        POOL,
        zone_limit(16, team_a=share(8), team_b=share(8)),
        [],
        [waiting(f"a{n}", "team-a", minute=n) for n in range(4)],
    )
    assert admitted(free) == ["a0", "a1", "a2", "a3"]
    capped = plan_round(
        POOL,
        zone_limit(16, team_a=share(8, borrowing=4), team_b=share(8)),
        [],
        [waiting(f"a{n}", "team-a", minute=n) for n in range(4)],
    )
    assert admitted(capped) == ["a0", "a1", "a2"]
    assert capped.held_back["a3"].endswith("team-a holds 12 chips, 4 past its 8 nominal and may borrow 0 more.")


def test_a_lending_limit_keeps_part_of_an_idle_nominal() -> None:
    limits = zone_limit(16, team_a=share(8), team_b=share(8, lending=4))
    plan = plan_round(POOL, limits, [], [waiting(f"a{n}", "team-a", minute=n) for n in range(4)])
    assert admitted(plan) == ["a0", "a1", "a2"]
    assert "may borrow 0 more" in plan.held_back["a3"]


def test_a_team_under_its_nominal_goes_before_an_older_higher_priority_borrower() -> None:
    limits = zone_limit(16, team_a=share(8), team_b=share(8))
    holders = [held("a0", "team-a"), held("a1", "team-a"), held("b0", "team-b")]  # 4 chips free
    plan = plan_round(
        POOL, limits, holders, [waiting("a2", "team-a"), waiting("b1", "team-b", minute=5, priority="low")]
    )
    assert admitted(plan) == ["b1"]
    assert "team-a" in plan.held_back["a2"]


def test_among_borrowers_the_lowest_weighted_share_goes_first() -> None:
    limits = zone_limit(32, team_a=share(4), team_b=share(4, weight=2.0), team_c=share(24, lending=24))
    holders = [held("a0", "team-a", chips=8), held("b0", "team-b", chips=8)]  # a: 8/4 = 2.0; b: 8/(4x2) = 1.0
    plan = plan_round(POOL, limits, holders, [waiting("a1", "team-a"), waiting("b1", "team-b", minute=5)])
    assert admitted(plan)[0] == "b1"


def test_a_high_priority_job_evicts_its_own_team_only() -> None:
    limits = zone_limit(16, team_a=share(8), team_b=share(8))
    holders = [held("a0", "team-a"), held("a1", "team-a", minute=1), held("b0", "team-b"), held("b1", "team-b")]
    plan = plan_round(POOL, limits, holders, [waiting("a2", "team-a", priority="high")])
    assert [h.job_id for a in plan.admitted for h in a.evicted] == ["a1"]
    assert all(h.team == "team-a" for a in plan.admitted for h in a.evicted)


def test_jobs_of_no_team_draw_only_on_unassigned_chips() -> None:
    limits = zone_limit(16, team_a=share(8), team_b=share(4))  # 4 unassigned
    plan = plan_round(POOL, limits, [], [waiting("x0", ""), waiting("x1", "", minute=1)])
    assert admitted(plan) == ["x0"]
    assert "jobs of no team draw only on the 4 chips no team holds as nominal" in plan.held_back["x1"]


def test_no_window_hides_a_job_behind_a_long_backlog_in_another_zone() -> None:
    limits = pool_limits(Limits(zones={ZONE: 4, OTHER_ZONE: 4}), POOL.region, {})
    backlog = [waiting(f"z{n}", "", minute=n) for n in range(500)]
    plan = plan_round(POOL, limits, [held("busy", "")], [*backlog, waiting("late", "", minute=999, zone=OTHER_ZONE)])
    assert admitted(plan) == ["late"]
    assert list(plan.held_back) == ["z0"]  # only each queue's head says why


def test_a_plain_limit_keeps_priority_then_age_and_a_region_limit_stops_its_queue() -> None:
    limits = pool_limits(Limits(total=8), POOL.region, {})
    plan = plan_round(
        POOL,
        limits,
        [],
        [
            waiting("old", "", minute=0),
            waiting("urgent", "", minute=9, priority="high"),
            waiting("small", "", chips=2, minute=1),
        ],
    )
    assert admitted(plan) == ["urgent", "old"]
    assert list(plan.held_back) == ["small"]
    full = plan_round(
        POOL, limits, [held("h", "", chips=6)], [waiting("big", "", minute=0), waiting("tiny", "", chips=1, minute=1)]
    )
    assert admitted(full) == [] and "big" in full.held_back


def test_a_job_bigger_than_a_lowered_limit_is_set_aside() -> None:
    plan = plan_round(POOL, zone_limit(4), [], [waiting("huge", "", chips=8), waiting("ok", "", minute=1)])
    assert [w.job_id for w in plan.too_big] == ["huge"] and admitted(plan) == ["ok"]


def test_paused_teams_wait_with_the_reason_given() -> None:
    plan = plan_round(
        POOL, zone_limit(16, team_a=share(8)), [], [waiting("a0", "team-a")], paused={"team-a": "over budget"}
    )
    assert plan.held_back == {"a0": "over budget"}


def test_positions_say_who_holds_borrows_and_lends() -> None:
    limits = Limits(zones={ZONE: 16})
    shares = {"team-a": share(8), "team-b": share(8)}
    holders = [held(f"a{n}", "team-a", minute=n) for n in range(3)]
    found = limit_positions(limits, ZONE, shares, holders, [waiting("b0", "team-b")])
    assert (found["team-a"].held, found["team-a"].borrowed, found["team-a"].lent) == (12, 4, 0)
    assert (found["team-b"].held, found["team-b"].lent, found["team-b"].waiting) == (0, 4, 4)


def test_the_dominant_share_across_pools_orders_borrowers() -> None:
    """team-b borrows less here, but holds far past its nominal in another family's pool: team-a goes first."""
    limits = zone_limit(32, team_a=share(4), team_b=share(4), team_c=share(24))
    holders = [held("a0", "team-a", chips=8), held("b0", "team-b", chips=4)]  # here: a 2.0, b 1.0
    waiting_jobs = [waiting("a1", "team-a"), waiting("b1", "team-b")]
    assert admitted(plan_round(POOL, limits, holders, waiting_jobs))[0] == "b1"
    elsewhere = team_shares(limits, holders) | {"team-b": 3.0}
    assert admitted(plan_round(POOL, limits, holders, waiting_jobs, elsewhere=elsewhere))[0] == "a1"

"""Admission by share (`domain/fair_share.py`) over random teams, limits and queues, round after round.

Each example draws a pool's limits (a region total and/or zone limits, teams' shares summing to
at most each), random holders that fit, then a few rounds: new jobs arrive, some holders end,
`plan_round` runs, its admissions become holders and what it took back waits again. After each
round: no limit is exceeded; a team's admissions never carry it past nominal + borrowing limit;
jobs of no team stay within the unassigned chips; a team under its nominal whose head fits its
nominal (free or reclaimable chips) is never left behind a borrower; the plan is the same
whatever order its input comes in; and the simulator's quota check (`local.simulator.quota_counts`,
the code that keeps a queued resource waiting over quota) accepts every job the round admitted.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from tpujobs.domain.admission import Holder
from tpujobs.domain.fair_share import Limit, Round, Waiting, plan_round, pool_limits
from tpujobs.domain.quotas import PoolKey, QuotaBook
from tpujobs.domain.spec import PRIORITY_RANK
from tpujobs.domain.teams import Share
from tpujobs.local.simulator.quota_counts import holdings, shortfall
from tpujobs.local.simulator.records import (
    Initiator,
    QrState,
    QueuedResourceRecord,
    QueuedResourceRequest,
    SliceRequest,
)

REGION = "us-central2"
ZONES = ("us-central2-a", "us-central2-b", "us-central2-c")
POOL = PoolKey("v4", "on-demand", REGION)
TEAMS = ("team-a", "team-b", "team-c", "team-d")
ACCELERATOR = {4: "v4-8", 8: "v4-16", 16: "v4-32"}  # chips -> the v4 slice that has them
T0 = datetime(2026, 12, 1, tzinfo=UTC)
EXAMPLES = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class World:
    """A pool's limits as admission sees them, and the `config/quotas` document they come from."""

    quotas: dict[str, Any]
    limits: list[Limit]

    @property
    def book(self) -> QuotaBook:
        return QuotaBook(self.quotas)


@st.composite
def worlds(draw: st.DrawFn) -> World:
    """A region total and/or zone limits; per limit, some teams' shares (nominals summing to at most its chips)."""
    total = draw(st.one_of(st.none(), st.sampled_from([0, 8, 16, 32, 48, 64])))
    zones = {z: c for z in ZONES if (c := draw(st.one_of(st.none(), st.sampled_from([0, 8, 16, 24, 32])))) is not None}
    if total is None and not zones:
        zones = {ZONES[0]: 16}
    quotas: dict[str, Any] = {z: {"v4": c} for z, c in zones.items()}
    if total is not None:
        quotas[REGION] = {"v4": total}
    shares: dict[str, dict[str, Share]] = {}
    for where, chips in ([(REGION, total)] if total is not None else []) + list(zones.items()):
        if not draw(st.booleans()):
            continue  # a plain limit: first come, by priority and age
        left = chips
        for team in draw(st.lists(st.sampled_from(TEAMS), unique=True)):
            nominal = draw(st.one_of(st.integers(0, left // 4).map(lambda n: 4 * n), st.integers(0, left)))
            left -= nominal
            borrowing = draw(st.one_of(st.none(), st.sampled_from([0, 4, 8, 16])))
            lending = draw(st.one_of(st.none(), st.integers(0, nominal)))
            weight = draw(st.sampled_from([0.5, 1.0, 2.0]))
            shares.setdefault(where, {})[team] = Share(where, "v4", "on-demand", nominal, borrowing, lending, weight)
    return World(quotas, pool_limits(QuotaBook(quotas).limits(POOL), REGION, shares))


@dataclass(frozen=True)
class Job:
    """A job as drawn: who, where, how big, how urgent, when."""

    team: str
    zone: str
    chips: int
    priority: str
    minute: int
    evictable: bool


def jobs(teams: Sequence[str] = ("", *TEAMS), max_minute: int = 10_000) -> st.SearchStrategy[Job]:
    return st.builds(
        Job,
        st.sampled_from(teams),
        st.sampled_from(ZONES),
        st.sampled_from([4, 4, 4, 8, 16]),  # chips: mostly the smallest slice, so that limits fill
        st.sampled_from(sorted(PRIORITY_RANK)),
        st.integers(0, max_minute),
        st.sampled_from([True, True, True, False]),  # evictable: mostly, so that there is something to take back
    )


@dataclass
class Pool:
    """A pool between rounds: who holds chips and who waits. Every time is unique (no ties)."""

    world: World
    holders: dict[str, Holder] = field(default_factory=dict)
    waiting: dict[str, Waiting] = field(default_factory=dict)
    serial: itertools.count[int] = field(default_factory=itertools.count)

    def submit(self, job: Job) -> None:
        n = next(self.serial)
        at = T0 + timedelta(minutes=job.minute, microseconds=n)
        self.waiting[f"j{n}"] = Waiting(f"j{n}", job.team, job.zone, job.chips, job.priority, at, 1, "", job.evictable)

    def hold(self, job: Job) -> None:
        """A holder from before the rounds, kept only while every limit still fits it."""
        n = next(self.serial)
        holder = Holder(f"h{n}", job.chips, 1, job.priority, T0 + timedelta(minutes=job.minute, microseconds=n),
                        job.evictable, job.zone, job.team)  # fmt: skip
        if all(held(self.world.limits[i], [*self.holders.values(), holder]) <= limit.chips
               for i, limit in enumerate(self.world.limits)):  # fmt: skip
            self.holders[holder.job_id] = holder

    def run(self, plan: Round, round_no: int) -> None:
        """The plan applied: admissions hold, what they took back waits again (next attempt)."""
        for n, admit in enumerate(plan.admitted):
            for victim in (*admit.evicted, *admit.reclaimed):
                del self.holders[victim.job_id]
                self.waiting[victim.job_id] = Waiting(victim.job_id, victim.team, victim.zone, victim.chips,
                                                      victim.priority, victim.since, victim.attempt + 1, "",
                                                      victim.evictable)  # fmt: skip
            job = self.waiting.pop(admit.job.job_id)
            since = T0 + timedelta(days=1 + round_no, microseconds=n)
            self.holders[job.job_id] = Holder(job.job_id, job.chips, job.attempt, job.priority, since, job.evictable,
                                              job.zone, job.team)  # fmt: skip
        for job in plan.too_big:
            del self.waiting[job.job_id]


def held(limit: Limit, holders: Iterable[Holder], team: str | None = None) -> int:
    """Chips counted under `limit`, of `team` only when given."""
    return sum(h.chips for h in holders if limit.counts(h.zone) and (team is None or h.team == team))


def within_nominal(limits: Sequence[Limit], holders: Sequence[Holder], job: Waiting) -> bool:
    """The job fits its team's nominal under every limit with shares that counts it (as the round starts)."""
    shared = [limit for limit in limits if limit.counts(job.zone) and limit.shares]
    return bool(job.team and shared) and all(
        held(limit, holders, job.team) + job.chips <= limit.nominal(job.team) for limit in shared
    )


def reclaimable(limit: Limit, holders: Sequence[Holder], team: str) -> int:
    """Chips a job of `team` may take back under `limit`: from each other team (or none) that
    holds past its nominal there, its excess, as far as its evictable jobs cover it."""
    found = 0
    for other in {h.team for h in holders if limit.counts(h.zone)} - {team}:
        excess = held(limit, holders, other) - limit.nominal(other)
        evictable = sum(h.chips for h in holders if limit.counts(h.zone) and h.team == other and h.evictable)
        found += max(0, min(excess, evictable))
    return found


def heads(waiting: Iterable[Waiting]) -> list[Waiting]:
    """Each (team, zone) queue's head: its highest priority, then its oldest."""
    queues: dict[tuple[str, str], Waiting] = {}
    for job in waiting:
        best = queues.get((job.team, job.zone))
        if best is None or (-PRIORITY_RANK[job.priority], job.created_at) < (
            -PRIORITY_RANK[best.priority],
            best.created_at,
        ):
            queues[(job.team, job.zone)] = job
    return list(queues.values())


def order(job: Waiting) -> tuple[int, datetime]:
    return -PRIORITY_RANK[job.priority], job.created_at


def owed(limits: Sequence[Limit], holders: Sequence[Holder], job: Waiting) -> bool:
    """A team under its nominal, whose head fits its nominal and finds its chips free or reclaimable
    under every limit that counts it: the round must not leave it behind a borrower."""
    relevant = [limit for limit in limits if limit.counts(job.zone)]
    return (
        within_nominal(limits, holders, job)
        and not any(0 < limit.chips < job.chips for limit in relevant)
        and all(
            limit.chips - held(limit, holders) + reclaimable(limit, holders, job.team) >= job.chips
            for limit in relevant
        )
    )


def qr(holder_id: str, zone: str, chips: int, number: int) -> QueuedResourceRecord:
    """A held job as the simulator keeps its queued resource: one v4 slice of its chips, holding them."""
    request = QueuedResourceRequest(slices=(SliceRequest(ACCELERATOR[chips], "tpu-ubuntu2204-base", holder_id),))
    return QueuedResourceRecord("proj", zone, holder_id, request, QrState.ACTIVE, Initiator.USER, 0.0, number,
                                holds_capacity=True)  # fmt: skip


# -- the properties, checked after every round ------------------------------------------------


def check_round(world: World, before: list[Holder], waiting: list[Waiting], plan: Round, after: list[Holder]) -> None:
    limits = world.limits
    admitted = [admit.job for admit in plan.admitted]
    for limit in limits:
        # (1) no limit is ever exceeded
        assert held(limit, after) <= limit.chips, (limit.where, limit.chips, held(limit, after))
        counted = [job for job in admitted if limit.counts(job.zone)]
        for team in {job.team for job in counted if job.team}:
            # (2) a team's admissions never carry it past nominal + borrowing limit
            share = limit.shares.get(team)
            if share is not None and share.borrowing_limit is not None:
                assert held(limit, after, team) <= share.nominal + share.borrowing_limit, (limit.where, team)
        if limit.shares and any(not job.team for job in counted):
            # (4) jobs of no team draw only on the chips no team holds as nominal
            assert held(limit, after, "") <= limit.unassigned, (limit.where, held(limit, after, ""), limit.unassigned)
    # (3) a team under its nominal is never left behind a borrower
    for job in heads(waiting):
        if not owed(limits, before, job):
            continue
        assert admitted, f"{job.job_id} of {job.team} is owed its nominal, and nothing was admitted"
        first = admitted[0]
        assert within_nominal(limits, before, first) and order(first) <= order(job), (first, job)
        mine = [a for a in admitted if a.team == job.team and a != job]
        if job not in admitted and not mine:  # its own team's other queue may have taken its room
            for limit in (limit for limit in limits if limit.counts(job.zone) and limit.shares):
                for other in {a.team for a in admitted if limit.counts(a.zone)} - {job.team}:
                    assert held(limit, after, other) <= limit.nominal(other), (job.job_id, limit.where, other)
    # (6) the simulator's quota check accepts every admitted job beside every other holder
    records = {h.job_id: qr(h.job_id, h.zone, h.chips, n) for n, h in enumerate(after)}
    for job in admitted:
        others = holdings(r for job_id, r in records.items() if job_id != job.job_id)
        assert shortfall(world.book, others, records[job.job_id]) is None, (job.job_id, world.quotas)


def plan(world: World, holders: Iterable[Holder], waiting: Iterable[Waiting]) -> Round:
    return plan_round(POOL, world.limits, list(holders), list(waiting))


@EXAMPLES
@given(world=worlds(), data=st.data())
def test_rounds_keep_every_limit_share_and_promise(world: World, data: st.DataObject) -> None:
    """(1) to (4) and (6), after every round of a random pool's life: jobs arrive, holders end, rounds admit."""
    pool = Pool(world)
    idle = data.draw(st.sets(st.sampled_from(TEAMS)), label="idle teams")  # hold nothing at first: lenders
    for job in data.draw(st.lists(jobs(["", *sorted(set(TEAMS) - idle)]), max_size=30), label="holders"):
        pool.hold(job)
    taken_back = 0
    for round_no in range(data.draw(st.integers(1, 5), label="rounds")):
        for job in data.draw(st.lists(jobs(), max_size=10), label="submitted"):
            pool.submit(job)
        if pool.holders:
            for job_id in data.draw(st.sets(st.sampled_from(sorted(pool.holders)), max_size=3), label="ended"):
                del pool.holders[job_id]
        before, waiting = list(pool.holders.values()), list(pool.waiting.values())
        found = plan(world, before, waiting)
        taken_back += sum(len(admit.reclaimed) for admit in found.admitted)
        pool.run(found, round_no)
        check_round(world, before, waiting, found, list(pool.holders.values()))
    target(float(taken_back), label="holders taken back")  # steer the search to reclaims, the rare case


@EXAMPLES
@given(world=worlds(), data=st.data())
def test_the_plan_is_the_same_whatever_order_its_input_comes_in(world: World, data: st.DataObject) -> None:
    """(5) Determinism: the pool's holders and queue come in any order (Firestore's, a retry's)."""
    pool = Pool(world)
    for job in data.draw(st.lists(jobs(), max_size=12), label="holders"):
        pool.hold(job)
    for job in data.draw(st.lists(jobs(), max_size=16), label="submitted"):
        pool.submit(job)
    holders, waiting = list(pool.holders.values()), list(pool.waiting.values())
    shuffled = plan(world, data.draw(st.permutations(holders)), data.draw(st.permutations(waiting)))
    assert shuffled == plan(world, holders, waiting)


def test_the_plan_is_the_same_whatever_order_jobs_submitted_in_the_same_instant_come_in() -> None:
    """Two jobs of one team's queue with the same priority and submission time: the queue's
    order, and so the plan, must not depend on which the pool's query returned first."""
    limits = pool_limits(QuotaBook({ZONES[0]: {"v4": 4}}).limits(POOL), REGION, {})
    same = [Waiting(job_id, "team-a", ZONES[0], 4, "medium", T0, 1) for job_id in ("first", "second")]
    assert plan_round(POOL, limits, [], same) == plan_round(POOL, limits, [], list(reversed(same)))


def test_the_victim_is_the_same_whatever_order_holders_started_in_the_same_instant_come_in() -> None:
    """Two borrowers' jobs started in the same instant: which one is reclaimed must not depend
    on the order the pool document lists its holders in."""
    shares = {ZONES[0]: {t: Share(ZONES[0], "v4", "on-demand", 4) for t in ("team-a", "team-b")}}
    limits = pool_limits(QuotaBook({ZONES[0]: {"v4": 8}}).limits(POOL), REGION, shares)
    holders = [Holder(job_id, 4, 1, "medium", T0, True, ZONES[0], "team-a") for job_id in ("a1", "a2")]
    arriving = [Waiting("b1", "team-b", ZONES[0], 4, "medium", T0 + timedelta(minutes=1), 1)]
    assert plan_round(POOL, limits, holders, arriving) == plan_round(POOL, limits, list(reversed(holders)), arriving)


def test_a_held_job_is_counted_as_the_simulator_counts_its_queued_resource() -> None:
    """The bridge (6) relies on: a v4 slice of N chips holds N chips of the job's pool and zone."""
    record = qr("j", ZONES[1], 8, 0)
    assert holdings([record]) == {POOL: [(ZONES[1], 8)]}
    assert replace(record, holds_capacity=False).quota_demand() == {POOL: 8}


def test_a_team_under_its_nominal_takes_back_a_zones_borrower_that_the_regions_turn_passed_over() -> None:
    """team-a is under its nominal under both limits; team-u borrows in the zone (no nominal
    there) but not in the region, team-v borrows in the region from another zone. Taking back
    u1 makes room under both: a take-back that looks at each holder once, for the region's
    limit first, passes u1 over and then finds no one for the zone's."""
    team_a, zone_a, zone_b = "team-a", ZONES[0], ZONES[1]
    quotas = {REGION: {"v4": 16}, zone_a: {"v4": 8}}
    shares = {
        REGION: {team_a: Share(REGION, "v4", "on-demand", 8), "team-u": Share(REGION, "v4", "on-demand", 8)},
        zone_a: {team_a: Share(zone_a, "v4", "on-demand", 8)},
    }
    limits = pool_limits(QuotaBook(quotas).limits(POOL), REGION, shares)

    def holder(job_id: str, team: str, zone: str, minute: int, evictable: bool = True) -> Holder:
        return Holder(job_id, 4, 1, "medium", T0 + timedelta(minutes=minute), evictable, zone, team)

    holders = [
        holder("a0", team_a, zone_a, 0, evictable=False),
        holder("u1", "team-u", zone_a, 3),  # the newest: looked at first
        holder("u2", "team-u", zone_b, 1),
        holder("v1", "team-v", zone_b, 2),
    ]
    job = Waiting("a1", team_a, zone_a, 4, "medium", T0 + timedelta(minutes=5), 1)
    assert owed(limits, holders, job)
    found = plan_round(POOL, limits, holders, [job])
    assert [a.job.job_id for a in found.admitted] == ["a1"], found.held_back
    assert "u1" in {h.job_id for a in found.admitted for h in a.reclaimed}

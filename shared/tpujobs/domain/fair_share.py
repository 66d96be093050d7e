"""Admission by share: which waiting jobs get a pool's chips, in what order, and whom they take back.

Teams (`domain.teams`) hold a nominal share of a quota limit, may borrow others' idle chips up to
their borrowing limit, and lend their own up to their lending limit. A team under its nominal is
admitted before any borrower, and takes back chips lent to borrowers (reclaim); among borrowers
the lowest weighted share goes first, then priority, then age. Within a team the queue is strict
per limit, as it was for the whole pool before teams. See docs/teams.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from tpujobs.domain.admission import EVICTING_PRIORITIES, Holder, waiting_reason
from tpujobs.domain.grace import parse_held_holder
from tpujobs.domain.quotas import Limits, PoolKey, Scope
from tpujobs.domain.spec import PRIORITY_RANK

if TYPE_CHECKING:
    from tpujobs.domain.teams import Share


@dataclass(frozen=True)
class Waiting:
    """A QUEUED job as admission orders it: a projection of its document, every one of the pool's."""

    job_id: str
    team: str
    zone: str
    chips: int
    priority: str
    created_at: datetime
    attempt: int
    state_reason: str = ""
    evictable: bool = True  # not `on_preemption: fail`: admitted, it may be evicted or reclaimed


@dataclass(frozen=True)
class Limit:
    """One limit of a pool as admission sees it: its chips, and the teams' shares of them (none:
    a plain limit, first come by priority and age)."""

    where: str  # a zone, or the region
    scope: Scope
    chips: int
    shares: Mapping[str, Share]

    def counts(self, zone: str) -> bool:
        """Whether chips in `zone` count under this limit."""
        return self.scope == "region" or zone == self.where

    @property
    def unassigned(self) -> int:
        """Chips no team holds as nominal: all that jobs of no team may draw on."""
        return max(0, self.chips - sum(s.nominal for s in self.shares.values()))

    def nominal(self, team: str) -> int:
        share = self.shares.get(team)
        return share.nominal if share else 0

    def kept(self, team: str) -> int:
        """Chips of the team's nominal it never lends (`nominal - lending_limit`)."""
        share = self.shares.get(team)
        if share is None or share.lending_limit is None:
            return 0
        return max(0, share.nominal - share.lending_limit)


def pool_limits(limits: Limits, region: str, shares: Mapping[str, Mapping[str, Share]]) -> list[Limit]:
    """The pool's limits, region first, each with the teams' shares of it (`TeamBook.shares_of`)."""
    found = []
    if limits.total is not None:
        found.append(Limit(region, "region", limits.total, shares.get(region, {})))
    for zone, chips in sorted(limits.zones.items()):
        found.append(Limit(zone, "zone", chips, shares.get(zone, {})))
    return found


class _Tally:
    """Chips held under each limit, in all and per team, as a round hands them out and takes them back."""

    def __init__(self, limits: Sequence[Limit], holders: Iterable[Holder], elsewhere: Mapping[str, float] = {}) -> None:
        self.limits = list(limits)
        self.elsewhere = elsewhere  # each team's share in its other pools: the dominant one counts
        self.total = [0] * len(self.limits)
        self.stopping = [0] * len(self.limits)  # held over while their hosts stop or save: no one's share
        self.by_team: list[dict[str, int]] = [{} for _ in self.limits]
        self.idle_kept_total = [sum(limit.kept(t) for t in limit.shares) for limit in self.limits]
        self._shares: dict[str, float] = {}  # `share`'s answers, forgotten when the team's chips change
        self.holders: dict[str, Holder] = {}
        self.of_team: dict[str, dict[str, Holder]] = {}  # the same holders by team: an eviction looks at its own
        for holder in holders:
            self.add(holder)

    def add(self, holder: Holder) -> None:
        self._count(holder, 1)
        self.holders[holder.job_id] = holder
        self.of_team.setdefault(holder.team, {})[holder.job_id] = holder

    def remove(self, holder: Holder) -> None:
        if self.holders.pop(holder.job_id, None) is not None:
            self._count(holder, -1)
            del self.of_team[holder.team][holder.job_id]

    def _count(self, holder: Holder, sign: int) -> None:
        self._shares.pop(holder.team, None)
        for i, limit in enumerate(self.limits):
            if limit.counts(holder.zone):
                self.total[i] += sign * holder.chips
                if parse_held_holder(holder.job_id) is not None:  # on its way out: counted, in no share
                    self.stopping[i] += sign * holder.chips
                    continue
                teams = self.by_team[i]
                kept, was = limit.kept(holder.team), teams.get(holder.team, 0)
                teams[holder.team] = was + sign * holder.chips
                self.idle_kept_total[i] += max(0, kept - teams[holder.team]) - max(0, kept - was)

    def held(self, i: int, team: str) -> int:
        return self.by_team[i].get(team, 0)

    def idle_kept(self, i: int, but: str) -> int:
        """Idle chips the other teams keep for themselves (their nominal past their lending limit)."""
        return self.idle_kept_total[i] - max(0, self.limits[i].kept(but) - self.held(i, but))

    def borrowing(self, i: int, team: str) -> bool:
        return self.held(i, team) > self.limits[i].nominal(team)

    def share(self, team: str) -> float:
        """The team's dominant weighted share: its highest held / (nominal x weight) over the
        limits that have shares (a limit where it has none counts as a nominal of one chip)."""
        if team in self._shares:
            return self._shares[team]
        found = self.elsewhere.get(team, 0.0)
        for i, limit in enumerate(self.limits):
            if limit.shares:
                share = limit.shares.get(team)
                weight = share.weight if share else 1.0
                found = max(found, self.held(i, team) / (max(limit.nominal(team), 1) * weight))
        self._shares[team] = found
        return found


@dataclass(frozen=True)
class Admit:
    """A job the round admits, with the holders that make room for it."""

    job: Waiting
    evicted: tuple[Holder, ...] = ()  # its own team's lower priorities (a high or very-high job)
    reclaimed: tuple[Holder, ...] = ()  # other teams' borrowed chips, taken back for its nominal share


@dataclass(frozen=True)
class Round:
    """What one admission round does with a pool's queue."""

    admitted: tuple[Admit, ...] = ()
    held_back: Mapping[str, str] = field(default_factory=dict)  # job id -> why it waits (each team's head per zone)
    too_big: tuple[Waiting, ...] = ()  # bigger than a whole limit now: they move on or fail


_Failure = tuple[int, str]  # the index of the limit a job does not fit under, and how
_Candidate = tuple[tuple[int, float, int, datetime, str], Waiting, tuple[Holder, ...], tuple[Holder, ...]]


def plan_round(
    pool: PoolKey,
    limits: Sequence[Limit],
    holders: Iterable[Holder],
    waiting: Iterable[Waiting],
    paused: Mapping[str, str] | None = None,
    elsewhere: Mapping[str, float] | None = None,
) -> Round:
    """Admit the pool's waiting jobs while they fit, in share order (see the module's docstring).

    Every waiting job is looked at: each team's queue per zone is strict (priority, then age), so
    only its head can go; a head that cannot closes its queue for the round, and says why. A team
    under its nominal that cannot get in (its chips are held by jobs that cannot be taken back)
    keeps those limits from borrowers for the round. `paused`: teams whose new jobs wait, with why.
    `elsewhere`: each team's weighted share in its other pools (`team_shares`), so the dominant
    one, across families, orders borrowers.
    """
    tally = _Tally(limits, holders, elsewhere or {})
    queues: dict[tuple[str, str], list[Waiting]] = {}
    for job in sorted(waiting, key=lambda j: (-PRIORITY_RANK[j.priority], j.created_at, j.job_id), reverse=True):
        queues.setdefault((job.team, job.zone), []).append(job)  # each queue's head last, for pop()
    admitted: list[Admit] = []
    held_back: dict[str, str] = {}
    too_big: list[Waiting] = []
    reserved: set[int] = set()  # limits an under-nominal team waits in: no borrower goes there this round
    while True:
        best: _Candidate | None = None
        for key, queue in list(queues.items()):
            while queue and _too_big(limits, queue[-1]):
                too_big.append(queue.pop())
            if not queue:
                continue
            job = queue[-1]
            relevant = [i for i, limit in enumerate(limits) if limit.counts(job.zone)]
            found = _candidate(pool, tally, job, relevant, reserved, paused or {})
            if isinstance(found, str):
                held_back[job.job_id] = found
                del queues[key]
                continue
            if best is None or found[0] < best[0]:
                best = found
        if best is None:
            return Round(tuple(admitted), held_back, tuple(too_big))
        _, job, evicted, reclaimed = best
        for victim in (*evicted, *reclaimed):
            tally.remove(victim)
        tally.add(Holder(job.job_id, job.chips, job.attempt, job.priority, job.created_at, False, job.zone, job.team))
        queues[(job.team, job.zone)].pop()
        admitted.append(Admit(job, evicted, reclaimed))


def team_shares(limits: Sequence[Limit], holders: Iterable[Holder]) -> dict[str, float]:
    """Each team's weighted share of one pool (its highest over the pool's limits with shares)."""
    tally = _Tally(limits, holders)
    teams = {team for counted in tally.by_team for team in counted} | {t for limit in limits for t in limit.shares}
    return {team: tally.share(team) for team in teams if team}


def _too_big(limits: Sequence[Limit], job: Waiting) -> bool:
    """Bigger than a whole limit (lowered after it was submitted; 0 is a pause, not a size)."""
    return any(0 < limit.chips < job.chips for limit in limits if limit.counts(job.zone))


def _candidate(
    pool: PoolKey, tally: _Tally, job: Waiting, relevant: list[int], reserved: set[int], paused: Mapping[str, str]
) -> _Candidate | str:
    """How `job` could be admitted now (its order key and the holders it takes), or why it waits."""
    if job.team in paused:
        return paused[job.team]
    limits = tally.limits
    shared = [i for i in relevant if limits[i].shares]
    within = bool(job.team and shared) and all(
        tally.held(i, job.team) + job.chips <= limits[i].nominal(job.team) for i in shared
    )
    order = (0, 0.0) if within else (1, tally.share(job.team))
    key = (*order, -PRIORITY_RANK[job.priority], job.created_at, job.job_id)
    failure = _failure(tally, job, relevant, reserved)
    if failure is None:
        return key, job, (), ()
    if within:  # its nominal share: take back what borrowers hold
        borrowers = [t for t in tally.of_team if t != job.team and any(tally.borrowing(i, t) for i in relevant)]
        borrowed = [h for team in borrowers for h in tally.of_team[team].values()]
        taken = _take_back(
            tally, job, relevant, reserved, lambda h, i: h.team != job.team and tally.borrowing(i, h.team), borrowed
        )
        if taken is not None:
            return key, job, (), taken
        reserved.update(shared)
    elif job.priority in EVICTING_PRIORITIES:
        rank = PRIORITY_RANK[job.priority]
        own = tally.of_team.get(job.team, {}).values()
        taken = _take_back(tally, job, relevant, reserved, lambda h, i: h.team == job.team and h.rank < rank, own)
        if taken is not None:
            return key, job, taken, ()
    return _why(pool, tally, job, failure, within)


def _failure(tally: _Tally, job: Waiting, relevant: list[int], reserved: set[int]) -> _Failure | None:
    """The first limit `job` does not fit under now, and how; None: it fits under all."""
    team, chips = job.team, job.chips
    for i in relevant:
        limit = tally.limits[i]
        held = tally.held(i, team)
        if tally.total[i] + chips > limit.chips:
            return i, "full"
        if not limit.shares or (team and held + chips <= limit.nominal(team)):
            continue
        if i in reserved:
            return i, "reserved"
        if not team:
            if held + chips > limit.unassigned:
                return i, "unassigned"
            continue
        share = limit.shares.get(team)
        if share and share.borrowing_limit is not None and held + chips - share.nominal > share.borrowing_limit:
            return i, "borrowing"
        if tally.total[i] + tally.idle_kept(i, team) + chips > limit.chips:
            return i, "kept"
    return None


def _take_back(
    tally: _Tally,
    job: Waiting,
    relevant: list[int],
    reserved: set[int],
    may_take: Callable[[Holder, int], bool],
    among: Iterable[Holder] | None = None,
) -> tuple[Holder, ...] | None:
    """The holders to stop so `job` fits: lowest priority and most recently started first, each
    one counted under the limit that holds the job back now (and that `may_take` allows there),
    then any no longer needed given back; None when stopping every one of them would not do. The
    tally is left as it was."""
    candidates = sorted(
        (h for h in (tally.holders.values() if among is None else among) if h.evictable and h.job_id != job.job_id),
        key=lambda h: (h.rank, -h.since.timestamp(), h.job_id),
    )
    taken: list[Holder] = []
    try:
        failure = _failure(tally, job, relevant, reserved)
        while failure is not None and failure[1] == "full":
            i = failure[0]
            pick = next(
                (h for h in candidates if h not in taken and tally.limits[i].counts(h.zone) and may_take(h, i)), None
            )
            if pick is None:
                return None
            tally.remove(pick)
            taken.append(pick)
            failure = _failure(tally, job, relevant, reserved)
        if failure is not None or not taken:
            return None
        for holder in list(taken):  # one taken for an earlier limit may not be needed after all
            tally.add(holder)
            if _failure(tally, job, relevant, reserved) is None:
                taken.remove(holder)
            else:
                tally.remove(holder)
        return tuple(taken)
    finally:
        for holder in taken:
            tally.add(holder)


def _why(pool: PoolKey, tally: _Tally, job: Waiting, failure: _Failure, within: bool) -> str:
    """Why a team's head waits: the limit, and the team's position under it. The same words while
    nothing changes, so saying it again writes nothing."""
    i, how = failure
    limit = tally.limits[i]
    if not limit.shares:
        return waiting_reason(pool, limit.scope, job.zone, limit.chips, job.chips)
    chips = pool.chips_of(job.zone if limit.scope == "zone" else pool.region)
    needs = f"Waiting for quota: needs {job.chips} {chips}"
    team = job.team
    if not team:
        held = tally.held(i, "")
        free = f"the {limit.unassigned} chips no team holds as nominal"
        return f"{needs}; jobs of no team draw only on {free}, and hold {held}."
    if how == "reserved":
        return f"{needs}; a team under its nominal share waits for chips there first."
    nominal, held = limit.nominal(team), tally.held(i, team)
    if within:
        stopping = tally.stopping[i]
        rest = (
            f"{stopping} chips are still held by jobs stopping within their grace"
            if stopping
            else "the rest are held by jobs that cannot be taken back yet"
        )
        return f"{needs}; {team} holds {held} of its {nominal} nominal chips, and {rest}."
    return f"{needs}; {team} {_holds(held, nominal)} and may borrow {_may_borrow(tally, i, team)} more."


def _holds(held: int, nominal: int) -> str:
    if held == nominal:
        return f"holds its {nominal} nominal chips"
    if held > nominal:
        return f"holds {held} chips, {held - nominal} past its {nominal} nominal"
    return f"holds {held} of its {nominal} nominal chips"


def _may_borrow(tally: _Tally, i: int, team: str) -> int:
    """Chips past its nominal the team could hold now: others' idle, lendable chips, up to its borrowing limit."""
    limit = tally.limits[i]
    held, nominal = tally.held(i, team), limit.nominal(team)
    free = limit.chips - tally.total[i] - tally.idle_kept(i, team) - max(0, nominal - held)
    share = limit.shares.get(team)
    room = (
        free
        if share is None or share.borrowing_limit is None
        else min(free, share.borrowing_limit - max(0, held - nominal))
    )
    return max(0, room)

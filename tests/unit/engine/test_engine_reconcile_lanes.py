"""A reconcile fan-out that fits its function, on the fakes and the TPU simulator: a tick with more
shards than the reconcile function takes at once runs them in lanes, never more in flight than
`reconcile_shards_in_flight`, so Cloud Run never refuses one and none is dead-lettered.

`PushedFunction` stands for Pub/Sub push in front of a Cloud Run function of N instances x
concurrency, in simulated seconds: a request over capacity waits in Cloud Run's queue for
QUEUE_S, then fails (429); each failure is a delivery attempt, retried with the subscription's
exponential backoff, and the fifth dead-letters the message (infra/pubsub.tf).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from engine_harness import ZONE, Engine

from tpujobs.domain import shards as sharding
from tpujobs.domain.shards import Shard, ShardError
from tpujobs.engine.errors import TransientError
from tpujobs.engine.topology import RECONCILE
from tpujobs.local.testing import ManualClock, inbound

OTHER = "us-east5-a"
INSTANCES = 3  # the reconcile function's max instances in these tests (production: 20)
CONCURRENCY = 1  # requests an instance takes at once (production: 1)
CAP = INSTANCES * CONCURRENCY - 1  # as infra/ sets TPUJOBS_RECONCILE_SHARDS_IN_FLIGHT: one kept for the tick
QUEUE_S = 10.0  # how long Cloud Run holds a request over capacity before it answers 429
MIN_BACKOFF_S, MAX_BACKOFF_S, MAX_ATTEMPTS = 10.0, 60.0, 5  # infra/pubsub.tf
LATENCY_S = 0.1  # from a publish to its push
# Simulated run times, chosen so that no finish ever ties a deadline: the tick's own phases, and
# a shard's (a slow one: about what bench/reconcile.py measures for 500 jobs on this machine).
TICK_S = 3.7
SHARD_S = 7.3
SLOW_SHARD_S = 29.3


@dataclass(order=True)
class _Event:
    at: float
    seq: int
    kind: str = field(compare=False)  # "push", "timeout", "done"
    message: _Message | None = field(compare=False, default=None)
    published: list[Shard] = field(compare=False, default_factory=list)


@dataclass(eq=False)
class _Message:
    message_id: str
    data: bytes
    attempts: int = 0
    waiting: bool = False


class PushedFunction:
    """Pub/Sub push into a Cloud Run function of `capacity` requests at once, in simulated time:
    the reconciler's shard port publishes into it, and each request runs `reconciler.handle` at
    its start, holding its slot for as long as its reads moved the clock on (`_Slow`)."""

    def __init__(self, jobs: Engine, clock: ManualClock, capacity: int, shard_s: float = SHARD_S) -> None:
        reconciler = jobs.reconciler(store=_Slow(jobs.store, clock, shard_s))
        self.reconciler = reconciler
        self.clock = clock
        self.start = clock.now
        self.capacity = capacity
        self.now = 0.0
        self._events: list[_Event] = []
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self._queue: list[_Message] = []  # held by Cloud Run, oldest first
        self._running = {True: 0, False: 0}  # requests running, by whether each is a shard
        self._outbox: list[Shard] | None = None  # what the running handler publishes
        self.refused = 0  # 429s
        self.dead_lettered: list[bytes] = []
        self.most_shards_in_flight = 0  # running or held by Cloud Run
        self.shards_run: list[str] = []
        reconciler.shards = self

    # -- the shard port ---------------------------------------------------------------------------

    def publish_shards(self, shards: list[Shard]) -> None:
        assert self._outbox is not None, "shards are published only by a running request"
        self._outbox.extend(shards)

    # -- the simulation -------------------------------------------------------------------------

    def tick_at(self, at: float) -> None:
        """Cloud Scheduler's message at `at` simulated seconds."""
        self._push(_Message(str(next(self._ids)), b"{}"), at)

    def run(self) -> None:
        while self._events:
            event = heapq.heappop(self._events)
            self.now = event.at
            if event.kind == "push":
                self._arrive(event.message)
            elif event.kind == "timeout":
                self._refuse(event.message)
            else:
                self._finish(event.message, event.published)

    def _push(self, message: _Message | None, at: float) -> None:
        heapq.heappush(self._events, _Event(at, next(self._seq), "push", message))

    def _arrive(self, message: Any) -> None:
        if sum(self._running.values()) < self.capacity:
            self._begin(message)
            return
        message.waiting = True
        self._queue.append(message)
        self._count_in_flight()
        heapq.heappush(self._events, _Event(self.now + QUEUE_S, next(self._seq), "timeout", message))

    def _refuse(self, message: Any) -> None:
        if not message.waiting:
            return  # it got an instance in time
        message.waiting = False
        self._queue.remove(message)
        self.refused += 1
        message.attempts += 1
        if message.attempts >= MAX_ATTEMPTS:
            self.dead_lettered.append(message.data)
            return
        backoff = min(MIN_BACKOFF_S * 2 ** (message.attempts - 1), MAX_BACKOFF_S)
        self._push(message, self.now + backoff)

    def _begin(self, message: Any) -> None:
        is_shard = _is_shard(message)
        self._running[is_shard] += 1
        self._count_in_flight()
        began = self.clock.now = self.start + timedelta(seconds=self.now)
        self._outbox = []
        report = self.reconciler.handle(inbound(RECONCILE, message.data, message.message_id))
        published, self._outbox = self._outbox, None
        if is_shard:
            self.shards_run += report.shards
        took = (self.clock.now - began).total_seconds()  # the reads moved the clock on
        heapq.heappush(self._events, _Event(self.now + took, next(self._seq), "done", message, published))

    def _finish(self, message: Any, published: list[Shard]) -> None:
        self._running[_is_shard(message)] -= 1
        for shard in published:  # what the handler published reaches Pub/Sub as it answers
            self._push(_Message(str(next(self._ids)), json.dumps(shard.message()).encode()), self.now + LATENCY_S)
        if self._queue:  # Cloud Run hands the freed slot to the request it has held longest
            held = self._queue.pop(0)
            held.waiting = False
            self._begin(held)

    def _count_in_flight(self) -> None:
        held = sum(1 for message in self._queue if _is_shard(message))
        self.most_shards_in_flight = max(self.most_shards_in_flight, self._running[True] + held)


def _is_shard(message: _Message) -> bool:
    return sharding.decode(message.data) is not None


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def fleet(engine: Any, clock: ManualClock, **settings: Any) -> Engine:
    """Eleven jobs in two zones, shards of one job: thirteen shards with the default zone."""
    jobs = engine(clock=clock, reconcile_shard_size=1, **settings)
    for n in range(11):
        zone = ZONE if n % 2 else OTHER
        body = {"job_id": f"job-{n:02d}", "name": "train", "owner": "ada@example.com", "accelerator_type": "v4-8",
                "command": "x", "zone": zone}  # fmt: skip
        assert jobs.submit(body).kind == "provisioning"
    return jobs


def test_more_shards_than_the_function_takes_run_in_lanes_and_none_is_refused(engine, clock):
    """Thirteen shards for a function of three requests at once: the tick publishes two lane
    heads, each shard hands on the next of its lane, so at most two shards are ever in flight
    (running or held by Cloud Run), no request is refused and none is dead-lettered, and every
    shard of the plan runs exactly once."""
    jobs = fleet(engine, clock, reconcile_shards_in_flight=CAP)
    function = PushedFunction(jobs, clock, INSTANCES * CONCURRENCY)
    plan = [shard.name for shard in _plan(jobs, clock)]
    assert len(plan) > INSTANCES * CONCURRENCY * 3  # several waves

    function.tick_at(0.0)
    function.run()

    assert function.most_shards_in_flight == CAP
    assert function.refused == 0 and function.dead_lettered == []
    assert sorted(function.shards_run) == sorted(plan)


def test_slow_shards_in_lanes_are_never_refused_and_later_ticks_cover_the_rest(engine, clock):
    """The same thirteen shards, each as slow as a 500-job shard, one tick a minute: a tick's
    lanes stop when the next tick begins, with shards left; nothing is refused, never more than
    two shards are in flight, and as each tick begins one wave further on, every shard has run
    within seven ticks."""
    clock.now = clock.now.replace(second=0, microsecond=0)  # on the minute, as Cloud Scheduler ticks
    jobs = fleet(engine, clock, reconcile_shards_in_flight=CAP, reconcile_tick_seconds=60.0)
    function = PushedFunction(jobs, clock, INSTANCES * CONCURRENCY, SLOW_SHARD_S)
    plan = [shard.name for shard in _plan(jobs, clock)]
    ticks = -(-len(plan) // CAP)  # one wave further on each tick: round up

    for n in range(ticks):
        function.tick_at(60.0 * n)
    function.run()

    assert function.most_shards_in_flight == CAP
    assert function.refused == 0 and function.dead_lettered == []
    assert len(function.shards_run) < ticks * len(plan)  # each tick was cut short by the next
    assert set(function.shards_run) == set(plan)


def test_the_same_tick_published_at_once_is_refused(engine, clock):
    """The check above can fail: with every shard published at once (the fan-out before lanes),
    Cloud Run holds more than it takes and refuses the excess, each refusal a delivery attempt
    toward the dead-letter limit."""
    jobs = fleet(engine, clock, reconcile_shards_in_flight=100)
    function = PushedFunction(jobs, clock, INSTANCES * CONCURRENCY, SLOW_SHARD_S)

    function.tick_at(0.0)
    function.run()

    assert function.most_shards_in_flight > INSTANCES * CONCURRENCY
    assert function.refused > 0


def test_a_shard_whose_run_fails_hands_nothing_on_until_it_runs_again(engine, clock):
    """The next shard of a lane is published only after the shard's own work: a shard whose
    read fails raises (Pub/Sub redelivers it) and publishes nothing; its redelivery runs it and
    publishes its successor once, with the rest of the lane."""
    jobs = fleet(engine, clock)
    published: list[Shard] = []
    failing = _FailingReads(jobs.store)
    reconciler = jobs.reconciler(store=failing, shards=_Collect(published))
    first, second, third = _plan(jobs, clock)[:3]
    shard = Shard(first.zone, first.after, first.through, clock.now.isoformat(), (second, third))
    message = inbound(RECONCILE, shard.message())

    failing.failing = True
    with pytest.raises(TransientError):
        reconciler.handle(message)
    assert published == []
    failing.failing = False
    reconciler.handle(message)

    assert published == [Shard(second.zone, second.after, second.through, shard.tick, (third,))]


def test_a_lane_stops_once_a_newer_tick_has_begun(engine, clock):
    """A lane still going when its tick is `reconcile_tick_seconds` old runs its shard and hands
    nothing on: the newer tick's lanes cover the same jobs. Younger, it hands on."""
    jobs = fleet(engine, clock, reconcile_tick_seconds=60.0)
    published: list[Shard] = []
    reconciler = jobs.reconciler(shards=_Collect(published))
    first, second = _plan(jobs, clock)[:2]
    shard = Shard(first.zone, first.after, first.through, clock.now.isoformat(), (second,))

    clock.advance(59.0)
    assert reconciler.handle(inbound(RECONCILE, shard.message())).shards == [first.name]
    assert [s.name for s in published] == [second.name]
    clock.advance(1.0)
    assert reconciler.handle(inbound(RECONCILE, shard.message())).shards == [first.name]
    assert len(published) == 1


def test_lanes_share_a_plan_out_once_each_in_waves():
    """`lanes` cuts a plan into at most `width` lanes: shard i in lane i % width, in order; the
    heads carry the tick, the rest ride in `then`; together they hold every shard once."""
    plan = [Shard(ZONE, f"job-{n}", f"job-{n + 1}", "t") for n in range(7)]
    heads = sharding.lanes(plan, 3)
    assert [head.name for head in heads] == [shard.name for shard in plan[:3]]
    assert all(head.tick == "t" for head in heads)
    assert [[s.name for s in head.then] for head in heads] == [
        [plan[3].name, plan[6].name],
        [plan[4].name],
        [plan[5].name],
    ]
    walked = []
    for head in heads:
        shard: Shard | None = head
        while shard is not None:
            walked.append(shard.name)
            shard = shard.next()
    assert sorted(walked) == sorted(shard.name for shard in plan)
    assert sharding.lanes(plan[:2], 3) == plan[:2]  # fewer shards than lanes: each its own
    with pytest.raises(ValueError, match="at least 1"):
        sharding.lanes(plan, 0)


def test_a_lane_round_trips_through_its_message():
    """A shard with the rest of its lane decodes to itself."""
    shard = Shard(ZONE, "", "job-3", "2026-01-01T00:00:00.000+00:00", (Shard(ZONE, "job-3"), Shard(OTHER)))
    assert sharding.decode(json.dumps(shard.message()).encode()) == shard


@pytest.mark.parametrize(
    ("then", "field"),
    [
        ("us-east5-a", "shard.then"),
        ([["us-east5-a", ""]], "shard.then[0]"),
        ([["Not A Zone", "", ""]], "shard.then[0]"),
        ([[ZONE, "", ""], [ZONE, "job-b", "job-a"]], "shard.then[1].through"),
        ([[ZONE, "bad id!", ""]], "shard.then[0]"),
    ],
)
def test_a_malformed_lane_is_refused_with_the_field_named(then, field):
    """Each bad part of `then` is a ShardError naming it, so the message is recorded, not retried."""
    body = {"shard": {"zone": ZONE, "after": "", "through": "", "then": then}}
    with pytest.raises(ShardError) as raised:
        sharding.decode(json.dumps(body).encode())
    assert f"'{field}'" in str(raised.value)


def _plan(jobs: Engine, clock: ManualClock) -> list[Shard]:
    """The tick's plan as the coordinator cuts it: every shard, before lanes, without its tick."""
    collected: list[Shard] = []
    reconciler = jobs.reconciler(shards=_Collect(collected))
    reconciler.settings = dataclasses.replace(reconciler.settings, reconcile_shards_in_flight=1000)
    reconciler.coordinate()
    return [Shard(shard.zone, shard.after, shard.through) for shard in collected]


class _Collect:
    def __init__(self, into: list[Shard]) -> None:
        self.into = into

    def publish_shards(self, shards: list[Shard]) -> None:
        self.into.extend(shards)


class _Slow:
    """The job store, whose reads take simulated time: the tick's TICK_S, a shard's `shard_s`."""

    def __init__(self, store: Any, clock: ManualClock, shard_s: float) -> None:
        self._store = store
        self._clock = clock
        self._shard_s = shard_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def active_placements(self, *args: Any, **kwargs: Any) -> Any:
        self._clock.advance(TICK_S)
        return self._store.active_placements(*args, **kwargs)

    def active_in_shard(self, *args: Any, **kwargs: Any) -> Any:
        self._clock.advance(self._shard_s)
        return self._store.active_in_shard(*args, **kwargs)


class _FailingReads:
    """The job store, whose shard read fails while `failing` (Firestore unreachable)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.failing = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def active_in_shard(self, *args: Any, **kwargs: Any) -> Any:
        if self.failing:
            raise TransientError("Firestore could not be reached")
        return self._store.active_in_shard(*args, **kwargs)

"""One job's messages, each delivered one to three times in any order, then reconciled: the record stays sound.

Pub/Sub promises at-least-once delivery and no order across topics, so the submission, the
agents' started and exited reports of two attempts, their preemption notices, queued-resource
observations and maybe a cancel can reach the handlers in any interleaving, twice or thrice.
Whatever the order, on the fakes, the TPU simulator and the real TPU client:

- every event of the job's timeline is a move the transition table allows (for some event),
  with consecutive sequence numbers, and its attempts never go back;
- the simulator was asked to create each `{job_id}-a{N}` at most once;
- after a couple of reconciler ticks, a terminal job holds no live queued resource and an
  active one holds at most its current one.
"""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timezone
from typing import Any

import pytest
from engine_harness import ZONE, Engine
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tpujobs.domain.naming import parse_queued_resource_name
from tpujobs.domain.states import TERMINAL, TRANSITIONS, JobState
from tpujobs.engine.inbound import InboundMessage
from tpujobs.local.simulator.client import SimulatorControl

OWNER = "ada@example.com"
ALLOWED = {(before, after) for (before, _), targets in TRANSITIONS.items() for after in targets}
QR_STATES = ["WAITING", "PROVISIONING", "ACTIVE", "ACTIVE", "LOST", "FAILED"]

_ids = itertools.count(700_000)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@pytest.fixture
def jobs(engine) -> Engine:
    """ONE engine for the whole test function; sleeps (restart backoff) return at once."""
    return engine(admins=("root@example.com",), stuck_after_seconds=0.0)


Delivery = tuple[str, str, dict[str, Any]]  # (topic, message id, payload)


@st.composite
def job_messages(draw: st.DrawFn) -> tuple[str, dict[str, Any], list[Delivery]]:
    """A job's spec and every message about it, each 1 to 3 times (same message id), shuffled."""
    job_id = f"shuffle-{next(_ids)}"
    spec = {
        "job_id": job_id,
        "name": "shuffle",
        "owner": OWNER,
        "accelerator_type": draw(st.sampled_from(["v4-8", "v4-16"])),  # one or two worker hosts
        "command": "python train.py",
        "on_preemption": draw(st.sampled_from(["resume", "rerun", "fail"])),
        "on_error": draw(st.sampled_from(["fail", "resume"])),
        "max_restarts": draw(st.integers(0, 3)),
    }
    workers = 2 if spec["accelerator_type"] == "v4-16" else 1
    payloads: list[tuple[str, dict[str, Any]]] = [("tpujobs-submit", spec)]
    for attempt in (1, 2):
        for worker in range(workers):
            where = {"job_id": job_id, "attempt": attempt, "slice_id": 0, "worker_id": worker}
            payloads.append(("tpujobs-worker-events", {"kind": "started", **where}))
            code = draw(st.sampled_from([0, 0, 0, 1]))
            payloads.append(("tpujobs-worker-events", {"kind": "exited", "exit_code": code, **where}))
        if draw(st.integers(0, 3)) > 0:
            payloads.append(("tpujobs-preemption", {"job_id": job_id, "attempt": attempt, "reason": "SIGTERM"}))
    for _ in range(draw(st.integers(0, 3))):
        qr = f"{job_id}-a{draw(st.integers(1, 2))}"
        payloads.append(
            (
                "tpujobs-qr-state",
                {"queued_resource": qr, "zone": ZONE, "state": draw(st.sampled_from(QR_STATES))},
            )
        )
    if draw(st.integers(0, 3)) == 0:
        payloads.append(("tpujobs-control", {"action": "cancel", "job_id": job_id, "owner": OWNER}))
    deliveries = [
        (topic, message_id, payload)
        for topic, payload in payloads
        for message_id in [str(next(_ids))]
        for _ in range(draw(st.integers(1, 3)))
    ]
    return job_id, spec, draw(st.permutations(deliveries))


def simulator_state(simulator_url: str) -> dict[str, Any]:
    return SimulatorControl(simulator_url).state()


def owned_by(job_id: str, name: str) -> bool:
    owner = parse_queued_resource_name(name.rsplit("/", 1)[-1])
    return owner is not None and owner[0] == job_id


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=job_messages())
def test_any_delivery_order_keeps_the_timeline_legal_and_capacity_single(jobs, simulator_url, case) -> None:
    """Duplicated, shuffled messages then two reconciler ticks: legal timeline, one create per attempt, no leak."""
    job_id, spec, deliveries = case
    for topic, message_id, payload in deliveries:
        jobs.handle(InboundMessage(message_id, topic, json.dumps(payload).encode()))  # nothing may raise
    for _ in range(2):
        jobs.tick()

    job = jobs.store.get(job_id)
    assert job is not None, "the submission was delivered at least once"
    assert job.spec.on_preemption == spec["on_preemption"] and job.restarts <= spec["max_restarts"]
    assert job.attempt <= 1 + job.restarts
    timeline = jobs.store.events(job_id)
    assert [e.seq for e in timeline] == list(range(1, len(timeline) + 1)) and len(timeline) == job.event_seq
    assert (timeline[0].from_state, timeline[0].to_state) == (None, JobState.QUEUED)
    illegal = [(e.seq, e.from_state, e.to_state) for e in timeline[1:] if (e.from_state, e.to_state) not in ALLOWED]
    assert illegal == []
    for before, after in itertools.pairwise(timeline):
        assert after.from_state is before.to_state, f"event {after.seq} starts where {before.seq} did not end"
    attempts = [e.attempt for e in timeline]
    assert attempts == sorted(attempts)
    assert job.state is timeline[-1].to_state and job.attempt >= attempts[-1]
    ended = [e.seq for e in timeline if e.to_state in TERMINAL]
    assert ended in ([], [timeline[-1].seq])

    state = simulator_state(simulator_url)
    creates = [
        op["metadata"]["target"].rsplit("/", 1)[-1]
        for op in state["operations"]
        if op["metadata"]["verb"] == "create" and owned_by(job_id, op["metadata"]["target"])
    ]
    assert sorted(creates) == sorted(set(creates)), f"a queued resource was created twice: {creates}"
    live = {
        qr["name"].rsplit("/", 1)[-1]
        for qr in state["queuedResources"]
        if owned_by(job_id, qr["name"]) and qr["state"]["state"] != "DELETING"
    }
    if job.state in TERMINAL:
        assert live == set(), f"a {job.state.value} job still holds {live}"
    else:
        assert live <= {job.queued_resource}, f"a {job.state.value} job at attempt {job.attempt} holds {live}"
    event(f"ends {job.state.value} at attempt {job.attempt}")

    if job.state not in TERMINAL:  # keep later examples' reconciler ticks small
        jobs.cancel(job_id, "Cancelled at the end of the example.")

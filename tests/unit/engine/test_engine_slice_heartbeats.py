"""Heartbeats that scale with slices: the engine's side, on the fakes.

Worker 0 of a multi-host slice heartbeats for its slice (one worker document written), each
live report sets the host's `silent_after` deadline that the reconciler's one query reads,
and worker 0's `peer_silent` loses that peer's host at once.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from engine_harness import Engine

from tpujobs.domain.states import JobState
from tpujobs.engine.jobs.worker_records import SPOKEN_FOR
from tpujobs.local.testing import ManualClock, signed
from tpujobs.local.testing import inbound as message

SPEC = {"job_id": "train-1", "name": "train", "owner": "ada@example.com", "command": "x"}


Clock = ManualClock


def beat(jobs: Engine, kind: str, worker: int, job_id: str = "train-1", **extra: object) -> None:
    payload = {"kind": kind, "job_id": job_id, "attempt": 1, "slice_id": 0, "worker_id": worker, **extra}
    jobs.handle(signed(jobs, "tpujobs-worker-events", payload))


def running_job(jobs: Engine) -> None:
    """A single-host job (v4-8), RUNNING at attempt 1, its `started` from an agent from before."""
    spec = {**SPEC, "accelerator_type": "v4-8"}
    assert jobs.handle(message("tpujobs-submit", spec)).kind == "provisioning"
    beat(jobs, "started", 0)
    assert jobs.store.get("train-1").state is JobState.RUNNING


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def jobs(engine, clock) -> Engine:
    return engine(clock=clock, heartbeat_timeout_seconds=60.0, heartbeat_seconds=10.0, stuck_after_seconds=30.0)


def records(jobs: Engine, job_id: str = "train-1", attempt: int = 1) -> dict[str, object]:
    return {w.worker: w for w in jobs.store.attempt_workers(job_id, attempt)}


def peer_started(jobs: Engine, clock: Clock) -> str:
    """A v4-16 job (one slice of 2 hosts) RUNNING; worker 1's `started` says worker 0 speaks for it."""
    spec = {**SPEC, "accelerator_type": "v4-16"}
    assert jobs.handle(message("tpujobs-submit", spec)).kind == "provisioning"
    beat(jobs, "started", 0, next_report_seconds=10)
    beat(jobs, "started", 1, watch="slice")
    assert jobs.store.get("train-1").state is JobState.RUNNING
    return "train-1"


def test_a_slice_heartbeat_writes_worker_0s_document_alone_with_the_slices_progress(jobs, clock):
    """Worker 0's heartbeat moves its own deadline (the longer of the timeout and two of its periods) and carries the
    slice's latest output and checkpoint; the peer's document is as its `started` left it."""
    peer_started(jobs, clock)
    before = records(jobs)["0-1"]
    clock.advance(20)
    printed, saved = clock.now - timedelta(seconds=3), clock.now - timedelta(seconds=8)
    beat(
        jobs, "heartbeat", 0, next_report_seconds=45, peers_heard=1, step=12,
        last_output_at=printed.isoformat(), checkpoint_at=saved.isoformat(),
    )  # fmt: skip
    found = records(jobs)
    zero = found["0-0"]
    assert zero.silent_after == clock.now + timedelta(seconds=90)  # 2 x 45 s > 60 s
    assert (zero.last_output_at, zero.checkpoint_step, zero.checkpoint_at) == (printed, 12, saved)
    assert found["0-1"] == before
    assert found["0-1"].silent_after == SPOKEN_FOR


def test_a_sparse_heartbeat_keeps_the_timeout_and_a_host_spoken_for_is_never_silent_by_its_record(jobs, clock):
    """Every 30 s, worker 0 is silent 60 s after its last word, as before; worker 1, spoken for, never by its record,
    even 10 minutes on."""
    peer_started(jobs, clock)
    for _ in range(20):
        clock.advance(30)
        beat(jobs, "heartbeat", 0, next_report_seconds=30)
    assert jobs.tick().observed == []
    clock.advance(59)
    assert jobs.store.silent_workers(clock.now) == []
    clock.advance(2)
    assert [w.worker for w in jobs.store.silent_workers(clock.now)] == ["0-0"]


def test_a_reordered_older_report_never_brings_a_deadline_back(jobs, clock):
    """Once worker 0 speaks for a host, a heartbeat of its own handled later (push keeps no order) leaves it so."""
    peer_started(jobs, clock)
    beat(jobs, "heartbeat", 1, next_report_seconds=10)  # from before the ack, handled after
    clock.advance(3600)
    assert records(jobs)["0-1"].silent_after == SPOKEN_FOR
    assert [w.worker for w in jobs.store.silent_workers(clock.now)] == ["0-0"]


def test_a_heartbeat_from_an_agent_from_before_keeps_todays_timeout(jobs, clock):
    """No `next_report_seconds`, no `watch`: silent after heartbeat_timeout_seconds, as before."""
    running_job(jobs)
    clock.advance(30)
    beat(jobs, "heartbeat", 0)
    assert records(jobs)["0-0"].silent_after == clock.now + timedelta(seconds=60)


def test_worker_0s_peer_silent_loses_that_host_at_once(jobs, clock):
    """peer_silent -> CAPACITY_LOST for the peer named: the attempt recovers, by the agent's word, naming the host."""
    peer_started(jobs, clock)
    beat(jobs, "peer_silent", 0, peer_worker_id=1, detail="worker 0-0 heard nothing from it for 11 s")
    job = jobs.store.get("train-1")
    assert (job.state, job.attempt) == (JobState.PROVISIONING, 2)
    lost = [e for e in jobs.store.events("train-1") if e.to_state is JobState.RECOVERING]
    assert len(lost) == 1 and lost[0].source == "agent"
    assert "Worker 0-1" in lost[0].reason and "heard nothing from it for 11 s" in lost[0].reason


def rejected(jobs: Engine, sent) -> str | None:
    found = next((r for r in jobs.store.rejections() if r.message_id == sent.message_id), None)
    return None if found is None else found.reason


@pytest.mark.parametrize(
    ("worker", "peer", "says"),
    [
        (1, 1, "only worker 0"),  # a peer speaks for no one
        (0, 2, "no peer 2"),  # a v4-16 slice has hosts 0 and 1
        (0, 0, "greater than or equal to 1"),  # worker 0 is no peer of its own (the schema says so)
    ],
)
def test_a_peer_silent_from_a_peer_or_about_no_such_peer_is_refused(jobs, clock, worker, peer, says):
    """The job stays RUNNING at attempt 1; the rejection names peer_worker_id and why."""
    peer_started(jobs, clock)
    payload = {"kind": "peer_silent", "job_id": "train-1", "attempt": 1, "slice_id": 0, "worker_id": worker}
    sent = signed(jobs, "tpujobs-worker-events", {**payload, "peer_worker_id": peer})
    assert jobs.handle(sent) is None
    job = jobs.store.get("train-1")
    assert (job.state, job.attempt) == (JobState.RUNNING, 1)
    reason = rejected(jobs, sent)
    assert reason is not None and "peer_worker_id" in reason and says in reason


def test_a_forged_peer_silent_is_refused(jobs, clock):
    """Signed with no key of the attempt's: refused, nothing lost."""
    peer_started(jobs, clock)
    sent = signed(
        jobs, "tpujobs-worker-events",
        {"kind": "peer_silent", "job_id": "train-1", "attempt": 1, "slice_id": 0, "worker_id": 0, "peer_worker_id": 1},
    )  # fmt: skip
    sent = type(sent)(sent.message_id, sent.topic, sent.data, {"tpujobs-signature": "v1=" + "0" * 64})
    assert jobs.handle(sent) is None
    assert jobs.store.get("train-1").state is JobState.RUNNING
    assert rejected(jobs, sent) is not None


def test_worker_0_that_succeeds_while_it_speaks_for_peers_stays_watched_until_silent(jobs, clock):
    """Worker 0's `exited` 0 with `peers_heard`: its record stays live with a deadline its later heartbeats move, so a
    worker 0 that dies then is found silent and its host lost, the reason saying why: its peer is not left unwatched."""
    peer_started(jobs, clock)
    clock.advance(5)
    beat(jobs, "exited", 0, exit_code=0, peers_heard=1, next_report_seconds=10)
    zero = records(jobs)["0-0"]
    assert (zero.live, zero.exit_code, zero.speaks_for_peers) == (True, 0, True)
    assert zero.silent_after == clock.now + timedelta(seconds=60)
    assert jobs.store.get("train-1").state is JobState.RUNNING  # worker 1 still runs
    clock.advance(50)
    beat(jobs, "heartbeat", 0, next_report_seconds=10, peers_heard=1)
    clock.advance(59)
    assert jobs.tick().observed == []
    clock.advance(2)
    observed = jobs.tick().observed
    assert len(observed) == 1 and "0-0 of attempt 1 sent nothing for 61 s after its command ended" in observed[0]
    assert jobs.store.get("train-1").attempt == 2


@pytest.mark.parametrize(
    ("worker", "extra"),
    [
        (0, {"exit_code": 0}),  # heard no peer: it ends
        (0, {"exit_code": 0, "peers_heard": 0, "next_report_seconds": 10}),
        (0, {"exit_code": 1, "peers_heard": 1, "next_report_seconds": 10}),  # failed: the job ends anyway
        (1, {"exit_code": 0, "peers_heard": 1, "next_report_seconds": 10}),  # a peer speaks for no one
    ],
)
def test_any_other_exit_ends_the_hosts_record(jobs, clock, worker, extra):
    """Only worker 0's success while it hears peers keeps its record live: any other exit is never found silent."""
    peer_started(jobs, clock)
    beat(jobs, "exited", worker, **extra)
    record = records(jobs)[f"0-{worker}"]
    assert (record.live, record.speaks_for_peers) == (False, None)
    clock.advance(3600)
    assert f"0-{worker}" not in [w.worker for w in jobs.store.silent_workers(clock.now)]


def test_a_peer_silent_lost_for_good_is_taken_from_worker_0s_next_heartbeat(jobs, clock):
    """The `peer_silent` never arrived (dead-lettered): worker 0's heartbeat still names the peer (`peers_silent`),
    and the jobs loses that host from it; the same heartbeat for an attempt that is over changes nothing."""
    peer_started(jobs, clock)
    clock.advance(20)
    beat(jobs, "heartbeat", 0, next_report_seconds=10, peers_heard=0, peers_silent=[1])
    job = jobs.store.get("train-1")
    assert (job.state, job.attempt) == (JobState.PROVISIONING, 2)
    lost = [e for e in jobs.store.events("train-1") if e.to_state is JobState.RECOVERING]
    assert len(lost) == 1 and "Worker 0-1 of attempt 1 went silent" in lost[0].reason
    assert "reported it silent and has not heard it since" in lost[0].reason
    beat(jobs, "heartbeat", 0, next_report_seconds=10, peers_heard=0, peers_silent=[1])  # attempt 1 is over
    after = jobs.store.get("train-1")
    assert (after.attempt, after.updated_at) == (job.attempt, job.updated_at)
    assert jobs.store.rejections() == []


def test_a_peers_silent_from_a_peer_is_refused(jobs, clock):
    """Only worker 0 speaks for a slice: a peer's heartbeat naming another peer loses nothing and is recorded."""
    peer_started(jobs, clock)
    sent = signed(
        jobs, "tpujobs-worker-events",
        {"kind": "heartbeat", "job_id": "train-1", "attempt": 1, "slice_id": 0, "worker_id": 1, "peers_silent": [1]},
    )  # fmt: skip
    jobs.handle(sent)
    assert jobs.store.get("train-1").attempt == 1
    assert "only worker 0" in (rejected(jobs, sent) or "")

"""The contract of `ports.WorkerRecords`: one record per host and attempt, merged, whose
silence deadline only ever moves later; counts; the silent ones across jobs."""

from __future__ import annotations

from datetime import timedelta

from contract_data import T0

from tpujobs.engine.ports import WorkerRecord


def record(worker: str = "0-0", attempt: int = 1, seconds: float = 0, **fields) -> WorkerRecord:
    slice_id, worker_id = (int(n) for n in worker.split("-"))
    at = T0 + timedelta(seconds=seconds)
    return WorkerRecord(attempt, worker, slice_id, worker_id, at, **fields)


def test_a_hosts_reports_merge_into_one_record_per_attempt(backend):
    """Fields left None keep what was said before; each attempt of a host has a record of its own."""
    store = backend.jobs
    store.record_worker("train-1", record(started_at=T0, live=True, silent_after=T0 + timedelta(minutes=5)))
    store.record_worker("train-1", record(seconds=30, exit_code=0, exited_at=T0 + timedelta(seconds=30)))
    store.record_worker("train-1", record(attempt=2, live=True))
    [first] = store.attempt_workers("train-1", 1)
    assert (first.started_at, first.exit_code, first.live, first.last_report_at) == (
        T0,
        0,
        True,
        T0 + timedelta(seconds=30),
    )
    assert first.silent_after == T0 + timedelta(minutes=5)
    assert [w.attempt for w in store.attempt_workers("train-1", 2)] == [2]
    assert store.attempt_workers("train-1", 3) == [] and store.attempt_workers("nobody", 1) == []


def test_the_silence_deadline_never_moves_back(backend):
    """A reordered, older heartbeat cannot bring a host's deadline closer."""
    store = backend.jobs
    later, earlier = T0 + timedelta(minutes=10), T0 + timedelta(minutes=5)
    store.record_worker("train-1", record(live=True, silent_after=later))
    store.record_worker("train-1", record(live=True, silent_after=earlier))
    assert store.attempt_workers("train-1", 1)[0].silent_after == later


def test_hosts_heard_and_succeeded_are_counted_per_attempt(backend):
    """heard: every host with a record; succeeded: those that exited 0."""
    store = backend.jobs
    store.record_worker("train-1", record("0-0", exit_code=0))
    store.record_worker("train-1", record("0-1", exit_code=3))
    store.record_worker("train-1", record("0-2", live=True))
    store.record_worker("train-1", record("0-0", attempt=2, exit_code=0))
    assert store.attempt_workers_heard("train-1", 1) == 3
    assert store.attempt_workers_succeeded("train-1", 1) == 1
    assert store.attempt_workers_heard("train-1", 9) == store.attempt_workers_succeeded("train-1", 9) == 0


def test_silent_workers_are_live_ones_past_their_deadline_across_jobs(backend):
    """Oldest deadline first; not live, not yet due, and exited hosts (unless speaking for peers) are left out."""
    store = backend.jobs
    due = T0 + timedelta(minutes=1)
    store.record_worker("job-a", record("0-0", live=True, silent_after=due + timedelta(seconds=2)))
    store.record_worker("job-b", record("0-0", live=True, silent_after=due))
    store.record_worker("job-c", record("0-0", live=True, silent_after=due + timedelta(hours=1)))  # not yet
    store.record_worker("job-d", record("0-0", live=False, silent_after=due))  # not watched
    exited = {"exited_at": T0, "exit_code": 0, "live": True, "silent_after": due}
    store.record_worker("job-e", record("0-0", **exited))  # exited: done, not silent
    store.record_worker("job-f", record("0-0", speaks_for_peers=True, **exited))  # still speaks for its peers
    found = store.silent_workers(T0 + timedelta(minutes=5))
    assert [(w.job_id, w.worker, w.after_its_exit) for w in found] == [
        ("job-b", "0-0", False),
        ("job-f", "0-0", True),
        ("job-a", "0-0", False),
    ]
    assert found[0].last_report_at == T0 and found[0].attempt == 1


def test_a_retired_worker_is_no_longer_watched(backend):
    """retire_worker stops the watch; retiring a host that never reported leaves no record to count as it."""
    store = backend.jobs
    store.record_worker("train-1", record(live=True, silent_after=T0))
    store.retire_worker("train-1", 1, "0-0")
    store.retire_worker("train-1", 1, "0-7")  # never reported
    assert store.silent_workers(T0 + timedelta(hours=1)) == []
    assert [w.worker for w in store.attempt_workers("train-1", 1)] == ["0-0"]
    assert store.attempt_workers("train-1", 1)[0].live is False

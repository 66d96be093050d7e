"""The contract of `ports.JobQueries` and `ports.Retention`: listing with filters, newest first;
the reconciler's reads (placements, shards, outlines, ended jobs), projected; expired jobs pruned
with everything under them."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from contract_data import T0, ZONE, a_job, clock

from tpujobs.adapters.firestore_documents import OUTLINE_LEAVES_OUT
from tpujobs.domain.shards import Placement
from tpujobs.domain.spec import JobSpec
from tpujobs.domain.states import EventKind
from tpujobs.domain.transitions import Observation
from tpujobs.engine.ports import AttemptLogs, JobFilter, WorkerRecord

ADMITTED = Observation(EventKind.ADMITTED, 1, "submit", capacity_state="ACCEPTED")
CANCEL = Observation(EventKind.CANCEL_REQUESTED, None, "user", reason="Cancelled.")


def test_a_list_is_newest_first_filtered_and_limited(backend):
    """State, owner, name prefix and every label must match; the limit keeps the newest."""
    store = backend.jobs
    store.create(*a_job("job-old", minutes=0, labels={"team": "a", "stage": "x"}))
    store.create(*a_job("job-mid", minutes=1, name="eval", labels={"team": "a"}))
    store.create(*a_job("job-new", minutes=2, owner="bob@example.com", labels={"team": "b"}))
    store.apply("job-mid", ADMITTED, clock)
    assert [j.job_id for j in store.list_jobs()] == ["job-new", "job-mid", "job-old"]
    assert [j.job_id for j in store.list_jobs(limit=2)] == ["job-new", "job-mid"]
    assert [j.job_id for j in store.list_jobs(state="QUEUED")] == ["job-new", "job-old"]
    assert [j.job_id for j in store.list_jobs(owner="ada@example.com")] == ["job-mid", "job-old"]
    assert [
        j.job_id for j in store.list_jobs(where=JobFilter(states=("PROVISIONING", "QUEUED"), owner="bob@example.com"))
    ] == ["job-new"]
    assert [j.job_id for j in store.list_jobs(where=JobFilter(name_prefix="ev"))] == ["job-mid"]
    assert [j.job_id for j in store.list_jobs(where=JobFilter(labels={"team": "a"}))] == ["job-mid", "job-old"]
    two_labels = JobFilter(labels={"team": "a", "stage": "x"})
    assert [j.job_id for j in store.list_jobs(where=two_labels, limit=1)] == ["job-old"]
    assert store.list_jobs(owner="nobody@example.com") == []


def test_placements_and_shards_read_active_jobs_in_id_order(backend):
    """Ended jobs are left out; a shard is a zone and an id range (after, through]; outlines lack the command."""
    store = backend.jobs
    for job_id in ("job-c", "job-a", "job-b", "job-d"):
        store.create(*a_job(job_id, zone=ZONE))
    store.apply("job-d", CANCEL, clock)
    assert store.active_placements() == [
        Placement("job-a", ZONE, (ZONE,), ""),
        Placement("job-b", ZONE, (ZONE,), ""),
        Placement("job-c", ZONE, (ZONE,), ""),
    ]
    assert [j.job_id for j in store.active_in_shard(ZONE, "", "")] == ["job-a", "job-b", "job-c"]
    shard = store.active_in_shard(ZONE, "job-a", "job-b", page_size=1)
    assert [j.job_id for j in shard] == ["job-b"]
    assert shard[0].spec.accelerator_type == "v4-16" and shard[0].queued_resource == "job-b-a1"
    assert "command" not in shard[0].spec.model_fields_set and "labels" not in shard[0].spec.model_fields_set
    assert store.active_in_shard("europe-west4-a", "", "") == []
    outlines = store.outlines(["job-c", "ghost", "job-a", "job-c"], page_size=1)
    assert sorted(j.job_id for j in outlines) == ["job-a", "job-c"]
    assert all("command" not in j.spec.model_fields_set for j in outlines)


def test_jobs_ended_in_a_window_are_read_oldest_end_first(backend):
    """ended_between is [start, end) on ended_at."""
    store = backend.jobs
    for job_id, seconds in (("job-a", 20), ("job-b", 10), ("job-c", 30)):
        store.create(*a_job(job_id))
        store.apply(job_id, CANCEL, lambda s=seconds: clock(s))
    assert [j.job_id for j in store.ended_between(clock(10), clock(30))] == ["job-b", "job-a"]
    assert store.ended_between(clock(31), clock(60)) == []


def test_expired_jobs_are_pruned_with_their_timeline_workers_and_attempts(backend):
    """Only jobs past expire_at, oldest expiry first, up to the limit; nothing of them is left."""
    store = backend.jobs
    for job_id in ("job-a", "job-b", "job-c"):
        store.create(*a_job(job_id))
        store.apply(job_id, CANCEL, clock)
        store.record_worker(job_id, WorkerRecord(1, "0-0", 0, 0, T0, live=False))
        store.record_attempt_logs(job_id, AttemptLogs(1, f"gs://logs/{job_id}/attempt-1/attempt.log", {}, T0))
    store.create(*a_job("job-live"))
    expire_at = store.get("job-a").expire_at
    assert expire_at is not None
    assert store.prune_expired_jobs(expire_at - timedelta(seconds=1)) == []
    gone = store.prune_expired_jobs(expire_at, limit=2)
    assert len(gone) == 2 and set(gone) < {"job-a", "job-b", "job-c"}
    for job_id in gone:
        assert store.get(job_id) is None and store.events(job_id) == []
        assert store.attempt_workers(job_id, 1) == [] and store.attempt_logs(job_id, 1) is None
    assert len(store.prune_expired_jobs(expire_at + timedelta(days=1))) == 1
    assert [j.job_id for j in store.list_jobs()] == ["job-live"]


def test_an_outline_leaves_env_command_and_setup_out_and_keeps_everything_compared(backend):
    """A job with 56 KB of env, command and setup (a spec may have 64 KB): the outline has none of
    them, and every other field (the spec's too) is the job's own; a spec field added later is
    projected by default."""
    store = backend.jobs
    env = {f"BLOB_{n}": "x" * 8000 for n in range(4)}
    big = "x" * 12_000
    store.create(*a_job("heavy", env=env, command=f"echo {big}", setup=f"echo {big}", labels={"team": "a"},
                        zones=[ZONE, "us-east5-a"], priority="high", max_restarts=7))  # fmt: skip
    store.apply("heavy", ADMITTED, clock)
    full = store.get("heavy")
    (outline,) = store.active_in_shard(ZONE, "", "")

    assert outline.spec.env == {} and outline.spec.setup is None and outline.spec.labels == {}
    with pytest.raises(AttributeError):
        outline.spec.command  # noqa: B018 - absent, so it can never boot hosts
    for name in set(JobSpec.model_fields) - OUTLINE_LEAVES_OUT:
        assert getattr(outline.spec, name) == getattr(full.spec, name), name
    assert dataclasses.replace(outline, spec=full.spec) == full
    assert store.outlines(["heavy"]) == [outline]


def test_every_paged_read_finds_all_past_a_page(backend):
    """Five of each, two to a page: placements, shards, outlines, ended jobs, silent workers and
    unannounced events are all read, never capped at a page."""
    store = backend.jobs
    names = [f"job-{n}" for n in range(5)]
    for job_id in names:
        store.create(*a_job(job_id))
        store.record_worker(job_id, WorkerRecord(1, "0-0", 0, 0, T0, live=True, silent_after=T0))
    assert [p.job_id for p in store.active_placements(page_size=2)] == names
    assert [j.job_id for j in store.active_in_shard(ZONE, "", "", page_size=2)] == names
    assert sorted(j.job_id for j in store.outlines(names, page_size=2)) == names
    assert sorted(w.job_id for w in store.silent_workers(clock(), page_size=2)) == names
    assert sorted(job_id for job_id, _ in store.unannounced_events(clock(), page_size=2)) == names
    for job_id in names:
        store.apply(job_id, CANCEL, clock)
    assert sorted(j.job_id for j in store.ended_between(T0, clock(6), page_size=2)) == names

"""The contract of `ports.JobRecords` and `ports.JobDocuments`: create once, compare-and-set
changes with their event, usage notes, announcements, labels, and the documents as stored."""

from __future__ import annotations

from datetime import datetime, timedelta

from contract_data import T0, a_job, clock

from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Decision, Ignored, Observation

ADMITTED = Observation(EventKind.ADMITTED, 1, "submit", capacity_state="WAITING_FOR_RESOURCES")


def test_a_job_is_created_once_and_a_missing_one_reads_as_none(backend):
    """The second create of an id is False and keeps the first job and its single event."""
    store = backend.jobs
    job, event = a_job()
    assert store.create(job, event) is True
    assert store.create(job.evolve(state_reason="another"), event) is False
    stored = store.get("train-1")
    assert stored == job and stored.state_reason == job.state_reason
    assert store.events("train-1") == [event]
    assert store.get("nobody") is None and store.events("nobody") == []


def test_a_change_writes_the_job_and_its_event_together(backend):
    """apply decides on the stored job and commits both; the timeline reads back in order."""
    store = backend.jobs
    store.create(*a_job())
    outcome = store.apply("train-1", ADMITTED, clock)
    assert isinstance(outcome, Decision)
    stored = store.get("train-1")
    assert stored == outcome.job
    assert (stored.state, stored.capacity_state, stored.updated_at) == (
        JobState.PROVISIONING,
        "WAITING_FOR_RESOURCES",
        clock(),
    )
    assert [(e.from_state, e.to_state) for e in store.events("train-1")] == [
        (None, JobState.QUEUED),
        (JobState.QUEUED, JobState.PROVISIONING),
    ]
    assert store.events("train-1")[1] == outcome.event


def test_a_refused_or_stale_observation_leaves_no_trace(backend):
    """An observation the table refuses, a stale one, and one of a missing job change nothing."""
    store = backend.jobs
    store.create(*a_job())
    assert isinstance(store.apply("train-1", Observation(EventKind.WORKER_SUCCEEDED, 1, "agent"), clock), Ignored)
    store.apply("train-1", ADMITTED, clock)
    assert isinstance(store.apply("train-1", ADMITTED, clock), Ignored)  # already moved: a redelivery
    assert len(store.events("train-1")) == 2
    missing = store.apply("nobody", Observation(EventKind.CANCEL_REQUESTED, None, "user"), clock)
    assert isinstance(missing, Ignored) and "does not exist" in missing.reason
    assert store.get("nobody") is None


def test_usage_notes_write_only_what_is_new(backend):
    """A checkpoint counts only when newer, all-started and an image digest once each; a missing job is False."""
    store = backend.jobs
    store.create(*a_job())
    store.apply("train-1", ADMITTED, clock)
    at = clock(60)
    assert store.record_checkpoint("train-1", 1, at, step=100) is True
    assert store.record_checkpoint("train-1", 1, at, step=100) is False
    assert store.record_checkpoint("train-1", 1, clock(120), step=200) is True
    assert store.record_all_started("train-1", 1, at) is True
    assert store.record_all_started("train-1", 1, at) is False
    digest = "sha256:" + "ab" * 32
    assert store.record_image_digest("train-1", 1, digest) is True
    assert store.record_image_digest("train-1", 1, digest) is False
    usage = store.get("train-1").usage[0]
    assert (usage.last_checkpoint_step, usage.last_checkpoint_at) == (200, clock(120))
    assert (usage.all_started_at, usage.image_digest) == (at, digest)
    assert len(store.events("train-1")) == 2  # no timeline entry for any of them
    assert store.record_checkpoint("nobody", 1, at, step=1) is False
    assert store.record_all_started("nobody", 1, at) is False


def test_unannounced_events_are_found_oldest_first_until_marked(backend):
    """Every committed event starts unannounced; marking one takes it out of the list."""
    store = backend.jobs
    for job_id, minutes in (("job-b", 0), ("job-a", 1)):
        store.create(*a_job(job_id, minutes=minutes))
    found = store.unannounced_events(T0 + timedelta(hours=1))
    assert [(job_id, e.seq) for job_id, e in found] == [("job-b", 1), ("job-a", 1)]
    assert store.unannounced_events(T0) == []  # only those committed before `before`
    store.mark_announced("job-b", found[0][1])
    assert [job_id for job_id, _ in store.unannounced_events(T0 + timedelta(hours=1))] == ["job-a"]
    documents = store.event_documents("job-b")
    assert [(d["id"], d["announced"]) for d in documents] == [("0001-queued", True)]


def test_labels_change_with_a_timeline_entry_and_a_retry_changes_nothing(backend):
    """relabel keeps the state, records who changed what, and is Ignored when nothing would change."""
    store = backend.jobs
    store.create(*a_job())
    outcome = store.relabel("train-1", {"stage": "eval"}, ["team"], "ada@example.com", clock)
    assert isinstance(outcome, Decision)
    stored = store.get("train-1")
    assert stored.spec.labels == {"stage": "eval"} and stored.state is JobState.QUEUED
    assert store.job_document(stored)["label_pairs"] == ["stage=eval"]
    assert len(store.events("train-1")) == 2
    assert isinstance(store.relabel("train-1", {"stage": "eval"}, [], "ada@example.com", clock), Ignored)
    assert isinstance(store.relabel("nobody", {"a": "b"}, [], "ada@example.com", clock), Ignored)


def test_the_job_document_is_flat_with_real_timestamps(backend):
    """What the API shows: top-level fields people filter on, the spec as a map, timestamps as datetimes."""
    store = backend.jobs
    job, event = a_job(capacity="spot")
    store.create(job, event)
    document = store.job_document(store.get("train-1"))
    assert isinstance(document["created_at"], datetime) and document["created_at"] == T0
    assert (document["state"], document["queued_resource"], document["chips"]) == ("QUEUED", "train-1-a1", 8)
    assert document["capacity"] == "spot" and document["spec"]["labels"] == {"team": "research"}
    [first] = store.event_documents("train-1")
    assert first["id"] == "0001-queued" and first["from_state"] is None and first["source"] == "submit"
    assert first["at"] == T0

"""The Firestore job store against the real Firestore emulator."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

from tpujobs.adapters.firestore_store import EVENTS, JOBS, REJECTIONS, FirestoreJobStore
from tpujobs.domain.job import new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Decision, Ignored, Observation
from tpujobs.engine.errors import TransientError
from tpujobs.engine.ports import Rejection

pytestmark = pytest.mark.emulator

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def clock():
    return T0 + timedelta(seconds=5)


def a_job(job_id: str = "train-1"):
    spec = parse_spec(
        {
            "job_id": job_id,
            "name": "train",
            "owner": "ada@example.com",
            "accelerator_type": "v4-16",
            "command": "python train.py",
            "capacity": "spot",
            "labels": {"team": "research"},
        }
    )
    return new_job(spec, "us-central2-b", T0)


def test_a_duplicate_create_changes_nothing(firestore_client):
    """Creating the same job id twice keeps the first document and its single event."""
    store = FirestoreJobStore(firestore_client)
    job, event = a_job()
    assert store.create(job, event) is True
    later = job.evolve(state_reason="a different reason")
    assert store.create(later, event) is False
    stored = store.get(job.job_id)
    assert stored is not None and stored.state_reason == job.state_reason
    assert len(store.events(job.job_id)) == 1


def test_the_job_document_reads_well_in_the_console(firestore_client):
    """Timestamps are real timestamps and the fields people look at are flat and top-level."""
    store = FirestoreJobStore(firestore_client)
    job, event = a_job()
    store.create(job, event)
    doc = firestore_client.collection(JOBS).document(job.job_id).get().to_dict()
    assert isinstance(doc["created_at"], datetime)
    assert doc["created_at"] == T0
    assert doc["state"] == "QUEUED"
    assert doc["queued_resource"] == "train-1-a1"
    assert doc["accelerator_type"] == "v4-16" and doc["chips"] == 8 and doc["capacity"] == "spot"
    assert doc["spec"]["labels"] == {"team": "research"}
    events = list(firestore_client.collection(JOBS).document(job.job_id).collection(EVENTS).stream())
    assert [e.id for e in events] == ["0001-queued"]
    first = events[0].to_dict()
    assert first["from_state"] is None and first["to_state"] == "QUEUED" and first["source"] == "submit"
    assert isinstance(first["at"], datetime)


def test_a_transition_writes_the_job_and_its_event_together(firestore_client):
    """Applying an observation moves the state and appends the matching timeline entry."""
    store = FirestoreJobStore(firestore_client)
    job, event = a_job()
    store.create(job, event)
    outcome = store.apply(
        job.job_id,
        Observation(EventKind.ADMITTED, 1, "submit", capacity_state="WAITING_FOR_RESOURCES"),
        clock,
    )
    assert isinstance(outcome, Decision)
    stored = store.get(job.job_id)
    assert stored.state is JobState.PROVISIONING
    assert stored.capacity_state == "WAITING_FOR_RESOURCES"
    assert stored.updated_at == clock()
    timeline = store.events(job.job_id)
    assert [(e.from_state, e.to_state) for e in timeline] == [
        (None, JobState.QUEUED),
        (JobState.QUEUED, JobState.PROVISIONING),
    ]


def test_an_illegal_transition_is_refused_and_leaves_no_trace(firestore_client):
    """An observation the table does not allow changes neither the job nor its timeline."""
    store = FirestoreJobStore(firestore_client)
    job, event = a_job()
    store.create(job, event)
    outcome = store.apply(job.job_id, Observation(EventKind.WORKER_SUCCEEDED, 1, "agent"), clock)
    assert isinstance(outcome, Ignored)
    assert store.get(job.job_id).state is JobState.QUEUED
    assert len(store.events(job.job_id)) == 1


def test_concurrent_transitions_of_one_job_apply_exactly_once(firestore_client, project_id):
    """Eight threads admitting the same job at once (retrying lost transactions, as redelivery
    would): exactly one moves it, the rest see it already moved, one event is written."""
    from google.cloud import firestore

    job, event = a_job()
    FirestoreJobStore(firestore_client).create(job, event)
    outcomes: list[object] = []
    barrier = threading.Barrier(8)

    def admit() -> None:
        store = FirestoreJobStore(firestore.Client(project=project_id))
        barrier.wait()
        seen = Observation(EventKind.ADMITTED, 1, "submit", capacity_state="ACCEPTED")
        for _ in range(20):  # a lost transaction is a TransientError: Pub/Sub would redeliver
            try:
                outcomes.append(store.apply(job.job_id, seen, clock))
                return
            except TransientError:
                continue

    threads = [threading.Thread(target=admit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(outcomes) == 8
    assert sum(isinstance(o, Decision) for o in outcomes) == 1
    assert len(FirestoreJobStore(firestore_client).events(job.job_id)) == 2


def test_an_observation_for_a_missing_job_is_ignored(firestore_client):
    """Events about a job that does not exist change nothing and do not create it."""
    store = FirestoreJobStore(firestore_client)
    outcome = store.apply("nobody-here", Observation(EventKind.CANCEL_REQUESTED, None, "user"), clock)
    assert isinstance(outcome, Ignored)
    assert store.get("nobody-here") is None


def test_a_rejection_is_recorded_once_per_message_and_counts_deliveries(firestore_client):
    """The rejection document is keyed by message id; a redelivery bumps its delivery count."""
    store = FirestoreJobStore(firestore_client)
    rejection = Rejection("1234", T0, "field 'name' is required", '{"owner": "x"}', "tpujobs-submit")
    store.reject(rejection)
    store.reject(rejection)
    docs = list(firestore_client.collection(REJECTIONS).stream())
    assert [d.id for d in docs] == ["1234"]
    data = docs[0].to_dict()
    assert data["reason"] == "field 'name' is required"
    assert data["topic"] == "tpujobs-submit" and data["payload"] == '{"owner": "x"}'
    assert data["deliveries"] == 2
    assert data["at"] == T0


def test_list_filters_by_state_and_owner(firestore_client):
    """Listing by state or owner returns only the matching jobs."""
    store = FirestoreJobStore(firestore_client)
    for job_id in ("job-a", "job-b"):
        store.create(*a_job(job_id))
    store.apply("job-b", Observation(EventKind.ADMITTED, 1, "submit", capacity_state="ACCEPTED"), clock)
    assert [j.job_id for j in store.list_jobs(state="QUEUED")] == ["job-a"]
    assert {j.job_id for j in store.list_jobs(owner="ada@example.com")} == {"job-a", "job-b"}
    assert store.list_jobs(owner="someone-else") == []


def test_a_limited_list_keeps_the_newest_jobs(firestore_client):
    """The limit applies after ordering: `tpujobs list --limit 2` shows the two newest."""
    store = FirestoreJobStore(firestore_client)
    for minute, job_id in enumerate(["job-old", "job-mid", "job-new", "job-newer"]):
        job, event = a_job(job_id)
        at = T0 + timedelta(minutes=minute)
        store.create(job.evolve(created_at=at, updated_at=at), event)
    assert [j.job_id for j in store.list_jobs(limit=2)] == ["job-newer", "job-new"]
    assert [j.job_id for j in store.list_jobs(state="QUEUED", owner="ada@example.com", limit=3)] == [
        "job-newer",
        "job-new",
        "job-mid",
    ]

"""`list`'s filters, label changes and the pruning of expired records, against the Firestore
emulator: the queries the store sends are the ones production runs (with the indexes of
`adapters.indexes`), and the API's `label` and `list` answer through them."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from google.cloud.firestore_v1.query import Query

from tpujobs.adapters.firestore_dead_letters import FirestoreDeadLetters
from tpujobs.adapters.firestore_documents import job_to_document
from tpujobs.adapters.firestore_store import ATTEMPTS, EVENTS, JOBS, REJECTIONS, WORKERS, FirestoreJobStore
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Decision, Observation
from tpujobs.engine.api import CALLER_HEADER, JobsApi
from tpujobs.engine.ports import AttemptLogs, DeadLetter, JobFilter, Rejection, WorkerRecord
from tpujobs.local.testing import inbound as message
from tpujobs.local.testing import local_settings, reconciler_for

pytestmark = pytest.mark.emulator

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
OWNER = "ada@example.com"


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def stored(store: FirestoreJobStore, job_id: str, minute: float, owner: str = OWNER, **labels: str) -> Job:
    """A QUEUED job created at `minute`, named like its id without the last part."""
    spec = parse_spec(
        {
            "job_id": job_id,
            "name": job_id.rsplit("-", 1)[0],
            "owner": owner,
            "accelerator_type": "v4-8",
            "command": "true",
            "labels": labels,
        }
    )
    job, event = new_job(spec, "us-central2-b", at(minute), record_retention_days=3)
    assert store.create(job, event)
    return job


def end(store: FirestoreJobStore, job_id: str, minute: float, kind: EventKind = EventKind.CANCEL_REQUESTED) -> Job:
    outcome = store.apply(job_id, Observation(kind, None, "user", reason="ended"), lambda: at(minute))
    assert isinstance(outcome, Decision), outcome
    return outcome.job


def ids(jobs: list[Job]) -> list[str]:
    return [job.job_id for job in jobs]


@pytest.fixture
def store(firestore_client) -> FirestoreJobStore:
    return FirestoreJobStore(firestore_client)


def test_list_filters_by_states_owner_name_prefix_and_labels_newest_first(store: FirestoreJobStore) -> None:
    """Each filter narrows, together they all must match, and the newest come first."""
    stored(store, "train-a-1", 1, team="x")
    stored(store, "train-b-2", 2, team="x", run="7")
    stored(store, "eval-3", 3, team="x")
    stored(store, "train-c-4", 4, "bob@example.com", team="y")
    end(store, "train-a-1", 10)
    end(store, "eval-3", 11)

    finished = JobFilter(states=("SUCCEEDED", "FAILED", "CANCELLED"))
    assert ids(store.list_jobs(where=finished)) == ["eval-3", "train-a-1"]
    assert ids(store.list_jobs(where=JobFilter(name_prefix="train"))) == ["train-c-4", "train-b-2", "train-a-1"]
    assert ids(store.list_jobs(where=JobFilter(labels={"team": "x"}))) == ["eval-3", "train-b-2", "train-a-1"]
    both = JobFilter(states=finished.states, labels={"team": "x"}, name_prefix="train")
    assert ids(store.list_jobs(where=both)) == ["train-a-1"]
    assert ids(store.list_jobs(where=JobFilter(owner="bob@example.com"))) == ["train-c-4"]
    assert ids(store.list_jobs(where=JobFilter(labels={"team": "x", "run": "7"}))) == ["train-b-2"]
    assert ids(store.list_jobs(where=JobFilter(labels={"team": "z"}))) == []
    assert ids(store.list_jobs(state="QUEUED", where=JobFilter(labels={"team": "x"}))) == ["train-b-2"]


def test_several_labels_keep_the_newest_matches_up_to_the_limit(store: FirestoreJobStore) -> None:
    """Several labels are one query in document-id order: `limit` still keeps the newest matches,
    whatever their ids."""
    for minute in range(7):
        labels = {"team": "x", "run": "7"} if minute in (0, 1, 5) else {"team": "x"}
        stored(store, f"job-{minute}", minute, **labels)
    both = JobFilter(labels={"team": "x", "run": "7"})
    assert ids(store.list_jobs(limit=2, where=both)) == ["job-5", "job-1"]
    assert ids(store.list_jobs(limit=10, where=both)) == ["job-5", "job-1", "job-0"]


def test_several_labels_read_only_the_jobs_that_have_them_all(
    store: FirestoreJobStore, firestore_client, monkeypatch
) -> None:
    """300 jobs have app=x (the label that sorts first) and 2 of them run=7 as well: listing by
    both reads those 2 documents, not the 300 with app=x, and the other filters still apply.
    Documents are counted where the client streams a query's results."""
    batch = firestore_client.batch()
    for n in range(300):
        job, _ = new_job(
            parse_spec(
                {
                    "job_id": f"crowd-{n:03}",
                    "name": "crowd",
                    "owner": OWNER,
                    "accelerator_type": "v4-8",
                    "command": "true",
                    "labels": {"app": "x"},
                }
            ),
            "us-central2-b",
            at(n),
            record_retention_days=3,
        )
        batch.set(firestore_client.collection(JOBS).document(job.job_id), job_to_document(job))
        if n % 100 == 99:
            batch.commit()
            batch = firestore_client.batch()
    stored(store, "both-a-1", 400, app="x", run="7")
    stored(store, "both-b-2", 401, app="x", run="7")
    read = count_streamed(monkeypatch)
    both = JobFilter(labels={"app": "x", "run": "7"})
    assert ids(store.list_jobs(limit=50, where=both)) == ["both-b-2", "both-a-1"]
    assert read == [2]
    read.clear()
    assert ids(store.list_jobs(limit=50, where=JobFilter(labels=both.labels, name_prefix="both-a"))) == ["both-a-1"]
    assert ids(store.list_jobs(limit=50, where=JobFilter(labels=both.labels, states=("RUNNING",)))) == []
    assert ids(store.list_jobs(limit=50, where=JobFilter(labels=both.labels, owner="bob@example.com"))) == []
    assert read == [2, 0, 0]


def count_streamed(monkeypatch) -> list[int]:
    """The number of documents each query streams from now on, one entry a query."""
    counts: list[int] = []
    streamed = Query.stream

    def counting(self, *args, **kwargs):
        counts.append(0)
        for doc in streamed(self, *args, **kwargs):
            counts[-1] += 1
            yield doc

    monkeypatch.setattr(Query, "stream", counting)
    return counts


def test_relabel_changes_what_list_finds_and_writes_the_timeline(store: FirestoreJobStore, firestore_client) -> None:
    """The new labels are in spec.labels and label_pairs; a retry changes nothing; the event says who."""
    stored(store, "run-1", 1, team="x", old="y")
    end(store, "run-1", 2)
    outcome = store.relabel("run-1", {"team": "z"}, ["old"], "root@example.com", lambda: at(3))
    assert isinstance(outcome, Decision)
    document = firestore_client.collection(JOBS).document("run-1").get().to_dict()
    assert document["spec"]["labels"] == {"team": "z"} and document["label_pairs"] == ["team=z"]
    assert document["state"] == "CANCELLED" and document["state_reason"] == "ended"
    assert ids(store.list_jobs(where=JobFilter(labels={"team": "z"}))) == ["run-1"]
    assert ids(store.list_jobs(where=JobFilter(labels={"team": "x"}))) == []
    last = store.events("run-1")[-1]
    assert (last.from_state, last.to_state) == (JobState.CANCELLED, JobState.CANCELLED)
    assert "root@example.com" in last.reason and "team=z (was x)" in last.reason
    again = store.relabel("run-1", {"team": "z"}, [], "root@example.com", lambda: at(4))
    assert not isinstance(again, Decision) and len(store.events("run-1")) == 3


def test_an_ended_job_carries_expire_at_and_pruning_deletes_it_with_its_subcollections(
    store: FirestoreJobStore, firestore_client
) -> None:
    """Past expire_at the job, its timeline, workers and attempts go; a job not yet expired,
    a running one, a fresh rejection and dead letter stay; old ones go."""
    stored(store, "old-1", 0)
    stored(store, "recent-2", 0)
    stored(store, "running-3", 0)
    store.record_worker("old-1", WorkerRecord(1, "0-0", 0, 0, at(1), live=True))
    store.record_attempt_logs("old-1", AttemptLogs(1, "gs://logs/old-1/a1.log", {0: "gs://logs/w0"}, at(2)))
    old = end(store, "old-1", 10)
    end(store, "recent-2", 60 * 24 * 3)
    assert old.expire_at == at(10) + timedelta(days=3)
    assert firestore_client.collection(JOBS).document("old-1").get().get("expire_at") == old.expire_at
    store_with_retention = FirestoreJobStore(firestore_client, rejection_retention=timedelta(days=1))
    store_with_retention.reject(Rejection("m-old", at(0), "bad", "{}", "tpujobs-submit"))
    store_with_retention.reject(Rejection("m-new", at(60 * 24 * 3), "bad", "{}", "tpujobs-submit"))
    letters = FirestoreDeadLetters(firestore_client, retention=timedelta(days=2))
    letters.add(DeadLetter("d-old", at(0), "tpujobs-submit", "s", 5, "{}"))
    letters.add(DeadLetter("d-new", at(60 * 24 * 3), "tpujobs-submit", "s", 5, "{}"))
    assert firestore_client.collection("dead_letters").document("d-old").get().get("expire_at") == at(60 * 24 * 2)

    gone = store.prune_expired(old.expire_at + timedelta(seconds=1))

    assert gone == ["old-1"]
    old_ref = firestore_client.collection(JOBS).document("old-1")
    assert not old_ref.get().exists
    assert all(not list(old_ref.collection(child).stream()) for child in (EVENTS, WORKERS, ATTEMPTS))
    assert store.get("recent-2") is not None and store.get("running-3") is not None
    assert [doc.id for doc in firestore_client.collection(REJECTIONS).stream()] == ["m-new"]
    assert [doc.id for doc in firestore_client.collection("dead_letters").stream()] == ["d-new"]


def test_the_api_labels_for_the_owner_or_an_admin_and_lists_with_filters(job_service) -> None:
    """`label` changes the labels (403 for anyone else, 400 naming a bad label), and `list`
    takes states, a name prefix and labels."""
    service = job_service(admins=("root@example.com",))
    api = JobsApi(service, service.store, local_settings(local_stack=True, admins=("root@example.com",)))

    def call(body: dict, who: str = OWNER):
        return api.handle("POST", "http://localhost/jobs", {CALLER_HEADER: who}, json.dumps(body).encode())

    for job_id in ("lab-1", "other-2"):
        spec = {"job_id": job_id, "name": job_id.split("-")[0], "owner": OWNER, "accelerator_type": "v4-8"}
        assert service.submission.submit(message("tpujobs-submit", {**spec, "command": "true"})).kind == "provisioning"
    refused = call({"action": "label", "job_id": "lab-1", "labels": {"team": "x"}}, who="eve@example.com")
    assert refused.status == 403
    bad = call({"action": "label", "job_id": "lab-1", "labels": {"Team": "x"}})
    assert bad.status == 400 and "'Team'" in bad.body["error"]
    done = call({"action": "label", "job_id": "lab-1", "labels": {"team": "x"}}, who="root@example.com")
    assert done.status == 200 and done.body["labels"] == {"team": "x"} and done.body["changed"]
    listed = call({"action": "list", "state": ["PROVISIONING", "QUEUED"], "labels": {"team": "x"}})
    assert listed.status == 200 and [j["job_id"] for j in listed.body["jobs"]] == ["lab-1"]
    by_name = call({"action": "list", "name_prefix": "oth"})
    assert [j["job_id"] for j in by_name.body["jobs"]] == ["other-2"]
    wrong = call({"action": "list", "state": ["DONE"]})
    assert wrong.status == 400 and "'state'" in wrong.body["error"]


def test_prune_expired_jobs_deletes_a_bounded_batch_oldest_first_with_subcollections(
    store: FirestoreJobStore, firestore_client
) -> None:
    """What the production reconciler calls each tick (TTL would leave the subcollections):
    at most `limit` expired jobs, the earliest expiry first; the rest wait for the next tick."""
    for index, job_id in enumerate(["first-1", "second-2", "third-3"]):
        stored(store, job_id, 0)
        end(store, job_id, 10 + index)
    stored(store, "running-4", 0)
    after_all = at(20) + timedelta(days=3)

    assert store.prune_expired_jobs(after_all, limit=2) == ["first-1", "second-2"]
    assert not list(firestore_client.collection(JOBS).document("first-1").collection(EVENTS).stream())
    assert store.get("third-3") is not None
    assert store.prune_expired_jobs(after_all, limit=2) == ["third-3"]
    assert store.prune_expired_jobs(after_all, limit=2) == []
    assert store.get("running-4") is not None


def test_the_reconcilers_tick_deletes_expired_jobs(job_service, firestore_client) -> None:
    """The tick's own phase: an ended job past its expire_at is gone after one tick, with its timeline."""
    service = job_service()
    stored(service.store, "expired-1", 0)
    ended = end(service.store, "expired-1", 1)
    assert ended.expire_at is not None
    service_later = job_service(clock=lambda: ended.expire_at + timedelta(minutes=1))
    report = reconciler_for(service_later).tick()
    assert report.pruned == ["expired-1"]
    job_ref = firestore_client.collection(JOBS).document("expired-1")
    assert not job_ref.get().exists and not list(job_ref.collection(EVENTS).stream())

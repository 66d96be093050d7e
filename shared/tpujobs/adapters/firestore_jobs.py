"""Job records on Firestore: the job document and its timeline, every change a compare-and-set.

Every change reads the job, lets the pure domain decide, and commits the job and its event in
one atomic write whose precondition is the job's update time as read. If another handler moved
the job first, the commit fails and the change is decided again on the new job, so a stale
observation can never overwrite a newer state. Deciding is pure, so running it again has no
side effects.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from google.api_core import exceptions as api_exceptions
from google.cloud import firestore

from tpujobs.adapters.firestore_cas import Write, compare_and_set, wrote
from tpujobs.adapters.firestore_documents import (
    ACTIVE_PAGE_SIZE,
    EVENTS,
    accounting_fields,
    event_from_document,
    event_to_document,
    job_from_document,
    job_to_document,
    label_pairs,
)
from tpujobs.adapters.firestore_reads import OnFirestore, paged, transient_on_failure
from tpujobs.domain.accounting import AttemptUsage, all_started, checkpoint_reported, image_reported
from tpujobs.domain.job import Job, JobEvent
from tpujobs.domain.labels import relabeled
from tpujobs.domain.transitions import Decision, Ignored, Observation, decide
from tpujobs.engine.ports import Clock

if TYPE_CHECKING:
    from tpujobs.adapters.firestore_cas import Snapshot


class FirestoreJobRecords(OnFirestore):
    """`ports.JobRecords` on Firestore: `jobs/{id}` and `jobs/{id}/events`."""

    def __init__(self, client: firestore.Client) -> None:
        OnFirestore.__init__(self, client)
        self._created = JustCreated()

    def create(self, job: Job, event: JobEvent) -> bool:
        # One atomic batch of two creates: a single round trip, and it fails as a whole
        # (ALREADY_EXISTS) when the job id is taken, which is the idempotency check itself.
        ref = self._job_ref(job.job_id)
        batch = self._db.batch()
        batch.create(ref, job_to_document(job))
        batch.create(ref.collection(EVENTS).document(event.document_id), event_to_document(event))
        with transient_on_failure("create job"):
            try:
                results = batch.commit()
            except api_exceptions.AlreadyExists:
                return False
        self._created.put(job, results[0].update_time)  # the next `apply` needs no read
        return True

    def get(self, job_id: str) -> Job | None:
        with transient_on_failure("read job"):
            snapshot = self._job_ref(job_id).get()
        return job_from_document(snapshot.to_dict() or {}) if snapshot.exists else None

    def apply(self, job_id: str, seen: Observation, clock: Clock) -> Decision | Ignored:
        """Read, decide, and commit the job and its event atomically, if the job is unchanged.

        The commit carries a precondition on the job's update time: the compare-and-set.
        A lost race re-reads and decides again (the observation may now be stale). This is
        optimistic on purpose: Firestore's read-write transactions take locks, and two
        handlers of one job holding read locks deadlock until "Transaction lock timeout".

        The first change to a job this store has just created (a submission's admission)
        skips the read: the create's update time is the precondition. If anyone wrote in
        between, or the decision is to ignore, it reads and decides as usual.
        """
        ref = self._job_ref(job_id)
        created = self._created.take(job_id)
        if created is not None:
            job, version = created
            outcome = decide(job, seen, clock())
            if isinstance(outcome, Decision) and wrote(
                self._change_batch(ref, outcome, version).commit, f"commit a change (job {job_id})"
            ):
                return outcome

        def change(snapshot: Snapshot) -> tuple[Decision | Ignored, Write | None]:
            if not snapshot.exists:
                return Ignored(f"job {job_id} does not exist"), None
            outcome = decide(job_from_document(snapshot.to_dict() or {}), seen, clock())
            if isinstance(outcome, Ignored):
                return outcome, None
            return outcome, self._change_batch(ref, outcome, snapshot.update_time).commit

        return compare_and_set(ref, change, what=f"job {job_id}", doing="commit a change")

    def _change_batch(
        self, ref: firestore.DocumentReference, outcome: Decision, version: datetime
    ) -> firestore.WriteBatch:
        """The job as decided, if still at `version` (its update time), and its new event."""
        batch = self._db.batch()
        batch.update(ref, job_to_document(outcome.job), option=self._db.write_option(last_update_time=version))
        batch.create(ref.collection(EVENTS).document(outcome.event.document_id), event_to_document(outcome.event))
        return batch

    def record_checkpoint(self, job_id: str, attempt: int, at: datetime, step: int | None = None) -> bool:
        """Note a checkpoint of `attempt` on the job's usage, if newer; no timeline entry.

        A checkpoint of an attempt that already ended still counts (a job saving on SIGTERM
        reports after the preemption notice). Of the many workers reporting one step only the
        first writes (`checkpoint_reported` compares steps); the others read and write nothing,
        and two at once race on the compare-and-set, never both writing.
        """
        change = lambda usage: checkpoint_reported(usage, attempt, at, step)  # noqa: E731
        return self._amend_usage(job_id, change, "note a checkpoint")

    def record_image_digest(self, job_id: str, attempt: int, digest: str) -> bool:
        """Note the image digest a host of `attempt` ran; the first is the attempt's, a different
        later one is kept beside it; no timeline entry."""
        return self._amend_usage(job_id, lambda usage: image_reported(usage, attempt, digest), "note an image digest")

    def record_all_started(self, job_id: str, attempt: int, at: datetime) -> bool:
        """Note that every host of `attempt` has reported (`AttemptUsage.all_started_at`)."""
        return self._amend_usage(job_id, lambda usage: all_started(usage, attempt, at), "note that hosts started")

    def _amend_usage(
        self,
        job_id: str,
        change: Callable[[tuple[AttemptUsage, ...]], tuple[AttemptUsage, ...] | None],
        doing: str,
    ) -> bool:
        """Write `change(usage)` on the job, unless it is None; no timeline entry.

        The same compare-and-set as `apply`: a transition that moved the job first makes this
        read again and change the usage it wrote.
        """
        ref = self._job_ref(job_id)

        def amend(snapshot: Snapshot) -> tuple[bool, Write | None]:
            if not snapshot.exists:
                return False, None
            job = job_from_document(snapshot.to_dict() or {})
            usage = change(job.usage)
            if usage is None:
                return False, None
            fields = accounting_fields(job.evolve(usage=usage))
            option = self._db.write_option(last_update_time=snapshot.update_time)
            return True, lambda: ref.update(fields, option=option)

        return compare_and_set(ref, amend, what=f"job {job_id}", doing=doing, lost=(api_exceptions.FailedPrecondition,))

    def events(self, job_id: str) -> list[JobEvent]:
        with transient_on_failure("read events"):
            docs = self._job_ref(job_id).collection(EVENTS).order_by("seq").stream()
            return [event_from_document(doc.to_dict()) for doc in docs]

    def mark_announced(self, job_id: str, event: JobEvent) -> None:
        ref = self._job_ref(job_id).collection(EVENTS).document(event.document_id)
        with transient_on_failure("mark an event announced"):
            ref.update({"announced": True})

    def unannounced_events(self, before: datetime, page_size: int = ACTIVE_PAGE_SIZE) -> list[tuple[str, JobEvent]]:
        # Index (announced, at), paged: returns only the few changes whose announcement failed.
        query = (
            self._db.collection_group(EVENTS)
            .where(filter=firestore.FieldFilter("announced", "==", False))
            .where(filter=firestore.FieldFilter("at", "<", before))
            .order_by("at")
            .order_by("__name__")
        )
        docs = paged(query, page_size, "find unannounced events")
        return [(doc.reference.parent.parent.id, event_from_document(doc.to_dict())) for doc in docs]

    def job_document(self, job: Job) -> dict[str, Any]:
        """The job as its document reads: what the HTTP API shows (`ports.JobDocuments`)."""
        return job_to_document(job)

    def event_documents(self, job_id: str) -> list[dict[str, Any]]:
        """The job's timeline as stored, in order: what the HTTP API's `describe` returns."""
        with transient_on_failure("read events"):
            docs = self._job_ref(job_id).collection(EVENTS).order_by("seq").stream()
            return [{"id": doc.id, **doc.to_dict()} for doc in docs]

    def relabel(
        self, job_id: str, put: Mapping[str, str], remove: Sequence[str], by: str, clock: Clock
    ) -> Decision | Ignored:
        """Change the job's labels and record who did, compare-and-set like `apply`, keeping its
        state (`domain.labels.relabeled`); LabelError when the labels are refused."""
        ref = self._job_ref(job_id)

        def change(snapshot: Snapshot) -> tuple[Decision | Ignored, Write | None]:
            if not snapshot.exists:
                return Ignored(f"job {job_id} does not exist"), None
            outcome = relabeled(job_from_document(snapshot.to_dict() or {}), put, remove, by, clock())
            if isinstance(outcome, Ignored):
                return outcome, None
            batch = self._db.batch()
            fields = {
                "spec.labels": dict(outcome.job.spec.labels),
                "label_pairs": label_pairs(outcome.job.spec.labels),
                "event_seq": outcome.job.event_seq,
                "updated_at": outcome.job.updated_at,
            }
            batch.update(ref, fields, option=self._db.write_option(last_update_time=snapshot.update_time))
            batch.create(ref.collection(EVENTS).document(outcome.event.document_id), event_to_document(outcome.event))
            return outcome, batch.commit

        return compare_and_set(ref, change, what=f"job {job_id}", doing="change labels")


class JustCreated:
    """The jobs this store created lately, with the update time of the create: what a read
    right after it would return. Taken once, by the job's first `apply`; bounded, since a
    job whose admission waits for quota is never taken. Thread-safe: a function instance
    handles many requests at once."""

    LIMIT = 512

    def __init__(self) -> None:
        self._jobs: OrderedDict[str, tuple[Job, datetime]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, job: Job, version: datetime) -> None:
        with self._lock:
            self._jobs[job.job_id] = (job, version)
            while len(self._jobs) > self.LIMIT:
                self._jobs.popitem(last=False)

    def take(self, job_id: str) -> tuple[Job, datetime] | None:
        with self._lock:
            return self._jobs.pop(job_id, None)

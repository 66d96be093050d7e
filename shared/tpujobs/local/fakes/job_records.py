"""Job records in memory: the job and its timeline, usage notes, labels, and exported logs.

Jobs are kept as the very documents the adapter writes (`adapters.firestore_documents`), so a
job reads back as it would from Firestore, and the API's document reads show the same fields.
A change holds the store's one lock, so a compare-and-set can never lose to a write in between;
the event is written with its job, or neither is.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from tpujobs.adapters.firestore_documents import (
    accounting_fields,
    event_from_document,
    event_to_document,
    job_from_document,
    job_to_document,
    label_pairs,
)
from tpujobs.domain.accounting import AttemptUsage, all_started, checkpoint_reported, image_reported
from tpujobs.domain.job import Job, JobEvent
from tpujobs.domain.labels import relabeled
from tpujobs.domain.naming import exported_attempt
from tpujobs.domain.transitions import Decision, Ignored, Observation, decide
from tpujobs.engine.errors import PermanentError
from tpujobs.engine.ports import AttemptLogs, Clock
from tpujobs.local.fakes.documents import Collections, Document


class InMemoryJobRecords(Collections):
    """`ports.JobRecords`, `ports.AttemptLogStore` and the document reads of `ports.JobDocuments`."""

    def create(self, job: Job, event: JobEvent) -> bool:
        with self._lock:
            if job.job_id in self._jobs:
                return False
            self._jobs[job.job_id] = job_to_document(job)
            self._events[job.job_id] = {event.document_id: event_to_document(event)}
            return True

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            document = self._jobs.get(job_id)
            return job_from_document(copy.deepcopy(document)) if document is not None else None

    def apply(self, job_id: str, seen: Observation, clock: Clock) -> Decision | Ignored:
        with self._lock:
            document = self._jobs.get(job_id)
            if document is None:
                return Ignored(f"job {job_id} does not exist")
            outcome = decide(job_from_document(copy.deepcopy(document)), seen, clock())
            if isinstance(outcome, Decision):
                self._commit(job_id, job_to_document(outcome.job), outcome.event)
            return outcome

    def _commit(self, job_id: str, fields: Document, event: JobEvent) -> None:
        self._jobs[job_id].update(fields)
        self._events.setdefault(job_id, {})[event.document_id] = event_to_document(event)

    def record_checkpoint(self, job_id: str, attempt: int, at: datetime, step: int | None = None) -> bool:
        return self._amend_usage(job_id, lambda usage: checkpoint_reported(usage, attempt, at, step))

    def record_image_digest(self, job_id: str, attempt: int, digest: str) -> bool:
        return self._amend_usage(job_id, lambda usage: image_reported(usage, attempt, digest))

    def record_all_started(self, job_id: str, attempt: int, at: datetime) -> bool:
        return self._amend_usage(job_id, lambda usage: all_started(usage, attempt, at))

    def _amend_usage(
        self, job_id: str, change: Callable[[tuple[AttemptUsage, ...]], tuple[AttemptUsage, ...] | None]
    ) -> bool:
        """Write `change(usage)` on the job's accounting fields unless it is None; no timeline entry."""
        with self._lock:
            document = self._jobs.get(job_id)
            if document is None:
                return False
            job = job_from_document(copy.deepcopy(document))
            usage = change(job.usage)
            if usage is None:
                return False
            document.update(accounting_fields(job.evolve(usage=usage)))
            return True

    def events(self, job_id: str) -> list[JobEvent]:
        return [event_from_document(d) for d in self._event_list(job_id)]

    def _event_list(self, job_id: str) -> list[Document]:
        with self._lock:
            return sorted((copy.deepcopy(d) for d in self._events.get(job_id, {}).values()), key=lambda d: d["seq"])

    def mark_announced(self, job_id: str, event: JobEvent) -> None:
        with self._lock:
            document = self._events.get(job_id, {}).get(event.document_id)
            if document is None:  # Firestore's update of a missing document: NOT_FOUND, permanent
                raise PermanentError(f"Firestore refused to mark an event announced: no event {event.document_id}")
            document["announced"] = True

    def unannounced_events(self, before: datetime, page_size: int = 500) -> list[tuple[str, JobEvent]]:
        with self._lock:
            found = [
                (d["at"], job_id, event_id, d)
                for job_id, events in self._events.items()
                for event_id, d in events.items()
                if d.get("announced") is False and d["at"] < before
            ]
        return [(job_id, event_from_document(d)) for _, job_id, _, d in sorted(found, key=lambda f: f[:3])]

    # -- JobDocuments ------------------------------------------------------------------------------

    def job_document(self, job: Job) -> Document:
        return job_to_document(job)

    def event_documents(self, job_id: str) -> list[Document]:
        with self._lock:
            events = self._events.get(job_id, {})
            ids = sorted(events, key=lambda event_id: events[event_id]["seq"])
            return [{"id": event_id, **copy.deepcopy(events[event_id])} for event_id in ids]

    def attempt_documents(self, job_id: str) -> list[Document]:
        with self._lock:
            found = [{"id": key, **copy.deepcopy(d)} for key, d in sorted(self._attempts.get(job_id, {}).items())]
        return sorted(found, key=lambda d: int(d["id"]) if d["id"].isdigit() else 0)

    def notification_documents(self, job_id: str) -> list[Document]:
        return []  # the notifier keeps its records in its own port (local.fakes.notifications)

    def relabel(
        self, job_id: str, put: Mapping[str, str], remove: Sequence[str], by: str, clock: Clock
    ) -> Decision | Ignored:
        with self._lock:
            document = self._jobs.get(job_id)
            if document is None:
                return Ignored(f"job {job_id} does not exist")
            outcome = relabeled(job_from_document(copy.deepcopy(document)), put, remove, by, clock())
            if isinstance(outcome, Decision):
                job = outcome.job
                document["spec"]["labels"] = dict(job.spec.labels)
                fields = {"label_pairs": label_pairs(job.spec.labels), "event_seq": job.event_seq}
                self._commit(job_id, {**fields, "updated_at": job.updated_at}, outcome.event)
            return outcome

    def record_attempt_logs(self, job_id: str, logs: AttemptLogs) -> None:
        with self._lock:
            self._attempts.setdefault(job_id, {}).setdefault(str(logs.attempt), {}).update(logs.fields())
            job = self._jobs.get(job_id)
            if job is None:
                return
            current = job.get("log_uri")
            if current != logs.log_uri and (exported_attempt(current) or 0) <= logs.attempt:
                job["log_uri"] = logs.log_uri

    def attempt_logs(self, job_id: str, attempt: int) -> AttemptLogs | None:
        with self._lock:
            data = copy.deepcopy(self._attempts.get(job_id, {}).get(str(attempt)))
        if data is None:
            return None
        return AttemptLogs(
            attempt=data.get("attempt", attempt),
            log_uri=data.get("log_uri", ""),
            worker_logs={int(k): v for k, v in (data.get("worker_logs") or {}).items()},
            exported_at=data["exported_at"],
            cut_off_workers=tuple(data.get("cut_off_workers") or ()),
        )

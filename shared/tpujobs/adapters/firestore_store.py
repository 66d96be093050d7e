"""The job store on Firestore: one object that owns its parts, one part per port.

`FirestoreJobStore` is what the runtime builds and what callers that need the whole store
(the service, the API, the CLI, the benches) get; it holds no state of its own and hands each
call to its part. Each part is an object of its own, on the one client, in a module of its own:
job records and their timeline (`firestore_jobs`), worker records (`firestore_workers`),
queries and retention (`firestore_queries`), rejections and the signed reports seen
(`firestore_rejections`), exported logs (`firestore_attempt_logs`), the warm-pool unit VMs'
secrets (`firestore_unit_secrets`); the documents they read and write are mapped in
`firestore_documents`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from tpujobs.adapters.firestore_attempt_logs import FirestoreAttemptLogs
from tpujobs.adapters.firestore_documents import (
    ACTIVE_PAGE_SIZE,
    ATTEMPTS,
    DEAD_LETTERS,
    EVENTS,
    JOBS,
    MAX_PAYLOAD_CHARS,
    OUTLINE_FIELDS,
    OUTLINE_LEAVES_OUT,
    PLACEMENT_FIELDS,
    REJECTIONS,
    REPORT_MEMORY,
    REPORTS_SEEN,
    WORKERS,
    event_from_document,
    event_to_document,
    job_from_document,
    job_outline_from_document,
    job_to_document,
    label_pairs,
)
from tpujobs.adapters.firestore_jobs import FirestoreJobRecords
from tpujobs.adapters.firestore_queries import FirestoreJobQueries, FirestoreRetention
from tpujobs.adapters.firestore_reads import transient_on_failure
from tpujobs.adapters.firestore_rejections import FirestoreMessageRecords
from tpujobs.adapters.firestore_unit_secrets import FirestoreUnitSecrets
from tpujobs.adapters.firestore_workers import FirestoreWorkerRecords

if TYPE_CHECKING:
    from google.cloud import firestore

    from tpujobs.domain.job import Job, JobEvent
    from tpujobs.domain.shards import Placement
    from tpujobs.domain.transitions import Decision, Ignored, Observation
    from tpujobs.engine.ports import AttemptLogs, Clock, JobFilter, Rejection, SilentWorker, WorkerRecord

__all__ = [
    "ACTIVE_PAGE_SIZE",
    "ATTEMPTS",
    "DEAD_LETTERS",
    "EVENTS",
    "JOBS",
    "MAX_PAYLOAD_CHARS",
    "OUTLINE_FIELDS",
    "OUTLINE_LEAVES_OUT",
    "PLACEMENT_FIELDS",
    "REJECTIONS",
    "REPORTS_SEEN",
    "REPORT_MEMORY",
    "WORKERS",
    "FirestoreJobStore",
    "event_from_document",
    "event_to_document",
    "job_from_document",
    "job_outline_from_document",
    "job_to_document",
    "label_pairs",
    "transient_on_failure",
]


class FirestoreJobStore:
    """`ports.JobStore`, `ports.JobDocuments` and `ports.UnitSecretRecords` on a Firestore client
    (the emulator when FIRESTORE_EMULATOR_HOST is set): one object that owns its parts, each with
    its own state, and hands every call to the part that answers it.

    A caller that needs one part only can take it (`job_records`, `worker_records`, `queries`,
    `retention`, `messages`, `exported_logs`, `unit_secrets`); the engine's services that take the
    whole `JobStore` get this object. Its methods are the ports', and the few the local tools and
    tests read beside them (`workers`, `rejections`, `prune_expired`, `unit_secret_document`).
    """

    def __init__(self, client: firestore.Client, rejection_retention: timedelta = timedelta(days=30)) -> None:
        """`rejection_retention`: how long a rejection is kept (TPUJOBS_REJECTION_RETENTION_DAYS)."""
        self.job_records = FirestoreJobRecords(client)
        self.worker_records = FirestoreWorkerRecords(client)
        self.queries = FirestoreJobQueries(client)
        self.retention = FirestoreRetention(client)
        self.messages = FirestoreMessageRecords(client, rejection_retention)
        self.exported_logs = FirestoreAttemptLogs(client)
        self.unit_secrets = FirestoreUnitSecrets(client)

    # ports.JobRecords, and the job's documents as the API shows them (ports.JobDocuments)
    def create(self, job: Job, event: JobEvent) -> bool:
        return self.job_records.create(job, event)

    def get(self, job_id: str) -> Job | None:
        return self.job_records.get(job_id)

    def apply(self, job_id: str, seen: Observation, clock: Clock) -> Decision | Ignored:
        return self.job_records.apply(job_id, seen, clock)

    def record_checkpoint(self, job_id: str, attempt: int, at: datetime, step: int | None = None) -> bool:
        return self.job_records.record_checkpoint(job_id, attempt, at, step)

    def record_image_digest(self, job_id: str, attempt: int, digest: str) -> bool:
        return self.job_records.record_image_digest(job_id, attempt, digest)

    def record_all_started(self, job_id: str, attempt: int, at: datetime) -> bool:
        return self.job_records.record_all_started(job_id, attempt, at)

    def events(self, job_id: str) -> list[JobEvent]:
        return self.job_records.events(job_id)

    def mark_announced(self, job_id: str, event: JobEvent) -> None:
        self.job_records.mark_announced(job_id, event)

    def unannounced_events(self, before: datetime, page_size: int = ACTIVE_PAGE_SIZE) -> list[tuple[str, JobEvent]]:
        return self.job_records.unannounced_events(before, page_size)

    def relabel(
        self, job_id: str, put: Mapping[str, str], remove: Sequence[str], by: str, clock: Clock
    ) -> Decision | Ignored:
        return self.job_records.relabel(job_id, put, remove, by, clock)

    def job_document(self, job: Job) -> dict[str, Any]:
        return self.job_records.job_document(job)

    def event_documents(self, job_id: str) -> list[dict[str, Any]]:
        return self.job_records.event_documents(job_id)

    # ports.WorkerRecords
    def record_worker(self, job_id: str, worker: WorkerRecord) -> None:
        self.worker_records.record_worker(job_id, worker)

    def attempt_workers(self, job_id: str, attempt: int) -> list[WorkerRecord]:
        return self.worker_records.attempt_workers(job_id, attempt)

    def attempt_workers_heard(self, job_id: str, attempt: int) -> int:
        return self.worker_records.attempt_workers_heard(job_id, attempt)

    def attempt_workers_succeeded(self, job_id: str, attempt: int) -> int:
        return self.worker_records.attempt_workers_succeeded(job_id, attempt)

    def silent_workers(self, before: datetime, page_size: int = ACTIVE_PAGE_SIZE) -> list[SilentWorker]:
        return self.worker_records.silent_workers(before, page_size)

    def retire_worker(self, job_id: str, attempt: int, worker: str) -> None:
        self.worker_records.retire_worker(job_id, attempt, worker)

    def workers(self, job_id: str) -> list[dict[str, Any]]:
        return self.worker_records.workers(job_id)

    # ports.JobQueries
    def list_jobs(
        self, state: str | None = None, owner: str | None = None, limit: int = 100, where: JobFilter | None = None
    ) -> list[Job]:
        return self.queries.list_jobs(state, owner, limit, where)

    def active_placements(self, page_size: int = ACTIVE_PAGE_SIZE) -> list[Placement]:
        return self.queries.active_placements(page_size)

    def active_in_shard(self, zone: str, after: str, through: str, page_size: int = ACTIVE_PAGE_SIZE) -> list[Job]:
        return self.queries.active_in_shard(zone, after, through, page_size)

    def outlines(self, job_ids: Sequence[str], page_size: int = ACTIVE_PAGE_SIZE) -> list[Job]:
        return self.queries.outlines(job_ids, page_size)

    def ended_between(self, start: datetime, end: datetime, page_size: int = ACTIVE_PAGE_SIZE) -> list[Job]:
        return self.queries.ended_between(start, end, page_size)

    # ports.Retention, and what the local stack's tick deletes in place of Firestore's TTL
    def prune_expired_jobs(self, now: datetime, limit: int = 100) -> list[str]:
        return self.retention.prune_expired_jobs(now, limit)

    def prune_expired(self, now: datetime, page_size: int = ACTIVE_PAGE_SIZE) -> list[str]:
        return self.retention.prune_expired(now, page_size)

    # ports.MessageRecords, and the rejections as the API and the CLI read them
    def reject(self, rejection: Rejection) -> None:
        self.messages.reject(rejection)

    def remember_report(self, digest: str, message_id: str, job_id: str, attempt: int, now: datetime) -> str:
        return self.messages.remember_report(digest, message_id, job_id, attempt, now)

    def recall_report(self, digest: str) -> str | None:
        return self.messages.recall_report(digest)

    def rejections(self, limit: int = 100) -> list[Rejection]:
        return self.messages.rejections(limit)

    def recent_rejections(self, limit: int = 50) -> list[Rejection]:
        return self.messages.recent_rejections(limit)

    def rejection(self, message_id: str) -> Rejection | None:
        return self.messages.rejection(message_id)

    # ports.AttemptLogStore, and the attempts' and notifications' documents the API shows
    def record_attempt_logs(self, job_id: str, logs: AttemptLogs) -> None:
        self.exported_logs.record_attempt_logs(job_id, logs)

    def attempt_logs(self, job_id: str, attempt: int) -> AttemptLogs | None:
        return self.exported_logs.attempt_logs(job_id, attempt)

    def attempt_documents(self, job_id: str) -> list[dict[str, Any]]:
        return self.exported_logs.attempt_documents(job_id)

    def notification_documents(self, job_id: str) -> list[dict[str, Any]]:
        return self.exported_logs.notification_documents(job_id)

    # ports.UnitSecretRecords
    def register_unit_secret(self, digest: str, secret_sha256: str, instance_id: str, now: datetime) -> str:
        return self.unit_secrets.register_unit_secret(digest, secret_sha256, instance_id, now)

    def unit_secret_sha256(self, digest: str) -> str | None:
        return self.unit_secrets.unit_secret_sha256(digest)

    def count_refused_unit_secret(self, digest: str, now: datetime) -> None:
        self.unit_secrets.count_refused_unit_secret(digest, now)

    def unit_secret_document(self, digest: str) -> dict[str, object] | None:
        return self.unit_secrets.unit_secret_document(digest)

"""The job store on Firestore: one object made of its parts, one part per port.

`FirestoreJobStore` is what the runtime builds and what callers that need the whole store
(the service, the API, the CLI, the benches) get. Each part lives in a module of its own:
job records and their timeline (`firestore_jobs`), worker records (`firestore_workers`),
queries and retention (`firestore_queries`), rejections and the signed reports seen
(`firestore_rejections`), exported logs (`firestore_attempt_logs`), the warm-pool unit VMs'
secrets (`firestore_unit_secrets`); the documents they read and
write are mapped in `firestore_documents`.
"""

from __future__ import annotations

from datetime import timedelta

from google.cloud import firestore

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


class FirestoreJobStore(
    FirestoreJobRecords,
    FirestoreWorkerRecords,
    FirestoreJobQueries,
    FirestoreRetention,
    FirestoreMessageRecords,
    FirestoreAttemptLogs,
    FirestoreUnitSecrets,
):
    """JobStore (and JobDocuments) on a Firestore client (the emulator when FIRESTORE_EMULATOR_HOST is set)."""

    def __init__(self, client: firestore.Client, rejection_retention: timedelta = timedelta(days=30)) -> None:
        """`rejection_retention`: how long a rejection is kept (TPUJOBS_REJECTION_RETENTION_DAYS)."""
        FirestoreJobRecords.__init__(self, client)
        FirestoreMessageRecords.__init__(self, client, rejection_retention)

"""Worker records on Firestore: `jobs/{id}/workers/a{attempt}-{worker}`, the latest word of each host.

Kept apart from the job document so heartbeats never contend with transitions.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from typing import Any

from google.cloud import firestore

from tpujobs.adapters.firestore_documents import ACTIVE_PAGE_SIZE, WORKERS
from tpujobs.adapters.firestore_reads import OnFirestore, count_of, paged, transient_on_failure
from tpujobs.engine.ports import SilentWorker, WorkerRecord


class FirestoreWorkerRecords(OnFirestore):
    """`ports.WorkerRecords` on Firestore."""

    def record_worker(self, job_id: str, worker: WorkerRecord) -> None:
        """Merge what one worker host reported into `jobs/{id}/workers/a{attempt}-{worker}`.

        Kept apart from the job document so heartbeats never contend with transitions.
        `silent_after` is stored as seconds since the epoch under Firestore's maximum transform,
        so a reordered older report never brings a deadline back (the transform takes numbers).
        """
        ref = self._job_ref(job_id).collection(WORKERS).document(f"a{worker.attempt}-{worker.worker}")
        fields: dict[str, Any] = {k: v for k, v in worker.fields().items() if v is not None}
        if worker.silent_after is not None:
            fields["silent_after"] = firestore.Maximum(worker.silent_after.timestamp())
        with transient_on_failure("record worker report"):
            ref.set(fields, merge=True)

    def attempt_workers(self, job_id: str, attempt: int) -> list[WorkerRecord]:
        # One query on the job's own workers (single-field index on `attempt`): the reconciler
        # asks only for attempts past the boot timeout whose hosts are not all known to be up.
        query = self._job_ref(job_id).collection(WORKERS).where(filter=firestore.FieldFilter("attempt", "==", attempt))
        with transient_on_failure("read an attempt's workers"):
            docs = [doc.to_dict() or {} for doc in query.stream()]
        names = {f.name for f in dataclasses.fields(WorkerRecord)}
        for d in docs:  # stored as epoch seconds (record_worker)
            if isinstance(d.get("silent_after"), (int, float)):
                d["silent_after"] = datetime.fromtimestamp(d["silent_after"], tz=timezone.utc)
        return [WorkerRecord(**{k: v for k, v in d.items() if k in names}) for d in docs if "worker" in d]

    def attempt_workers_heard(self, job_id: str, attempt: int) -> int:
        """How many hosts of the attempt have a record: one aggregation query, which Firestore bills
        as one document read per batch of up to 1,000 index entries it matches (at least one),
        never a read per host document."""
        query = self._job_ref(job_id).collection(WORKERS).where(filter=firestore.FieldFilter("attempt", "==", attempt))
        return count_of(query, "count an attempt's workers")

    def attempt_workers_succeeded(self, job_id: str, attempt: int) -> int:
        """How many hosts of the attempt exited 0 by their records: the job's success count,
        kept off the job document so 1,000 exits are not 1,000 writes of one document."""
        query = (
            self._job_ref(job_id)
            .collection(WORKERS)
            .where(filter=firestore.FieldFilter("attempt", "==", attempt))
            .where(filter=firestore.FieldFilter("exit_code", "==", 0))
        )
        return count_of(query, "count an attempt's finished workers")

    def silent_workers(self, before: datetime, page_size: int = ACTIVE_PAGE_SIZE) -> list[SilentWorker]:
        # One collection-group query on (live, silent_after), paged: it returns only the silent
        # ones, so a tick reads nothing for healthy workers, for hosts worker 0 speaks for, nor
        # of finished jobs. A record without `silent_after` (written before it existed) gets
        # one from its next heartbeat.
        query = (
            self._db.collection_group(WORKERS)
            .where(filter=firestore.FieldFilter("live", "==", True))
            .where(filter=firestore.FieldFilter("silent_after", "<", before.timestamp()))
            .order_by("silent_after")
            .order_by("__name__")
        )
        found = []
        for doc in paged(query, page_size, "find silent workers"):
            d = doc.to_dict() or {}
            exited = d.get("exited_at") is not None
            # An exited host is live again only by a `started` handled after its exit, unless
            # it is worker 0 that went on speaking for its peers (`service.speaks_after_exit`).
            if not exited or d.get("speaks_for_peers"):
                job_id = doc.reference.parent.parent.id
                found.append(SilentWorker(job_id, d["attempt"], d["worker"], d["last_report_at"], exited))
        return found

    def retire_worker(self, job_id: str, attempt: int, worker: str) -> None:
        ref = self._job_ref(job_id).collection(WORKERS).document(f"a{attempt}-{worker}")
        with transient_on_failure("retire worker"):
            ref.set({"live": False}, merge=True)

    def workers(self, job_id: str) -> list[dict[str, Any]]:
        with transient_on_failure("read workers"):
            return [doc.to_dict() for doc in self._job_ref(job_id).collection(WORKERS).stream()]

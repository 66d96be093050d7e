"""Worker records and the reads over many jobs, in memory, in the order Firestore's queries return them."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from datetime import datetime, timezone

from tpujobs.adapters.firestore_documents import (
    OUTLINE_FIELDS,
    PLACEMENT_FIELDS,
    job_from_document,
    job_outline_from_document,
    placement_from_document,
)
from tpujobs.domain.job import Job
from tpujobs.domain.shards import Placement
from tpujobs.domain.states import ACTIVE
from tpujobs.engine.ports import JobFilter, SilentWorker, WorkerRecord
from tpujobs.local.fakes.documents import Collections, Document, projected

_ACTIVE_STATES = frozenset(state.value for state in ACTIVE)
_WORKER_FIELDS = frozenset(WorkerRecord.__dataclass_fields__)


class InMemoryWorkerRecords(Collections):
    """`ports.WorkerRecords`: one document per host and attempt, its deadline in epoch seconds."""

    def record_worker(self, job_id: str, worker: WorkerRecord) -> None:
        fields = {k: v for k, v in worker.fields().items() if v is not None}
        with self._lock:
            document = self._workers.setdefault(job_id, {}).setdefault(f"a{worker.attempt}-{worker.worker}", {})
            if worker.silent_after is not None:  # epoch seconds under Firestore's maximum transform
                stored = document.get("silent_after")
                later = worker.silent_after.timestamp()
                fields["silent_after"] = max(stored, later) if isinstance(stored, (int, float)) else later
            document.update(fields)

    def attempt_workers(self, job_id: str, attempt: int) -> list[WorkerRecord]:
        records = []
        for document in self._worker_documents(job_id):
            if document.get("attempt") != attempt or "worker" not in document:
                continue
            if isinstance(document.get("silent_after"), (int, float)):
                document["silent_after"] = datetime.fromtimestamp(document["silent_after"], tz=timezone.utc)
            records.append(WorkerRecord(**{k: v for k, v in document.items() if k in _WORKER_FIELDS}))
        return records

    def _worker_documents(self, job_id: str) -> list[Document]:
        with self._lock:
            workers = self._workers.get(job_id, {})
            return [copy.deepcopy(workers[key]) for key in sorted(workers)]

    def attempt_workers_heard(self, job_id: str, attempt: int) -> int:
        return sum(d.get("attempt") == attempt for d in self._worker_documents(job_id))

    def attempt_workers_succeeded(self, job_id: str, attempt: int) -> int:
        return sum(d.get("attempt") == attempt and d.get("exit_code") == 0 for d in self._worker_documents(job_id))

    def silent_workers(self, before: datetime, page_size: int = 500) -> list[SilentWorker]:
        with self._lock:
            found = sorted(
                (d["silent_after"], job_id, key, copy.deepcopy(d))
                for job_id, workers in self._workers.items()
                for key, d in workers.items()
                if d.get("live") is True
                and isinstance(d.get("silent_after"), (int, float))
                and d["silent_after"] < before.timestamp()
            )
        silent = []
        for _, job_id, _, d in found:
            exited = d.get("exited_at") is not None
            if not exited or d.get("speaks_for_peers"):
                silent.append(SilentWorker(job_id, d["attempt"], d["worker"], d["last_report_at"], exited))
        return silent

    def retire_worker(self, job_id: str, attempt: int, worker: str) -> None:
        with self._lock:
            self._workers.setdefault(job_id, {}).setdefault(f"a{attempt}-{worker}", {})["live"] = False

    def workers(self, job_id: str) -> list[Document]:
        """Every worker document of the job, as stored (`silent_after` in epoch seconds)."""
        return self._worker_documents(job_id)


class InMemoryJobQueries(Collections):
    """`ports.JobQueries` and `ports.Retention`: projected like the adapter's reads; a page size changes nothing."""

    def list_jobs(
        self, state: str | None = None, owner: str | None = None, limit: int = 100, where: JobFilter | None = None
    ) -> list[Job]:
        where = where or JobFilter()
        states = set(where.states) | ({state} if state else set())
        owner = owner or where.owner
        prefix = where.name_prefix
        newest = sorted(
            (d for _, d in self.job_documents() if d.get("created_at") is not None),
            key=lambda d: (d["created_at"], d["job_id"]),
            reverse=True,
        )
        matching = [
            job_from_document(d)
            for d in newest
            if (not states or d["state"] in states)
            and (not owner or d["owner"] == owner)
            and (not prefix or prefix <= d["name"] < prefix + "\uf8ff")
            and all(d["spec"].get("labels", {}).get(k) == v for k, v in where.labels.items())
        ]
        return matching[:limit]

    def active_placements(self, page_size: int = 500) -> list[Placement]:
        return [
            placement_from_document(job_id, projected(d, PLACEMENT_FIELDS))
            for job_id, d in self.job_documents()
            if d["state"] in _ACTIVE_STATES
        ]

    def active_in_shard(self, zone: str, after: str, through: str, page_size: int = 500) -> list[Job]:
        return [
            job_outline_from_document(projected(d, OUTLINE_FIELDS))
            for job_id, d in self.job_documents()
            if d["state"] in _ACTIVE_STATES
            and d.get("zone") == zone
            and (not after or job_id > after)
            and (not through or job_id <= through)
        ]

    def outlines(self, job_ids: Sequence[str], page_size: int = 500) -> list[Job]:
        with self._lock:
            found = [copy.deepcopy(self._jobs[job_id]) for job_id in dict.fromkeys(job_ids) if job_id in self._jobs]
        return [job_outline_from_document(projected(d, OUTLINE_FIELDS)) for d in found]

    def ended_between(self, start: datetime, end: datetime, page_size: int = 500) -> list[Job]:
        ended = sorted(
            (d["ended_at"], job_id, d)
            for job_id, d in self.job_documents()
            if d.get("ended_at") is not None and start <= d["ended_at"] < end
        )
        return [job_outline_from_document(projected(d, OUTLINE_FIELDS)) for _, _, d in ended]

    # -- Retention ---------------------------------------------------------------------------------

    def prune_expired_jobs(self, now: datetime, limit: int = 100) -> list[str]:
        with self._lock:
            expired = sorted(
                (d["expire_at"], job_id)
                for job_id, d in self._jobs.items()
                if d.get("expire_at") is not None and d["expire_at"] <= now
            )[:limit]
            for _, job_id in expired:
                for children in (self._jobs, self._events, self._workers, self._attempts):
                    children.pop(job_id, None)
            return [job_id for _, job_id in expired]

    def prune_expired(self, now: datetime, page_size: int = 500) -> list[str]:
        """What Firestore's TTL would have deleted by `now` (the dead letters live in their own fake)."""
        gone: list[str] = []
        while batch := self.prune_expired_jobs(now, page_size):
            gone += batch
        with self._lock:
            for collection in (self._rejections, self._reports_seen):
                for key in [k for k, d in collection.items() if d.get("expire_at") and d["expire_at"] <= now]:
                    del collection[key]
        return gone

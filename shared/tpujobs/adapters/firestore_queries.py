"""Queries over jobs on Firestore: listing, the reconciler's paged reads, and retention.

Each query has its index in `adapters.indexes`; every read the reconciler makes is paged with
no cap, projected to the fields it compares.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from google.cloud import firestore
from google.cloud.firestore_v1.field_path import FieldPath

from tpujobs.adapters.firestore_documents import (
    ACTIVE_PAGE_SIZE,
    ATTEMPTS,
    DEAD_LETTERS,
    EVENTS,
    JOBS,
    NOTIFICATIONS,
    OUTLINE_FIELDS,
    PLACEMENT_FIELDS,
    REJECTIONS,
    REPORTS_SEEN,
    WORKERS,
    job_from_document,
    job_outline_from_document,
    label_pairs,
    placement_from_document,
)
from tpujobs.adapters.firestore_reads import OnFirestore, paged, pages, transient_on_failure
from tpujobs.domain.job import Job
from tpujobs.domain.shards import Placement
from tpujobs.domain.states import ACTIVE
from tpujobs.engine.ports import JobFilter

LABELS_PAGE = 500  # jobs a page when several labels are asked for (`_with_labels`)
# The most jobs such a listing reads: past it, the newest of those read (a bound on one call's cost).
MAX_LABEL_MATCHES = 2_000


class FirestoreJobQueries(OnFirestore):
    """`ports.JobQueries` on Firestore."""

    def list_jobs(
        self, state: str | None = None, owner: str | None = None, limit: int = 100, where: JobFilter | None = None
    ) -> list[Job]:
        """The newest jobs that match, at most `limit`.

        Firestore filters: state (== or IN), owner, the name prefix (a range on `name`) and one
        label (array-contains on `label_pairs`), each combination with its index in
        `adapters.indexes`, newest first in the query so `limit` keeps the newest jobs. Several
        labels go to `_with_labels`.
        """
        where = where or JobFilter()
        states = tuple(dict.fromkeys((*where.states, *((state,) if state else ()))))
        owner = owner or where.owner
        query: Any = self._db.collection(JOBS)
        if len(states) == 1:
            query = query.where(filter=firestore.FieldFilter("state", "==", states[0]))
        elif states:
            query = query.where(filter=firestore.FieldFilter("state", "in", list(states)))
        if owner:
            query = query.where(filter=firestore.FieldFilter("owner", "==", owner))
        labels = sorted(where.labels.items())
        if len(labels) > 1:
            return self._with_labels(query, labels, where.name_prefix, limit)
        if labels:
            query = query.where(
                filter=firestore.FieldFilter("label_pairs", "array_contains", label_pairs(dict(labels))[0])
            )
        if where.name_prefix:
            query = query.where(filter=firestore.FieldFilter("name", ">=", where.name_prefix))
            query = query.where(filter=firestore.FieldFilter("name", "<", where.name_prefix + "\uf8ff"))
        query = query.order_by("created_at", direction=firestore.Query.DESCENDING)
        with transient_on_failure("list jobs"):
            return [job_from_document(doc.to_dict()) for doc in query.limit(limit).stream()]

    def _with_labels(self, query: Any, labels: list[tuple[str, str]], name_prefix: str | None, limit: int) -> list[Job]:
        """The newest `limit` jobs with every one of `labels`, reading only the jobs that have
        them all (and the state and owner asked for), never every job with the first label.

        One query with an equality on `spec.labels.KEY` for each label: Firestore serves
        equalities alone from its single-field indexes (a merge join), with no composite index.
        Ordering by `created_at`, or a range on `name`, would need a composite index per set of
        label keys, which no list can declare ahead of time; so the query pages in document-id
        order, and the name prefix, the order and `limit` are applied here, on those jobs only
        (at most MAX_LABEL_MATCHES of them: past that, the newest of the first read).
        """
        for key, value in labels:
            query = query.where(
                filter=firestore.FieldFilter(FieldPath("spec", "labels", key).to_api_repr(), "==", value)
            )
        documents = itertools.chain.from_iterable(pages(query.order_by("__name__"), LABELS_PAGE, "list jobs"))
        found = [
            job
            for job in (job_from_document(doc.to_dict()) for doc in itertools.islice(documents, MAX_LABEL_MATCHES))
            if not name_prefix or name_prefix <= job.name < name_prefix + "\uf8ff"
        ]
        found.sort(key=lambda job: (job.created_at, job.job_id), reverse=True)
        return found[:limit]

    def active_placements(self, page_size: int = ACTIVE_PAGE_SIZE) -> list[Placement]:
        """Where every job not yet ended is (PLACEMENT_FIELDS only: some dozens of bytes a job,
        whatever its spec), paged in document-id order with no cap: the reconcile coordinator
        cuts the tick into shards from it."""
        query = (
            self._db.collection(JOBS)
            .where(filter=firestore.FieldFilter("state", "in", [state.value for state in ACTIVE]))
            .select(PLACEMENT_FIELDS)
            .order_by("__name__")
        )
        found: list[Placement] = []
        for page in pages(query, page_size, "list where active jobs are"):
            found += [placement_from_document(doc.id, doc.to_dict() or {}) for doc in page]
        return found

    def active_in_shard(self, zone: str, after: str, through: str, page_size: int = ACTIVE_PAGE_SIZE) -> list[Job]:
        """The jobs not yet ended in `zone` whose ids are in (after, through] ("" an open end), as
        outlines (OUTLINE_FIELDS), paged in document-id order with no cap: one reconcile shard's
        read. Index: jobs (zone, state) (adapters/indexes.py)."""
        jobs = self._db.collection(JOBS)
        query = jobs.where(filter=firestore.FieldFilter("state", "in", [state.value for state in ACTIVE])).where(
            filter=firestore.FieldFilter("zone", "==", zone)
        )
        if after:
            query = query.where(filter=firestore.FieldFilter("__name__", ">", jobs.document(after)))
        if through:
            query = query.where(filter=firestore.FieldFilter("__name__", "<=", jobs.document(through)))
        query = query.select(OUTLINE_FIELDS).order_by("__name__")
        found: list[Job] = []
        for page in pages(query, page_size, f"list the active jobs of zone {zone}"):
            found += [job_outline_from_document(doc.to_dict() or {}) for doc in page]
        return found

    def outlines(self, job_ids: Sequence[str], page_size: int = ACTIVE_PAGE_SIZE) -> list[Job]:
        """These jobs as outlines (OUTLINE_FIELDS), read by id `page_size` at a time; the ones
        that do not exist are left out."""
        jobs = self._db.collection(JOBS)
        found: list[Job] = []
        ids = list(dict.fromkeys(job_ids))
        for start in range(0, len(ids), page_size):
            refs = [jobs.document(job_id) for job_id in ids[start : start + page_size]]
            with transient_on_failure("read jobs by id"):
                snapshots = list(self._db.get_all(refs, field_paths=OUTLINE_FIELDS))
            found += [job_outline_from_document(s.to_dict() or {}) for s in snapshots if s.exists]
        return found

    def ended_between(self, start: datetime, end: datetime, page_size: int = ACTIVE_PAGE_SIZE) -> list[Job]:
        """Jobs that ended in [start, end), as outlines and paged like `active_in_shard`: the
        reconciler checks their last export."""
        query = (
            self._db.collection(JOBS)
            .where(filter=firestore.FieldFilter("ended_at", ">=", start))
            .where(filter=firestore.FieldFilter("ended_at", "<", end))
            .select(OUTLINE_FIELDS)
            .order_by("ended_at")
            .order_by("__name__")
        )
        pages = paged(query, page_size, "list ended jobs")
        return [job_outline_from_document(doc.to_dict() or {}) for doc in pages]


class FirestoreRetention(OnFirestore):
    """`ports.Retention` on Firestore: what its TTL leaves behind."""

    def prune_expired_jobs(self, now: datetime, limit: int = 100) -> list[str]:
        """Delete up to `limit` ended jobs past `expire_at`, oldest expiry first, each with its
        timeline, workers and attempts: Firestore's TTL deletes a job's document but never its
        subcollections, so the reconciler's tick gets there first (jobs' `expire_at` keeps its
        single-field index for this query, infra/firestore.tf). Returns the job ids deleted."""
        query = (
            self._db.collection(JOBS)
            .where(filter=firestore.FieldFilter("expire_at", "<=", now))
            .order_by("expire_at")
            .limit(limit)
        )
        gone: list[str] = []
        with transient_on_failure("find expired jobs"):
            expired = list(query.stream())
        for job_doc in expired:
            with transient_on_failure("delete an expired job"):
                for child in (EVENTS, WORKERS, ATTEMPTS, NOTIFICATIONS):
                    for doc in job_doc.reference.collection(child).stream():
                        doc.reference.delete()
                job_doc.reference.delete()
            gone.append(job_doc.id)
        return gone

    def prune_expired(self, now: datetime, page_size: int = ACTIVE_PAGE_SIZE) -> list[str]:
        """Delete what Firestore's TTL would have by `now`: ended jobs past `expire_at` with their
        timeline, workers and attempts, and expired rejections, dead letters and signed-report memories.

        The emulator has no TTL, so the local stack calls this on its tick; in production the
        TTL policies of infra/firestore.tf delete the documents (and the reconciler, through
        `prune_expired_jobs`, the jobs with their subcollections). Returns the job ids deleted.
        """
        gone: list[str] = []
        while batch := self.prune_expired_jobs(now, page_size):
            gone += batch
        expired = firestore.FieldFilter("expire_at", "<=", now)
        for collection in (REJECTIONS, DEAD_LETTERS, REPORTS_SEEN):
            query = self._db.collection(collection).where(filter=expired).order_by("expire_at")
            for doc in paged(query, page_size, f"find expired {collection}"):
                with transient_on_failure(f"delete an expired {collection} document"):
                    doc.reference.delete()
        return gone

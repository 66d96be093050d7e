"""The job store on Firestore: job documents, their timeline, and rejections.

Every change reads the job, lets the pure domain decide, and commits the job and its
event in one atomic write whose precondition is the job's update time as read: a
compare-and-set. If another handler moved the job first, the commit fails and the
change is decided again on the new job, so a stale observation can never overwrite a
newer state. Deciding is pure, so running it again has no side effects.

Documents are flat and typed for the Firestore console: timestamps are timestamps,
the spec is a map, and the fields people filter on are top-level.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, timezone
from typing import Any

from google.api_core import exceptions as api_exceptions
from google.cloud import firestore

from tpujobs.adapters.firestore_cas import FIRESTORE, Write, compare_and_set, wrote
from tpujobs.adapters.google_errors import translated
from tpujobs.domain.accounting import AttemptUsage, all_started, checkpoint_reported, image_reported
from tpujobs.domain.admission import pool_id
from tpujobs.domain.job import Job, JobEvent, SuspectHost
from tpujobs.domain.labels import relabeled
from tpujobs.domain.naming import exported_attempt
from tpujobs.domain.shards import Placement
from tpujobs.domain.spec import PRIORITY_RANK, JobSpec
from tpujobs.domain.states import ACTIVE, JobState
from tpujobs.domain.transitions import Decision, Ignored, Observation, decide
from tpujobs.engine.ports import AttemptLogs, Clock, JobFilter, Rejection, SilentWorker, WorkerRecord

JOBS = "jobs"
EVENTS = "events"
WORKERS = "workers"
REJECTIONS = "rejections"
DEAD_LETTERS = "dead_letters"  # written by adapters.firestore_dead_letters; pruned here with the rest
REPORTS_SEEN = "reports_seen"  # {digest}: the message that first carried a signed report
REPORT_MEMORY = timedelta(days=8)  # longer than Pub/Sub keeps a message (7 days); TTL on expire_at
ATTEMPTS = "attempts"  # jobs/{id}/attempts/{N}: where each attempt's exported logs are
MAX_PAYLOAD_CHARS = 4096


def job_to_document(job: Job) -> dict[str, Any]:
    """A job as its Firestore document: flat fields and real timestamps, readable in the console."""
    spec = job.spec
    return {
        "job_id": job.job_id,
        "name": job.name,
        "owner": job.owner,
        "owner_verified": job.owner_verified,
        "submitted_via": job.submitted_via,
        "state": job.state.value,
        "state_reason": job.state_reason,
        "attempt": job.attempt,
        "restarts": job.restarts,
        "queued_resource": job.queued_resource,
        "capacity_state": job.capacity_state,
        "zone": job.zone,
        "accelerator_type": spec.accelerator_type,
        "slices": spec.slices,
        "chips": spec.chips,
        "capacity": spec.capacity,
        "priority": spec.priority,
        "priority_rank": PRIORITY_RANK[spec.priority],  # the admission queue orders by it
        # family@zone: where its chips come from; none on a warm pool, whose unit holds them
        "pool": "" if job.warm_pool else pool_id(spec, job.zone),
        "warm_pool": job.warm_pool,  # the warm pool it runs on or waits for: the pool's queue reads it
        "warm_pool_unit": job.warm_pool_unit,
        "on_demand": job.on_demand,
        "requested_at": job.requested_at,
        "resume_next": job.resume_next,
        "workers_done": list(job.workers_done),
        "next_attempt_at": job.next_attempt_at,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "exit_code": job.exit_code,
        "log_uri": job.log_uri,
        "event_seq": job.event_seq,
        "create_operation": job.create_operation,
        "suspect_hosts": [dataclasses.asdict(host) for host in job.suspect_hosts],
        "label_pairs": label_pairs(spec.labels),  # `list --label`: array-contains, one index for every key
        "record_retention_days": job.record_retention_days,
        "expire_at": job.expire_at,  # Firestore's TTL deletes the document then (infra/firestore.tf)
        "restart_requests": list(job.restart_requests),
        "run_first_attempt": job.run_first_attempt,
        **_accounting_fields(job),
        "spec": spec.to_document(),
    }


def _accounting_fields(job: Job) -> dict[str, Any]:
    """Each attempt's usage and the job's totals as of its last change
    (domain/accounting.py says how each is computed)."""
    totals = job.accounting()
    return {
        "usage": [_usage_to_map(u, job) for u in job.usage],
        "chip_hours": round(totals.chip_hours, 6),
        "useful_chip_hours": round(totals.useful_chip_hours, 6),
        "lost_chip_hours": round(totals.lost_chip_hours, 6),
        "lost_seconds": round(totals.lost_seconds, 3),
        "queue_wait_seconds": round(totals.queue_wait_seconds, 3),
        "goodput": None if totals.goodput is None else round(totals.goodput, 6),
    }


def _usage_to_map(usage: AttemptUsage, job: Job) -> dict[str, Any]:
    """One attempt's timestamps, with its numbers beside them for the console reader."""
    now = job.updated_at or usage.waiting_since
    return {
        **dataclasses.asdict(usage),
        "chip_hours": round(usage.chip_hours(now), 6),
        "queue_wait_seconds": round(usage.queue_wait_seconds(now), 3),
        "lost_seconds": round(usage.lost_seconds(), 3),
    }


def _usage_from_map(data: dict[str, Any]) -> AttemptUsage:
    names = {f.name for f in dataclasses.fields(AttemptUsage)}
    return AttemptUsage(**{k: v for k, v in data.items() if k in names})


def job_from_document(data: dict[str, Any], spec: JobSpec | None = None) -> Job:
    return Job(
        job_id=data["job_id"],
        name=data["name"],
        owner=data["owner"],
        spec=spec or JobSpec.model_validate(data["spec"], strict=False),
        state=JobState(data["state"]),
        state_reason=data.get("state_reason", ""),
        zone=data["zone"],
        attempt=data.get("attempt", 1),
        restarts=data.get("restarts", 0),
        queued_resource=data.get("queued_resource", ""),
        capacity_state=data.get("capacity_state"),
        resume_next=data.get("resume_next", False),
        workers_done=tuple(data.get("workers_done") or ()),
        next_attempt_at=data.get("next_attempt_at"),
        created_at=data.get("created_at"),
        updated_at=data.get("updated_at"),
        started_at=data.get("started_at"),
        ended_at=data.get("ended_at"),
        exit_code=data.get("exit_code"),
        log_uri=data.get("log_uri"),
        event_seq=data.get("event_seq", 0),
        usage=tuple(_usage_from_map(u) for u in data.get("usage") or ()),
        requested_at=data.get("requested_at"),
        on_demand=data.get("on_demand", False),
        submitted_via=data.get("submitted_via", "topic"),
        owner_verified=data.get("owner_verified", False),
        create_operation=data.get("create_operation") or "",
        suspect_hosts=tuple(SuspectHost(**host) for host in data.get("suspect_hosts") or ()),
        record_retention_days=data.get("record_retention_days") or 180,
        expire_at=data.get("expire_at"),
        restart_requests=tuple(data.get("restart_requests") or ()),
        run_first_attempt=data.get("run_first_attempt", 1),
        warm_pool=data.get("warm_pool") or "",
        warm_pool_unit=data.get("warm_pool_unit") or "",
    )


# The reconciler's projection of a job document (`active_in_shard`, `outlines`): every field but the spec's
# that grow with what a user writes. A spec field added later is projected unless named here.
OUTLINE_LEAVES_OUT = frozenset({"env", "secrets", "setup", "command", "code_uri", "code_sha256", "labels"})
_OUTLINE_TOP = (
    "job_id", "name", "owner", "state", "state_reason", "zone", "attempt", "restarts", "queued_resource",
    "capacity_state", "resume_next", "workers_done", "next_attempt_at", "created_at", "updated_at",
    "started_at", "ended_at", "exit_code", "log_uri", "event_seq", "usage", "requested_at", "on_demand",
    "submitted_via", "owner_verified", "create_operation", "suspect_hosts",
    "record_retention_days", "expire_at", "run_first_attempt", "warm_pool", "warm_pool_unit",
)  # fmt: skip
OUTLINE_FIELDS = (
    *_OUTLINE_TOP,
    *(f"spec.{name}" for name in JobSpec.model_fields if name not in OUTLINE_LEAVES_OUT),
)
ACTIVE_PAGE_SIZE = 500
# The reconcile coordinator's projection (`active_placements`): where a job is, nothing else.
PLACEMENT_FIELDS = ("zone", "spec.zone", "spec.zones", "warm_pool_unit")


def label_pairs(labels: Mapping[str, str]) -> list[str]:
    """Labels as `key=value` strings, sorted: what `list --label` finds with array-contains.

    A map field `spec.labels.KEY == v` ordered by `created_at` needs a composite index per
    key, which no list can declare ahead of time; one array field needs one index for all.
    """
    return sorted(f"{key}={value}" for key, value in labels.items())


def job_outline_from_document(data: dict[str, Any]) -> Job:
    """A job read through OUTLINE_FIELDS: its spec is not validated again (it was at submit)
    and lacks the fields left out; `command` is absent, so asking for capacity with an outline
    fails loudly instead of booting hosts without their command."""
    return job_from_document(data, spec=JobSpec.model_construct(**(data.get("spec") or {})))


def event_to_document(event: JobEvent) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "at": event.at,
        "from_state": event.from_state.value if event.from_state else None,
        "to_state": event.to_state.value,
        "reason": event.reason,
        "source": event.source,
        "attempt": event.attempt,
        # False until the change is published on tpujobs-status; the reconciler finishes it.
        "announced": False,
    }


def event_from_document(data: dict[str, Any]) -> JobEvent:
    return JobEvent(
        seq=data["seq"],
        at=data["at"],
        from_state=JobState(data["from_state"]) if data.get("from_state") else None,
        to_state=JobState(data["to_state"]),
        reason=data.get("reason", ""),
        source=data.get("source", "submit"),
        attempt=data.get("attempt", 1),
    )


class FirestoreJobStore:
    """JobStore on a Firestore client (the emulator when FIRESTORE_EMULATOR_HOST is set)."""

    def __init__(self, client: firestore.Client, rejection_retention: timedelta = timedelta(days=30)) -> None:
        """`rejection_retention`: how long a rejection is kept (TPUJOBS_REJECTION_RETENTION_DAYS)."""
        self._db = client
        self._rejection_retention = rejection_retention
        self._created = _JustCreated()

    def _job_ref(self, job_id: str) -> firestore.DocumentReference:
        return self._db.collection(JOBS).document(job_id)

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

        def change(snapshot: firestore.DocumentSnapshot) -> tuple[Decision | Ignored, Write | None]:
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

        def amend(snapshot: firestore.DocumentSnapshot) -> tuple[bool, Write | None]:
            if not snapshot.exists:
                return False, None
            job = job_from_document(snapshot.to_dict() or {})
            usage = change(job.usage)
            if usage is None:
                return False, None
            fields = _accounting_fields(job.evolve(usage=usage))
            option = self._db.write_option(last_update_time=snapshot.update_time)
            return True, lambda: ref.update(fields, option=option)

        return compare_and_set(ref, amend, what=f"job {job_id}", doing=doing, lost=(api_exceptions.FailedPrecondition,))

    def events(self, job_id: str) -> list[JobEvent]:
        with transient_on_failure("read events"):
            docs = self._job_ref(job_id).collection(EVENTS).order_by("seq").stream()
            return [event_from_document(doc.to_dict()) for doc in docs]

    def job_document(self, job: Job) -> dict[str, Any]:
        """The job as its document reads: what the HTTP API shows (`ports.JobDocuments`)."""
        return job_to_document(job)

    def event_documents(self, job_id: str) -> list[dict[str, Any]]:
        """The job's timeline as stored, in order: what the HTTP API's `describe` returns."""
        with transient_on_failure("read events"):
            docs = self._job_ref(job_id).collection(EVENTS).order_by("seq").stream()
            return [{"id": doc.id, **doc.to_dict()} for doc in docs]

    def attempt_documents(self, job_id: str) -> list[dict[str, Any]]:
        """`jobs/{id}/attempts/{N}` as stored, by attempt (none before an attempt's logs are exported)."""
        with transient_on_failure("read attempts"):
            docs = list(self._job_ref(job_id).collection(ATTEMPTS).stream())
        return sorted(
            ({"id": doc.id, **doc.to_dict()} for doc in docs),
            key=lambda d: int(d["id"]) if d["id"].isdigit() else 0,
        )

    def list_jobs(
        self, state: str | None = None, owner: str | None = None, limit: int = 100, where: JobFilter | None = None
    ) -> list[Job]:
        """The newest jobs that match, at most `limit`.

        Firestore filters: state (== or IN), owner, the name prefix (a range on `name`) and the
        first label (array-contains on `label_pairs`), each combination with its index in
        `adapters.indexes`. Firestore allows one array-contains per query, so further labels
        are checked here, on pages of the query, until `limit` jobs match or none are left.
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
        if labels:
            first = label_pairs(dict(labels[:1]))[0]
            query = query.where(filter=firestore.FieldFilter("label_pairs", "array_contains", first))
        if where.name_prefix:
            query = query.where(filter=firestore.FieldFilter("name", ">=", where.name_prefix))
            query = query.where(filter=firestore.FieldFilter("name", "<", where.name_prefix + "\uf8ff"))
        # Newest first in the query itself, so `limit` keeps the newest jobs, not any jobs.
        query = query.order_by("created_at", direction=firestore.Query.DESCENDING)
        if len(labels) < 2:
            with transient_on_failure("list jobs"):
                return [job_from_document(doc.to_dict()) for doc in query.limit(limit).stream()]
        found: list[Job] = []
        for page in _pages(query, limit, "list jobs"):  # limit >= 1 (the CLI and the API check)
            found += [
                job
                for job in (job_from_document(doc.to_dict()) for doc in page)
                if all(job.spec.labels.get(k) == v for k, v in labels)
            ]
            if len(found) >= limit:
                break
        return found[:limit]

    def relabel(
        self, job_id: str, put: Mapping[str, str], remove: Sequence[str], by: str, clock: Clock
    ) -> Decision | Ignored:
        """Change the job's labels and record who did, compare-and-set like `apply`, keeping its
        state (`domain.labels.relabeled`); LabelError when the labels are refused."""
        ref = self._job_ref(job_id)

        def change(snapshot: firestore.DocumentSnapshot) -> tuple[Decision | Ignored, Write | None]:
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
                for child in (EVENTS, WORKERS, ATTEMPTS):
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
            for doc in _paged(query, page_size, f"find expired {collection}"):
                with transient_on_failure(f"delete an expired {collection} document"):
                    doc.reference.delete()
        return gone

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
        for page in _pages(query, page_size, "list where active jobs are"):
            found += [_placement(doc.id, doc.to_dict() or {}) for doc in page]
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
        for page in _pages(query, page_size, f"list the active jobs of zone {zone}"):
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
        pages = _paged(query, page_size, "list ended jobs")
        return [job_outline_from_document(doc.to_dict() or {}) for doc in pages]

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
        """How many hosts of the attempt have a record: one aggregation query, no documents read."""
        query = self._job_ref(job_id).collection(WORKERS).where(filter=firestore.FieldFilter("attempt", "==", attempt))
        return _count(query, "count an attempt's workers")

    def attempt_workers_succeeded(self, job_id: str, attempt: int) -> int:
        """How many hosts of the attempt exited 0 by their records: the job's success count,
        kept off the job document so 1,000 exits are not 1,000 writes of one document."""
        query = (
            self._job_ref(job_id)
            .collection(WORKERS)
            .where(filter=firestore.FieldFilter("attempt", "==", attempt))
            .where(filter=firestore.FieldFilter("exit_code", "==", 0))
        )
        return _count(query, "count an attempt's finished workers")

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
        for doc in _paged(query, page_size, "find silent workers"):
            d = doc.to_dict() or {}
            exited = d.get("exited_at") is not None
            # An exited host is live again only by a `started` handled after its exit, unless
            # it is worker 0 that went on speaking for its peers (`service.speaks_after_exit`).
            if not exited or d.get("speaks_for_peers"):
                job_id = doc.reference.parent.parent.id
                found.append(SilentWorker(job_id, d["attempt"], d["worker"], d["last_report_at"], exited))
        return found

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
        docs = _paged(query, page_size, "find unannounced events")
        return [(doc.reference.parent.parent.id, event_from_document(doc.to_dict())) for doc in docs]

    def retire_worker(self, job_id: str, attempt: int, worker: str) -> None:
        ref = self._job_ref(job_id).collection(WORKERS).document(f"a{attempt}-{worker}")
        with transient_on_failure("retire worker"):
            ref.set({"live": False}, merge=True)

    def workers(self, job_id: str) -> list[dict[str, Any]]:
        with transient_on_failure("read workers"):
            return [doc.to_dict() for doc in self._job_ref(job_id).collection(WORKERS).stream()]

    def record_attempt_logs(self, job_id: str, logs: AttemptLogs) -> None:
        """Merge the attempt's exported logs into `jobs/{id}/attempts/{N}`, then point the
        job's `log_uri` at its combined log unless a later attempt's is already there.

        The job document is written with a plain field update, outside the compare-and-set
        of `apply`: that is safe, because any write changes the document's update time, so a
        transition racing it fails its precondition, reads again (this log_uri included) and
        decides again. The update itself carries a precondition too, so that an export of
        attempt 1 finishing late never replaces attempt 2's log_uri.
        """
        job_ref = self._job_ref(job_id)
        attempt_ref = job_ref.collection(ATTEMPTS).document(str(logs.attempt))
        fields = logs.fields()
        with transient_on_failure("record exported logs"):
            # Every field named is replaced whole: a re-export's worker_logs map is the truth.
            attempt_ref.set(fields, merge=list(fields))

        def point(snapshot: firestore.DocumentSnapshot) -> tuple[None, Write | None]:
            if not snapshot.exists:
                return None, None
            current = (snapshot.to_dict() or {}).get("log_uri")
            if current == logs.log_uri or (exported_attempt(current) or 0) > logs.attempt:
                return None, None
            option = self._db.write_option(last_update_time=snapshot.update_time)
            return None, lambda: job_ref.update({"log_uri": logs.log_uri}, option=option)

        # A job deleted meanwhile (NotFound) is looked at again too, and then left alone.
        compare_and_set(
            job_ref,
            point,
            what=f"job {job_id}",
            doing="record its log_uri",
            lost=(api_exceptions.FailedPrecondition, api_exceptions.NotFound),
        )

    def attempt_logs(self, job_id: str, attempt: int) -> AttemptLogs | None:
        ref = self._job_ref(job_id).collection(ATTEMPTS).document(str(attempt))
        with transient_on_failure("read exported logs"):
            snapshot = ref.get()
        if not snapshot.exists:
            return None
        data = snapshot.to_dict() or {}
        return AttemptLogs(
            attempt=data.get("attempt", attempt),
            log_uri=data.get("log_uri", ""),
            worker_logs={int(k): v for k, v in (data.get("worker_logs") or {}).items()},
            exported_at=data["exported_at"],
            cut_off_workers=tuple(data.get("cut_off_workers") or ()),
        )

    def reject(self, rejection: Rejection) -> None:
        ref = self._db.collection(REJECTIONS).document(_document_id(rejection.message_id))
        with transient_on_failure("record rejection"):
            ref.set(
                {
                    "at": rejection.at,
                    "reason": rejection.reason,
                    "payload": rejection.payload[:MAX_PAYLOAD_CHARS],
                    "topic": rejection.topic,
                    "message_id": rejection.message_id,
                    # how often this message was seen: more than 1 means it was redelivered
                    "deliveries": firestore.Increment(1),
                    "expire_at": rejection.at + self._rejection_retention,  # Firestore's TTL deletes it then
                },
                merge=True,
            )

    def remember_report(self, digest: str, message_id: str, job_id: str, attempt: int, now: datetime) -> str:
        """The id of the first message that carried this signed report: `message_id` if new."""
        ref = self._db.collection(REPORTS_SEEN).document(digest)
        fields = {"message_id": message_id, "job_id": job_id, "attempt": attempt, "seen_at": now,
                  "expire_at": now + REPORT_MEMORY}  # fmt: skip
        with transient_on_failure("remember a signed report"):
            try:
                ref.create(fields)
                return message_id
            except api_exceptions.Conflict:  # AlreadyExists: seen before, maybe by this very message
                pass
        with transient_on_failure("read a remembered report"):
            first = ref.get().to_dict() or {}
        return str(first.get("message_id") or message_id)

    def rejections(self, limit: int = 100) -> list[Rejection]:
        with transient_on_failure("list rejections"):
            docs = list(self._db.collection(REJECTIONS).limit(limit).stream())
        return [
            Rejection(
                message_id=d.get("message_id") or doc.id,
                at=d["at"],
                reason=d["reason"],
                payload=d.get("payload", ""),
                topic=d.get("topic", ""),
            )
            for doc in docs
            for d in [doc.to_dict() or {}]
        ]

    def recent_rejections(self, limit: int = 50) -> list[Rejection]:
        """The newest rejections first (`tpujobs rejections`)."""
        with transient_on_failure("list recent rejections"):
            docs = list(
                self._db.collection(REJECTIONS)
                .order_by("at", direction=firestore.Query.DESCENDING)
                .limit(limit)
                .stream()
            )
        return [_rejection(doc.id, doc.to_dict() or {}) for doc in docs]

    def rejection(self, message_id: str) -> Rejection | None:
        """The rejection of one message, if it was refused (`submit --wait`)."""
        with transient_on_failure("read a rejection"):
            doc = self._db.collection(REJECTIONS).document(_document_id(message_id)).get()
        return _rejection(doc.id, doc.to_dict() or {}) if doc.exists else None


class _JustCreated:
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


def _placement(job_id: str, data: dict[str, Any]) -> Placement:
    """A job's place from its PLACEMENT_FIELDS: the zones it may use as `JobSpec.preferred_zones` says."""
    spec = data.get("spec") or {}
    zones = tuple(spec.get("zones") or ()) or ((spec["zone"],) if spec.get("zone") else ())
    return Placement(job_id, data.get("zone") or "", zones, data.get("warm_pool_unit") or "")


def _rejection(document_id: str, data: dict[str, Any]) -> Rejection:
    return Rejection(
        message_id=data.get("message_id") or document_id,
        at=data["at"],
        reason=data.get("reason", ""),
        payload=data.get("payload", ""),
        topic=data.get("topic", ""),
    )


def _document_id(message_id: str) -> str:
    """Firestore ids may not contain '/' nor be '.' or '..'; Pub/Sub ids are digits anyway."""
    cleaned = message_id.replace("/", "_")[:1500]
    return cleaned if cleaned not in ("", ".", "..") else f"_{cleaned}"


def transient_on_failure(doing: str) -> AbstractContextManager[None]:
    """Firestore's errors through the one table (adapters/google_errors.py): TransientError
    when worth retrying, PermanentError when not, naming what was being done. An outcome a
    caller expects (AlreadyExists on create) is caught inside the block."""
    return translated(FIRESTORE, doing)


def _count(query: Any, doing: str) -> int:
    """The number of documents the query matches, by Firestore's count aggregation."""
    with transient_on_failure(doing):
        result = query.count(alias="n").get()
    return int(result[0][0].value)


def _paged(query: Any, page_size: int, doing: str) -> list[Any]:
    """Every document the query matches, `page_size` at a time: never a cap that would hide
    the rest."""
    return [doc for page in _pages(query, page_size, doing) for doc in page]


def _pages(query: Any, page_size: int, doing: str) -> Iterator[list[Any]]:
    """The query's documents a page at a time, each page read only when asked for. The query
    must be ordered (the last document of a page is the next cursor)."""
    after: Any = None
    while True:
        with transient_on_failure(doing):
            page = list((query if after is None else query.start_after(after)).limit(page_size).stream())
        yield page
        if len(page) < page_size:
            return
        after = page[-1]

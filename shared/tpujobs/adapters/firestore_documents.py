"""The job store's documents on Firestore: what each collection is called and how a job, its
timeline entry, a rejection and a placement map to and from a document.

Documents are flat and typed for the Firestore console: timestamps are timestamps, the spec is
a map, and the fields people filter on are top-level. Pure mapping, no client: the in-memory
fakes (`tpujobs.local.fakes`) show what the API shows through the same functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from tpujobs.domain.accounting import AttemptUsage
from tpujobs.domain.admission import job_pool
from tpujobs.domain.job import HeldOver, Job, JobEvent, ScheduledMaintenance, SuspectHost
from tpujobs.domain.shards import Placement
from tpujobs.domain.spec import PRIORITY_RANK, JobSpec
from tpujobs.domain.states import JobState
from tpujobs.engine.ports import Rejection

JOBS = "jobs"
EVENTS = "events"
WORKERS = "workers"
REJECTIONS = "rejections"
DEAD_LETTERS = "dead_letters"  # written by adapters.firestore_dead_letters; pruned here with the rest
REPORTS_SEEN = "reports_seen"  # {digest}: the message that first carried a signed report
REPORT_MEMORY = timedelta(days=8)  # longer than Pub/Sub keeps a message (7 days); TTL on expire_at
ATTEMPTS = "attempts"  # jobs/{id}/attempts/{N}: where each attempt's exported logs are
NOTIFICATIONS = "notifications"  # jobs/{id}/notifications/{key}: what became of each notify target
MAX_PAYLOAD_CHARS = 4096


def job_to_document(job: Job) -> dict[str, Any]:
    """A job as its Firestore document: flat fields and real timestamps, readable in the console."""
    spec = job.spec
    return {
        "job_id": job.job_id,
        "name": job.name,
        "owner": job.owner,
        "owner_verified": job.owner_verified,
        "team": job.team,  # whose shares it draws on (`domain.teams`); admission reads it
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
        # its admission pool (`domain.quotas`), by the capacity it asks for now; none on a warm
        # pool, whose unit holds the chips
        "pool": "" if job.warm_pool else job_pool(job).id,
        "warm_pool": job.warm_pool,  # the warm pool it runs on or waits for: the pool's queue reads it
        "warm_pool_unit": job.warm_pool_unit,
        "unit_requested_at": job.unit_requested_at,  # its VMs are no older (`attempt-key` checks)
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
        "maintenance": [dataclasses.asdict(window) for window in job.maintenance],
        "run_ends_at": job.run_ends_at,  # Compute Engine ends the attempt's VMs then (maxRunDuration)
        # earlier attempts' holdings kept through their hosts' shutdown grace (`domain.grace`)
        "held_over": [dataclasses.asdict(held) for held in job.held_over],
        "label_pairs": label_pairs(spec.labels),  # `list --label`: array-contains, one index for every key
        "record_retention_days": job.record_retention_days,
        "expire_at": job.expire_at,  # Firestore's TTL deletes the document then (infra/firestore.tf)
        "restart_requests": list(job.restart_requests),
        "run_first_attempt": job.run_first_attempt,
        **accounting_fields(job),
        "spec": spec.to_document(),
    }


def accounting_fields(job: Job) -> dict[str, Any]:
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
        team=data.get("team") or "",
        create_operation=data.get("create_operation") or "",
        suspect_hosts=tuple(SuspectHost(**host) for host in data.get("suspect_hosts") or ()),
        maintenance=tuple(ScheduledMaintenance(**window) for window in data.get("maintenance") or ()),
        run_ends_at=data.get("run_ends_at"),
        record_retention_days=data.get("record_retention_days") or 180,
        expire_at=data.get("expire_at"),
        restart_requests=tuple(data.get("restart_requests") or ()),
        run_first_attempt=data.get("run_first_attempt", 1),
        warm_pool=data.get("warm_pool") or "",
        warm_pool_unit=data.get("warm_pool_unit") or "",
        unit_requested_at=data.get("unit_requested_at"),
        held_over=tuple(HeldOver(**held) for held in data.get("held_over") or ()),
    )


# The reconciler's projection of a job document (`active_in_shard`, `outlines`): every field but the spec's
# that grow with what a user writes. A spec field added later is projected unless named here.
OUTLINE_LEAVES_OUT = frozenset({"env", "secrets", "setup", "command", "code_uri", "code_sha256", "labels"})
_OUTLINE_TOP = (
    "job_id", "name", "owner", "state", "state_reason", "zone", "attempt", "restarts", "queued_resource",
    "capacity_state", "resume_next", "workers_done", "next_attempt_at", "created_at", "updated_at",
    "started_at", "ended_at", "exit_code", "log_uri", "event_seq", "usage", "requested_at", "on_demand",
    "submitted_via", "owner_verified", "create_operation", "suspect_hosts", "maintenance",
    "record_retention_days", "expire_at", "run_first_attempt", "warm_pool", "warm_pool_unit", "unit_requested_at",
    "held_over", "run_ends_at", "team",
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


def placement_from_document(job_id: str, data: dict[str, Any]) -> Placement:
    """A job's place from its PLACEMENT_FIELDS: the zones it may use as `JobSpec.preferred_zones` says."""
    spec = data.get("spec") or {}
    zones = tuple(spec.get("zones") or ()) or ((spec["zone"],) if spec.get("zone") else ())
    return Placement(job_id, data.get("zone") or "", zones, data.get("warm_pool_unit") or "")


def rejection_from_document(document_id: str, data: dict[str, Any]) -> Rejection:
    return Rejection(
        message_id=data.get("message_id") or document_id,
        at=data["at"],
        reason=data.get("reason", ""),
        payload=data.get("payload", ""),
        topic=data.get("topic", ""),
    )


def rejection_document_id(message_id: str) -> str:
    """Firestore ids may not contain '/' nor be '.' or '..'; Pub/Sub ids are digits anyway."""
    cleaned = message_id.replace("/", "_")[:1500]
    return cleaned if cleaned not in ("", ".", "..") else f"_{cleaned}"

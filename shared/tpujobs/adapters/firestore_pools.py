"""Quotas and the chips each pool has handed out, on Firestore (`tpujobs.domain.admission`).

`config/quotas` holds the limits (`domain.quotas`: per zone or region, family and tier, and
named reservations), edited in the console or with `tpujobs quota`. `quota_pools/{pool id}`
lists the jobs (and warm pools' units) holding chips of a limited pool, with their zones. A
change to a pool document is a compare-and-set on its update time, like the job store's
(`firestore_cas.wrote`): no read-write transaction, so no lock for concurrent admissions to
wait on; the service reads again after a lost race.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from google.cloud import firestore
from google.cloud.firestore_v1.field_path import FieldPath

from tpujobs.adapters.firestore_cas import compare_and_set, wrote
from tpujobs.adapters.firestore_store import JOBS, job_from_document, transient_on_failure
from tpujobs.domain.admission import Holder
from tpujobs.domain.fair_share import Waiting
from tpujobs.domain.job import Job
from tpujobs.domain.quota_edits import with_limit, with_reservation
from tpujobs.domain.quotas import RESERVATIONS, PoolKey, QuotaBook
from tpujobs.domain.states import JobState
from tpujobs.engine.ports import PoolView as PoolView  # the port's view; its version is the update time

if TYPE_CHECKING:
    from tpujobs.adapters.firestore_cas import Snapshot

CONFIG = "config"
QUOTAS = "quotas"
POOLS = "quota_pools"
WAITING_FIELDS = [
    "job_id", "team", "zone", "chips", "priority", "created_at", "attempt", "state_reason", "spec.on_preemption",
]  # fmt: skip


class FirestorePools:
    """The admission store on a Firestore client."""

    def __init__(self, client: firestore.Client) -> None:
        self._db = client

    # -- quotas ---------------------------------------------------------------------

    def quotas(self) -> QuotaBook:
        with transient_on_failure("read quotas"):
            snapshot = self._quotas_ref().get()
        return QuotaBook(snapshot.to_dict() if snapshot.exists else None)

    def set_quota(self, location: str, family: str, tier: str, chips: int | None) -> None:
        """Set (or with None remove) one limit; takes effect at the next admission."""
        self._edit(lambda document: with_limit(document, location, family, tier, chips), location)

    def set_reservation(self, name: str, chips: int | None) -> None:
        """Set (or with None remove) a named reservation's chips."""
        self._edit(lambda document: with_reservation(document, name, chips), RESERVATIONS)

    def _quotas_ref(self) -> firestore.DocumentReference:
        return self._db.collection(CONFIG).document(QUOTAS)

    def _edit(self, edit: Callable[[dict[str, Any]], dict[str, Any]], key: str) -> None:
        """Rewrite one top-level entry of `config/quotas` (a location, or the reservations), by
        compare-and-set on the document as read: an admin's edit in between is kept."""
        ref = self._quotas_ref()

        def change(snapshot: Snapshot) -> tuple[None, Callable[[], object] | None]:
            document = (snapshot.to_dict() or {}) if snapshot.exists else {}
            edited = edit(document)
            if edited == document:
                return None, None
            if not snapshot.exists:
                return None, lambda: ref.create(edited)
            value = edited.get(key, firestore.DELETE_FIELD)
            option = self._db.write_option(last_update_time=snapshot.update_time)
            return None, lambda: ref.update({FieldPath(key).to_api_repr(): value}, option=option)

        compare_and_set(ref, change, what="config/quotas", doing="set a quota")

    # -- holders --------------------------------------------------------------------

    def view(self, pool: str) -> PoolView:
        with transient_on_failure("read pool"):
            snapshot = self._db.collection(POOLS).document(pool).get()
        if not snapshot.exists:
            return PoolView(pool, (), None)
        holders = (snapshot.to_dict() or {}).get("holders") or {}
        return PoolView(pool, tuple(_holder(job_id, h) for job_id, h in sorted(holders.items())), snapshot.update_time)

    def change(self, seen: PoolView, add: Holder | Sequence[Holder] = (), remove: frozenset[str] = frozenset()) -> bool:
        """Add and remove holders if the pool is still as `seen`; False when someone came first."""
        holders = {h.job_id: h for h in seen.holders if h.job_id not in remove}
        for holder in (add,) if isinstance(add, Holder) else add:
            holders[holder.job_id] = holder
        document = {
            **_described(seen.pool),
            "chips_held": sum(h.chips for h in holders.values()),
            "holders": {job_id: _holder_fields(h) for job_id, h in holders.items()},
            "updated_at": firestore.SERVER_TIMESTAMP,
        }
        ref = self._db.collection(POOLS).document(seen.pool)
        if seen.version is None:
            committed = wrote(lambda: ref.create(document), f"change pool {seen.pool}")
        else:
            option = self._db.write_option(last_update_time=seen.version)
            committed = wrote(lambda: ref.update(document, option=option), f"change pool {seen.pool}")
        if not committed:
            time.sleep(random.uniform(0, 0.01))  # the caller reads again; spread a burst's retries
        return committed

    def pools(self) -> list[str]:
        """Every pool that has a document: those the reconciler looks after."""
        with transient_on_failure("list pools"):
            return [ref.id for ref in self._db.collection(POOLS).list_documents()]

    # -- the queue ------------------------------------------------------------------

    def queue(self, pool: str, limit: int = 10) -> list[Job]:
        """The pool's QUEUED jobs in admission order: priority, then submission."""
        query = (
            self._db.collection(JOBS)
            .where(filter=firestore.FieldFilter("pool", "==", pool))
            .where(filter=firestore.FieldFilter("state", "==", JobState.QUEUED.value))
            .order_by("priority_rank", direction=firestore.Query.DESCENDING)
            .order_by("created_at")
            .limit(limit)
        )
        with transient_on_failure("read queue"):
            return [job_from_document(d.to_dict() or {}) for d in query.stream()]

    def waiting(self, pool: str) -> list[Waiting]:
        """Every QUEUED job of the pool, as admission orders them (a projection: no window, so a
        backlog in one zone or team never hides another's job; `domain.fair_share` orders them)."""
        query = (
            self._db.collection(JOBS)
            .where(filter=firestore.FieldFilter("pool", "==", pool))
            .where(filter=firestore.FieldFilter("state", "==", JobState.QUEUED.value))
            .select(WAITING_FIELDS)
        )
        with transient_on_failure("read queue"):
            return [waiting_from_document(d.to_dict() or {}) for d in query.stream()]

    def active_in(self, pool: str) -> list[Job]:
        """Jobs of the pool that may hold chips: everything not QUEUED and not ended."""
        query = (
            self._db.collection(JOBS)
            .where(filter=firestore.FieldFilter("pool", "==", pool))
            .where(
                filter=firestore.FieldFilter(
                    "state", "in", [JobState.PROVISIONING.value, JobState.RUNNING.value, JobState.RECOVERING.value]
                )
            )
        )
        with transient_on_failure("read pool jobs"):
            return [job_from_document(d.to_dict() or {}) for d in query.stream()]


def waiting_from_document(data: dict[str, Any]) -> Waiting:
    """A QUEUED job's document (`WAITING_FIELDS` of it) as admission reads it."""
    return Waiting(
        job_id=str(data["job_id"]),
        team=str(data.get("team") or ""),
        zone=str(data.get("zone") or ""),
        chips=int(data["chips"]),
        priority=str(data["priority"]),
        created_at=data["created_at"],
        attempt=int(data["attempt"]),
        state_reason=str(data.get("state_reason") or ""),
        evictable=(data.get("spec") or {}).get("on_preemption") != "fail",
    )


def _holder(job_id: str, fields: dict[str, Any]) -> Holder:
    return Holder(
        job_id=job_id,
        chips=int(fields["chips"]),
        attempt=int(fields["attempt"]),
        priority=str(fields["priority"]),
        since=fields["since"],
        evictable=bool(fields.get("evictable", True)),
        zone=str(fields.get("zone") or ""),
        team=str(fields.get("team") or ""),
    )


def _holder_fields(holder: Holder) -> dict[str, Any]:
    since: datetime = holder.since
    return {
        "chips": holder.chips,
        "attempt": holder.attempt,
        "priority": holder.priority,
        "since": since,
        "evictable": holder.evictable,
        "zone": holder.zone,
        "team": holder.team,
    }


def _described(pool: str) -> dict[str, str]:
    """The pool document's own fields, for a reader in the console: its family, tier, region and
    reservation; none for a zone's pool from before pools were regional (the reconciler retires it)."""
    try:
        key = PoolKey.parse(pool)
    except ValueError:
        return {}
    return {"family": key.family, "tier": key.tier, "region": key.region, "reservation": key.reservation}

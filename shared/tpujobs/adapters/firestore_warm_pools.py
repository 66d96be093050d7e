"""Warm pools on Firestore: `pools/{name}`, one document per pool (`tpujobs.domain.pools`).

The document holds the pool's settings, its units (state, queued resource, job, assignment
counter) and its recent busy and idle stretches, flat and with real timestamps, so it reads
well in the console. Every change is a compare-and-set on the document's update time
(`firestore_cas.compare_and_set`): two handlers that both saw a unit idle cannot both give it a
job, the loser decides again on a fresh read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from google.cloud import firestore

from tpujobs.adapters.firestore_cas import compare_and_set, wrote
from tpujobs.adapters.firestore_store import JOBS, job_from_document, transient_on_failure
from tpujobs.domain.job import Job
from tpujobs.domain.pools import Pool, PoolState, Stretch, Unit, UnitState, settings_of
from tpujobs.domain.states import JobState

POOLS = "pools"


def pool_to_document(pool: Pool) -> dict[str, Any]:
    """A pool as its document: settings, units (with their queued resource spelled out) and usage."""
    return {
        **settings_of(pool),
        "updated_at": pool.updated_at,
        "units": [
            {
                **dataclasses.asdict(unit),
                "state": unit.state.value,
                "queued_resource": unit.queued_resource(pool.name),
            }
            for unit in pool.units
        ],
        "busy_chip_hours": pool.busy_chip_hours,
        "idle_chip_hours": pool.idle_chip_hours,
        "recent": [dataclasses.asdict(stretch) for stretch in pool.recent],
    }


_UNIT_FIELDS = frozenset(f.name for f in dataclasses.fields(Unit))
_STRETCH_FIELDS = frozenset(f.name for f in dataclasses.fields(Stretch))


def pool_from_document(data: dict[str, Any], version: Any = None) -> Pool:
    units = tuple(
        Unit(**{**{k: v for k, v in u.items() if k in _UNIT_FIELDS}, "state": UnitState(u["state"])})
        for u in data.get("units") or ()
    )
    return Pool(
        name=data["name"],
        owner=data["owner"],
        accelerator_type=data["accelerator_type"],
        slices=int(data.get("slices", 1)),
        count=int(data.get("count", len(units))),
        capacity=data.get("capacity", "on-demand"),
        zones=tuple(data.get("zones") or ()),
        created_at=data["created_at"],
        updated_at=data.get("updated_at") or data["created_at"],
        reservation=data.get("reservation"),
        image=data.get("image"),
        idle_minutes=data.get("idle_minutes"),
        service_account=data.get("service_account"),
        users=tuple(data.get("users") or ()),
        platform=data.get("platform") or "tpu-api",
        owner_verified=bool(data.get("owner_verified", True)),  # older documents: as the API's, out of a claim's reach
        state=PoolState(data.get("state", PoolState.ACTIVE.value)),
        reason=data.get("reason", ""),
        units=units,
        busy_chip_hours=float(data.get("busy_chip_hours") or 0.0),
        idle_chip_hours=float(data.get("idle_chip_hours") or 0.0),
        recent=tuple(Stretch(**{k: v for k, v in s.items() if k in _STRETCH_FIELDS}) for s in data.get("recent") or ()),
        version=version,
    )


class FirestoreWarmPools:
    """The warm-pool store (`ports.WarmPoolStore`) on a Firestore client."""

    def __init__(self, client: firestore.Client) -> None:
        self._db = client

    def _ref(self, name: str) -> firestore.DocumentReference:
        return self._db.collection(POOLS).document(name)

    def get(self, name: str) -> Pool | None:
        with transient_on_failure(f"read pool {name}"):
            snapshot = self._ref(name).get()
        return pool_from_document(snapshot.to_dict() or {}, snapshot.update_time) if snapshot.exists else None

    def create(self, pool: Pool) -> bool:
        """Write a new pool; False when the name is taken."""
        ref = self._ref(pool.name)
        return wrote(lambda: ref.create(pool_to_document(pool)), f"create pool {pool.name}")

    def update(self, name: str, change: Callable[[Pool], Pool | None]) -> tuple[Pool, Pool] | None:
        """Apply `change` to a fresh read until its write commits: (before, after), the pool as
        read and as written; None when the pool does not exist. `change` returning None, or the
        same pool, writes nothing (after is before). Exceptions from `change` pass through."""
        ref = self._ref(name)

        def decide(snapshot: Any) -> tuple[tuple[Pool, Pool] | None, Callable[[], object] | None]:
            if not snapshot.exists:
                return None, None
            before = pool_from_document(snapshot.to_dict() or {}, snapshot.update_time)
            after = change(before)
            if after is None or after == before:
                return (before, before), None
            option = self._db.write_option(last_update_time=snapshot.update_time)
            document = pool_to_document(after)
            return (before, after), lambda: ref.update(document, option=option)

        return compare_and_set(ref, decide, what=f"pool {name}", doing="change it")

    def delete(self, seen: Pool) -> bool:
        """Delete the pool document if it is still as `seen`; False when it changed since."""
        ref = self._ref(seen.name)
        option = self._db.write_option(last_update_time=seen.version)
        return wrote(lambda: ref.delete(option=option), f"delete pool {seen.name}")

    def list_pools(self) -> list[Pool]:
        with transient_on_failure("list pools"):
            return [pool_from_document(s.to_dict() or {}, s.update_time) for s in self._db.collection(POOLS).stream()]

    def queue(self, name: str, limit: int = 10) -> list[Job]:
        """The jobs waiting for the pool, in its order: priority, then submission."""
        query = (
            self._db.collection(JOBS)
            .where(filter=firestore.FieldFilter("warm_pool", "==", name))
            .where(filter=firestore.FieldFilter("state", "==", JobState.QUEUED.value))
            .order_by("priority_rank", direction=firestore.Query.DESCENDING)
            .order_by("created_at")
            .limit(limit)
        )
        with transient_on_failure(f"read the queue of pool {name}"):
            return [job_from_document(d.to_dict() or {}) for d in query.stream()]

    def jobs_on(self, name: str) -> list[Job]:
        """Every job not ended that runs on, or waits for, the pool."""
        query = (
            self._db.collection(JOBS)
            .where(filter=firestore.FieldFilter("warm_pool", "==", name))
            .where(
                filter=firestore.FieldFilter(
                    "state",
                    "in",
                    [s.value for s in (JobState.QUEUED, JobState.PROVISIONING, JobState.RUNNING, JobState.RECOVERING)],
                )
            )
        )
        with transient_on_failure(f"read the jobs of pool {name}"):
            return [job_from_document(d.to_dict() or {}) for d in query.stream()]

"""Quota pools and warm pools in memory: `FirestorePools` and `FirestoreWarmPools` without Firestore.

A version is a counter that every write moves, standing for Firestore's update time: a
compare-and-set against a version that moved fails, as the adapters' preconditions do. The
queues read the jobs of an `InMemoryJobStore`, in the order the adapters' queries return them.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tpujobs.adapters.firestore_documents import job_from_document
from tpujobs.adapters.firestore_pools import waiting_from_document
from tpujobs.domain.admission import Holder
from tpujobs.domain.fair_share import Waiting
from tpujobs.domain.job import Job
from tpujobs.domain.pools import Pool
from tpujobs.domain.quota_edits import with_limit, with_reservation
from tpujobs.domain.quotas import QuotaBook
from tpujobs.domain.states import JobState
from tpujobs.engine.ports import PoolView
from tpujobs.local.fakes.job_store import InMemoryJobStore

_HOLDING = frozenset(s.value for s in (JobState.PROVISIONING, JobState.RUNNING, JobState.RECOVERING))
_ON_POOL = _HOLDING | {JobState.QUEUED.value}


def _queued_in_order(documents: Iterable[dict[str, Any]], limit: int) -> list[Job]:
    """QUEUED jobs by priority (highest first), then submission, then id: the queues' order."""
    queued = [d for d in documents if d.get("state") == JobState.QUEUED.value]
    queued.sort(key=lambda d: (-d["priority_rank"], d["created_at"], d["job_id"]))
    return [job_from_document(d) for d in queued[:limit]]


class InMemoryPools:
    """`ports.Pools` in memory, with `set_quota` as `FirestorePools` has it."""

    def __init__(self, jobs: InMemoryJobStore) -> None:
        self._jobs = jobs
        self._lock = threading.Lock()
        self._quotas: dict[str, Any] = {}  # config/quotas as stored
        self._holders: dict[str, tuple[tuple[Holder, ...], int]] = {}  # pool -> (holders, version)
        self._versions = itertools.count(1)

    def quotas(self) -> QuotaBook:
        with self._lock:
            return QuotaBook(self._quotas)

    def set_quota(self, location: str, family: str, tier: str, chips: int | None) -> None:
        """Set (or with None remove) one limit, as the adapter writes it (`domain.quota_edits`)."""
        with self._lock:
            self._quotas = with_limit(self._quotas, location, family, tier, chips)

    def set_reservation(self, name: str, chips: int | None) -> None:
        with self._lock:
            self._quotas = with_reservation(self._quotas, name, chips)

    def view(self, pool: str) -> PoolView:
        with self._lock:
            if pool not in self._holders:
                return PoolView(pool, (), None)
            holders, version = self._holders[pool]
            return PoolView(pool, holders, version)

    def change(self, seen: PoolView, add: Holder | Sequence[Holder] = (), remove: frozenset[str] = frozenset()) -> bool:
        holders = {h.job_id: h for h in seen.holders if h.job_id not in remove}
        for holder in (add,) if isinstance(add, Holder) else add:
            holders[holder.job_id] = holder
        with self._lock:
            current = self._holders.get(seen.pool)
            if (current[1] if current else None) != seen.version:
                return False
            self._holders[seen.pool] = (tuple(holders[k] for k in sorted(holders)), next(self._versions))
            return True

    def pools(self) -> list[str]:
        with self._lock:
            return sorted(self._holders)

    def queue(self, pool: str, limit: int = 10) -> list[Job]:
        return _queued_in_order((d for _, d in self._jobs.job_documents() if d.get("pool") == pool), limit)

    def waiting(self, pool: str) -> list[Waiting]:
        return [
            waiting_from_document(d)
            for _, d in self._jobs.job_documents()
            if d.get("pool") == pool and d.get("state") == JobState.QUEUED.value
        ]

    def active_in(self, pool: str) -> list[Job]:
        return [
            job_from_document(d)
            for _, d in self._jobs.job_documents()
            if d.get("pool") == pool and d.get("state") in _HOLDING
        ]


class InMemoryWarmPools:
    """`ports.WarmPoolStore` in memory: a pool's `version` is the counter of its last write."""

    def __init__(self, jobs: InMemoryJobStore) -> None:
        self._jobs = jobs
        self._lock = threading.Lock()
        self._pools: dict[str, Pool] = {}
        self._versions = itertools.count(1)

    def get(self, name: str) -> Pool | None:
        with self._lock:
            return self._pools.get(name)

    def create(self, pool: Pool) -> bool:
        with self._lock:
            if pool.name in self._pools:
                return False
            self._pools[pool.name] = dataclasses.replace(pool, version=next(self._versions))
            return True

    def update(self, name: str, change: Callable[[Pool], Pool | None]) -> tuple[Pool, Pool] | None:
        with self._lock:
            before = self._pools.get(name)
        if before is None:
            return None
        after = change(before)  # outside the lock, as Firestore decides outside its write
        if after is None or after == before:
            return before, before
        with self._lock:
            current = self._pools.get(name)
            if current is None or current.version != before.version:
                return self.update(name, change)  # someone wrote first: decide again on a fresh read
            self._pools[name] = dataclasses.replace(after, version=next(self._versions))
        return before, after

    def delete(self, seen: Pool) -> bool:
        with self._lock:
            current = self._pools.get(seen.name)
            if current is None or current.version != seen.version:
                return False
            del self._pools[seen.name]
            return True

    def list_pools(self) -> list[Pool]:
        with self._lock:
            return [self._pools[name] for name in sorted(self._pools)]

    def queue(self, name: str, limit: int = 10) -> list[Job]:
        return _queued_in_order((d for _, d in self._jobs.job_documents() if d.get("warm_pool") == name), limit)

    def jobs_on(self, name: str) -> list[Job]:
        return [
            job_from_document(d)
            for _, d in self._jobs.job_documents()
            if d.get("warm_pool") == name and d.get("state") in _ON_POOL
        ]

"""Whether an attempt's slice is ready for its command: the gate of `attempt-key`.

A host boots its agent as soon as its VM runs, and the agent starts the command as soon as it
has the attempt's key. A VM running does not make a slice: on Compute Engine its interconnect may
still be ACTIVATING, or only some of an individual-mode MIG's VMs came (the adapter reads both
as a holding that is not ACTIVE yet: `adapters.compute_states`); on the TPU API the queued
resource is ACTIVE once every node is. So the key, and with it the command, waits for the
holding (the attempt's own, or the warm-pool unit's that runs it) to be ACTIVE as the capacity
port reads it: one status read per key request, shared by the requests of one function
instance for `SHARED_FOR` (a slice's hosts ask together). Until then the answer is 409, "not
ready, ask again", with the holding's state and detail; a holding that is gone or failed will
never be ready, and is refused for good (403).

The next attempt is requested while the lost one's hosts may still save on SIGTERM, within
Google's grace (`domain.grace`): its command waits too, until every host of that attempt that
said it started has said it exited, or the grace is over, so it resumes from that save.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta
from typing import Protocol

from tpujobs.domain.holdings import HOLDING_LOST, HoldingState
from tpujobs.domain.job import Job
from tpujobs.engine.errors import TransientError
from tpujobs.engine.jobs_api.answers import ApiError, Response
from tpujobs.engine.ports import CapacityStatus, Clock, WorkerRecord

log = logging.getLogger(__name__)

NEVER_READY = HOLDING_LOST | {HoldingState.RELEASING}  # a holding in these is never ACTIVE again
NOT_READY_STATUS = 409  # the holding's state conflicts with a grant now; the agent asks again
RETRY_AFTER_SECONDS = 5
SHARED_FOR = timedelta(seconds=2)  # one read of a holding answers every host that asks this soon


class HoldingStates(Protocol):
    """What the key function reads of capacity: one holding's state (the capacity port's
    `status`). Its account may read capacity and change none (infra/iam.tf)."""

    def status(self, zone: str, name: str) -> CapacityStatus | None:
        """What the holding `name` is now; None when it does not exist."""


class EarlierHosts(Protocol):
    """What the key function reads of an earlier attempt's hosts: their latest word."""

    def attempt_workers(self, job_id: str, attempt: int) -> list[WorkerRecord]:
        """The latest word of each host of one attempt that ever reported."""


class SliceReadiness:
    """The gate: None when the attempt's holding is ACTIVE and no earlier attempt's hosts may
    still be saving, else the answer that says why not."""

    def __init__(self, holdings: HoldingStates, clock: Clock, earlier: EarlierHosts | None = None) -> None:
        """`earlier`: where a held-over attempt's hosts are read (None: the grace is waited out)."""
        self.holdings = holdings
        self.clock = clock
        self.earlier = earlier
        self._read: dict[tuple[str, str], tuple[datetime, CapacityStatus | None]] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    def not_ready(self, job: Job, where: str) -> Response | None:
        """None when the job's holding is ACTIVE; a 409 naming its state and detail while it may
        still become so (or its state could not be read); ApiError 403 when it never will."""
        name = job.warm_pool_unit or job.queued_resource
        try:
            status = self._status(job.zone, name)
        except TransientError as error:
            log.warning("could not read %s for the key of %s: %s", name, where, error)
            return _waiting(where, name, "UNKNOWN", f"its state could not be read: {error}")
        if status is None:
            raise ApiError(403, f"No key for {where}: {name} does not exist (released?); it will never be ready.")
        if status.state is HoldingState.ACTIVE:
            return self._earlier_saving(job, where)
        if status.state in NEVER_READY:
            said = f" ({status.detail})" if status.detail else ""
            raise ApiError(403, f"No key for {where}: {name} is {status.state}{said}; it will never be ready.")
        return _waiting(where, name, status.state.value, status.detail)

    def _earlier_saving(self, job: Job, where: str) -> Response | None:
        """A 409 while an earlier attempt's hosts, kept through their grace (`Job.held_over`),
        may still be saving: some said they started and not that they exited. None after."""
        now = self.clock()
        for held in job.held_over:
            if held.attempt >= job.attempt or now >= held.release_after:
                continue
            hosts = self.earlier.attempt_workers(job.job_id, held.attempt) if self.earlier is not None else None
            running = None if hosts is None else sum(1 for w in hosts if w.started_at and not w.exited_at)
            if running is None or running:
                until = held.release_after.isoformat(timespec="seconds")
                some = "" if running is None else f" ({running} not exited)"
                detail = f"attempt {held.attempt}'s hosts may still save on SIGTERM{some}, until {until} at the latest"
                return _waiting(where, held.holding, "SAVING", detail)
        return None

    def _status(self, zone: str, name: str) -> CapacityStatus | None:
        """The holding's status, read at most once per SHARED_FOR by this instance: the hosts of a
        slice that ask together wait for the first one's read, and share it."""
        key = (zone, name)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            now = self.clock()
            kept = self._read.get(key)
            if kept is not None and now - kept[0] < SHARED_FOR:
                return kept[1]
            status = self.holdings.status(zone, name)
            with self._guard:
                self._forget_old(now)
                self._read[key] = (now, status)
            return status

    def _forget_old(self, now: datetime) -> None:
        """Drop the reads too old to share (callers hold `_guard`): the dict stays as small as
        the holdings asked about in the last SHARED_FOR."""
        for key in [k for k, (at, _) in self._read.items() if now - at >= SHARED_FOR]:
            del self._read[key]
            lock = self._locks.get(key)
            if lock is not None and not lock.locked():
                del self._locks[key]


def _waiting(where: str, name: str, state: str, detail: str) -> Response:
    """The 409 of a holding not ready yet: a sentence, its state and detail, when to ask again."""
    said = f" ({detail})" if detail else ""
    sentence = (
        f"Not ready: the slice of {where}, {name}, is {state}{said}; the command starts once it is "
        f"ACTIVE. Ask again in {RETRY_AFTER_SECONDS} s."
    )
    body = {"error": sentence, "ready": False, "holding": name, "state": state, "detail": detail}
    return Response(NOT_READY_STATUS, {**body, "retry_after_seconds": RETRY_AFTER_SECONDS}, _retry_after())


def _retry_after() -> dict[str, str]:
    return {"Retry-After": str(RETRY_AFTER_SECONDS)}

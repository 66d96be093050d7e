"""Helpers for tests of tpujobs and of code built on it (shipped, like structlog.testing).

- `wait_for`: poll until something is true, across processes.
- `local_settings`: settings with a fresh report-signing key and a TPU VM account, as the
  local stack has them; `signed`: a report or notice signed as the attempt's agent signs it.
- `CrashPlan`, `CrashingStore`, `CrashingTpu`, `CrashingPools`, `CrashingWarmPools`: fault
  injection at the ports. The wrappers delegate every port call to a real adapter and count
  it as one I/O step; the plan makes the process "die" (raise `InjectedCrash`) just before
  or just after the k-th step, so a test can walk a handler through every place it could be
  killed and check that redelivery and the reconciler still finish its work.
"""

from __future__ import annotations

import itertools
import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from tpujobs.domain import signing
from tpujobs.domain.job import Job, JobEvent
from tpujobs.domain.transitions import Decision, Ignored, Observation
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.ports import (
    Capacity,
    CapacityStatus,
    Clock,
    HostBoot,
    JobStore,
    Rejection,
    SilentWorker,
    WorkerRecord,
)
from tpujobs.engine.settings import DEFAULT_PROJECT, Settings

if TYPE_CHECKING:
    from tpujobs.engine.reconciler import Reconciler
    from tpujobs.engine.services import Engine

T = TypeVar("T")

_message_ids = itertools.count(1_000_000)


def inbound(topic: str, payload: Any, message_id: str | None = None) -> InboundMessage:
    """A Pub/Sub message as a handler receives it: `payload` as JSON (bytes as they are), with
    a fresh id of digits, as Pub/Sub's are, unless one is given (a redelivery keeps its id)."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return InboundMessage(message_id or str(next(_message_ids)), topic, data)


def local_settings(**overrides: Any) -> Settings:
    """Settings as the local stack has them: a fresh random report-signing key (never a fixed
    one) and a TPU VM account, which production gets from infra/; `overrides` win."""
    project = overrides.get("project", DEFAULT_PROJECT)
    defaults = {
        "report_key": secrets.token_urlsafe(48),
        "tpu_service_account": f"tpujobs-tpu-vm@{project}.iam.gserviceaccount.com",
    }
    return Settings(**{**defaults, **overrides})


def signed(service: Any, topic: str, payload: dict[str, Any], message_id: str | None = None) -> InboundMessage:
    """A worker report or preemption notice as the attempt's agent sends it to `service` (an
    `engine.services.Engine`): with a time (the service's clock, unless the payload has `at`) and a fresh
    nonce, signed with the key of the attempt it names, derived for the job as stored (a job
    that does not exist gets a key of nobody's)."""
    job = service.store.get(str(payload.get("job_id", "")))
    body = {"at": service.clock().isoformat(), "nonce": secrets.token_hex(16), **payload}
    data = json.dumps(body).encode()
    created = job.created_at if job is not None and job.created_at is not None else datetime(2000, 1, 1)
    attempt = body.get("attempt")
    keys = service.settings.master_keys()
    attributes = signing_attributes(
        keys, str(body.get("job_id")), signing.created_micros(created), attempt if isinstance(attempt, int) else 0, data
    )
    return InboundMessage(message_id or str(next(_message_ids)), topic, data, attributes)


def signed_with(service: Any, key: bytes, topic: str, payload: dict[str, Any]) -> InboundMessage:
    """A report or notice signed with `key`, whoever's it is, naming the current master key version
    and the creation time of the job it names (public facts): a forgery, unless `key` is right."""
    job = service.store.get(str(payload.get("job_id", "")))
    body = {"at": service.clock().isoformat(), "nonce": secrets.token_hex(16), **payload}
    data = json.dumps(body).encode()
    created = job.created_at if job is not None and job.created_at is not None else datetime(2000, 1, 1)
    attributes = {
        signing.SIGNATURE_ATTRIBUTE: signing.sign(key, data),
        signing.KEY_VERSION_ATTRIBUTE: service.settings.master_keys().current_version,
        signing.JOB_CREATED_ATTRIBUTE: str(signing.created_micros(created)),
    }
    return InboundMessage(str(next(_message_ids)), topic, data, attributes)


def signing_attributes(
    keys: signing.MasterKeys, job_id: str, created: int, attempt: int, data: bytes, version: str | None = None
) -> dict[str, str]:
    """The attributes an agent sends with `data`: its signature under the attempt's key of `version`
    (default: the current), and what names that key."""
    version = version or keys.current_version
    key = keys.attempt_key(job_id, created, attempt, version)
    return {
        signing.SIGNATURE_ATTRIBUTE: signing.sign(key, data),
        signing.KEY_VERSION_ATTRIBUTE: version,
        signing.JOB_CREATED_ATTRIBUTE: str(created),
    }


When = Literal["before", "after"]
"""Where a crash falls around its step: `before` the call is made, or `after` it took effect."""


def wait_for(
    probe: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.05, what: str | None = None
) -> T:
    """Poll `probe` until it returns something truthy, and return that; AssertionError on timeout.

    The one wait of the tests and benches, for conditions across threads and processes where
    there is no event to wait on: `what`, else the probe's docstring, names what was awaited
    in the failure message.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or probe.__doc__ or probe}")
        time.sleep(interval)


class ManualClock:
    """A clock the test moves by hand: it stands still until `advance(s)`."""

    def __init__(self) -> None:
        self.now = datetime.now(timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class SecondsClock:
    """The simulator model's clock (seconds, as `time.monotonic`), moved by hand with `tick(s)`."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += seconds


class OffsetClock:
    """The wall clock plus a lead the test adds to: `advance(s)` stands in for sleeping s seconds.

    A service given this clock sees time pass as it really does, and jumps when the test
    says (a zone's wait running out, a job created later than another) without a sleep.
    """

    def __init__(self) -> None:
        self.lead = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(timezone.utc) + self.lead

    def advance(self, seconds: float) -> None:
        self.lead += timedelta(seconds=seconds)


class InjectedCrash(BaseException):
    """The process died at a planned I/O step.

    Deliberately neither a TransientError nor a PermanentError, nor an Exception at all (as
    SystemExit is not): code that survives any error of one item (the reconciler's tick,
    which goes on past an unexpected exception) must not survive its instance being killed.
    """

    def __init__(self, step: int, name: str, when: When) -> None:
        super().__init__(f"injected crash {when} I/O step {step} ({name})")
        self.step = step
        self.name = name
        self.when = when


@dataclass
class CrashPlan:
    """Counts the I/O steps made through the crashing ports, and crashes at one of them.

    `at` is 1-based over every call through any wrapper sharing this plan (store and TPU
    alike); None only counts. `steps` records each step's name ("store.apply",
    "tpu.request", ...) in order, for diagnostics and to learn a handler's steps.
    """

    at: int | None = None
    when: When = "before"
    steps: list[str] = field(default_factory=list)
    crashed: bool = False

    def step(self, name: str, call: Callable[[], T]) -> T:
        """Make one I/O step through the real adapter, crashing around it if planned."""
        self.steps.append(name)
        here = len(self.steps) == self.at
        if here and self.when == "before":
            self.crashed = True
            raise InjectedCrash(len(self.steps), name, self.when)
        result = call()
        if here:
            self.crashed = True
            raise InjectedCrash(len(self.steps), name, self.when)
        return result


class CrashingStore:
    """A JobStore whose every call is one step of `plan`, made on the real `store`.

    Methods beyond the JobStore port (an adapter's extras) are delegated and counted too.
    """

    def __init__(self, store: JobStore, plan: CrashPlan) -> None:
        self._store = store
        self._plan = plan

    def __getattr__(self, name: str) -> Any:
        return _counted(self._plan, f"store.{name}", getattr(self._store, name))

    def create(self, job: Job, event: JobEvent) -> bool:
        return self._plan.step("store.create", lambda: self._store.create(job, event))

    def get(self, job_id: str) -> Job | None:
        return self._plan.step("store.get", lambda: self._store.get(job_id))

    def apply(self, job_id: str, seen: Observation, clock: Clock) -> Decision | Ignored:
        return self._plan.step("store.apply", lambda: self._store.apply(job_id, seen, clock))

    def events(self, job_id: str) -> list[JobEvent]:
        return self._plan.step("store.events", lambda: self._store.events(job_id))

    def list_jobs(self, state: str | None = None, owner: str | None = None, limit: int = 100) -> list[Job]:
        return self._plan.step("store.list_jobs", lambda: self._store.list_jobs(state, owner, limit))

    def record_worker(self, job_id: str, worker: WorkerRecord) -> None:
        self._plan.step("store.record_worker", lambda: self._store.record_worker(job_id, worker))

    def silent_workers(self, before: datetime, page_size: int = 500) -> list[SilentWorker]:
        return self._plan.step("store.silent_workers", lambda: self._store.silent_workers(before, page_size))

    def retire_worker(self, job_id: str, attempt: int, worker: str) -> None:
        self._plan.step("store.retire_worker", lambda: self._store.retire_worker(job_id, attempt, worker))

    def mark_announced(self, job_id: str, event: JobEvent) -> None:
        self._plan.step("store.mark_announced", lambda: self._store.mark_announced(job_id, event))

    def unannounced_events(self, before: datetime, page_size: int = 500) -> list[tuple[str, JobEvent]]:
        return self._plan.step("store.unannounced_events", lambda: self._store.unannounced_events(before, page_size))

    def reject(self, rejection: Rejection) -> None:
        self._plan.step("store.reject", lambda: self._store.reject(rejection))


class CrashingTpu:
    """A Capacity port whose every call is one step of `plan` (named `tpu.<method>`), made on
    the real `tpu`."""

    def __init__(self, tpu: Capacity, plan: CrashPlan) -> None:
        self._tpu = tpu
        self._plan = plan

    def __getattr__(self, name: str) -> Any:
        return _counted(self._plan, f"tpu.{name}", getattr(self._tpu, name))

    def request(self, job: Job, boot: HostBoot) -> CapacityStatus:
        return self._plan.step("tpu.request", lambda: self._tpu.request(job, boot))

    def status(self, zone: str, name: str) -> CapacityStatus | None:
        return self._plan.step("tpu.status", lambda: self._tpu.status(zone, name))

    def release(self, zone: str, name: str) -> None:
        self._plan.step("tpu.release", lambda: self._tpu.release(zone, name))

    def list_capacity(self, zone: str) -> Sequence[CapacityStatus]:
        return self._plan.step("tpu.list_capacity", lambda: self._tpu.list_capacity(zone))


class CrashingPools:
    """The admission store (`ports.Pools`), every call one step of `plan`."""

    def __init__(self, pools: Any, plan: CrashPlan) -> None:
        self._pools = pools
        self._plan = plan

    def __getattr__(self, name: str) -> Any:
        return _counted(self._plan, f"pools.{name}", getattr(self._pools, name))


class CrashingWarmPools:
    """The warm-pool store (`ports.WarmPoolStore`), every call one step of `plan`: an `update`
    is one step (its compare-and-set commits whole, or not at all)."""

    def __init__(self, store: Any, plan: CrashPlan) -> None:
        self._store = store
        self._plan = plan

    def __getattr__(self, name: str) -> Any:
        return _counted(self._plan, f"warm.{name}", getattr(self._store, name))


def _counted(plan: CrashPlan, name: str, attribute: Any) -> Any:
    """An adapter's extra method as a step of `plan`; other attributes pass through."""
    if not callable(attribute):
        return attribute

    def call(*args: Any, **kwargs: Any) -> Any:
        return plan.step(name, lambda: attribute(*args, **kwargs))

    return call


def crashing_engine(service: Engine, plan: CrashPlan, *, warm_pools: bool = False, **ports: Any) -> Engine:
    """The same engine on a job store and capacity that die at the plan's step (with `warm_pools`,
    its warm pools' store too); `ports` are the other constructor ports to keep (quota pools,
    publishers, access): left out, their I/O is neither made nor counted."""
    from tpujobs.engine.services import Engine as Services

    warm = CrashingWarmPools(service.warm.store, plan) if warm_pools and service.warm is not None else None
    store: Any = CrashingStore(service.store, plan)  # forwards every store call, which mypy cannot see
    return Services(
        store,
        CrashingTpu(service.capacity, plan),
        service.settings,
        service.clock,
        service.sleep,
        warm_pools=warm,
        **ports,
    )


def reconciler_for(service: Engine) -> Reconciler:
    """A Reconciler on the very ports a hand-built `service` uses, as `runtime` wires both."""
    from tpujobs.engine.reconciler import Reconciler

    return Reconciler(
        service,
        service.store,
        service.capacity,
        service.settings,
        service.clock,
        pools=service.pools,
        exports=service.exports,
        status=service.status,
        warm=service.warm,
        warm_pools=service.warm.store if service.warm is not None else None,
    )


def config_document(firestore_client: Any, name: str) -> dict[str, Any]:
    """`config/{name}` as an admin sees it in the console ({} when there is none)."""
    snapshot = firestore_client.collection("config").document(name).get()
    return snapshot.to_dict() if snapshot.exists else {}

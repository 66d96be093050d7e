"""The engine on in-memory fakes, as the tests of tests/unit/engine drive it.

Tests here speak of behaviour (submit, report, preempt, control, tick), never of which class
does it: `build_engine` is the only place that calls the engine's constructors and service
methods, so splitting a service changes this file and no test. The stores, the publishers and
the access policies are `tpujobs.local.fakes`; capacity is the TPU simulator of this test
(`tests/conftest.py`), in-process, behind the real TPU adapter.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from tpujobs.domain.access import AccessPolicies
from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.job import Job, JobEvent
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.budgets import TeamBudgets
from tpujobs.engine.ports import Capacity, Rejection
from tpujobs.engine.settings import Settings
from tpujobs.local.fakes import (
    InMemoryAccessPolicies,
    InMemoryJobStore,
    InMemoryPools,
    InMemoryWarmPools,
    RecordingPublisher,
)
from tpujobs.local.fakes.budgets import InMemoryBudgetTally
from tpujobs.local.fakes.teams import FakeTeams
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.testing import (
    CrashingPools,
    CrashingStore,
    CrashPlan,
    crashing_engine,
    inbound,
    local_settings,
    reconciler_for,
    signed,
)

ZONE = "us-central2-b"
PROJECT = "test-project"


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Engine:
    """The engine's handlers and its ports, as a test drives and reads them."""

    store: InMemoryJobStore
    capacity: Capacity
    pools: InMemoryPools
    warm_pools: InMemoryWarmPools
    teams: FakeTeams
    budget_tally: InMemoryBudgetTally  # the teams' monthly chip-hours, whose new jobs wait past budget
    access: InMemoryAccessPolicies
    published: RecordingPublisher
    settings: Settings
    simulator: SimulatorControl
    sleeps: list[float]
    service: Any = field(repr=False)  # the engine's own objects: only this file touches them
    api_settings: Settings = field(repr=False)  # the jobs API's: the local stack's caller header

    def clock(self) -> datetime:
        """The engine's time now (a test moves it with the clock it built the engine with)."""
        return self.service.clock()

    # -- messages, as the functions pass them --------------------------------------------------

    def submit(self, spec: dict[str, Any] | bytes, message_id: str | None = None) -> Any:
        """A tpujobs-submit message; its outcome (kind, job_id, reason)."""
        return self.service.submission.submit(inbound("tpujobs-submit", spec, message_id))

    def submit_message(self, message: Any) -> Any:
        """A tpujobs-submit message exactly as given (an undecodable one, say)."""
        return self.service.submission.submit(message)

    def submit_verified(self, spec: dict[str, Any]) -> Any:
        """A submission through the jobs API's path, whose caller is verified as the owner: the
        deployment's defaults filled in, then admitted (vet it first with `refusal`)."""
        submission = self.service.submission
        return submission.submit_verified(submission.completed(parse_spec(spec)))

    def refusal(self, spec: dict[str, Any], *, owner_verified: bool = True) -> str | None:
        """Why the engine would refuse this submission (with the deployment's defaults), or None."""
        completed = self.service.submission.completed(parse_spec(spec))
        return self.service.vetting.refusal(completed, owner_verified=owner_verified)

    # -- warm pools --------------------------------------------------------------------------------

    def create_pool(self, data: dict[str, Any], caller: str, *, verified: bool = True) -> Any:
        """`tpujobs pool create`, as `caller` asks; its outcome (kind, reason)."""
        return self.service.warm.create(data, caller, verified=verified)

    def resize_pool(self, name: str, count: int, caller: str) -> Any:
        return self.service.warm.resize(name, count, caller)

    def delete_pool(self, name: str, caller: str) -> Any:
        return self.service.warm.delete(name, caller)

    def report(
        self, kind: str, attempt: int, worker: int = 0, job_id: str = "train-1", slice_id: int = 0, **extra: Any
    ) -> Any:
        """A signed worker report (tpujobs-worker-events)."""
        payload = {"kind": kind, "job_id": job_id, "attempt": attempt, "slice_id": slice_id, "worker_id": worker}
        return self.service.worker_events.on_worker_report(signed(self, "tpujobs-worker-events", {**payload, **extra}))

    def preempt(self, attempt: int, worker: int = 0, job_id: str = "train-1", **extra: Any) -> Any:
        """A signed preemption notice (tpujobs-preemption)."""
        payload = {"job_id": job_id, "attempt": attempt, "slice_id": 0, "worker_id": worker, "reason": "SIGTERM"}
        return self.service.capacity_events.on_preemption(signed(self, "tpujobs-preemption", {**payload, **extra}))

    def deliver(self, topic: str, payload: Any, message_id: str | None = None) -> Any:
        """Any payload on a topic the engine handles, unsigned, as it arrives."""
        return self.handle(inbound(topic, payload, message_id))

    def handle(self, message: Any) -> Any:
        """A message exactly as given (forged, replayed, redelivered), by its topic's handler."""
        handlers = {
            "tpujobs-submit": self.service.submission.submit,
            "tpujobs-worker-events": self.service.worker_events.on_worker_report,
            "tpujobs-preemption": self.service.capacity_events.on_preemption,
            "tpujobs-qr-state": self.service.capacity_events.on_qr_state,
            "tpujobs-control": self.service.controls.on_control,
            "tpujobs-converge": self.service.convergence.on_converge,
        }
        return handlers[message.topic](message)

    def control(self, payload: dict[str, Any]) -> Any:
        """A tpujobs-control request (cancel, restart, ...)."""
        return self.deliver("tpujobs-control", payload)

    def qr_state(self, payload: dict[str, Any]) -> Any:
        """A tpujobs-qr-state message: a queued resource's state, or an audit-log entry."""
        return self.deliver("tpujobs-qr-state", payload)

    # -- what operators and repairs do -----------------------------------------------------------

    def cancel(self, job_id: str, reason: str) -> Any:
        return self.service.cancel(job_id, reason)

    def restart(self, job_id: str, action: str, caller: str, request_id: str, overrides: dict[str, Any]) -> Any:
        """Resume or rerun an ended job, as the jobs API asks for it; its outcome (kind, reason)."""
        return self.service.restart(job_id, action, caller, request_id, overrides)

    def api(self, body: dict[str, Any], caller: str) -> Any:
        """A POST to the jobs HTTP API from `caller` (the local stack's caller header); its answer."""
        from tpujobs.engine.api import CALLER_HEADER, JobsApi

        api = JobsApi(self.service, self.store, self.api_settings)
        return api.handle("POST", "http://127.0.0.1/jobs", {CALLER_HEADER: caller}, json.dumps(body).encode())

    def handing_off(self) -> Any:
        """The jobs API's engine as runtime builds it (`instances.api_engine`): these stores, no
        capacity (`NoCapacity`), its capacity work handed off to `published`."""
        from tpujobs.engine.capacity_handoff import NoCapacity
        from tpujobs.engine.services import Engine as Services

        old = self.service
        return Services(
            self.store, NoCapacity(), self.settings, old.clock, self.sleeps.append, status=self.published,
            exports=self.published, pools=self.pools, access=old.access, warm_pools=self.warm_pools,
            handoff=self.published, teams=old.teams,
        )  # fmt: skip

    def api_on(self, service: Any, body: dict[str, Any], caller: str) -> Any:
        """A POST to a jobs HTTP API built on `service` (say, `handing_off()`); its answer."""
        from tpujobs.engine.api import CALLER_HEADER, JobsApi

        api = JobsApi(service, self.store, self.api_settings)
        return api.handle("POST", "http://127.0.0.1/jobs", {CALLER_HEADER: caller}, json.dumps(body).encode())

    def converge(self, payload: dict[str, Any], message_id: str | None = None) -> Any:
        """A tpujobs-converge message, handled by this engine (the converge function's)."""
        return self.handle(inbound("tpujobs-converge", payload, message_id))

    def deliver_handoffs(self) -> list[tuple[str, str]]:
        """Every hand-off published since the last call, delivered to the converge function; them."""
        handed = self.published.take_handoffs()
        for kind, name in handed:
            self.converge(
                {"action": "converge", "job_id": name} if kind == "job" else {"action": "pool-converge", "name": name}
            )
        return handed

    def redeployed(self, **settings: Any) -> Engine:
        """The functions deployed again with changed settings (a rotated key, say), on the same store,
        capacity and pools: what a new function instance builds."""
        from tpujobs.engine.services import Engine as Services

        old = self.service
        service = Services(
            self.store,
            self.capacity,
            replace(self.settings, **settings),
            old.clock,
            self.sleeps.append,
            status=self.published,
            exports=self.published,
            pools=self.pools,
            access=old.access,
            warm_pools=self.warm_pools,
            teams=old.teams,
        )
        return replace(
            self, service=service, settings=service.settings, api_settings=replace(self.api_settings, **settings)
        )

    def crashing(self, plan: CrashPlan) -> Engine:
        """The same engine with its job store and capacity dying at the plan's step (no quota pools,
        publishers or warm pools: only the job's own I/O is counted)."""
        return replace(self, service=crashing_engine(self.service, plan, access=self.service.access))

    def crashing_admission(self, plan: CrashPlan) -> Engine:
        """The same engine with its job store, capacity and quota pools dying at the plan's step:
        admission's I/O (who holds a pool's chips) counted with the job's own."""
        service = crashing_engine(
            self.service,
            plan,
            status=self.service.status,
            exports=self.service.exports,
            pools=CrashingPools(self.pools, plan),
            access=self.service.access,
        )
        return replace(self, service=service)

    def start_next_attempt(self, job: Job) -> None:
        """The recovery of a job as a handler that read it earlier (RECOVERING) would make it."""
        self.service.lifecycle._start_next_attempt(job)

    def tick(self, store: Any = None) -> Any:
        """One reconcile tick over every zone; its report. `store`, if given, is what the tick reads
        the jobs through (a wrapper that counts or fails some calls)."""
        return reconciler_for(self.service if store is None else _ReadingThrough(self.service, store)).tick()

    def reconciler(self, store: Any = None, shards: Any = None) -> Any:
        """The reconciler itself, for a test of its coordinator and shards: `store` as in `tick`;
        `shards`, if given, is where the coordinator publishes its shards (else it runs them inline)."""
        reconciler = reconciler_for(self.service if store is None else _ReadingThrough(self.service, store))
        if shards is not None:
            reconciler.shards = shards
        return reconciler

    # -- reads -------------------------------------------------------------------------------------

    def job(self, job_id: str = "train-1") -> Job:
        job = self.store.get(job_id)
        assert job is not None, f"no job {job_id}"
        return job

    def events(self, job_id: str = "train-1") -> list[JobEvent]:
        return self.store.events(job_id)

    def rejections(self) -> list[Rejection]:
        return self.store.rejections()

    def live_capacity(self, zone: str = ZONE) -> set[str]:
        """The queued resources of the zone that are not being deleted."""
        return {s.name for s in self.capacity.list_capacity(zone) if s.state is not HoldingState.RELEASING}


def build_engine(
    simulator_url: str,
    tpu_client: Any,
    sleeps: list[float],
    *,
    clock: Callable[[], datetime] = utc_now,
    capacity: Capacity | None = None,
    access: AccessPolicies | None = None,
    steps: CrashPlan | None = None,
    **settings: Any,
) -> Engine:
    """The one place that builds the engine's services: update it when their constructors change."""
    from tpujobs.adapters.google_errors import transient_retry
    from tpujobs.adapters.tpu import CloudTpu
    from tpujobs.engine.services import Engine as Services

    merged = {
        "project": PROJECT,
        "default_zone": ZONE,
        "tpu_endpoint": simulator_url,
        "logs_bucket": "logs",
        "report_key": secrets.token_urlsafe(48),
        **settings,
    }
    store = InMemoryJobStore()
    capacity = capacity or CloudTpu(tpu_client, PROJECT, retry=transient_retry(deadline_s=0.2))  # a failing API: quick
    published = RecordingPublisher()
    pools, warm_pools, policies = InMemoryPools(store), InMemoryWarmPools(store), InMemoryAccessPolicies(access)
    teams, budget_tally = FakeTeams(pools), InMemoryBudgetTally()
    service = Services(
        store if steps is None else CrashingStore(store, steps),
        capacity,
        local_settings(**merged),
        clock,
        sleeps.append,
        status=published,
        exports=published,
        pools=pools if steps is None else CrashingPools(pools, steps),
        access=policies if access is not None else None,  # None: no policies, as a hand-built engine has
        warm_pools=warm_pools,
        teams=teams,
        budgets=TeamBudgets(budget_tally, clock),
    )
    return Engine(
        api_settings=local_settings(**{**merged, "local_stack": True}),
        store=store,
        capacity=capacity,
        pools=pools,
        warm_pools=warm_pools,
        teams=teams,
        budget_tally=budget_tally,
        access=policies,
        published=published,
        settings=service.settings,
        simulator=SimulatorControl(simulator_url),
        sleeps=sleeps,
        service=service,
    )


class _ReadingThrough:
    """The engine as the reconciler sees it, with its job store replaced by `store`."""

    def __init__(self, service: Any, store: Any) -> None:
        self._service = service
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._service, name)

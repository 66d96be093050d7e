"""The capacity port (`engine.ports.Capacity`) in memory: holdings whose state a test sets.

A request makes a holding in `initial_state` (WAITING unless told; or adopts the one of that name, as the TPU API
adapter does: tests/contract/test_contract_capacity.py holds both to one contract), a release
removes it; `set_state`, `vanish` and `refuse_next` stand in for what
Google does meanwhile (preemption, a failed create, a full quota), and `plant_foreign` for
someone else's resource of a holding's name: without tpujobs' marker (`domain.ownership`), it
is never adopted or written (NotOurs) nor released (left as it is), as the adapters do. Every call is recorded in
`calls`, in order, so a test can assert what the engine asked for.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.job import Job
from tpujobs.domain.naming import node_id
from tpujobs.domain.ownership import marked, refusal
from tpujobs.engine.errors import NotOurs, PermanentError
from tpujobs.engine.ports import CapacityStatus, HostBoot, UnitRequest


@dataclass
class Holding:
    """One holding as the fake keeps it: its status, how its hosts boot, and its slices."""

    status: CapacityStatus
    boot: HostBoot
    slices: int
    labels: Mapping[str, str] = field(default_factory=dict)
    metadata: dict[str, Mapping[str, str]] = field(default_factory=dict)  # node -> its metadata


class InMemoryCapacity:
    """Holdings by (zone, name); every method as `engine.ports.Capacity` says."""

    def __init__(self, initial_state: HoldingState = HoldingState.WAITING) -> None:
        self.initial_state = HoldingState(initial_state)  # a word of no state fails here, loudly
        self.holdings: dict[tuple[str, str], Holding] = {}
        self.calls: list[tuple[str, ...]] = []
        self.failed_operations: dict[str, str] = {}  # operation -> what it said (`create_error`)
        self._refusals: list[Exception] = []
        self._operations = itertools.count(1)
        self._lock = threading.Lock()

    # -- what a test does --------------------------------------------------------------------

    def plant_foreign(
        self,
        zone: str,
        name: str,
        state: HoldingState = HoldingState.ACTIVE,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """Someone else made a resource named `name` in `zone` (no tpujobs marker, unless
        `labels` forge one), holding `state`."""
        with self._lock:
            status = CapacityStatus(name, zone, HoldingState(state))
            self.holdings[(zone, name)] = Holding(status, HostBoot("", {}), 1, dict(labels or {}))

    def refuse_next(self, error: Exception) -> None:
        """The next request raises `error` (QuotaExhausted, PermanentError, TransientError)."""
        self._refusals.append(error)

    def set_state(
        self,
        name: str,
        state: HoldingState,
        detail: str = "",
        unhealthy_hosts: int = 0,
        suspect_hosts: tuple[tuple[str, str], ...] = (),
    ) -> CapacityStatus:
        """Google moved the holding `name` (in whichever zone) to `state`."""
        with self._lock:
            holding = self._named(name)
            holding.status = dataclasses.replace(
                holding.status,
                state=HoldingState(state),
                detail=detail,
                unhealthy_hosts=unhealthy_hosts,
                suspect_hosts=suspect_hosts,
            )
            return holding.status

    def schedule_maintenance(self, name: str, host: str, window_start: str) -> CapacityStatus:
        """Google scheduled maintenance for one host of the holding (its `upcomingMaintenance`)."""
        with self._lock:
            holding = self._named(name)
            announced = (*holding.status.maintenance, (host, window_start))
            holding.status = dataclasses.replace(holding.status, maintenance=announced)
            return holding.status

    def schedule_run_end(self, name: str, termination: str) -> CapacityStatus:
        """Its VMs run with a maxRunDuration: Google ends them at `termination` (RFC 3339)."""
        with self._lock:
            holding = self._named(name)
            holding.status = dataclasses.replace(holding.status, run_ends=termination)
            return holding.status

    def vanish(self, name: str) -> None:
        """The holding is gone without tpujobs releasing it (deleted by hand, reclaimed)."""
        with self._lock:
            holding = self._named(name)
            del self.holdings[(holding.status.zone, name)]

    def held(self, zone: str | None = None) -> list[str]:
        """The names held now (in `zone`), sorted."""
        return sorted(name for (z, name) in self.holdings if zone is None or z == zone)

    def requested(self) -> list[str]:
        """The names asked for (`request`, `request_unit`), in order, repeats included."""
        return [call[2] for call in self.calls if call[0] in ("request", "request_unit")]

    def released(self) -> list[str]:
        """The names given back (`release`), in order, repeats included."""
        return [call[2] for call in self.calls if call[0] == "release"]

    # -- the port -----------------------------------------------------------------------------

    def request(self, job: Job, boot: HostBoot) -> CapacityStatus:
        labels = {**job.spec.labels, "tpujobs-job": job.job_id, "tpujobs-attempt": str(job.attempt)}
        return self._create("request", job.zone, job.queued_resource, boot, job.spec.slices, labels)

    def request_unit(self, unit: UnitRequest, boot: HostBoot) -> CapacityStatus:
        return self._create("request_unit", unit.zone, unit.name, boot, unit.spec.slices, dict(unit.labels))

    def status(self, zone: str, name: str) -> CapacityStatus | None:
        with self._lock:
            self.calls.append(("status", zone, name))
            holding = self.holdings.get((zone, name))
            return holding.status if holding is not None else None

    def create_error(self, operation: str) -> str | None:
        with self._lock:
            self.calls.append(("create_error", operation))
            return self.failed_operations.get(operation)

    def release(self, zone: str, name: str) -> None:
        with self._lock:
            self.calls.append(("release", zone, name))
            holding = self.holdings.get((zone, name))
            if holding is not None and marked(name, holding.labels):  # someone else's is left as it is
                del self.holdings[(zone, name)]

    def list_capacity(self, zone: str) -> Sequence[CapacityStatus]:
        with self._lock:
            self.calls.append(("list_capacity", zone))
            return [h.status for (z, _), h in sorted(self.holdings.items()) if z == zone]

    def tell_hosts(self, zone: str, name: str, slices: int, metadata: Mapping[str, str]) -> None:
        with self._lock:
            self.calls.append(("tell_hosts", zone, name))
            holding = self.holdings.get((zone, name))
            if holding is not None and not marked(name, holding.labels):
                raise NotOurs(f"fake capacity: {refusal(name, name)}")
            if holding is None or holding.status.state is not HoldingState.ACTIVE:
                state = "missing" if holding is None else holding.status.state
                raise PermanentError(f"fake capacity: the nodes of {name} are not READY ({state})")
            for index in range(slices):
                holding.metadata[node_id(name, index, slices)] = dict(metadata)

    # -- inside --------------------------------------------------------------------------------

    def _create(
        self, call: str, zone: str, name: str, boot: HostBoot, slices: int, labels: Mapping[str, str]
    ) -> CapacityStatus:
        with self._lock:
            self.calls.append((call, zone, name))
            if self._refusals:
                raise self._refusals.pop(0)
            existing = self.holdings.get((zone, name))
            if existing is not None and not marked(name, existing.labels):
                raise NotOurs(f"fake capacity: {refusal(name, name)}")
            if existing is not None:  # an earlier request made it: adopted, never bought twice
                return existing.status  # with no operation: this request created nothing
            status = CapacityStatus(
                name,
                zone,
                self.initial_state,
                job_label=labels.get("tpujobs-job"),
                pool_label=labels.get("tpujobs-pool"),
            )
            self.holdings[(zone, name)] = Holding(status, boot, slices, dict(labels))
            # Only the request that created the holding learns its operation (as from the TPU API).
            return dataclasses.replace(status, operation=f"operations/fake-{next(self._operations)}")

    def _named(self, name: str) -> Holding:
        found = [h for (_, n), h in self.holdings.items() if n == name]
        if not found:
            raise KeyError(f"fake capacity holds no {name}")
        return found[0]

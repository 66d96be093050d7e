"""The capacity of an engine that must never touch capacity: the internet-facing functions'.

The `jobs` API (and the dashboard, which reads through it) commits what a user asks in Firestore
and hands the capacity work on (`ports.CapacityHandoff`, a job's id or a pool's name on
tpujobs-converge); the `converge` function, which holds the TPU and Compute Engine roles,
converges it. Its engine is built on `NoCapacity`, so a path that still reached for capacity would fail
loudly (a 500 and a log line), never act, and a hole in the API cannot touch capacity directly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tpujobs.domain.job import Job
from tpujobs.engine.ports import CapacityStatus, HostBoot, UnitRequest


class CapacityNotHeld(RuntimeError):
    """Capacity was asked of an engine that holds none. Neither Transient nor Permanent: a bug,
    never recorded on a job as the platform's answer."""


class NoCapacity:
    """A capacity port that refuses every call: the jobs API's, whose capacity work is handed off."""

    def _refuse(self, what: str) -> CapacityNotHeld:
        return CapacityNotHeld(f"this function holds no capacity and may not {what}: hand the work off instead")

    def request(self, job: Job, boot: HostBoot) -> CapacityStatus:
        raise self._refuse(f"request {job.queued_resource}")

    def request_unit(self, unit: UnitRequest, boot: HostBoot) -> CapacityStatus:
        raise self._refuse(f"request {unit.name}")

    def status(self, zone: str, name: str) -> CapacityStatus | None:
        raise self._refuse(f"read {name}")

    def create_error(self, operation: str) -> str | None:
        raise self._refuse("read an operation")

    def release(self, zone: str, name: str) -> None:
        raise self._refuse(f"release {name}")

    def list_capacity(self, zone: str) -> Sequence[CapacityStatus]:
        raise self._refuse(f"list {zone}")

    def tell_hosts(self, zone: str, name: str, slices: int, metadata: Mapping[str, str]) -> None:
        raise self._refuse(f"write the metadata of {name}")

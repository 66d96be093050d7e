"""One capacity port over two platforms: the Cloud TPU API's queued resources and Compute Engine.

The engine never knows which platform holds a job's slices: a request goes where the spec's
`platform` says, and everything later by the holding's name alone, whose letter says the
platform (`naming.platform_of`: `-a{N}` on the TPU API, `-c{N}` on Compute Engine). A
create's operation says its own: the TPU API's are `projects/*/locations/*/operations/*`,
Compute Engine's `zones/*/operations/*`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tpujobs.domain.job import Job
from tpujobs.domain.naming import platform_of
from tpujobs.domain.platforms import COMPUTE
from tpujobs.engine.errors import PermanentError
from tpujobs.engine.ports import Capacity, CapacityStatus, HostBoot, UnitRequest


class PlatformCapacity:
    """The Capacity port (`engine.ports.Capacity`) that hands each call to the platform's own.

    `compute` is None where the deployment has no Compute Engine backend (a local stack without
    its simulator): a Compute Engine job is then refused for good, and listings are the TPU API's.
    """

    def __init__(self, tpu: Capacity, compute: Capacity | None = None) -> None:
        self._tpu = tpu
        self._compute = compute

    def _by_platform(self, platform: str | None) -> Capacity:
        if platform != COMPUTE:
            return self._tpu
        if self._compute is None:
            raise PermanentError("this deployment has no Compute Engine backend for platform 'compute'")
        return self._compute

    def _by_name(self, name: str) -> Capacity:
        return self._by_platform(platform_of(name))

    def request(self, job: Job, boot: HostBoot) -> CapacityStatus:
        return self._by_platform(job.spec.platform).request(job, boot)

    def request_unit(self, unit: UnitRequest, boot: HostBoot) -> CapacityStatus:
        return self._by_platform(unit.spec.platform).request_unit(unit, boot)

    def status(self, zone: str, name: str) -> CapacityStatus | None:
        return self._by_name(name).status(zone, name)

    def create_error(self, operation: str) -> str | None:
        if operation.startswith("zones/"):
            return self._compute.create_error(operation) if self._compute is not None else None
        return self._tpu.create_error(operation)

    def release(self, zone: str, name: str) -> None:
        self._by_name(name).release(zone, name)

    def list_capacity(self, zone: str) -> Sequence[CapacityStatus]:
        """Both platforms' holdings of the zone (a listing that fails fails the whole, so the
        reconciler skips the zone rather than take a platform's silence for an absence)."""
        found = list(self._tpu.list_capacity(zone))
        if self._compute is not None:
            found += self._compute.list_capacity(zone)
        return found

    def write_metadata(self, zone: str, name: str, slices: int, metadata: Mapping[str, str]) -> None:
        self._by_name(name).write_metadata(zone, name, slices, metadata)

"""One capacity port over every platform: the Cloud TPU API's queued resources and Compute Engine.

The engine never knows which platform holds a job's slices: a request goes where the spec's
`platform` says, and everything later by the holding's name alone, whose letter says the
platform (`naming.platform_of`: `-a{N}` on the TPU API, `-c{N}` on Compute Engine). A create's
operation says its own (`OPERATION_FORMS`). Each platform is one row of `PLATFORMS`; a platform
with no row, or a deployment without its backend, is refused with a PermanentError naming it,
never sent to another platform's API.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from tpujobs.domain.job import Job
from tpujobs.domain.naming import platform_of
from tpujobs.domain.platforms import COMPUTE, TPU_API, Platform
from tpujobs.engine.errors import PermanentError
from tpujobs.engine.ports import Capacity, CapacityStatus, HostBoot, UnitRequest

# Every platform the router knows, in the order a zone's listing is read, with the form of its
# create operations' names (Compute Engine's may be several, comma-separated: one per MIG).
OPERATION_FORMS: dict[Platform, re.Pattern[str]] = {
    TPU_API: re.compile(r"projects/[^/]+/locations/[^/]+/operations/"),
    COMPUTE: re.compile(r"zones/[^/]+/operations/"),
}
PLATFORMS: tuple[Platform, ...] = tuple(OPERATION_FORMS)
NAMES: dict[str, str] = {TPU_API: "the Cloud TPU API", COMPUTE: "Compute Engine"}  # how a refusal names each


class PlatformCapacity:
    """The Capacity port (`engine.ports.Capacity`) that hands each call to the platform's own.

    `compute` is None where the deployment has no Compute Engine backend (a local stack without
    its simulator): a Compute Engine job is then refused for good, and listings are the TPU API's.
    """

    def __init__(self, tpu: Capacity, compute: Capacity | None = None) -> None:
        backends: dict[Platform, Capacity | None] = {TPU_API: tpu, COMPUTE: compute}
        self._backends: dict[str, Capacity | None] = {platform: backends[platform] for platform in PLATFORMS}

    def backend(self, platform: str | None) -> Capacity:
        """The backend of `platform` (None: a spec that names none, stored before platforms
        were named: the TPU API's); PermanentError for a platform with no row or no backend."""
        chosen = TPU_API if platform is None else platform
        if chosen not in self._backends:
            known = ", ".join(PLATFORMS)
            raise PermanentError(f"no capacity backend for platform {chosen!r}: this router knows {known}")
        found = self._backends[chosen]
        if found is None:
            raise PermanentError(f"this deployment has no {NAMES[chosen]} backend for platform {chosen!r}")
        return found

    def _by_name(self, name: str) -> Capacity:
        return self.backend(platform_of(name))

    def request(self, job: Job, boot: HostBoot) -> CapacityStatus:
        return self.backend(job.spec.platform).request(job, boot)

    def request_unit(self, unit: UnitRequest, boot: HostBoot) -> CapacityStatus:
        return self.backend(unit.spec.platform).request_unit(unit, boot)

    def status(self, zone: str, name: str) -> CapacityStatus | None:
        return self._by_name(name).status(zone, name)

    def create_error(self, operation: str) -> str | None:
        """The platform whose form the operation has answers ("" is no operation: None); a
        platform without its backend here no longer knows it (None); a form of no platform
        is refused (PermanentError), never asked of another platform's API."""
        if not operation:
            return None
        platform = next((p for p, form in OPERATION_FORMS.items() if form.match(operation)), None)
        if platform is None:
            raise PermanentError(
                f"operation {operation!r} is of no platform this router knows ({', '.join(PLATFORMS)})"
            )
        found = self._backends[platform]
        return found.create_error(operation) if found is not None else None

    def release(self, zone: str, name: str) -> None:
        self._by_name(name).release(zone, name)

    def list_capacity(self, zone: str) -> Sequence[CapacityStatus]:
        """Every platform's holdings of the zone (a listing that fails fails the whole, so the
        reconciler skips the zone rather than take a platform's silence for an absence)."""
        return [
            status for found in self._backends.values() if found is not None for status in found.list_capacity(zone)
        ]

    def tell_hosts(self, zone: str, name: str, slices: int, metadata: Mapping[str, str]) -> None:
        self._by_name(name).tell_hosts(zone, name, slices, metadata)

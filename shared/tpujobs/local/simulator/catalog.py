"""What the TPU API offers, as gcloud asks it: locations, accelerator types and runtime versions
(v2 and v2alpha1: ``tpu-vm accelerator-types|versions list``), and v1's accelerator types and
TensorFlow versions (``compute tpus accelerator-types|versions|locations list``). Read-only tables:
the accelerator types come from `tpujobs.domain.accelerators`, the rest are listed here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tpujobs.domain.accelerators import FAMILIES, BadTopology, UnknownAcceleratorType, accelerator_type_of
from tpujobs.local.simulator.errors import Code, SimulatorError
from tpujobs.local.simulator.http import Routes
from tpujobs.local.simulator.messages import query_str
from tpujobs.local.simulator.model import Simulator
from tpujobs.local.simulator.tpu_json import Json, Query, page_json, query_int
from tpujobs.local.simulator.world import paged

# Zones where Cloud TPU is offered (the TPU regions and zones page); the simulator serves any zone,
# and also lists those its config names.
TPU_ZONES = (
    "asia-east1-c",
    "asia-northeast1-b",
    "asia-southeast1-b",
    "europe-west4-a",
    "europe-west4-b",
    "us-central1-a",
    "us-central1-b",
    "us-central1-c",
    "us-central2-b",
    "us-east1-d",
    "us-east5-a",
    "us-east5-b",
    "us-south1-a",
    "us-west1-c",
    "us-west4-a",
)
# TPU VM runtime versions (the TPU software versions page), for v2's runtimeVersions.
RUNTIME_VERSIONS = (
    "tpu-ubuntu2204-base",
    "tpu-vm-base",
    "tpu-vm-tf-2.16.1-pjrt",
    "tpu-vm-tf-2.17.0-pjrt",
    "tpu-vm-v4-base",
    "tpu-vm-v4-pt-2.0",
    "v2-alpha-tpuv5",
    "v2-alpha-tpuv5-lite",
    "v2-alpha-tpuv6e",
)
TENSORFLOW_VERSIONS = ("2.15.0", "2.16.1", "2.17.0", "pytorch-2.0", "pytorch-nightly")  # v1's tensorflowVersions
_API_VERSIONS = ("v1", "v2", "v2alpha1")


@dataclass(frozen=True)
class _Entry:
    """One listed resource: its full name (what pages are ordered by) and its JSON."""

    name: str
    body: Json


def offered_accelerator_types() -> list[tuple[str, str, str]]:
    """(accelerator type, AcceleratorConfig type, topology) of each listed shape: the families
    the TPU API serves, in powers-of-two sizes (other sizes a family allows can still be asked for)."""
    offered = []
    for family in FAMILIES.values():
        if not family.config_type:  # Compute Engine only (v7x)
            continue
        for size in sorted(family.sizes):
            if size & (size - 1):
                continue
            chips = size // 2 if family.counts_cores else size
            topology = _topology(chips, family.topology_dimensions)
            try:
                accelerator_type = accelerator_type_of(family.config_type, topology)
            except (BadTopology, UnknownAcceleratorType):  # pragma: no cover - a table that disagrees
                continue
            offered.append((accelerator_type, family.config_type, topology))
    return offered


def _topology(chips: int, dimensions: int) -> str:
    """The most nearly cubic (or square) topology of *chips*, a power of two, as Google writes it:
    2x2x4 for 16 chips, 2x2x1 for 4 (sides ascending, ones last)."""
    sides = [1] * dimensions
    while sides[0] * sides[1] * (sides[2] if dimensions == 3 else 1) < chips:
        sides[sides.index(min(sides))] *= 2
    return "x".join(str(side) for side in sorted(sides, key=lambda side: (side == 1, side)))


class CatalogApi:
    """The read-only catalog routes of every API version gcloud uses."""

    def __init__(self, simulator: Simulator) -> None:
        self._simulator = simulator
        self._accelerator_types = offered_accelerator_types()
        rules: list[tuple[str, str, Callable[[str, dict[str, str], Query], Json]]] = []
        for version in _API_VERSIONS:
            location = f"/{version}/projects/<project>/locations/<zone>"
            versions = "tensorflowVersions" if version == "v1" else "runtimeVersions"
            rules += [
                ("GET", f"/{version}/projects/<project>/locations", self._locations),
                ("GET", location, self._location),
                ("GET", f"{location}/acceleratorTypes", self._list_accelerator_types),
                ("GET", f"{location}/acceleratorTypes/<id:id>", self._get_accelerator_type),
                ("GET", f"{location}/{versions}", self._list_versions),
                ("GET", f"{location}/{versions}/<id:id>", self._get_version),
            ]
        self._routes = Routes(
            [(method, path, (path.split("/")[1], handler)) for method, path, handler in rules]  # (version, handler)
        )

    def route(self, method: str, path: str, query: Query) -> tuple[int, Json] | None:
        """The answer to a catalog request, or None when *path* is no catalog path."""
        found = self._routes.match(method, path)
        if found is None:
            return None
        (version, handler), params = found
        return 200, handler(version, params, query)

    # -- locations --------------------------------------------------------------------------

    def _zones(self) -> list[str]:
        config = self._simulator.config
        named = {pool.split("@", 1)[1].split(":", 1)[0] for pool in config.capacity if "@" in pool}
        quota_zones = {entry.location for entry in config.quota_book.entries if entry.scope == "zone"}
        return sorted({*TPU_ZONES, *named, *quota_zones})

    def _locations(self, version: str, params: dict[str, str], query: Query) -> Json:
        project = params["project"]
        entries = [
            _Entry(f"projects/{project}/locations/{zone}", _location_json(project, zone)) for zone in self._zones()
        ]
        return _page("locations", entries, query)

    def _location(self, version: str, params: dict[str, str], query: Query) -> Json:
        if params["zone"] not in self._zones():
            raise SimulatorError(
                Code.NOT_FOUND, f"Location 'projects/{params['project']}/locations/{params['zone']}' was not found"
            )
        return _location_json(params["project"], params["zone"])

    # -- accelerator types and versions -------------------------------------------------------

    def _accelerator_type_entries(self, version: str, params: dict[str, str]) -> list[_Entry]:
        parent = f"projects/{params['project']}/locations/{params['zone']}"
        entries = []
        for accelerator_type, config_type, topology in self._accelerator_types:
            body: Json = {"name": f"{parent}/acceleratorTypes/{accelerator_type}", "type": accelerator_type}
            if version != "v1":
                body["acceleratorConfigs"] = [{"type": config_type, "topology": topology}]
            entries.append(_Entry(body["name"], body))
        return entries

    def _list_accelerator_types(self, version: str, params: dict[str, str], query: Query) -> Json:
        return _page("acceleratorTypes", self._accelerator_type_entries(version, params), query)

    def _get_accelerator_type(self, version: str, params: dict[str, str], query: Query) -> Json:
        return _one(self._accelerator_type_entries(version, params), params, "acceleratorTypes")

    @staticmethod
    def _version_entries(version: str, params: dict[str, str]) -> list[_Entry]:
        parent = f"projects/{params['project']}/locations/{params['zone']}"
        kind, names = (
            ("tensorflowVersions", TENSORFLOW_VERSIONS) if version == "v1" else ("runtimeVersions", RUNTIME_VERSIONS)
        )
        return [
            _Entry(f"{parent}/{kind}/{name}", {"name": f"{parent}/{kind}/{name}", "version": name}) for name in names
        ]

    def _list_versions(self, version: str, params: dict[str, str], query: Query) -> Json:
        key = "tensorflowVersions" if version == "v1" else "runtimeVersions"
        return _page(key, self._version_entries(version, params), query)

    def _get_version(self, version: str, params: dict[str, str], query: Query) -> Json:
        key = "tensorflowVersions" if version == "v1" else "runtimeVersions"
        return _one(self._version_entries(version, params), params, key)


def _location_json(project: str, zone: str) -> Json:
    return {"name": f"projects/{project}/locations/{zone}", "locationId": zone, "displayName": zone}


def _page(key: str, entries: Iterable[_Entry], query: Query) -> Json:
    page = paged(entries, query_int(query, "pageSize"), query_str(query, "pageToken"))
    return page_json(key, page, lambda entry: entry.body)


def _one(entries: list[_Entry], params: dict[str, str], kind: str) -> Json:
    name = f"projects/{params['project']}/locations/{params['zone']}/{kind}/{params['id']}"
    for entry in entries:
        if entry.name == name:
            return entry.body
    raise SimulatorError(Code.NOT_FOUND, f"Resource '{name}' was not found")

"""Where a job's slices run: the Cloud TPU API (queued resources) or Compute Engine (instances, MIGs).

Google serves TPU7x and later only through Compute Engine, v5p and v6e through both, and v2 to v5e
only through the TPU API, which now gets bug fixes alone. On Compute Engine a slice is named as its
VMs' own `accelerator-type` metadata names it (`v7x-16`: 16 TensorCores, 8 chips, a 2x2x2 slice on
2 hosts; `tpu7x-16`, as GKE and xpk write it, is the same) and made of a machine type and a host
count: `COMPUTE_FAMILIES` is that one table.
Sources: ../shared/design/compute-engine.md ([TRCE], [TMIG], the TPU machine pages) and
docs/platforms.md (TPU7x's shapes). Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from tpujobs.domain.accelerators import (
    IRONWOOD_SHAPES,
    BadTopology,
    UnknownAcceleratorType,
    canonical_accelerator_type,
)

Platform = Literal["tpu-api", "compute"]
TPU_API: Platform = "tpu-api"
COMPUTE: Platform = "compute"
PLATFORMS: tuple[Platform, ...] = (TPU_API, COMPUTE)

# Which platforms serve each generation, by the family name of its accelerator types.
SERVED_BY: dict[str, frozenset[Platform]] = {
    "v2": frozenset({TPU_API}),
    "v3": frozenset({TPU_API}),
    "v4": frozenset({TPU_API}),
    "v5litepod": frozenset({TPU_API}),
    "v5p": frozenset({TPU_API, COMPUTE}),
    "v6e": frozenset({TPU_API, COMPUTE}),
    "v7x": frozenset({COMPUTE}),
}


@dataclass(frozen=True)
class ComputeFamily:
    """One generation as Compute Engine makes its slices."""

    name: str  # as the VMs' accelerator-type metadata names it
    counts_cores: bool  # the size counts TensorCores (2 per chip), else chips
    machine_prefix: str  # the machine type is `{prefix}-{chips per VM}t`
    chips_per_host: int  # each VM of a multi-host slice
    single_host_chips: frozenset[int]  # slices that are one VM of that many chips
    topologies: dict[int, tuple[str, ...]]  # chips -> the shapes offered, the usual one first


# The 3D tori of 4-chip VMs of v5p: chips -> shape.
_CUBES: dict[int, tuple[str, ...]] = {
    4: ("2x2x1",),
    8: ("2x2x2",),
    16: ("2x2x4",),
    32: ("2x4x4",),
    64: ("4x4x4",),
    128: ("4x4x8",),
    256: ("4x8x8",),
}

COMPUTE_FAMILIES: dict[str, ComputeFamily] = {
    f.name: f
    for f in (
        # tpu7x-standard-1t (1x1x1) and -4t: 2x2x1 is one VM, 2x2x2 two ... a pod of 4x4x4 cubes,
        # 9,216 chips on 2,304 VMs [TRCE; xpk system_characteristics; docs/platforms.md].
        ComputeFamily(
            "v7x",
            True,
            "tpu7x-standard",
            4,
            frozenset({1, 4}),
            IRONWOOD_SHAPES,
        ),
        # ct6e-standard-1t, -4t and -8t: one VM up to 8 chips; multi-host slices of 4-chip VMs.
        ComputeFamily(
            "v6e",
            False,
            "ct6e-standard",
            4,
            frozenset({1, 4, 8}),
            {
                1: ("1x1",),
                4: ("2x2",),
                8: ("2x4",),
                16: ("4x4",),
                32: ("4x8",),
                64: ("8x8",),
                128: ("8x16",),
                256: ("16x16",),
            },
        ),
        # ct5p-hightpu-4t: 4 chips a VM, 3D tori.
        ComputeFamily(
            "v5p",
            True,
            "ct5p-hightpu",
            4,
            frozenset({4}),
            {**_CUBES, 512: ("8x8x8",)},
        ),
    )
}

_TYPE = re.compile(r"^(?P<family>[a-z0-9]+)-(?P<size>[1-9][0-9]{0,5})$")


@dataclass(frozen=True)
class ComputeShape:
    """One slice on Compute Engine: what its VMs are and how many."""

    accelerator_type: str
    family: str
    topology: str
    chips: int
    hosts: int
    machine_type: str

    @property
    def multi_host(self) -> bool:
        """A MIG with a workload policy naming the topology; else one VM (or a MIG of one)."""
        return self.hosts > 1


def family_of(accelerator_type: str) -> str:
    """The generation an accelerator type names (`v7x-16` or `tpu7x-16`: v7x), or UnknownAcceleratorType."""
    match = _TYPE.fullmatch(canonical_accelerator_type(accelerator_type or ""))
    if match is None or match["family"] not in SERVED_BY:
        known = ", ".join(sorted(SERVED_BY))
        raise UnknownAcceleratorType(
            f"accelerator_type {accelerator_type[:32]!r} names no TPU generation tpujobs knows; known: {known}"
        )
    return match["family"]


def compute_shape(accelerator_type: str, topology: str | None = None) -> ComputeShape:
    """The machine type, host count and topology of a slice on Compute Engine; `topology` picks
    among the shapes of a size that has several (default: the usual one). UnknownAcceleratorType
    or BadTopology with the sentence why."""
    given, accelerator_type = accelerator_type, canonical_accelerator_type(accelerator_type)
    family = COMPUTE_FAMILIES.get(family_of(accelerator_type))
    if family is None:
        raise UnknownAcceleratorType(f"accelerator_type {given!r}: {platform_refusal(accelerator_type, COMPUTE)}")
    size = int(accelerator_type.rsplit("-", 1)[1])
    chips = size // 2 if family.counts_cores else size
    shapes = family.topologies.get(chips) if not family.counts_cores or size % 2 == 0 else None
    if not shapes:
        raise UnknownAcceleratorType(
            f"accelerator_type {given!r} is not offered on Compute Engine; {_sizes(family, chips)}"
        )
    chosen = topology or shapes[0]
    if chosen not in shapes:
        offered = ", ".join(shapes)
        ascending = "x".join(sorted(chosen.split("x"), key=lambda side: (side != "1", len(side), side)))
        hint = f" (sides ascending: {ascending})" if ascending != chosen and ascending in shapes else ""
        raise BadTopology(f"topology {chosen[:32]!r} is not a shape of {given} on Compute Engine: {offered}{hint}")
    if chips in family.single_host_chips:
        return ComputeShape(accelerator_type, family.name, chosen, chips, 1, f"{family.machine_prefix}-{chips}t")
    hosts = chips // family.chips_per_host
    machine_type = f"{family.machine_prefix}-{family.chips_per_host}t"
    return ComputeShape(accelerator_type, family.name, chosen, chips, hosts, machine_type)


def _sizes(family: ComputeFamily, chips: int) -> str:
    """The sizes a family is offered in, for a refusal: all of them when few, else the nearest
    to *chips* and the range."""
    names = [f"{family.name}-{c * 2 if family.counts_cores else c}" for c in sorted(family.topologies)]
    if len(names) <= 12:
        return f"sizes: {', '.join(names)}"
    counts = sorted(family.topologies)
    below = [n for c, n in zip(counts, names, strict=True) if c < chips][-1:]
    above = [n for c, n in zip(counts, names, strict=True) if c > chips][:1]
    nearest = below + above
    verb = "sizes are" if len(nearest) > 1 else "size is"
    return f"the nearest {verb} {' and '.join(nearest)} ({len(names)} sizes from {names[0]} to {names[-1]})"


def platform_refusal(accelerator_type: str, platform: str) -> str | None:
    """Why `platform` cannot run `accelerator_type`'s generation, or None when it can."""
    if platform not in PLATFORMS:
        return f"platform {platform[:32]!r} is not one of {', '.join(PLATFORMS)}"
    served = SERVED_BY[family_of(accelerator_type)]
    if platform in served:
        return None
    family = family_of(accelerator_type)
    if platform == TPU_API:
        return (
            f"{family} is served only through Compute Engine (platform: compute); the Cloud TPU API does not serve it"
        )
    return f"{family} is served only through the Cloud TPU API (platform: tpu-api), not Compute Engine"


def default_platform(accelerator_type: str, compute_by_default: frozenset[str] = frozenset()) -> Platform:
    """The platform of a job that names none: the only one that serves its generation, else
    Compute Engine for the generations the deployment lists in `compute_by_default`."""
    family = family_of(accelerator_type)
    served = SERVED_BY[family]
    if len(served) == 1:
        return next(iter(served))
    return COMPUTE if family in compute_by_default else TPU_API

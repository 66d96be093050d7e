"""TPU accelerator types: which exist, how many chips and worker hosts each has, and the
topologies (chips along each axis) that may name the same slice.

The number after the dash means TensorCores for v2, v3, v4, v5p and v7x (two per chip)
and chips for v5e (``v5litepod``) and v6e. Every worker host holds four chips,
except the single-host shapes of v5e and v6e, which hold up to eight.
A slice may also be asked for as an AcceleratorConfig: the family's type and a topology,
``AxB`` for v2, v3, v5e and v6e (2D tori) and ``AxBxC`` for v4 and v5p (3D), whose product is
the chip count (gcloud's ``--type --topology`` instead of ``--accelerator-type``).
TPU7x (``v7x``, also written ``tpu7x`` as GKE and xpk name it) is made of 4x4x4 cubes up to a
full 9,216-chip pod, plus the smaller 2x2x1 to 2x4x4 slices and a 1-chip VM (``IRONWOOD_SHAPES``).
Sources: the Cloud TPU system architecture pages for each version; docs/platforms.md for TPU7x.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """One TPU generation as it is named in accelerator types."""

    name: str
    counts_cores: bool  # True: the size counts TensorCores (2 per chip); False: chips
    sizes: frozenset[int]  # the sizes the TPU API offers
    max_single_host_chips: int  # the largest slice that fits on one worker host
    config_type: str  # the TPU API's AcceleratorConfig.Type name of the family; "" if it serves none
    topology_dimensions: int  # how many numbers its topology has: 2 (AxB) or 3 (AxBxC)


def _multiples(step: int, upto: int) -> frozenset[int]:
    return frozenset(range(step, upto + 1, step))


def cube_shapes(max_cubes: int, max_side: int) -> dict[int, tuple[str, ...]]:
    """Chips -> the 3D slices of that many chips built from 4x4x4 cubes (each side a multiple of 4,
    at most *max_side*, sides ascending, at most *max_cubes* cubes), the most nearly cubic first
    (the smallest longest side, then the largest shortest): Google's default shape of a size."""
    sides = range(4, max_side + 1, 4)
    found: dict[int, list[tuple[int, int, int]]] = {}
    for a in sides:
        for b in (s for s in sides if s >= a):
            for c in (s for s in sides if s >= b):
                if (a // 4) * (b // 4) * (c // 4) <= max_cubes:
                    found.setdefault(a * b * c, []).append((a, b, c))
    return {
        chips: tuple("x".join(map(str, t)) for t in sorted(shapes, key=lambda t: (t[2], -t[0], t)))
        for chips, shapes in sorted(found.items())
    }


# TPU7x (Ironwood) slices as Google offers them: a 1-chip VM (tpu7x-standard-1t), the 4-chip VM's
# 2x2x1 and the 2x2x2, 2x2x4 and 2x4x4 slices below a cube, then any AxBxC of 4x4x4 cubes, sides of
# at most 256 chips, up to the pod's 144 cubes (9,216 chips) [xpk system_characteristics; TPU7x page].
IRONWOOD_POD_CUBES = 144
IRONWOOD_SHAPES: dict[int, tuple[str, ...]] = {
    1: ("1x1x1",),
    4: ("2x2x1",),
    8: ("2x2x2",),
    16: ("2x2x4",),
    32: ("2x4x4",),
    **cube_shapes(IRONWOOD_POD_CUBES, 256),
}
# Other names of a family, as other tools write them: xpk and GKE name TPU7x slices `tpu7x-N`.
ALIASES: dict[str, str] = {"tpu7x": "v7x"}


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("v2", True, frozenset({8, 32, 128, 256, 512}), 4, "V2", 2),
        Family("v3", True, frozenset({8, 32, 64, 128, 256, 512, 1024, 2048}), 4, "V3", 2),
        Family("v4", True, _multiples(8, 4096), 4, "V4", 3),
        Family("v5p", True, _multiples(8, 12288), 4, "V5P", 3),
        Family("v5litepod", False, frozenset({1, 4, 8, 16, 32, 64, 128, 256}), 8, "V5LITE_POD", 2),
        Family("v6e", False, frozenset({1, 4, 8, 16, 32, 64, 128, 256}), 8, "V6E", 2),
        # TPU7x (Ironwood): Compute Engine only (`domain.platforms`), so no TPU API config type.
        Family("v7x", True, frozenset(2 * chips for chips in IRONWOOD_SHAPES), 4, "", 3),
    )
}

_TYPE = re.compile(r"^(?P<family>[a-z0-9]+)-(?P<size>[1-9][0-9]{0,4})$")
CHIPS_PER_HOST = 4


class UnknownAcceleratorType(ValueError):
    """The accelerator type names no family or size the TPU API offers."""


@dataclass(frozen=True)
class AcceleratorShape:
    """What one slice of an accelerator type is made of."""

    accelerator_type: str
    family: str
    chips: int
    hosts: int

    @property
    def chips_per_host(self) -> int:
        return self.chips // self.hosts


def canonical_accelerator_type(accelerator_type: str) -> str:
    """The name tpujobs keeps of an accelerator type: `tpu7x-16` is `v7x-16`; others unchanged."""
    family, dash, size = (accelerator_type or "").partition("-")
    return f"{ALIASES[family]}-{size}" if dash and family in ALIASES else accelerator_type


def parse_accelerator_type(accelerator_type: str) -> AcceleratorShape:
    """Chips and hosts of one slice (named canonically), or UnknownAcceleratorType with a sentence why."""
    match = _TYPE.fullmatch(accelerator_type or "")
    if not match:
        raise UnknownAcceleratorType(
            f"accelerator_type {accelerator_type!r} is not of the form FAMILY-SIZE, such as v4-8"
        )
    family = FAMILIES.get(ALIASES.get(match["family"], match["family"]))
    if family is None:
        known = ", ".join(sorted(FAMILIES))
        raise UnknownAcceleratorType(
            f"accelerator_type {accelerator_type!r} names an unknown TPU family; known: {known}"
        )
    size = int(match["size"])
    if size not in family.sizes:
        offered = sorted(family.sizes)
        sample = ", ".join(str(s) for s in offered[:8]) + (", ..." if len(offered) > 8 else "")
        raise UnknownAcceleratorType(
            f"accelerator_type {accelerator_type!r}: {family.name} is not offered with size {size}; sizes: {sample}"
        )
    chips = size // 2 if family.counts_cores else size
    hosts = 1 if chips <= family.max_single_host_chips else chips // CHIPS_PER_HOST
    return AcceleratorShape(canonical_accelerator_type(accelerator_type), family.name, chips, hosts)


_TOPOLOGY = re.compile(r"^[1-9][0-9]{0,2}(?:x[1-9][0-9]{0,2})+$")
FAMILY_OF_CONFIG_TYPE: dict[str, str] = {f.config_type: f.name for f in FAMILIES.values() if f.config_type}


class BadTopology(ValueError):
    """A topology that is malformed, has the wrong number of axes, or holds another chip count."""


def topology_chips(topology: str, family: str) -> int:
    """The chips of a topology of *family* (the product of its axes), or BadTopology saying why."""
    if not _TOPOLOGY.fullmatch(topology or ""):
        raise BadTopology(f"topology {topology[:32]!r} is not of the form AxB or AxBxC, such as 2x2x4")
    axes = [int(n) for n in topology.split("x")]
    wanted = FAMILIES[family].topology_dimensions
    if len(axes) != wanted:
        example = "2x2x4" if wanted == 3 else "4x4"
        raise BadTopology(
            f"topology {topology!r} has {len(axes)} dimensions; {family} slices have {wanted}, such as {example}"
        )
    chips = 1
    for n in axes:
        chips *= n
    return chips


def check_topology(accelerator_type: str, topology: str) -> None:
    """BadTopology unless *topology* is a shape of *accelerator_type*: its family's number of
    axes and the same number of chips."""
    shape = parse_accelerator_type(accelerator_type)
    chips = topology_chips(topology, shape.family)
    if chips != shape.chips:
        raise BadTopology(
            f"topology {topology!r} has {chips} chips but accelerator_type {accelerator_type!r} has {shape.chips}"
        )


def accelerator_type_of(config_type: str, topology: str) -> str:
    """The accelerator type an AcceleratorConfig names (V4 and 2x2x4: v4-32), or
    UnknownAcceleratorType / BadTopology saying why it names none."""
    family_name = FAMILY_OF_CONFIG_TYPE.get(config_type)
    if family_name is None:
        known = ", ".join(sorted(FAMILY_OF_CONFIG_TYPE))
        raise UnknownAcceleratorType(f"accelerator_config.type {config_type!r} is not one of {known}")
    family = FAMILIES[family_name]
    chips = topology_chips(topology, family_name)
    accelerator_type = f"{family_name}-{chips * 2 if family.counts_cores else chips}"
    parse_accelerator_type(accelerator_type)  # a size the family is not offered in
    return accelerator_type

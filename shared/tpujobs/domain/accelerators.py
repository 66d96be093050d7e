"""TPU accelerator types: which exist, how many chips and worker hosts each has.

The number after the dash means TensorCores for v2, v3, v4 and v5p (two per chip)
and chips for v5e (``v5litepod``) and v6e. Every worker host holds four chips,
except the single-host shapes of v5e and v6e, which hold up to eight.
Sources: the Cloud TPU system architecture pages for each version.
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


def _multiples(step: int, upto: int) -> frozenset[int]:
    return frozenset(range(step, upto + 1, step))


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("v2", True, frozenset({8, 32, 128, 256, 512}), 4),
        Family("v3", True, frozenset({8, 32, 64, 128, 256, 512, 1024, 2048}), 4),
        Family("v4", True, _multiples(8, 4096), 4),
        Family("v5p", True, _multiples(8, 12288), 4),
        Family("v5litepod", False, frozenset({1, 4, 8, 16, 32, 64, 128, 256}), 8),
        Family("v6e", False, frozenset({1, 4, 8, 16, 32, 64, 128, 256}), 8),
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


def parse_accelerator_type(accelerator_type: str) -> AcceleratorShape:
    """Chips and hosts of one slice, or UnknownAcceleratorType with a sentence why."""
    match = _TYPE.fullmatch(accelerator_type or "")
    if not match:
        raise UnknownAcceleratorType(
            f"accelerator_type {accelerator_type!r} is not of the form FAMILY-SIZE, such as v4-8"
        )
    family = FAMILIES.get(match["family"])
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
    return AcceleratorShape(accelerator_type, family.name, chips, hosts)

"""Quota as Google counts it: chips per TPU family and tier, in a zone or in a whole region.

Google keeps a TPU version's on-demand, Spot (preemptible) and reserved quota apart; most are
zonal, some regional (an error names both: "Quota limit 'TPUV2sPodPerProjectPerRegionForTPUAPI,
TPUV2sPodPerProjectPerZoneForTPUAPI' has been exceeded"). Flex-start VMs consume preemptible
quota, and reserved capacity comes from its reservation, not from a quota. `config/quotas` says
the same, and admission and the simulator read it through this one module:

    {"us-central2-b": {"v4": 64},                              # a bare number: on-demand
     "us-east5-a": {"v5p": {"on-demand": 64, "spot": 256, "reserved": 128}},
     "us-east5": {"v5p": {"spot": 512}},                       # a region: its zones share it
     "reservations": {"team-a-v5p": 256}}                      # a named reservation's chips

Chips are held in one admission pool per family, tier and region (`quota_pools/{pool}`), so a
region's quota and each of its zones' quotas are checked against the same holders. See
docs/quotas.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote, unquote

from tpujobs.domain.accelerators import FAMILIES

Tier = Literal["on-demand", "spot", "reserved"]
TIERS: tuple[Tier, ...] = ("on-demand", "spot", "reserved")
# The quota a capacity kind draws on: Flex-start VMs "consume preemptible quota" (Google Cloud's
# Flex-start announcement); reserved capacity is counted against its reservation.
TIER_OF_CAPACITY: Mapping[str, Tier] = {
    "on-demand": "on-demand",
    "spot": "spot",
    "flex-start": "spot",
    "reserved": "reserved",
}
RESERVATIONS = "reservations"  # the config key of named reservations' sizes
ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
Scope = Literal["zone", "region"]


def region_of(zone: str) -> str:
    """us-central2-b -> us-central2."""
    return zone.rsplit("-", 1)[0]


@dataclass(frozen=True)
class PoolKey:
    """An admission pool: one family's chips of one tier in one region, or one reservation's."""

    family: str
    tier: Tier
    region: str
    reservation: str = ""  # reserved capacity of a named reservation; "": any of the zone's

    @property
    def id(self) -> str:
        """The pool's document id: `v4@us-central2`, `v4@us-central2:spot`, `v5p@us-east5:reserved:NAME`."""
        base = f"{self.family}@{self.region}"
        if self.tier == "on-demand":
            return base
        if self.reservation:
            return f"{base}:reserved:{quote(self.reservation, safe='')}"
        return f"{base}:{self.tier}"

    @classmethod
    def parse(cls, pool: str) -> PoolKey:
        """The key of a pool id (`id`); ValueError for one that is not."""
        head, _, rest = pool.partition(":")
        family, _, region = head.partition("@")
        tier, _, reservation = rest.partition(":")
        tier = tier or "on-demand"
        if family not in FAMILIES or not REGION.fullmatch(region) or tier not in TIERS:
            raise ValueError(f"{pool!r} is no quota pool (FAMILY@REGION[:spot|:reserved[:NAME]])")
        if reservation and tier != "reserved":
            raise ValueError(f"{pool!r}: only the reserved tier names a reservation")
        return cls(family, tier, region, unquote(reservation))

    def chips_of(self, where: str) -> str:
        """Words for its chips: 'v4 spot chips in us-central2-b', '... of reservation R'."""
        if self.reservation:
            return f"{self.family} chips of reservation {self.reservation}"
        place = where if ZONE.fullmatch(where) else f"region {where}"
        return f"{self.family} {self.tier} chips in {place}"


def pool_key(family: str, capacity: str, zone: str, reservation: str | None = None) -> PoolKey:
    """The pool that capacity of `family` in `zone` is counted in (config-independent, so a job's
    stored pool never changes when an admin edits the quotas)."""
    tier = TIER_OF_CAPACITY[capacity]
    return PoolKey(family, tier, region_of(zone), (reservation or "") if tier == "reserved" else "")


@dataclass(frozen=True)
class Limits:
    """The chips a pool may hold: in all (its region's quota, or its reservation's size), and in
    each zone that has a quota of its own. None and absent zones: no limit there."""

    total: int | None = None
    zones: Mapping[str, int] = field(default_factory=dict)

    @property
    def unlimited(self) -> bool:
        return self.total is None and not self.zones

    def of(self, scope: Scope, zone: str) -> int | None:
        return self.total if scope == "region" else self.zones.get(zone)

    def blocked_by(self, held: Iterable[tuple[str, int]], zone: str, chips: int) -> Scope | None:
        """Which limit `chips` more in `zone` would pass, next to what is `held` ((zone, chips)
        pairs): the region's first (no other zone of it helps), then the zone's; None: they fit."""
        pairs = list(held)
        if self.total is not None and sum(c for _, c in pairs) + chips > self.total:
            return "region"
        limit = self.zones.get(zone)
        if limit is not None and sum(c for z, c in pairs if z == zone) + chips > limit:
            return "zone"
        return None

    def never_fits(self, zone: str, chips: int) -> Scope | None:
        """Which limit `chips` exceed even alone: the job could never run under it. A limit of 0
        is a pause, not a size (an admin stops a pool, then opens it again): its jobs wait."""
        if self.total is not None and 0 < self.total < chips:
            return "region"
        limit = self.zones.get(zone)
        return "zone" if limit is not None and 0 < limit < chips else None


@dataclass(frozen=True)
class QuotaEntry:
    """One limit as `config/quotas` states it, for `tpujobs quota show` and checks."""

    location: str  # a zone, a region, or "reservations"
    family: str  # "" for a named reservation
    tier: Tier
    chips: int
    reservation: str = ""

    @property
    def scope(self) -> str:
        if self.reservation:
            return "reservation"
        return "zone" if ZONE.fullmatch(self.location) else "region"


class QuotaBook:
    """`config/quotas` read: the limits of each pool, and what in the document makes no sense
    (`problems`: skipped, never fatal, as admins edit it by hand in the console)."""

    def __init__(self, document: Mapping[str, Any] | None) -> None:
        self.entries: list[QuotaEntry] = []
        self.problems: list[str] = []
        for location, families in sorted((document or {}).items()):
            if location != RESERVATIONS and not (ZONE.fullmatch(location) or REGION.fullmatch(location)):
                self.problems.append(f"{location!r} is neither a zone, a region nor {RESERVATIONS!r}")
            elif not isinstance(families, Mapping):
                self.problems.append(f"{location}: not a map")
            elif location == RESERVATIONS:
                self._read_reservations(families)
            else:
                for family, value in sorted(families.items()):
                    self._read_family(location, str(family), value)

    def _read_family(self, location: str, family: str, value: Any) -> None:
        if family not in FAMILIES:
            self.problems.append(f"{location}.{family}: no such TPU family ({', '.join(sorted(FAMILIES))})")
            return
        tiers = {"on-demand": value} if not isinstance(value, Mapping) else dict(value)
        for tier, chips in sorted(tiers.items()):
            where = f"{location}.{family}.{tier}"
            if tier not in TIERS:
                self.problems.append(f"{where}: no such tier ({', '.join(TIERS)})")
            elif tier == "reserved" and not ZONE.fullmatch(location):
                self.problems.append(f"{where}: reservations are zonal; give the reserved chips per zone")
            elif _chips(chips) is None:
                self.problems.append(f"{where}: {chips!r} is not a whole number of chips")
            else:
                self.entries.append(QuotaEntry(location, family, tier, _chips(chips) or 0))

    def _read_reservations(self, sizes: Mapping[str, Any]) -> None:
        for name, chips in sorted(sizes.items()):
            if _chips(chips) is None:
                self.problems.append(f"{RESERVATIONS}.{name}: {chips!r} is not a whole number of chips")
            else:
                self.entries.append(QuotaEntry(RESERVATIONS, "", "reserved", _chips(chips) or 0, str(name)))

    def limits(self, pool: PoolKey) -> Limits:
        """The pool's limits: its region's and its zones' entries of its family and tier, or its
        reservation's size."""
        if pool.reservation:
            sizes = [e.chips for e in self.entries if e.reservation == pool.reservation]
            return Limits(total=sizes[0] if sizes else None)
        mine = [e for e in self.entries if e.family == pool.family and e.tier == pool.tier and not e.reservation]
        total = next((e.chips for e in mine if e.location == pool.region), None)
        zones = {e.location: e.chips for e in mine if e.scope == "zone" and region_of(e.location) == pool.region}
        return Limits(total, zones)

    def limited_pools(self) -> list[PoolKey]:
        """Every pool some entry limits (named reservations under any family: their pools are
        found from their jobs)."""
        keys = {
            PoolKey(e.family, e.tier, e.location if e.scope == "region" else region_of(e.location))
            for e in self.entries
            if not e.reservation
        }
        return sorted(keys, key=lambda k: k.id)

    def is_limited(self, pool: str) -> bool:
        return not self.limits(PoolKey.parse(pool)).unlimited


def _chips(value: Any) -> int | None:
    """A whole, non-negative number of chips (Firestore stores integers, or floats from the console)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or int(value) != value:
        return None
    return int(value)

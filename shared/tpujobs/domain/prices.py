"""Chips' list prices, per family, tier and region: what `tpujobs usage` estimates a cost from.

Estimates, never a bill: Google bills what its own price list says on the day, less any discount a
contract gives, and tpujobs counts chip time from the capacity becoming ACTIVE (docs/records.md).
The deployment's own prices are the Firestore document `config/prices`, laid out as
`config/quotas` is (a region, or `*` for any region; a family; a price per chip-hour in USD per tier):

    {"*": {"v6e": {"on-demand": 2.70, "reserved": 1.89}},      # any region without its own price
     "us-east5": {"v5p": {"on-demand": 4.20, "spot": null}},   # null: no estimate there
     "europe-west4": {"v6e": 2.97}}                            # a bare number: on-demand

Each (region, family, tier) it names replaces the shipped default; a price it does not name keeps
the default. The shipped defaults (DEFAULT_PRICES) hold only prices Google published that we could
read, with the source and the day they were read (SOURCES): a family without one has no estimate
(None), never a guessed one. Which tier a job's chip time is priced at: its quota tier
(`domain.quotas.TIER_OF_CAPACITY`; flex-start draws on spot). See docs/usage.md#prices.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpujobs.domain.accelerators import FAMILIES
from tpujobs.domain.quotas import REGION, TIERS, ZONE

ANY_REGION = "*"
CURRENCY = "USD"
PriceKey = tuple[str, str, str]  # (region or ANY_REGION, family, tier)

# Where each shipped price comes from, and the day it was read (UTC).
SOURCES: tuple[str, ...] = (
    "Google Cloud's Trillium (TPU v6e) general-availability announcement, 2024-12-11, as quoted by "
    "https://neowin.net/amp/google-takes-on-nvidia-blackwell-gpus-with-the-new-trillium-tpus "
    "(read 2026-12-02): 'For evaluation, Trillium is available starting at $2.7000 per chip-hour. "
    "With 1-year and 3-year commitments, it is available starting at $1.8900 per chip-hour and "
    "$1.2200 per chip-hour'. On-demand is the evaluation price, reserved the 1-year commitment's; "
    "both are 'starting at' prices, so they stand for every region.",
    "https://cloud.google.com/tpu/pricing (read 2026-12-02): the copy we could read shows no price "
    "table for v2, v3, v4, v5e (v5litepod), v5p or TPU7x (v7x), so those have no estimate here.",
)
READ_ON = "2026-12-02"

DEFAULT_PRICES: Mapping[PriceKey, float | None] = {
    (ANY_REGION, "v6e", "on-demand"): 2.70,
    (ANY_REGION, "v6e", "reserved"): 1.89,
}


@dataclass(frozen=True)
class Prices:
    """Price per chip-hour by (region, family, tier): the defaults with `config/prices` over them."""

    entries: Mapping[PriceKey, float | None] = field(default_factory=lambda: dict(DEFAULT_PRICES))
    problems: tuple[str, ...] = ()  # what config/prices held that makes no sense (skipped)
    overridden: bool = False  # config/prices named at least one price

    def per_chip_hour(self, family: str, tier: str, region: str) -> float | None:
        """The region's own price, else the any-region one; None: no estimate."""
        for key in ((region, family, tier), (ANY_REGION, family, tier)):
            if key in self.entries:
                return self.entries[key]
        return None

    def rows(self) -> list[dict[str, Any]]:
        """Every price named, in order, as `tpujobs usage -o json` lists them."""
        return [
            {"region": region, "family": family, "tier": tier, "usd_per_chip_hour": price}
            for (region, family, tier), price in sorted(self.entries.items())
        ]


def prices_from_document(document: Mapping[str, Any] | None) -> Prices:
    """The shipped defaults with `config/prices` (None or empty: none) over them; an entry that
    makes no sense is skipped and named in `problems`, never fatal."""
    entries: dict[PriceKey, float | None] = dict(DEFAULT_PRICES)
    problems: list[str] = []
    named = 0
    for region, families in (document or {}).items():
        if region != ANY_REGION and not REGION.fullmatch(str(region)):
            hint = " (prices are per region: drop the zone's letter)" if ZONE.fullmatch(str(region)) else ""
            problems.append(f"{str(region)[:64]!r} is neither a region nor '*'{hint}: skipped")
            continue
        if not isinstance(families, Mapping):
            problems.append(f"{region}: expected families with their prices: skipped")
            continue
        for family, tiers in families.items():
            if family not in FAMILIES:
                problems.append(f"{region}.{str(family)[:32]}: unknown family: skipped")
                continue
            for tier, price in _tiers(tiers).items():
                if tier not in TIERS:
                    problems.append(f"{region}.{family}.{str(tier)[:32]}: unknown tier ({', '.join(TIERS)}): skipped")
                elif not _price_ok(price):
                    problems.append(
                        f"{region}.{family}.{tier}: {price!r} is no price (a number >= 0, or null): skipped"
                    )
                else:
                    entries[(region, family, tier)] = None if price is None else float(price)
                    named += 1
    return Prices(entries, tuple(problems), named > 0)


def _tiers(value: Any) -> Mapping[Any, Any]:
    """A family's prices: a bare number (or null) is on-demand's, as in config/quotas."""
    return value if isinstance(value, Mapping) else {"on-demand": value}


def _price_ok(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and value >= 0

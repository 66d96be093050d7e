"""One limit of `config/quotas` changed, as `tpujobs quota` and the stores write it.

The document is edited by hand too, so an edit keeps what the admin wrote: a bare number (a
family's on-demand chips) stays bare while only on-demand changes, and becomes a map of tiers
(`{family: {tier: chips}}`) when another tier joins it (`domain.quotas`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpujobs.domain.accelerators import FAMILIES
from tpujobs.domain.quotas import REGION, RESERVATIONS, TIERS, ZONE


def with_limit(document: Mapping[str, Any], location: str, family: str, tier: str, chips: int | None) -> dict[str, Any]:
    """`document` with one zone's or region's limit of a family and tier set (None: removed);
    ValueError for a limit the document cannot hold."""
    if not (ZONE.fullmatch(location) or REGION.fullmatch(location)):
        raise ValueError(f"{location!r} is neither a zone (us-central2-b) nor a region (us-central2)")
    if family not in FAMILIES:
        raise ValueError(f"{family!r} is no TPU family ({', '.join(sorted(FAMILIES))})")
    if tier not in TIERS:
        raise ValueError(f"{tier!r} is no tier ({', '.join(TIERS)})")
    if tier == "reserved" and not ZONE.fullmatch(location):
        raise ValueError("reservations are zonal: give the reserved chips per zone")
    _check_chips(chips)
    families = dict(document.get(location) or {})
    current = families.get(family)
    if tier == "on-demand" and current is not None and not isinstance(current, Mapping):
        value: Any = chips  # a bare number stays as the admin wrote it
    else:
        tiers = dict(current) if isinstance(current, Mapping) else {}
        if current is not None and not isinstance(current, Mapping):
            tiers["on-demand"] = current
        tiers.pop(tier, None)
        value = {**tiers, tier: chips} if chips is not None else tiers or None
    return _with(document, location, _with(families, family, value) or None)


def with_reservation(document: Mapping[str, Any], name: str, chips: int | None) -> dict[str, Any]:
    """`document` with a named reservation's chips set (None: removed)."""
    if not name:
        raise ValueError("a reservation needs a name")
    _check_chips(chips)
    sizes = _with(dict(document.get(RESERVATIONS) or {}), name, chips)
    return _with(document, RESERVATIONS, sizes or None)


def _with(mapping: Mapping[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A copy with `key` set, or removed when `value` is None."""
    copied = {k: v for k, v in mapping.items() if k != key}
    return copied if value is None else {**copied, key: value}


def _check_chips(chips: int | None) -> None:
    if chips is not None and (isinstance(chips, bool) or not isinstance(chips, int) or chips < 0):
        raise ValueError(f"{chips!r} is not a whole number of chips")

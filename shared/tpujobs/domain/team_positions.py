"""Where each team stands under one quota limit, for `tpujobs team show` and the dashboard."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpujobs.domain.admission import Holder
from tpujobs.domain.fair_share import Limit, Waiting
from tpujobs.domain.quotas import Limits, Scope

if TYPE_CHECKING:
    from tpujobs.domain.teams import Share


@dataclass(frozen=True)
class Position:
    """One team's chips under one limit, for `tpujobs team show`: all in chips."""

    team: str
    nominal: int
    held: int
    borrowed: int  # held past its nominal, on others' idle chips
    lent: int  # of its nominal, held by others now
    waiting: int  # asked for by its waiting jobs


def limit_positions(
    limits: Limits, where: str, shares: Mapping[str, Share], holders: Sequence[Holder], waiting: Sequence[Waiting]
) -> dict[str, Position]:
    """Each team's position under one limit of a pool (`where`: its zone, or its region), for
    `tpujobs team show`. Borrowed chips come first from chips no team holds as nominal; the rest
    are lent by the teams with idle lendable nominal, in proportion to it."""
    scope: Scope = "region" if limits.total is not None and where not in limits.zones else "zone"
    chips = limits.of(scope, where)
    limit = Limit(where, scope, chips if chips is not None else sum(s.nominal for s in shares.values()), shares)
    counted = [h for h in holders if limit.counts(h.zone)]
    teams = sorted({*shares, *(h.team for h in counted), *(w.team for w in waiting if limit.counts(w.zone))})
    held = {t: sum(h.chips for h in counted if h.team == t) for t in teams}
    borrowed = {t: max(0, held[t] - limit.nominal(t)) for t in teams}
    from_nominals = max(0, sum(borrowed.values()) - limit.unassigned) if chips is not None else 0
    lendable = {t: max(0, min(limit.nominal(t) - limit.kept(t), limit.nominal(t) - held[t])) for t in shares}
    lent = _in_proportion(from_nominals, lendable)
    return {
        t: Position(
            t,
            limit.nominal(t),
            held[t],
            borrowed[t],
            lent.get(t, 0),
            sum(w.chips for w in waiting if w.team == t and limit.counts(w.zone)),
        )
        for t in teams
    }


def _in_proportion(total: int, weights: Mapping[str, int]) -> dict[str, int]:
    """`total` split in whole chips in proportion to `weights` (none past its weight); the
    remainder goes one chip at a time in name order."""
    whole = sum(weights.values())
    if not whole or not total:
        return {}
    total = min(total, whole)
    parts = {t: total * w // whole for t, w in weights.items()}
    for t in sorted(weights):
        if sum(parts.values()) >= total:
            break
        if parts[t] < weights[t]:
            parts[t] += 1
    return parts

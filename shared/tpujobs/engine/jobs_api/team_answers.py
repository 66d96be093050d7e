"""What `tpujobs team show` and the API's `team-show` answer: each team, its members and accounts,
and under each of its limits its share and its position now (`domain.team_positions.limit_positions`).

A position is computed from what admission itself reads: each pool's holders (each names its
team) and its waiting jobs. A pool is read once, however many teams share its limits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpujobs.domain.team_positions import Position, limit_positions
from tpujobs.domain.teams import Share, Team, TeamBook

if TYPE_CHECKING:
    from tpujobs.engine.ports import Pools, Teams


def team_document(teams: Teams, pools: Pools | None) -> dict[str, Any]:
    """`{"teams": [{name, members, accounts, budget_chip_hours, limits: [...]}], "problems": [...]}`;
    without pools (no quotas in this deployment) every position is 0."""
    return book_document(teams.teams(), pools)


def book_document(book: TeamBook, pools: Pools | None) -> dict[str, Any]:
    """`team_document` of a `config/teams` already read (the dashboard reads it to know the caller's team)."""
    positions = _positions(book, pools) if pools is not None else {}
    return {
        "teams": [_team(team, positions) for team in book.teams],
        "problems": list(book.problems),
    }


def _positions(book: TeamBook, pools: Pools) -> dict[tuple[str, str], Position]:
    """(team, limit) -> its position, for every limit some team has a share of."""
    keys = {share.pool for team in book.teams for share in team.shares}
    if not keys:
        return {}
    quotas = pools.quotas()
    found: dict[tuple[str, str], Position] = {}
    for key in sorted(keys, key=lambda k: k.id):
        holders = pools.view(key.id).holders
        waiting = pools.waiting(key.id)
        limits = quotas.limits(key)
        for where, shares in book.shares_of(key).items():
            for name, position in limit_positions(limits, where, shares, holders, waiting).items():
                if name in shares:
                    found[(name, shares[name].limit)] = position
    return found


def _team(team: Team, positions: dict[tuple[str, str], Position]) -> dict[str, Any]:
    return {
        "name": team.name,
        "members": list(team.members),
        "accounts": list(team.accounts),
        "budget_chip_hours": team.budget_chip_hours,
        "limits": [_limit(share, positions.get((team.name, share.limit))) for share in team.shares],
    }


def _limit(share: Share, position: Position | None) -> dict[str, Any]:
    return {
        "location": share.location,
        "family": share.family,
        "tier": share.tier,
        "nominal": share.nominal,
        "borrowing_limit": share.borrowing_limit,
        "lending_limit": share.lending_limit,
        "weight": share.weight,
        "held": position.held if position else 0,
        "borrowed": position.borrowed if position else 0,
        "lent": position.lent if position else 0,
        "waiting": position.waiting if position else 0,
    }

"""Teams and their shares of the quota limits: `config/teams`, read as admission reads it.

A team has members (people's e-mails) and accounts (service accounts that submit jobs), and per
quota limit of `config/quotas` (a zone's or a region's chips of a family and tier) a share:

    {"team-a": {"members": ["alice@example.com"],
                "accounts": ["ci@proj.iam.gserviceaccount.com"],
                "limits": {"us-central2-b/v4": {"nominal": 8, "borrowing_limit": 4,
                                                "lending_limit": 8, "weight": 1},
                           "us-east5/v5p/spot": {"nominal": 64}},
                "budget_chip_hours": 1000}}

`nominal` is the chips the team is guaranteed under that limit; `borrowing_limit` how many more
it may hold on others' idle chips (absent: no limit); `lending_limit` how many of its idle nominal
chips others may hold (absent: all); `weight` how borrowers are ordered (default 1). Admins edit
the document by hand too, so what makes no sense is skipped and said in `problems`, never fatal,
as `config/quotas` is (`domain.quotas`). See docs/teams.md.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpujobs.domain.accelerators import FAMILIES
from tpujobs.domain.quotas import REGION, TIERS, ZONE, PoolKey, QuotaBook, Tier, region_of

TEAM_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
TEAM_FIELDS = ("members", "accounts", "limits", "budget_chip_hours")
SHARE_FIELDS = ("nominal", "borrowing_limit", "lending_limit", "weight")


@dataclass(frozen=True)
class Share:
    """A team's part of one quota limit of `config/quotas`."""

    location: str  # a zone or a region, as config/quotas names it
    family: str
    tier: Tier
    nominal: int  # chips guaranteed to the team under this limit
    borrowing_limit: int | None = None  # chips past its nominal it may hold on others' idle chips; None: no limit
    lending_limit: int | None = None  # chips of its idle nominal others may hold; None: all of it
    weight: float = 1.0

    @property
    def pool(self) -> PoolKey:
        """The admission pool the limit is one of: its family and tier in its region."""
        region = region_of(self.location) if ZONE.fullmatch(self.location) else self.location
        return PoolKey(self.family, self.tier, region)

    @property
    def where(self) -> str:
        """The zone, or the region: the limit inside its pool."""
        return self.location

    @property
    def limit(self) -> str:
        """`LOCATION/FAMILY`, or `LOCATION/FAMILY/TIER` past on-demand: as `--chips` names it."""
        return limit_key(self.location, self.family, self.tier)


@dataclass(frozen=True)
class Team:
    name: str
    members: tuple[str, ...] = ()  # e-mails of people
    accounts: tuple[str, ...] = ()  # service accounts that submit jobs (a verified owner that is an SA)
    shares: tuple[Share, ...] = ()
    budget_chip_hours: float | None = None  # per calendar month; None: no budget


def limit_key(location: str, family: str, tier: str) -> str:
    """A limit's name in `config/teams`: the tier is left out for on-demand."""
    return f"{location}/{family}" if tier == "on-demand" else f"{location}/{family}/{tier}"


def parse_limit(key: str) -> tuple[str, str, Tier]:
    """(location, family, tier) of `LOCATION/FAMILY[/TIER]`; ValueError saying what is wrong."""
    parts = key.split("/")
    if len(parts) not in (2, 3):
        raise ValueError(f"{key!r} is no limit: LOCATION/FAMILY[/TIER], e.g. us-central2-b/v4 or us-east5/v5p/spot")
    location, family = parts[0], parts[1]
    tier = parts[2] if len(parts) == 3 else "on-demand"
    if not (ZONE.fullmatch(location) or REGION.fullmatch(location)):
        raise ValueError(f"{key!r}: {location!r} is neither a zone (us-central2-b) nor a region (us-central2)")
    if family not in FAMILIES:
        raise ValueError(f"{key!r}: {family!r} is no TPU family ({', '.join(sorted(FAMILIES))})")
    for known in TIERS:
        if tier == known:
            if known == "reserved" and not ZONE.fullmatch(location):
                raise ValueError(f"{key!r}: reservations are zonal; give the reserved chips per zone")
            return location, family, known
    raise ValueError(f"{key!r}: {tier!r} is no tier ({', '.join(TIERS)})")


def whole_chips(value: Any) -> int | None:
    """A whole, non-negative number (Firestore stores integers, or floats from the console)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or int(value) != value:
        return None
    return int(value)


def positive_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        return None
    return float(value)


class TeamBook:
    """`config/teams` read: teams, and what in the document makes no sense (`problems`: skipped, never fatal)."""

    def __init__(self, document: Mapping[str, Any] | None, quotas: QuotaBook | None = None) -> None:
        self.teams: list[Team] = []
        self.problems: list[str] = []
        self._quotas = quotas
        self._principals: dict[str, str] = {}  # lower-cased e-mail -> the first team (by name) listing it
        for name, fields in sorted((document or {}).items(), key=lambda item: str(item[0])):
            team = self._read_team(str(name), fields)
            if team is not None:
                self.teams.append(team)
        self._check_nominals()

    def get(self, name: str) -> Team | None:
        return next((team for team in self.teams if team.name == name), None)

    def team_of(self, principal: str) -> str:
        """The team listing `principal` in its members or accounts (case-insensitive); "" for none."""
        return self._principals.get(principal.strip().lower(), "")

    def shares_of(self, pool: PoolKey) -> dict[str, dict[str, Share]]:
        """where (zone or region) -> team name -> its Share, for this pool's limits."""
        found: dict[str, dict[str, Share]] = defaultdict(dict)
        for team in self.teams:
            for share in team.shares:
                if share.pool == pool and not pool.reservation:
                    found[share.where][team.name] = share
        return dict(found)

    # -- reading ---------------------------------------------------------------------

    def _read_team(self, name: str, fields: Any) -> Team | None:
        if not TEAM_NAME.fullmatch(name):
            self.problems.append(
                f"{name!r} is no team name (lowercase letters, digits and dashes, at most 63, starting with a letter)"
            )
            return None
        if not isinstance(fields, Mapping):
            self.problems.append(f"{name}: not a map of members, accounts, limits and budget_chip_hours")
            return None
        for unknown in sorted(set(map(str, fields)) - set(TEAM_FIELDS)):
            self.problems.append(f"{name}.{unknown}: no such field ({', '.join(TEAM_FIELDS)})")
        return Team(
            name,
            members=self._principals_of(name, "members", fields.get("members")),
            accounts=self._principals_of(name, "accounts", fields.get("accounts")),
            shares=self._shares_of(name, fields.get("limits")),
            budget_chip_hours=self._budget(name, fields.get("budget_chip_hours")),
        )

    def _principals_of(self, team: str, field: str, value: Any) -> tuple[str, ...]:
        """The e-mails of a list, each kept in the first team (by name) that lists it."""
        if value is None:
            return ()
        if not isinstance(value, list):
            self.problems.append(f"{team}.{field}: not a list of e-mails")
            return ()
        kept: list[str] = []
        for principal in value:
            if not isinstance(principal, str) or not EMAIL.fullmatch(principal.strip()):
                self.problems.append(f"{team}.{field}: {principal!r} is not an e-mail")
                continue
            key = principal.strip().lower()
            first = self._principals.setdefault(key, team)
            if first != team:
                self.problems.append(f"{team}.{field}: {principal} is in team {first} already; kept there only")
            elif key not in (p.lower() for p in kept):
                kept.append(principal.strip())
        return tuple(kept)

    def _shares_of(self, team: str, limits: Any) -> tuple[Share, ...]:
        if limits is None:
            return ()
        if not isinstance(limits, Mapping):
            self.problems.append(f"{team}.limits: not a map of LOCATION/FAMILY[/TIER] to a share")
            return ()
        shares: dict[tuple[str, str, str], Share] = {}
        for key, value in sorted(limits.items(), key=lambda item: str(item[0])):
            share = self._share(f"{team}.limits.{key}", str(key), value)
            if share is None:
                continue
            if (share.location, share.family, share.tier) in shares:
                self.problems.append(f"{team}.limits.{key}: {share.limit} is given twice; the first kept")
                continue
            shares[(share.location, share.family, share.tier)] = share
        return tuple(shares.values())

    def _share(self, where: str, key: str, value: Any) -> Share | None:
        """One limit's share, or None (and why, in `problems`)."""
        try:
            location, family, tier = parse_limit(key)
        except ValueError as error:
            self.problems.append(f"{where}: {error}")
            return None
        if self._quotas is not None and not any(
            e.location == location and e.family == family and e.tier == tier and not e.reservation
            for e in self._quotas.entries
        ):
            self.problems.append(f"{where}: config/quotas has no such limit; skipped")
            return None
        fields = value if isinstance(value, Mapping) else {"nominal": value}
        for unknown in sorted(set(map(str, fields)) - set(SHARE_FIELDS)):
            self.problems.append(f"{where}.{unknown}: no such field ({', '.join(SHARE_FIELDS)})")
        chips: dict[str, int | None] = {}
        for name in ("nominal", "borrowing_limit", "lending_limit"):
            given = fields.get(name)
            chips[name] = None if given is None else whole_chips(given)
            if given is not None and chips[name] is None:
                self.problems.append(f"{where}.{name}: {given!r} is not a whole number of chips; limit skipped")
                return None
        weight = fields.get("weight", 1)
        if positive_number(weight) is None:
            self.problems.append(f"{where}.weight: {weight!r} is not a number above 0; limit skipped")
            return None
        return Share(
            location, family, tier, chips["nominal"] or 0, chips["borrowing_limit"], chips["lending_limit"],
            positive_number(weight) or 1.0,
        )  # fmt: skip

    def _budget(self, team: str, value: Any) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            self.problems.append(f"{team}.budget_chip_hours: {value!r} is not a number of chip-hours; no budget")
            return None
        return float(value)

    def _check_nominals(self) -> None:
        """Nominal shares of a limit add up to at most its chips: said, and kept (admission
        guarantees what fits, in the order of the teams' names)."""
        if self._quotas is None:
            return
        for entry in self._quotas.entries:
            if entry.reservation:
                continue
            sharing = [
                (team.name, share.nominal)
                for team in self.teams
                for share in team.shares
                if (share.location, share.family, share.tier) == (entry.location, entry.family, entry.tier)
            ]
            total = sum(nominal for _, nominal in sharing)
            if total > entry.chips:
                who = ", ".join(f"{name} {nominal}" for name, nominal in sharing)
                self.problems.append(
                    f"{limit_key(entry.location, entry.family, entry.tier)}: the nominal shares add up to {total} "
                    f"chips ({who}), more than its {entry.chips}"
                )

"""One team of `config/teams` changed, as `tpujobs team` and the jobs API write it.

The document is edited by hand too, so an edit keeps what it does not change: other teams, a
limit's fields not given, and the spelling of a limit's key (`us-central2-b/v4/on-demand` stays
so when `--chips us-central2-b/v4=8` changes it). What `domain.teams` would skip is refused here,
with a ValueError naming it, before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tpujobs.domain.teams import EMAIL, TEAM_NAME, parse_limit, positive_number, whole_chips


def with_team(
    document: Mapping[str, Any],
    name: str,
    *,
    members: Sequence[str] | None = None,
    accounts: Sequence[str] | None = None,
    chips: Mapping[str, int] | None = None,
    borrowing_limit: int | None = None,
    lending_limit: int | None = None,
    weight: float | None = None,
    budget_chip_hours: float | None = None,
) -> dict[str, Any]:
    """`document` with team `name` created or changed: the fields given replace its own; `chips`
    sets each named limit's nominal; borrowing, lending and weight apply to the limits named in
    `chips`, or to all of the team's limits when none is named."""
    _check_name(name)
    team = dict(document.get(name) or {}) if isinstance(document.get(name), Mapping) else {}
    for field, given in (("members", members), ("accounts", accounts)):
        if given is not None:
            team[field] = _principals(document, name, field, given)
    limits = dict(team.get("limits") or {}) if isinstance(team.get("limits"), Mapping) else {}
    named = [_set_nominal(limits, key, value) for key, value in (chips or {}).items()]
    options = {
        "borrowing_limit": _chips_or_none("borrowing limit", borrowing_limit),
        "lending_limit": _chips_or_none("lending limit", lending_limit),
        "weight": _weight(weight),
    }
    given_options = {field: value for field, value in options.items() if value is not None}
    if given_options:
        if not limits:
            raise ValueError(f"team {name} has no limits for a borrowing limit, lending limit or weight: give --chips")
        for key in named or list(limits):
            limits[key] = {**_share_fields(limits[key]), **given_options}
    if chips is not None or given_options:
        team["limits"] = limits
    if budget_chip_hours is not None:
        team["budget_chip_hours"] = _budget(budget_chip_hours)
    return {**{k: v for k, v in document.items() if k != name}, name: team}


def without_team(document: Mapping[str, Any], name: str) -> dict[str, Any]:
    """`document` without team `name` (the same document when it has none)."""
    _check_name(name)
    return {k: v for k, v in document.items() if k != name}


def _check_name(name: str) -> None:
    if not TEAM_NAME.fullmatch(name):
        raise ValueError(
            f"{name!r} is no team name: lowercase letters, digits and dashes, at most 63, starting with a letter"
        )


def _principals(document: Mapping[str, Any], name: str, field: str, given: Sequence[str]) -> list[str]:
    """E-mails without repeats; refused when one is not an e-mail or is another team's already."""
    elsewhere = {
        str(principal).strip().lower(): other
        for other, fields in document.items()
        if other != name and isinstance(fields, Mapping)
        for listed in (fields.get("members"), fields.get("accounts"))
        if isinstance(listed, list)
        for principal in listed
    }
    kept: list[str] = []
    for principal in given:
        if not isinstance(principal, str) or not EMAIL.fullmatch(principal.strip()):
            raise ValueError(f"{principal!r} is not an e-mail ({field})")
        other = elsewhere.get(principal.strip().lower())
        if other is not None:
            raise ValueError(f"{principal} is in team {other} already: a person or account is in one team")
        if principal.strip().lower() not in (p.lower() for p in kept):
            kept.append(principal.strip())
    return kept


def _set_nominal(limits: dict[str, Any], key: str, chips: int) -> str:
    """Set the nominal of the limit `key` names, under the key the document already spells it
    with; the key it is stored under."""
    wanted = parse_limit(key)
    if whole_chips(chips) is None or not isinstance(chips, int):
        raise ValueError(f"{key}={chips!r}: the nominal share is a whole number of chips (0 or more)")
    stored = next((k for k in limits if _parsed_or_none(k) == wanted), key)
    limits[stored] = {**_share_fields(limits.get(stored)), "nominal": chips}
    return stored


def _share_fields(value: Any) -> dict[str, Any]:
    """A limit's fields as a map (a bare number is its nominal, as `domain.teams` reads it)."""
    if isinstance(value, Mapping):
        return dict(value)
    return {} if value is None else {"nominal": value}


def _parsed_or_none(key: str) -> tuple[str, str, str] | None:
    try:
        return parse_limit(key)
    except ValueError:
        return None


def _chips_or_none(what: str, value: int | None) -> int | None:
    if value is not None and (not isinstance(value, int) or whole_chips(value) is None):
        raise ValueError(f"{value!r} is not a {what}: a whole number of chips (0 or more)")
    return value


def _weight(value: float | None) -> float | None:
    if value is not None and positive_number(value) is None:
        raise ValueError(f"{value!r} is not a weight: a number above 0")
    return value


def _budget(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise ValueError(f"{value!r} is not a budget: a number of chip-hours (0 or more)")
    return value

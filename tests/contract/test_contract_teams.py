"""The contract of `ports.Teams` (`config/teams`): `FakeTeams` and `FirestoreTeams` read and edit
alike; an edit is a compare-and-set that keeps an edit made in between, and touches only its team."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tpujobs.domain.team_edits import with_team, without_team
from tpujobs.domain.teams import Share
from tpujobs.local.fakes.job_store import InMemoryJobStore
from tpujobs.local.fakes.pools import InMemoryPools
from tpujobs.local.fakes.teams import FakeTeams

ZONE = "us-central2-b"


@pytest.fixture(params=["memory", pytest.param("firestore", marks=pytest.mark.emulator)])
def ports(request: pytest.FixtureRequest) -> tuple[Any, Any]:
    """(teams, pools) of one backend, sharing one database: the pools set the quotas the book checks."""
    if request.param == "memory":
        pools = InMemoryPools(InMemoryJobStore())
        return FakeTeams(pools), pools
    from tpujobs.adapters.firestore_pools import FirestorePools
    from tpujobs.adapters.firestore_teams import FirestoreTeams

    client = request.getfixturevalue("firestore_client")
    return FirestoreTeams(client), FirestorePools(client)


def test_teams_are_set_read_back_and_removed(ports):
    """No document: no team; a set reads back as the book reads it, its problems checked against the quotas."""
    teams, pools = ports
    assert teams.teams().teams == [] and teams.teams().problems == []
    pools.set_quota(ZONE, "v4", "on-demand", 16)
    teams.edit_team("team-a", lambda d: with_team(d, "team-a", members=["alice@example.com"], chips={f"{ZONE}/v4": 8}))
    teams.edit_team("team-b", lambda d: with_team(d, "team-b", chips={f"{ZONE}/v4": 12, "us-east5/v5p/spot": 4}))
    book = teams.teams()
    team_a = book.get("team-a")
    assert team_a is not None and team_a.shares == (Share(ZONE, "v4", "on-demand", 8),)
    assert book.team_of("ALICE@example.com") == "team-a"
    assert book.problems == [
        "team-b.limits.us-east5/v5p/spot: config/quotas has no such limit; skipped",
        f"{ZONE}/v4: the nominal shares add up to 20 chips (team-a 8, team-b 12), more than its 16",
    ]
    teams.edit_team("team-b", lambda d: without_team(d, "team-b"))
    teams.edit_team("team-x", lambda d: without_team(d, "team-x"))  # nothing to remove: nothing written
    assert [team.name for team in teams.teams().teams] == ["team-a"]


def test_an_edit_decided_on_a_stale_read_is_decided_again(ports):
    """Another edit lands while the first is decided: both are kept, and the first saw the second."""
    teams, _ = ports
    seen: list[dict[str, object]] = []

    def racing(
        edit: Callable[[dict[str, object]], dict[str, object]],
    ) -> Callable[[dict[str, object]], dict[str, object]]:
        def decide(document: dict[str, object]) -> dict[str, object]:
            seen.append(dict(document))
            if len(seen) == 1:  # an admin's edit in the console, between the read and the write
                teams.edit_team("team-z", lambda d: with_team(d, "team-z", members=["z@example.com"]))
            return edit(document)

        return decide

    teams.edit_team("team-a", lambda d: with_team(d, "team-a", members=["alice@example.com"]))
    teams.edit_team("team-a", racing(lambda d: with_team(d, "team-a", budget_chip_hours=100)))
    assert len(seen) == 2 and "team-z" in seen[1]
    book = teams.teams()
    assert [team.name for team in book.teams] == ["team-a", "team-z"]
    team_a = book.get("team-a")
    assert team_a is not None and (team_a.members, team_a.budget_chip_hours) == (("alice@example.com",), 100.0)


def test_an_edit_writes_only_its_own_team(ports):
    """Whatever else `edit` returns, only the named team's entry is written."""
    teams, _ = ports
    teams.edit_team("team-a", lambda d: with_team(d, "team-a", members=["alice@example.com"]))
    teams.edit_team("team-b", lambda d: {"team-b": {"members": ["bob@example.com"]}})  # drops team-a: ignored
    assert [team.name for team in teams.teams().teams] == ["team-a", "team-b"]


def test_a_refused_edit_writes_nothing(ports):
    """A ValueError from the edit comes out as it is, before any write."""
    teams, _ = ports
    with pytest.raises(ValueError, match="is not an e-mail"):
        teams.edit_team("team-a", lambda d: with_team(d, "team-a", members=["alice"]))
    assert teams.teams().teams == []

"""`tpujobs team set|unset|show` without the jobs API, on the Firestore emulator: what
`config/teams` then holds, what `show` says of it, and what is refused before any write."""

from __future__ import annotations

import functools
import json

import pytest

from tpujobs.adapters.firestore_pools import FirestorePools
from tpujobs.adapters.firestore_teams import FirestoreTeams
from tpujobs.domain.admission import Holder
from tpujobs.local.testing import config_document
from tpujobs.runtime.instances import utc_now

pytestmark = pytest.mark.emulator
ZONE = "us-central2-b"


@pytest.fixture
def run(cli_without_api):
    return functools.partial(cli_without_api, "team")


def stored(firestore_client) -> dict:
    return config_document(firestore_client, "teams")


def test_a_team_is_set_shown_and_unset(run, firestore_client):
    """Members, accounts, a share with its options and a budget are written as the docs show them;
    show gives each limit's share and the chips held under it; unset removes the team alone."""
    FirestorePools(firestore_client).set_quota(ZONE, "v4", "on-demand", 16)
    assert "No teams" in run("show").output

    result = run(
        "set", "team-a", "--member", "alice@example.com", "--account", "ci@p.iam.gserviceaccount.com",
        "--chips", f"{ZONE}/v4=8", "--borrowing-limit", "4", "--weight", "2", "--budget-chip-hours", "1000",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "Team team-a set." in result.output
    result = run("set", "team-b", "--member", "bob@example.com", "--chips", f"{ZONE}/v4=12")
    assert result.exit_code == 0, result.output
    assert "the nominal shares add up to 20 chips" in result.output  # said, and kept
    assert stored(firestore_client) == {
        "team-a": {
            "members": ["alice@example.com"],
            "accounts": ["ci@p.iam.gserviceaccount.com"],
            "limits": {f"{ZONE}/v4": {"nominal": 8, "borrowing_limit": 4, "weight": 2.0}},
            "budget_chip_hours": 1000.0,
        },
        "team-b": {"members": ["bob@example.com"], "limits": {f"{ZONE}/v4": {"nominal": 12}}},
    }
    pools = FirestorePools(firestore_client)
    assert pools.change(
        pools.view("v4@us-central2"), add=Holder("a-1", 4, 1, "medium", utc_now(), zone=ZONE, team="team-a")
    )

    answer = json.loads(run("show", "-o", "json").stdout)
    assert answer["problems"] == [
        f"{ZONE}/v4: the nominal shares add up to 20 chips (team-a 8, team-b 12), more than its 16"
    ]
    team_a = answer["teams"][0]
    assert (team_a["name"], team_a["members"], team_a["accounts"], team_a["budget_chip_hours"]) == (
        "team-a", ["alice@example.com"], ["ci@p.iam.gserviceaccount.com"], 1000.0,
    )  # fmt: skip
    assert team_a["limits"] == [
        {"location": ZONE, "family": "v4", "tier": "on-demand", "nominal": 8, "borrowing_limit": 4,
         "lending_limit": None, "weight": 2.0, "held": 4, "borrowed": 0, "lent": 0, "waiting": 0},
    ]  # fmt: skip
    table = run("show").stdout
    assert "MEMBERS" in table and "BORROWED" in table and f"{ZONE}/v4" in table and "no limit" in table

    assert run("unset", "team-b").exit_code == 0
    assert "No team team-b" in run("unset", "team-b").output
    assert list(stored(firestore_client)) == ["team-a"]
    assert FirestoreTeams(firestore_client).teams().team_of("bob@example.com") == ""


def test_what_the_document_cannot_hold_is_refused_before_any_write(run, firestore_client):
    """A bad e-mail, a principal of another team, a --chips that does not parse: exit 1 or 2, nothing written."""
    assert run("set", "team-a", "--member", "alice@example.com").exit_code == 0
    before = stored(firestore_client)
    for args in (
        ["team-b", "--member", "alice@example.com"],
        ["team-b", "--member", "bob"],
        ["team-b", "--chips", f"{ZONE}/v9=8"],
        ["team-b", "--chips", f"{ZONE}/v4"],
        ["Team-B"],
    ):
        result = run("set", *args)
        assert result.exit_code != 0, (args, result.output)
    assert stored(firestore_client) == before
    refused = run("set", "team-b", "--member", "alice@example.com")
    assert "is in team team-a already" in refused.output

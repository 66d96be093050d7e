"""`config/teams` read (`domain.teams.TeamBook`): teams, their shares of the quota limits, and
what makes no sense said in `problems`, skipped and never fatal."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpujobs.domain.quotas import PoolKey, QuotaBook
from tpujobs.domain.teams import Share, Team, TeamBook, parse_limit

QUOTAS = QuotaBook(
    {
        "us-central2-b": {"v4": 16},
        "us-east5-a": {"v5p": {"spot": 64}},
        "us-east5": {"v5p": {"spot": 128}},
    }
)
DOCUMENT = {
    "team-a": {
        "members": ["alice@example.com"],
        "accounts": ["ci@proj.iam.gserviceaccount.com"],
        "limits": {"us-central2-b/v4": {"nominal": 8, "borrowing_limit": 4, "lending_limit": 8, "weight": 1}},
        "budget_chip_hours": 1000,
    },
    "team-b": {"members": ["bob@example.com"], "limits": {"us-central2-b/v4": 8, "us-east5/v5p/spot": {"nominal": 32}}},
}


def test_a_well_formed_document_is_read_whole_with_no_problem():
    """Every field is read; a bare number is a nominal; absent limits mean none and all."""
    book = TeamBook(DOCUMENT, QUOTAS)
    assert book.problems == []
    assert book.get("team-a") == Team(
        "team-a",
        members=("alice@example.com",),
        accounts=("ci@proj.iam.gserviceaccount.com",),
        shares=(Share("us-central2-b", "v4", "on-demand", 8, 4, 8, 1.0),),
        budget_chip_hours=1000.0,
    )
    team_b = book.get("team-b")
    assert team_b is not None and team_b.budget_chip_hours is None
    assert team_b.shares == (
        Share("us-central2-b", "v4", "on-demand", 8),
        Share("us-east5", "v5p", "spot", 32),
    )
    assert book.get("team-c") is None


def test_a_share_names_its_pool_its_place_in_it_and_its_limit():
    """A zone's share is in its region's pool; the tier is left out of the name for on-demand."""
    zonal = Share("us-central2-b", "v4", "on-demand", 8)
    regional = Share("us-east5", "v5p", "spot", 32)
    assert (zonal.pool, zonal.where, zonal.limit) == (
        PoolKey("v4", "on-demand", "us-central2"),
        "us-central2-b",
        "us-central2-b/v4",
    )
    assert (regional.pool, regional.where, regional.limit) == (
        PoolKey("v5p", "spot", "us-east5"),
        "us-east5",
        "us-east5/v5p/spot",
    )
    assert parse_limit("us-central2-b/v4/on-demand") == ("us-central2-b", "v4", "on-demand")


def test_a_principal_is_found_in_its_team_whatever_its_case():
    """Members and accounts both place a principal; anyone else is in no team."""
    book = TeamBook(DOCUMENT)
    assert book.team_of("Alice@Example.com") == "team-a"
    assert book.team_of("ci@proj.iam.gserviceaccount.com") == "team-a"
    assert book.team_of("bob@example.com") == "team-b"
    assert book.team_of("carol@example.com") == ""


def test_shares_of_a_pool_are_grouped_by_zone_or_region():
    """Only the pool's limits; each place lists the teams sharing it."""
    book = TeamBook(DOCUMENT, QUOTAS)
    v4 = book.shares_of(PoolKey("v4", "on-demand", "us-central2"))
    assert sorted(v4) == ["us-central2-b"]
    assert {name: share.nominal for name, share in v4["us-central2-b"].items()} == {"team-a": 8, "team-b": 8}
    assert list(book.shares_of(PoolKey("v5p", "spot", "us-east5"))) == ["us-east5"]
    assert book.shares_of(PoolKey("v5p", "on-demand", "us-east5")) == {}


def test_a_principal_in_two_teams_stays_in_the_first_by_name():
    """team-a comes before team-b: the repeat is dropped from team-b, and said."""
    book = TeamBook({"team-b": {"members": ["x@example.com"]}, "team-a": {"accounts": ["X@example.com"]}})
    assert book.team_of("x@example.com") == "team-a"
    team_b = book.get("team-b")
    assert team_b is not None and team_b.members == ()
    assert book.problems == ["team-b.members: x@example.com is in team team-a already; kept there only"]


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"Team_A": {}}, "'Team_A' is no team name"),
        ({"9lives": {}}, "'9lives' is no team name"),
        ({"a" * 64: {}}, "is no team name"),
        ({"team-a": ["alice@example.com"]}, "team-a: not a map"),
        ({"team-a": {"members": ["alice"]}}, "team-a.members: 'alice' is not an e-mail"),
        ({"team-a": {"accounts": "ci@x.com"}}, "team-a.accounts: not a list of e-mails"),
        ({"team-a": {"limits": {"us-central2-b": 8}}}, "team-a.limits.us-central2-b: 'us-central2-b' is no limit"),
        ({"team-a": {"limits": {"us-central2-b/v9": 8}}}, "'v9' is no TPU family"),
        ({"team-a": {"limits": {"us-central2-b/v4/preemptible": 8}}}, "'preemptible' is no tier"),
        ({"team-a": {"limits": {"moon/v4": 8}}}, "'moon' is neither a zone"),
        ({"team-a": {"limits": {"us-central2-b/v4": 8.5}}}, "nominal: 8.5 is not a whole number of chips"),
        ({"team-a": {"limits": {"us-central2-b/v4": {"nominal": -1}}}}, "nominal: -1 is not a whole number"),
        ({"team-a": {"limits": {"us-central2-b/v4": {"nominal": 4, "borrowing_limit": "x"}}}}, "borrowing_limit"),
        ({"team-a": {"limits": {"us-central2-b/v4": {"nominal": 4, "lending_limit": True}}}}, "lending_limit"),
        (
            {"team-a": {"limits": {"us-central2-b/v4": {"nominal": 4, "weight": 0}}}},
            "weight: 0 is not a number above 0",
        ),
        ({"team-a": {"limits": {"us-central2-b/v4": {"nominal": 4, "weight": -2}}}}, "weight: -2"),
        ({"team-a": {"limits": {"us-central2-b/v5p": 4}}}, "config/quotas has no such limit; skipped"),
        ({"team-a": {"limits": {"us-central2-b/v4/spot": 4}}}, "config/quotas has no such limit"),
        ({"team-a": {"budget_chip_hours": "lots"}}, "budget_chip_hours: 'lots' is not a number"),
        ({"team-a": {"owners": []}}, "team-a.owners: no such field"),
    ],
)
def test_what_makes_no_sense_is_skipped_and_said(document, problem):
    """Each mistake is a problem naming where it is; the rest of the document is still read."""
    book = TeamBook({**document, "team-z": {"members": ["zed@example.com"]}}, QUOTAS)
    assert any(problem in said for said in book.problems), book.problems
    assert book.team_of("zed@example.com") == "team-z"
    assert all(not team.shares for team in book.teams)


def test_nominal_shares_past_the_limit_are_said_and_kept():
    """16 chips, 24 shared out: both shares stand, and the problem names the limit and who."""
    book = TeamBook(
        {"team-a": {"limits": {"us-central2-b/v4": 16}}, "team-b": {"limits": {"us-central2-b/v4": 8}}}, QUOTAS
    )
    assert book.problems == [
        "us-central2-b/v4: the nominal shares add up to 24 chips (team-a 16, team-b 8), more than its 16"
    ]
    assert len(book.shares_of(PoolKey("v4", "on-demand", "us-central2"))["us-central2-b"]) == 2


def test_without_quotas_no_limit_is_checked_against_them():
    """A book read with no quotas keeps every share that parses."""
    book = TeamBook({"team-a": {"limits": {"us-central2-b/v5p": 4}}})
    assert book.problems == []
    assert TeamBook(None).teams == [] and TeamBook(None).problems == []


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 100) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=20), children, max_size=4),
    max_leaves=20,
)
limit_keys = st.sampled_from(
    ["us-central2-b/v4", "us-east5/v5p/spot", "us-east5-a/v5p/spot", "x/y", "us-central2-b/v4/reserved"]
)
team_documents = st.dictionaries(
    st.sampled_from(["team-a", "team-b", "Bad", "c"]) | st.text(max_size=8),
    st.fixed_dictionaries(
        {},
        optional={
            "members": st.lists(st.sampled_from(["a@x.com", "B@x.com", "nope"]) | json_values, max_size=3),
            "accounts": st.lists(st.sampled_from(["a@x.com", "sa@p.iam.gserviceaccount.com"]), max_size=2),
            "limits": st.dictionaries(
                limit_keys,
                json_values
                | st.fixed_dictionaries(
                    {},
                    optional={
                        "nominal": json_values,
                        "borrowing_limit": json_values,
                        "lending_limit": json_values,
                        "weight": json_values,
                    },
                ),
                max_size=3,
            ),
            "budget_chip_hours": json_values,
        },
    )
    | json_values,
    max_size=4,
)


@given(team_documents)
def test_no_document_is_fatal(document):
    """Whatever an admin types, the book reads: every share kept is well formed, every principal in one team."""
    book = TeamBook(document, QUOTAS)
    seen: dict[str, str] = {}
    for team in book.teams:
        for principal in (*team.members, *team.accounts):
            assert seen.setdefault(principal.lower(), team.name) == team.name
            assert book.team_of(principal) == team.name
        for share in team.shares:
            assert share.nominal >= 0 and share.weight > 0
            assert share.borrowing_limit is None or share.borrowing_limit >= 0
            assert share.lending_limit is None or share.lending_limit >= 0

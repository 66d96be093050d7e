"""Edits of `config/teams` (`domain.team_edits`): what `tpujobs team set|unset` writes, keeping
what it does not change, and refusing what the book would skip."""

from __future__ import annotations

import pytest

from tpujobs.domain.team_edits import with_team, without_team
from tpujobs.domain.teams import TeamBook

TYPED = {
    "team-a": {
        "members": ["alice@example.com"],
        "limits": {"us-central2-b/v4/on-demand": {"nominal": 8, "weight": 2}, "us-east5/v5p/spot": 16},
        "budget_chip_hours": 500,
    },
    "team-b": {"members": ["bob@example.com"], "accounts": ["ci@p.iam.gserviceaccount.com"]},
}


def test_a_new_team_gets_only_the_fields_given():
    """Members, accounts, chips and budget: read back as the book reads them."""
    document = with_team(
        {},
        "team-c",
        members=["carol@example.com", "Carol@example.com"],
        accounts=["bot@p.iam.gserviceaccount.com"],
        chips={"us-central2-b/v4": 8},
        budget_chip_hours=100,
    )
    assert document == {
        "team-c": {
            "members": ["carol@example.com"],
            "accounts": ["bot@p.iam.gserviceaccount.com"],
            "limits": {"us-central2-b/v4": {"nominal": 8}},
            "budget_chip_hours": 100,
        }
    }
    assert TeamBook(document).team_of("bot@p.iam.gserviceaccount.com") == "team-c"


def test_chips_keep_the_keys_spelling_and_the_limits_other_fields():
    """`us-central2-b/v4` changes the entry typed `us-central2-b/v4/on-demand`; its weight stays;
    the other team and the other limits are untouched."""
    document = with_team(TYPED, "team-a", chips={"us-central2-b/v4": 12})
    assert document["team-a"]["limits"] == {
        "us-central2-b/v4/on-demand": {"nominal": 12, "weight": 2},
        "us-east5/v5p/spot": 16,
    }
    assert document["team-a"]["members"] == ["alice@example.com"]
    assert document["team-b"] == TYPED["team-b"]
    assert TYPED["team-a"]["limits"]["us-central2-b/v4/on-demand"]["nominal"] == 8  # not changed in place


def test_options_apply_to_the_limits_named_or_else_to_all():
    """With chips: only those limits; without: every limit of the team (a bare number becomes a map)."""
    named = with_team(TYPED, "team-a", chips={"us-east5/v5p/spot": 32}, borrowing_limit=4)
    assert named["team-a"]["limits"] == {
        "us-central2-b/v4/on-demand": {"nominal": 8, "weight": 2},
        "us-east5/v5p/spot": {"nominal": 32, "borrowing_limit": 4},
    }
    everywhere = with_team(TYPED, "team-a", lending_limit=0, weight=0.5)
    assert everywhere["team-a"]["limits"] == {
        "us-central2-b/v4/on-demand": {"nominal": 8, "weight": 0.5, "lending_limit": 0},
        "us-east5/v5p/spot": {"nominal": 16, "weight": 0.5, "lending_limit": 0},
    }


def test_given_lists_replace_and_unset_removes_only_that_team():
    """Members given replace the list; without_team of an absent team changes nothing."""
    document = with_team(TYPED, "team-a", members=["ann@example.com"])
    assert document["team-a"]["members"] == ["ann@example.com"]
    assert without_team(document, "team-a") == {"team-b": TYPED["team-b"]}
    assert without_team(TYPED, "team-z") == TYPED


@pytest.mark.parametrize(
    ("name", "fields", "refusal"),
    [
        ("Team A", {}, "is no team name"),
        ("team-a", {"members": ["alice"]}, "'alice' is not an e-mail (members)"),
        ("team-a", {"accounts": ["ci@p.iam.gserviceaccount.com"]}, "is in team team-b already"),
        ("team-a", {"members": ["BOB@example.com"]}, "is in team team-b already"),
        ("team-a", {"chips": {"us-central2-b": 8}}, "is no limit"),
        ("team-a", {"chips": {"us-central2-b/v9": 8}}, "'v9' is no TPU family"),
        ("team-a", {"chips": {"us-central2/v4/reserved": 8}}, "reservations are zonal"),
        ("team-a", {"chips": {"us-central2-b/v4": -1}}, "whole number of chips"),
        ("team-a", {"borrowing_limit": -1}, "not a borrowing limit"),
        ("team-a", {"lending_limit": 1.5}, "not a lending limit"),
        ("team-a", {"weight": 0}, "not a weight"),
        ("team-a", {"budget_chip_hours": -3}, "not a budget"),
        ("team-b", {"weight": 2}, "team team-b has no limits"),
    ],
)
def test_what_the_book_would_skip_is_refused(name, fields, refusal):
    """A ValueError naming what is wrong, before any document is made."""
    with pytest.raises(ValueError, match=refusal.replace("(", r"\(").replace(")", r"\)")):
        with_team(TYPED, name, **fields)

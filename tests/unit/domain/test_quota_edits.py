"""Edits of `config/quotas` keep what an admin wrote by hand."""

from __future__ import annotations

import pytest

from tpujobs.domain.quota_edits import with_limit, with_reservation

ZONE = "us-central2-b"


def test_a_bare_number_stays_bare_while_only_on_demand_changes() -> None:
    """The console's `{zone: {v4: 64}}` is on-demand; changing it writes a number again."""
    assert with_limit({ZONE: {"v4": 64}}, ZONE, "v4", "on-demand", 32) == {ZONE: {"v4": 32}}


def test_another_tier_turns_a_bare_number_into_a_map_of_tiers() -> None:
    """Spot beside a bare on-demand number: the on-demand chips are kept under their tier."""
    assert with_limit({ZONE: {"v4": 64}}, ZONE, "v4", "spot", 128) == {ZONE: {"v4": {"on-demand": 64, "spot": 128}}}
    assert with_limit({}, "us-central2", "v4", "on-demand", 16) == {"us-central2": {"v4": {"on-demand": 16}}}


def test_removing_the_last_limit_removes_the_family_and_the_location() -> None:
    """None removes one tier; an empty family or location goes too; other entries stay."""
    document = {ZONE: {"v4": {"on-demand": 64, "spot": 8}, "v5p": 16}, "reservations": {"r": 8}}
    once = with_limit(document, ZONE, "v4", "spot", None)
    assert once == {ZONE: {"v4": {"on-demand": 64}, "v5p": 16}, "reservations": {"r": 8}}
    twice = with_limit(with_limit(once, ZONE, "v4", "on-demand", None), ZONE, "v5p", "on-demand", None)
    assert twice == {"reservations": {"r": 8}}
    assert with_reservation(twice, "r", None) == {}


def test_a_reservation_is_set_by_name() -> None:
    assert with_reservation({}, "team-a-v5p", 256) == {"reservations": {"team-a-v5p": 256}}


@pytest.mark.parametrize(
    ("location", "family", "tier", "chips"),
    [("us-central2-b-x", "v4", "spot", 8), (ZONE, "v9", "spot", 8), (ZONE, "v4", "cheap", 8),
     ("us-central2", "v4", "reserved", 8), (ZONE, "v4", "spot", -1)],
)  # fmt: skip
def test_a_limit_the_document_cannot_hold_is_refused(location: str, family: str, tier: str, chips: int) -> None:
    """An unknown place, family or tier, a regional reservation, negative chips: ValueError."""
    with pytest.raises(ValueError):
        with_limit({}, location, family, tier, chips)

"""The contracts of `budgets.BudgetTally` and `usage_report.PriceBook`: `InMemoryBudgetTally` and
`FixedPrices` answer as `FirestoreBudgetTally` and `FirestorePrices` on the emulator. An attempt is
counted once whatever redelivers it, a notice claimed once, a lift kept; `config/prices` is laid
over the shipped defaults."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from tpujobs.domain.prices import prices_from_document
from tpujobs.engine.budgets import BudgetTally, MonthTally
from tpujobs.engine.usage_report import FixedPrices, PriceBook
from tpujobs.local.fakes.budgets import InMemoryBudgetTally


@pytest.fixture(params=["memory", pytest.param("firestore", marks=pytest.mark.emulator)])
def tally(request: pytest.FixtureRequest) -> Callable[[], BudgetTally]:
    if request.param == "memory":
        return InMemoryBudgetTally
    from tpujobs.adapters.firestore_budgets import FirestoreBudgetTally

    client = request.getfixturevalue("firestore_client")
    return lambda: FirestoreBudgetTally(client)


def test_an_attempt_is_added_once_and_months_are_kept_apart(tally: Callable[[], BudgetTally]) -> None:
    """The same key twice adds once; another key adds; another month is its own."""
    store = tally()
    assert store.record("team-a", "2026-12", "job-1:1", 12.5)
    assert not store.record("team-a", "2026-12", "job-1:1", 12.5)
    assert store.record("team-a", "2026-12", "job-1:2", 2.5)
    assert store.record("team-a", "2026-11", "job-1:1", 8.0)
    found = store.read(["team-a", "team-b"], "2026-12")
    assert found == {"team-a": MonthTally(15.0, ""), "team-b": MonthTally()}
    assert store.read(["team-a"], "2026-11")["team-a"].chip_hours == pytest.approx(8.0)


def test_a_notice_is_claimed_once_until_released(tally: Callable[[], BudgetTally]) -> None:
    """The first claim wins; a released claim can be made again."""
    store = tally()
    assert store.claim_notice("team-a", "2026-12", 80)
    assert not store.claim_notice("team-a", "2026-12", 80)
    assert store.claim_notice("team-a", "2026-12", 100)
    store.release_notice("team-a", "2026-12", 80)
    assert store.claim_notice("team-a", "2026-12", 80)


def test_a_lift_is_kept_beside_the_sum_and_can_be_undone(tally: Callable[[], Any]) -> None:
    """`lifted_by` names the admin; "" holds the team again; the sum is untouched."""
    store = tally()
    store.record("team-a", "2026-12", "job-1:1", 3.0)
    store.lift("team-a", "2026-12", "root@example.com")
    assert store.read(["team-a"], "2026-12")["team-a"] == MonthTally(3.0, "root@example.com")
    store.lift("team-a", "2026-12", "")
    assert store.read(["team-a"], "2026-12")["team-a"] == MonthTally(3.0, "")


@pytest.fixture(params=["memory", pytest.param("firestore", marks=pytest.mark.emulator)])
def price_book(request: pytest.FixtureRequest) -> Callable[[Mapping[str, Any] | None], PriceBook]:
    """`price_book(document)`: the PriceBook once an admin wrote `config/prices` (None: never)."""
    if request.param == "memory":
        return lambda document: FixedPrices(None if document is None else prices_from_document(document))
    from tpujobs.adapters.firestore_prices import FirestorePrices

    client = request.getfixturevalue("firestore_client")

    def written(document: Mapping[str, Any] | None) -> PriceBook:
        if document is not None:
            client.collection("config").document("prices").set(dict(document))
        return FirestorePrices(client)

    return written


def test_config_prices_is_read_over_the_defaults(price_book) -> None:
    """No document: the shipped defaults; a document: its prices over them, its problems said."""
    assert price_book(None).prices().per_chip_hour("v6e", "on-demand", "us-east5") == pytest.approx(2.70)
    read = price_book({"us-east5": {"v5p": 4.2}, "moon": {}}).prices()
    assert read.per_chip_hour("v5p", "on-demand", "us-east5") == pytest.approx(4.2)
    assert read.per_chip_hour("v6e", "on-demand", "us-east5") == pytest.approx(2.70)
    assert read.overridden and len(read.problems) == 1

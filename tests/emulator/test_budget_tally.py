"""The budget tally and the price table on the Firestore emulator, held to the in-memory fake by
one contract: an attempt counted once whatever redelivers it, notices claimed once, a lift kept,
and `config/prices` laid over the shipped defaults."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tpujobs.adapters.firestore_budgets import FirestoreBudgetTally
from tpujobs.adapters.firestore_prices import FirestorePrices
from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.adapters.firestore_usage import FirestoreUsageJobs
from tpujobs.domain.accounting import AttemptUsage
from tpujobs.domain.job import new_job
from tpujobs.domain.prices import prices_from_document
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.budgets import BudgetTally, MonthTally
from tpujobs.engine.usage_report import FixedPrices, MonthlyUsage
from tpujobs.local.fakes.budgets import InMemoryBudgetTally

pytestmark = pytest.mark.emulator

NOW = datetime(2026, 12, 20, tzinfo=timezone.utc)


@pytest.fixture(params=["firestore", "memory"])
def tally(request: pytest.FixtureRequest) -> Callable[[], BudgetTally]:
    if request.param == "memory":
        return InMemoryBudgetTally
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


def test_a_lift_is_kept_beside_the_sum_and_can_be_undone(tally: Callable[[], BudgetTally]) -> None:
    """`lifted_by` names the admin; "" holds the team again; the sum is untouched."""
    store = tally()
    store.record("team-a", "2026-12", "job-1:1", 3.0)
    store.lift("team-a", "2026-12", "root@example.com")
    assert store.read(["team-a"], "2026-12")["team-a"] == MonthTally(3.0, "root@example.com")
    store.lift("team-a", "2026-12", "")
    assert store.read(["team-a"], "2026-12")["team-a"] == MonthTally(3.0, "")


def test_config_prices_is_read_over_the_defaults(firestore_client: Any) -> None:
    """No document: the shipped defaults; a document: its prices over them, its problems said."""
    prices = FirestorePrices(firestore_client)
    assert prices.prices().per_chip_hour("v6e", "on-demand", "us-east5") == pytest.approx(2.70)
    firestore_client.collection("config").document("prices").set({"us-east5": {"v5p": 4.2}, "moon": {}})
    read = prices.prices()
    assert read.per_chip_hour("v5p", "on-demand", "us-east5") == pytest.approx(4.2)
    assert read.overridden and len(read.problems) == 1


def test_usage_reads_team_family_and_tier_from_the_projected_jobs(firestore_client: Any) -> None:
    """`tpujobs usage` on Firestore: the usage reads' projection holds what grouping and pricing need."""
    store = FirestoreJobStore(firestore_client)
    spec = parse_spec({"job_id": "job-1", "name": "train", "owner": "ada@example.com", "accelerator_type": "v6e-8",
                       "command": "true", "capacity": "spot"})  # fmt: skip
    job, event = new_job(spec, "us-east5-b", NOW - timedelta(days=2))
    start = NOW - timedelta(days=1)
    usage = AttemptUsage(1, 8, start, held_from=start, ended_at=start + timedelta(hours=1), zone="us-east5-b")
    store.create(replace(job, team="team-a", usage=(usage,)), event)
    prices = FixedPrices(prices_from_document({"*": {"v6e": {"spot": 1.0}}}))
    report = MonthlyUsage(FirestoreUsageJobs(firestore_client), prices, lambda: NOW).report("team", "2026-12")
    assert report["groups"] == [
        {"group": "team-a", "chip_hours": 8.0, "useful_chip_hours": 8.0, "goodput": 1.0,
         "estimated_cost_usd": 8.0, "unpriced_chip_hours": 0.0, "jobs": 1}
    ]  # fmt: skip

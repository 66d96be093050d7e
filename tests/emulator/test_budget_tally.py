"""`tpujobs usage` on the Firestore emulator. (The budget tally's and the price table's contracts,
fake and adapter alike, are in tests/contract/test_contract_budgets.py.)"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.adapters.firestore_usage import FirestoreUsageJobs
from tpujobs.domain.accounting import AttemptUsage
from tpujobs.domain.job import new_job
from tpujobs.domain.prices import prices_from_document
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.usage_report import FixedPrices, MonthlyUsage

pytestmark = pytest.mark.emulator

NOW = datetime(2026, 12, 20, tzinfo=timezone.utc)


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

"""What the dashboard's pages show whom: the jobs API's rules, its filters, the accounting figures."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from tpujobs.domain.accounting import AttemptUsage
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import JobState
from tpujobs.engine.api import ApiError, JobsApi
from tpujobs.engine.dashboard.output_tail import RecentOutput
from tpujobs.engine.dashboard.views import DashboardViews
from tpujobs.engine.settings import Settings
from tpujobs.local.fakes import InMemoryJobStore, InMemoryOutputBucket
from tpujobs.local.fakes.usage_jobs import InMemoryUsageJobs

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
NOW = T0 + timedelta(hours=2)
ADA, BOB, ROOT = "ada@example.com", "bob@example.com", "root@example.com"


def output(texts: dict[int, bytes], job_id: str = "done-1") -> RecentOutput:
    """Each worker's output as one chunk of attempt 1, in an in-memory logs bucket."""
    bucket = InMemoryOutputBucket()
    for worker, text in texts.items():
        bucket.put(f"logs/jobs/{job_id}/attempt-1/chunks/slice-0-worker-{worker}/000000.log", text)
    return RecentOutput(bucket, lambda: NOW)


def add(store: InMemoryJobStore, job_id: str, owner: str, state: JobState, pool: str = "", **fields: Any) -> Job:
    data = {"job_id": job_id, "name": "train", "owner": owner, "accelerator_type": "v4-16", "command": "true"}
    job, event = new_job(parse_spec({**data, **fields}), "us-central2-b", T0)
    # Held from 09:10 to 10:10 on 8 chips, the last 15 minutes lost: 8 chip-hours, 2 of them lost.
    usage = AttemptUsage(
        1,
        8,
        T0,
        held_from=T0 + timedelta(minutes=10),
        started_at=T0 + timedelta(minutes=20),
        ended_at=T0 + timedelta(minutes=70),
        last_checkpoint_at=T0 + timedelta(minutes=55),
        capacity_lost=True,
    )
    ended_at = T0 + timedelta(minutes=70) if state.is_terminal else None
    job = job.evolve(
        state=state, usage=(usage,), updated_at=T0 + timedelta(minutes=70), ended_at=ended_at, warm_pool=pool
    )
    store.create(job, event)
    return job


@pytest.fixture
def store() -> InMemoryJobStore:
    store = InMemoryJobStore()
    add(store, "done-1", ADA, JobState.FAILED, labels={"team": "a"}, env={"TOKEN": "s3cret"})
    add(store, "live-1", BOB, JobState.RUNNING, labels={"team": "b"})
    return store


def views(store: InMemoryJobStore, logs: RecentOutput | None = None, **settings: Any) -> DashboardViews:
    config = Settings(project="p", admins=(ROOT,), logs_bucket="p-logs", **settings)
    api = JobsApi(SimpleNamespace(warm=None, access=None), store, config)  # type: ignore[arg-type]
    return DashboardViews(api, lambda: NOW, InMemoryUsageJobs(store), logs)


def test_the_jobs_page_filters_as_the_list_api_does(store: InMemoryJobStore) -> None:
    """state, owner and label narrow the list; with none, every job; any moving job refreshes the page."""
    dashboard = views(store)
    assert {r.job_id for r in dashboard.jobs(ADA, {}).rows} == {"done-1", "live-1"}
    assert [r.job_id for r in dashboard.jobs(ADA, {"state": "RUNNING"}).rows] == ["live-1"]
    assert [r.job_id for r in dashboard.jobs(ADA, {"owner": ADA}).rows] == ["done-1"]
    assert [r.job_id for r in dashboard.jobs(ADA, {"label": "team=b"}).rows] == ["live-1"]
    assert dashboard.jobs(ADA, {}).moving and not dashboard.jobs(ADA, {"state": "FAILED"}).moving


def test_a_bad_filter_is_a_400_that_says_what_is_wrong(store: InMemoryJobStore) -> None:
    """A label without '=' and a state no job has are refused, not ignored."""
    with pytest.raises(ApiError) as label:
        views(store).jobs(ADA, {"label": "team"})
    assert label.value.status == 400 and "KEY=VALUE" in label.value.message
    with pytest.raises(ApiError) as state:
        views(store).jobs(ADA, {"state": "SLEEPING"})
    assert state.value.status == 400


def test_a_pool_filter_never_matches_a_placement_hidden_from_the_caller(store: InMemoryJobStore) -> None:
    """A job on warm pool `p1`: its placement is hidden from one the pool is not for (no pool
    document says otherwise), so filtering by `p1` finds nothing for them, and an admin finds it."""
    add(store, "pooled-1", BOB, JobState.RUNNING, pool="p1")
    assert views(store).jobs(ADA, {"pool": "p1"}).rows == []
    assert [r.job_id for r in views(store).jobs(ROOT, {"pool": "p1"}).rows] == ["pooled-1"]


def test_the_job_page_shows_the_accounting_and_hides_what_the_api_hides(store: InMemoryJobStore) -> None:
    """8 chip-hours, 2 lost: goodput 75%; queue wait 10 min; env values only for owner and admin;
    output lines only for them too."""
    logs = output({0: b"one\ntwo\n<script>alert(1)</script>\n"})
    page = views(store, logs).job(BOB, "done-1")
    assert page.row.chip_hours == pytest.approx(8.0)
    assert page.lost_chip_hours == pytest.approx(2.0)
    assert page.row.goodput == pytest.approx(0.75)
    assert page.queue_wait_seconds == pytest.approx(600.0)
    assert '"TOKEN": "<hidden>"' in page.spec_text and "s3cret" not in page.spec_text
    assert page.output is None
    owner = views(store, logs).job(ADA, "done-1")
    assert '"TOKEN": "s3cret"' in owner.spec_text
    assert owner.output == {0: ["one", "two", "<script>alert(1)</script>"], 1: []}  # v4-16: 2 workers
    assert views(store, logs).job(ROOT, "done-1").output is not None
    assert [s.phase for s in owner.lanes[0].segments] == ["waiting", "provisioning", "running", "lost"]
    assert not owner.moving


def test_an_unknown_job_is_a_404(store: InMemoryJobStore) -> None:
    """As `describe` answers it."""
    with pytest.raises(ApiError) as missing:
        views(store).job(ADA, "nope-1")
    assert missing.value.status == 404


def test_usage_sums_chip_hours_and_goodput_per_owner_and_label_per_day(store: InMemoryJobStore) -> None:
    """Each job's 8 chip-hours on 2026-03-01, 75% goodput, under its owner and its label."""
    usage = views(store).usage(ADA)
    rows = {(r.group, r.day): (round(r.chip_hours, 6), r.goodput) for r in usage.rows}
    assert rows == {
        (f"owner {ADA}", "2026-03-01"): (8.0, 0.75),
        (f"owner {BOB}", "2026-03-01"): (8.0, 0.75),
        ("label team=a", "2026-03-01"): (8.0, 0.75),
        ("label team=b", "2026-03-01"): (8.0, 0.75),
    }
    assert [(b.label, round(b.value, 6)) for b in usage.days] == [("2026-03-01", 16.0)]
    assert {b.label for b in usage.owners} == {ADA, BOB}
    assert {b.label for b in usage.labels} == {"team=a", "team=b"}


def test_no_warm_pools_is_an_empty_pools_page(store: InMemoryJobStore) -> None:
    """A deployment built without warm pools shows none, and no error."""
    assert views(store).pools(ADA) == []


def test_the_pools_page_plots_each_pools_busy_share_per_hour_and_shows_it_as_pool_list_does(
    store: InMemoryJobStore,
) -> None:
    """A one-unit pool held idle from 09:00 and busy from 10:00 (now 11:00): 0% in the 09:00
    hour, 100% in the 10:00 hour; the job on it is hidden from a caller the pool is not for."""
    from tpujobs.domain import pools
    from tpujobs.local.fakes import InMemoryWarmPools

    request, _ = pools.parse_pool_request(
        {"name": "demo", "accelerator_type": "v4-8", "count": 1, "owner": ADA}, "us-central2-b"
    )
    pool = pools.new_pool(request, T0)
    pool = pools.active(pools.requested(pool, 0, T0), 0, T0)
    pool = pools.assigned(pool, 0, "live-1", 1, T0 + timedelta(hours=1))
    warm = InMemoryWarmPools(store)
    warm.create(pool)
    now = T0 + timedelta(hours=2)
    service = SimpleNamespace(warm=SimpleNamespace(store=warm), access=None, clock=lambda: now)
    api = JobsApi(service, store, Settings(project="p"))  # type: ignore[arg-type]
    (shown,) = DashboardViews(api, lambda: now, InMemoryUsageJobs(store)).pools(BOB)
    hours = {bar.label: bar.value for bar in shown.hours}
    assert len(hours) == 24 and (hours["09:00"], hours["10:00"]) == (0.0, pytest.approx(1.0))
    assert shown.summary["units"][0]["job_id"] == "(hidden)"
    (owners,) = DashboardViews(api, lambda: now, InMemoryUsageJobs(store)).pools(ADA)
    assert owners.summary["units"][0]["job_id"] == "live-1"

"""The dashboard's HTML: user text escaped, a strict CSP on every answer, 401 without a caller."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from tpujobs.domain.accounting import AttemptUsage
from tpujobs.domain.job import new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import JobState
from tpujobs.engine.api import JobsApi
from tpujobs.engine.dashboard.caller import DashboardCaller
from tpujobs.engine.dashboard.output_tail import RecentOutput
from tpujobs.engine.dashboard.views import DashboardViews
from tpujobs.engine.settings import Settings
from tpujobs.local.fakes import InMemoryJobStore, InMemoryOutputBucket
from tpujobs.local.fakes.usage_jobs import InMemoryUsageJobs
from tpujobs.runtime.dashboard_site import DashboardSite

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
SCRIPT = "<script>alert(1)</script>"


def site(local_user: str = "ada@example.com") -> DashboardSite:
    store = InMemoryJobStore()
    spec = parse_spec(
        {"job_id": "live-1", "name": "train", "owner": "ada@example.com", "accelerator_type": "v4-8", "command": SCRIPT}
    )
    job, event = new_job(spec, "us-central2-b", T0)
    usage = AttemptUsage(1, 4, T0, held_from=T0 + timedelta(minutes=5), started_at=T0 + timedelta(minutes=6))
    store.create(job.evolve(state=JobState.RUNNING, usage=(usage,)), event)
    settings = Settings(project="p", local_stack=True)
    api = JobsApi(SimpleNamespace(warm=None, access=None), store, settings)  # type: ignore[arg-type]
    bucket = InMemoryOutputBucket()
    bucket.put("logs/jobs/live-1/attempt-1/chunks/slice-0-worker-0/000000.log", f"step 1\n{SCRIPT}\n".encode())
    now = T0 + timedelta(minutes=65)
    views = DashboardViews(api, lambda: now, InMemoryUsageJobs(store), RecentOutput(bucket, lambda: now))
    return DashboardSite(
        views, DashboardCaller(lambda token, audiences: {}, "", local_stack=True, local_user=local_user)
    )


def test_a_jobs_script_output_and_command_are_shown_as_text() -> None:
    """The `<script>` a job printed (and ran) appears escaped, never as markup."""
    page = site().handle("GET", "/jobs/live-1", {}, {})
    assert page.status == 200
    assert SCRIPT not in page.body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.body
    assert "<svg" in page.body and 'class="phase running"' in page.body
    assert "4.000 chip-hours" in page.body  # 4 chips held from 09:05 to 10:05


@pytest.mark.parametrize("path", ["/", "/jobs/live-1", "/pools", "/usage", "/nope", "/style.css"])
def test_every_answer_carries_a_strict_content_security_policy(path: str) -> None:
    """No script source at all, no framing, nothing from other origins; pages are never cached."""
    page = site().handle("GET", path, {}, {})
    csp = page.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp and "script-src" not in csp
    assert "unsafe-inline" not in csp
    assert page.headers["Cache-Control"] == "no-store"


def test_a_page_of_moving_jobs_refreshes_itself_without_script() -> None:
    """A running job: a meta refresh, and no <script> element anywhere."""
    body = site().handle("GET", "/", {}, {}).body
    assert '<meta http-equiv="refresh"' in body and "<script" not in body


def test_no_caller_is_a_401_and_a_write_is_a_405() -> None:
    """A local stack that names no user refuses; POST is refused before anything is read."""
    assert site(local_user="").handle("GET", "/", {}, {}).status == 401
    assert site().handle("POST", "/", {}, {}).status == 405


def _pool_site(caller: str) -> DashboardSite:
    """A one-unit pool of ada's whose unit holds live-1 since 10:00."""
    from tpujobs.domain import pools
    from tpujobs.local.fakes import InMemoryWarmPools

    store = InMemoryJobStore()
    request, _ = pools.parse_pool_request(
        {"name": "demo", "accelerator_type": "v4-8", "count": 1, "owner": "ada@example.com"}, "us-central2-b"
    )
    pool = pools.active(pools.requested(pools.new_pool(request, T0), 0, T0), 0, T0)
    warm = InMemoryWarmPools(store)
    warm.create(pools.assigned(pool, 0, "live-1", 1, T0 + timedelta(hours=1)))
    now = T0 + timedelta(hours=2)
    service = SimpleNamespace(warm=SimpleNamespace(store=warm), access=None, clock=lambda: now)
    api = JobsApi(service, store, Settings(project="p", local_stack=True))  # type: ignore[arg-type]
    views = DashboardViews(api, lambda: now, InMemoryUsageJobs(store))
    return DashboardSite(views, DashboardCaller(lambda token, audiences: {}, "", local_stack=True, local_user=caller))


def test_the_pools_page_shows_each_unit_and_its_holder_to_those_the_pool_is_for() -> None:
    """The pool's owner sees the unit's holder linked to its job page and the last day's busy share;
    another caller sees that a unit is held, never by which job; a held unit refreshes the page."""
    owner = _pool_site("ada@example.com").handle("GET", "/pools", {}, {}).body
    assert '<a href="/jobs/live-1">live-1</a> (attempt 1)' in owner
    assert "50.0% busy" in owner  # idle 09:00-10:00, busy 10:00-11:00
    assert 'class="chart"' in owner and '<meta http-equiv="refresh"' in owner
    other = _pool_site("bob@example.com").handle("GET", "/pools", {}, {}).body
    assert "live-1" not in other and "(hidden)" in other


def test_the_usage_page_says_its_window_and_refuses_a_wider_one() -> None:
    """The page names its window, the jobs it summed and the bound; `days` past it is a 400."""
    body = site().handle("GET", "/usage", {"days": "3"}, {}).body
    assert "The last 3 days" in body and "jobs summed: 1." in body and "at most 31 days" in body
    refused = site().handle("GET", "/usage", {"days": "32"}, {})
    assert refused.status == 400 and "1 to 31" in refused.body

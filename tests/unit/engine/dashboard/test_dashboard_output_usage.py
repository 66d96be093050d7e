"""The job page's last lines (newest chunks only, kept briefly, bounded) and the usage page's
sums over every job of its window, read a page at a time."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from tpujobs.domain.accounting import AttemptUsage
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import JobState
from tpujobs.engine.api import ApiError, JobsApi
from tpujobs.engine.dashboard import output_tail, usage
from tpujobs.engine.dashboard.output_tail import OUTPUT_LINES, RecentOutput
from tpujobs.engine.dashboard.views import DashboardViews
from tpujobs.engine.ports import StoredObject
from tpujobs.engine.settings import Settings
from tpujobs.local.fakes import InMemoryJobStore, InMemoryOutputBucket
from tpujobs.local.fakes.usage_jobs import InMemoryUsageJobs

NOW = datetime(2026, 3, 20, 12, 0, tzinfo=timezone.utc)


class CountingBucket(InMemoryOutputBucket):
    """The in-memory logs bucket, counting listings and object reads."""

    def __init__(self) -> None:
        super().__init__()
        self.listings = 0
        self.reads = 0

    def list_objects(self, prefix: str) -> list[StoredObject]:
        self.listings += 1
        return super().list_objects(prefix)

    def read_all(self, names: Sequence[str]) -> list[bytes | None]:
        self.reads += len(names)
        return super().read_all(names)


def a_job(job_id: str = "j-1", owner: str = "ada@example.com", accelerator: str = "v4-8", **fields: object) -> Job:
    data = {"job_id": job_id, "name": "train", "owner": owner, "accelerator_type": accelerator, "command": "true"}
    job, _ = new_job(parse_spec({**data, **fields}), "us-central2-b", NOW - timedelta(days=40))
    return job


def chunks(bucket: InMemoryOutputBucket, job_id: str, worker: int, texts: list[str]) -> None:
    for seq, text in enumerate(texts):
        bucket.put(f"logs/jobs/{job_id}/attempt-1/chunks/slice-0-worker-{worker}/{seq:06d}.log", text.encode())


def test_the_last_lines_come_from_the_newest_chunks_only() -> None:
    """1,000 chunks of 3 lines: the last 20 lines, in order, from 8 reads, not 1,000; the line the
    oldest chunk read starts mid-way is left out, not shown cut."""
    bucket = CountingBucket()
    chunks(bucket, "j-1", 0, [f"line {3 * i}\nline {3 * i + 1}\nline {3 * i + 2}\n" for i in range(1000)])
    lines = RecentOutput(bucket, lambda: NOW).last_lines(a_job(), 1, 1, ended=False)
    assert lines == {0: [f"line {n}" for n in range(3000 - OUTPUT_LINES, 3000)]}
    assert bucket.reads <= 14 and bucket.listings == 1


def test_a_line_split_across_chunks_is_joined_and_a_short_log_is_shown_whole() -> None:
    """Chunks cut lines anywhere; a worker with few chunks shows all of them, its first line included."""
    bucket = InMemoryOutputBucket()
    chunks(bucket, "j-1", 0, ["fir", "st\nsec", "ond\n"])
    assert RecentOutput(bucket, lambda: NOW).last_lines(a_job(), 1, 2, ended=False) == {0: ["first", "second"], 1: []}


def test_chunks_few_lines_each_are_read_until_the_lines_shown_or_the_cap() -> None:
    """One line per chunk: more chunks are read, twice as many a round, up to TAIL_CHUNKS."""
    bucket = CountingBucket()
    chunks(bucket, "j-1", 0, [f"step {i}\n" for i in range(500)])
    lines = RecentOutput(bucket, lambda: NOW).last_lines(a_job(), 1, 1, ended=False)[0]
    assert lines == [f"step {i}" for i in range(480, 500)]
    assert bucket.reads <= output_tail.TAIL_CHUNKS


def test_an_attempts_lines_are_reused_briefly_and_then_read_again() -> None:
    """Within MOVING_FRESH no read at all; after it, read again with the new output; an ended
    attempt's lines are kept ENDED_FRESH."""
    bucket = CountingBucket()
    chunks(bucket, "j-1", 0, ["one\n"])
    now = [NOW]
    output = RecentOutput(bucket, lambda: now[0])
    assert output.last_lines(a_job(), 1, 1, ended=False) == {0: ["one"]}
    chunks(bucket, "j-1", 0, ["one\n", "two\n"])
    now[0] += output_tail.MOVING_FRESH - timedelta(seconds=1)
    listed = bucket.listings
    assert output.last_lines(a_job(), 1, 1, ended=False) == {0: ["one"]} and bucket.listings == listed
    now[0] += timedelta(seconds=1)
    assert output.last_lines(a_job(), 1, 1, ended=True) == {0: ["one", "two"]}
    now[0] += output_tail.ENDED_FRESH - timedelta(seconds=1)
    listed = bucket.listings
    assert output.last_lines(a_job(), 1, 1, ended=True) == {0: ["one", "two"]} and bucket.listings == listed


def test_the_cache_holds_at_most_cached_attempts_and_lines_are_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    """The least recently shown (job, attempt) is dropped first; a huge line is cut to LINE_CHARS."""
    monkeypatch.setattr(output_tail, "CACHED_ATTEMPTS", 2)
    bucket = CountingBucket()
    chunks(bucket, "j-1", 0, ["x" * 10_000 + "\n"])
    output = RecentOutput(bucket, lambda: NOW)
    assert output.last_lines(a_job("j-1"), 1, 1, ended=True)[0] == ["x" * output_tail.LINE_CHARS]
    output.last_lines(a_job("j-2"), 1, 1, ended=True)
    output.last_lines(a_job("j-1"), 1, 1, ended=True)  # j-1 shown again: j-2 is the oldest now
    output.last_lines(a_job("j-3"), 1, 1, ended=True)
    listed = bucket.listings
    output.last_lines(a_job("j-1"), 1, 1, ended=True)
    assert bucket.listings == listed
    output.last_lines(a_job("j-2"), 1, 1, ended=True)
    assert bucket.listings == listed + 1


def held(job: Job, start: datetime, hours: float, chips: int = 4, ended: bool = True, lost: bool = False) -> Job:
    end = start + timedelta(hours=hours)
    attempt = AttemptUsage(1, chips, start, held_from=start, started_at=start, ended_at=end if ended else None)
    if lost:
        attempt = AttemptUsage(
            1,
            chips,
            start,
            held_from=start,
            started_at=start,
            ended_at=end,
            last_checkpoint_at=start,
            capacity_lost=True,
        )
    state = (JobState.FAILED if lost else JobState.SUCCEEDED) if ended else JobState.RUNNING
    return job.evolve(state=state, usage=(attempt,), ended_at=end if ended else None, updated_at=end)


def test_usage_sums_every_job_of_the_window_over_many_pages() -> None:
    """1,203 jobs that ended in the window (3 pages of 500), 2 running, 4 that ended before it: all
    and only those of the window count, a running one up to now."""
    store = InMemoryJobStore()
    day = NOW.replace(hour=0) - timedelta(days=3)
    for i in range(1203):
        job = held(a_job(f"done-{i}", labels={"team": "a" if i % 3 else "b"}), day + timedelta(hours=1), 0.5)
        store.create(job, new_job(job.spec, job.zone, job.created_at or NOW)[1])
    for i in range(2):
        job = held(a_job(f"live-{i}", owner="bob@example.com"), NOW - timedelta(hours=2), 0, ended=False)
        store.create(job, new_job(job.spec, job.zone, job.created_at or NOW)[1])
    for i in range(4):
        job = held(a_job(f"old-{i}"), NOW - timedelta(days=20), 5)
        store.create(job, new_job(job.spec, job.zone, job.created_at or NOW)[1])
    jobs = InMemoryUsageJobs(store)
    page = usage.usage_page(jobs, NOW, days=14)
    assert jobs.pages_read == 4 and page.jobs == 1205
    sums = {(row.group, row.day): row.chip_hours for row in page.rows}
    assert sums[("owner ada@example.com", day.strftime("%Y-%m-%d"))] == pytest.approx(1203 * 4 * 0.5)
    assert sums[("label team=b", day.strftime("%Y-%m-%d"))] == pytest.approx(401 * 4 * 0.5)
    assert sums[("owner bob@example.com", NOW.strftime("%Y-%m-%d"))] == pytest.approx(2 * 4 * 2)
    assert len(sums) == 4  # the old jobs' day is outside the window


def test_a_job_read_running_and_then_ended_counts_once() -> None:
    """A job that ends between the two reads comes in both; it is summed once."""
    job = held(a_job("j-1"), NOW - timedelta(hours=1), 1)

    class Twice:
        def overlapping(self, since: datetime, page_size: int = 500) -> list[list[Job]]:
            return [[job.evolve(state=JobState.RUNNING, ended_at=None)], [job]]

    page = usage.usage_page(Twice(), NOW, days=1)  # type: ignore[arg-type]
    assert page.jobs == 1 and [row.chip_hours for row in page.rows] == [pytest.approx(4.0)]


def test_the_window_is_days_from_the_query_at_most_max_days() -> None:
    """No value: DEFAULT_DAYS; 1..MAX_DAYS as asked; anything else a 400 that names the bound."""
    assert usage.window_days(None) == usage.window_days(" ") == usage.DEFAULT_DAYS
    assert usage.window_days("1") == 1 and usage.window_days(str(usage.MAX_DAYS)) == usage.MAX_DAYS
    for bad in ("0", str(usage.MAX_DAYS + 1), "-3", "7.5", "x", "1e9"):
        with pytest.raises(ApiError) as refused:
            usage.window_days(bad)
        assert refused.value.status == 400 and str(usage.MAX_DAYS) in refused.value.message


def test_the_usage_page_reads_days_from_its_query() -> None:
    """A job that held chips 3 days ago counts in a 7-day window and not in a 2-day one."""
    store = InMemoryJobStore()
    job = held(a_job("j-1"), NOW - timedelta(days=3), 1)
    store.create(job, new_job(job.spec, job.zone, job.created_at or NOW)[1])
    api = JobsApi(SimpleNamespace(warm=None, access=None), store, Settings(project="p"))  # type: ignore[arg-type]
    views = DashboardViews(api, lambda: NOW, InMemoryUsageJobs(store))
    assert (
        views.usage("ada@example.com", {"days": "7"}).rows
        and views.usage("ada@example.com", {"days": "7"}).window_days == 7
    )
    assert views.usage("ada@example.com", {"days": "2"}).rows == []

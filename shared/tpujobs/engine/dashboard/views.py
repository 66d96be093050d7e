"""What each dashboard page shows a caller, as plain view objects built from the API's own parts.

Rights are the `jobs` API's, reused and never restated: a job as `JobActions.shown` shows it (env
values and warm-pool placement hidden from those the API hides them from), a job page as `describe`
answers it, pools as `pool-list` shows them. Output lines, like env values, only for the job's
owner or an admin (`domain.access.may_cancel`, the rule of env values).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from tpujobs.domain.access import may_cancel
from tpujobs.domain.pools import Pool, usage_since
from tpujobs.domain.states import TERMINAL
from tpujobs.engine.dashboard import charts
from tpujobs.engine.jobs_api.answers import ApiError
from tpujobs.engine.jobs_api.requests import JobRequest, ListRequest, NothingRequest, validated
from tpujobs.engine.ports import JobFilter

if TYPE_CHECKING:
    from tpujobs.domain.job import Job
    from tpujobs.engine.api import JobsApi
    from tpujobs.engine.output_export import LogReader
    from tpujobs.engine.ports import Clock

OUTPUT_LINES = 20  # last lines shown per worker
OUTPUT_WORKERS = 8  # workers whose output a job page reads (a big slice has hundreds)
USAGE_JOBS = 500  # the newest jobs the usage page sums
USAGE_DAYS = 14


@dataclass(frozen=True)
class JobRow:
    job_id: str
    name: str
    owner: str
    state: str
    pool: str
    labels: Mapping[str, str]
    created_at: str
    chip_hours: float
    goodput: float | None


@dataclass(frozen=True)
class JobsPage:
    rows: list[JobRow]
    filters: Mapping[str, str]
    moving: bool  # some job shown has not ended: the page refreshes


@dataclass(frozen=True)
class JobPage:
    row: JobRow
    spec_text: str
    state_reason: str
    events: list[Mapping[str, Any]]
    lanes: list[charts.Lane]
    queue_wait_seconds: float
    lost_chip_hours: float
    log_links: list[tuple[str, str]]  # (what, gs:// URI)
    output: dict[int, list[str]] | None  # worker K -> last lines; None: not for this caller
    moving: bool


@dataclass(frozen=True)
class PoolView:
    name: str
    summary: Mapping[str, Any]
    hours: list[charts.Bar]


@dataclass(frozen=True)
class UsageRow:
    group: str  # "owner alice@x" or "label team=a"
    day: str
    chip_hours: float
    goodput: float | None


@dataclass(frozen=True)
class UsagePage:
    days: list[charts.Bar]
    owners: list[charts.Bar]
    labels: list[charts.Bar]
    rows: list[UsageRow] = field(default_factory=list)


class DashboardViews:
    """Builds each page's view for a caller on the jobs API's parts (its store, settings, rules)."""

    def __init__(self, api: JobsApi, clock: Clock, logs: LogReader | None = None) -> None:
        self.api = api
        self.clock = clock
        self.logs = logs

    def jobs(self, caller: str, query: Mapping[str, str]) -> JobsPage:
        """The list API's filters (state, owner, label `k=v`), and pool; a bad one is a 400."""
        filters = {k: query[k].strip() for k in ("state", "owner", "label", "pool") if query.get(k, "").strip()}
        labels: dict[str, str] = {}
        if "label" in filters:
            key, eq, value = filters["label"].partition("=")
            if not eq or not key:
                raise ApiError(400, "A label filter is KEY=VALUE.")
            labels[key] = value
        data = {"state": filters.get("state"), "owner": filters.get("owner"), "labels": labels}
        request = validated("list", {k: v for k, v in data.items() if v})
        assert isinstance(request, ListRequest)
        where = JobFilter(states=request.state, owner=request.owner, labels=dict(request.labels))
        actions, sees = self.api.job_actions, dict[str, bool]()
        rows = []
        for job in self.api.store.list_jobs(limit=request.limit, where=where):
            row = self._row(job, actions.shown(caller, job, sees))
            if "pool" not in filters or row.pool == filters["pool"]:  # a hidden placement never matches
                rows.append(row)
        return JobsPage(rows, filters, any(r.state not in _TERMINAL for r in rows))

    def job(self, caller: str, job_id: str) -> JobPage:
        """One job as `describe` answers the caller, with its attempts timeline and accounting."""
        actions = self.api.job_actions
        job = actions.job(job_id)
        answer = actions.describe(caller, JobRequest(job_id=job.job_id)).body
        document = answer["job"]
        now = self.clock()
        accounting = job.accounting(None if job.state in TERMINAL else now)
        links = []
        for attempt in answer["attempts"]:
            number = attempt.get("attempt")
            if attempt.get("log_uri"):
                links.append((f"attempt {number}", str(attempt["log_uri"])))
            for worker, uri in sorted((attempt.get("worker_logs") or {}).items()):
                links.append((f"attempt {number} worker {worker}", str(uri)))
        return JobPage(
            row=self._row(job, document),
            spec_text=json.dumps(document.get("spec", {}), indent=2, sort_keys=True, default=str),
            state_reason=str(document.get("state_reason") or ""),
            events=list(answer["events"]),
            lanes=charts.attempts_timeline(job.usage, now),
            queue_wait_seconds=accounting.queue_wait_seconds,
            lost_chip_hours=accounting.lost_chip_hours,
            log_links=links,
            output=self._output(caller, job),
            moving=job.state not in TERMINAL,
        )

    def pools(self, caller: str) -> list[PoolView]:
        """Every warm pool as `pool-list` shows it to the caller, with its last day's busy share by hour."""
        if self.api.service.warm is None:
            return []
        store = self.api.service.warm.store
        now = self.clock()
        views = []
        for summary in self.api.pool_actions.list(caller, NothingRequest()).body["pools"]:
            pool = store.get(summary["name"])
            hours = charts.hourly_utilisation(_usage_since(pool, now), now) if pool else []
            views.append(PoolView(summary["name"], summary, charts.bars(hours)))
        return views

    def usage(self, caller: str, days: int = USAGE_DAYS) -> UsagePage:
        """Chip-hours and goodput per owner and per label, per day, over the newest jobs' attempts.
        Anyone sees them, as anyone may `list` jobs with their usage."""
        now = self.clock()
        since = (now - timedelta(days=days - 1)).strftime("%Y-%m-%d")
        sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
        for job in self.api.store.list_jobs(limit=USAGE_JOBS):
            groups = [f"owner {job.owner}", *(f"label {k}={v}" for k, v in sorted(job.spec.labels.items()))]
            for day, (total, lost) in charts.daily_chip_hours(job.usage, now).items():
                if day < since:
                    continue
                for group in groups:
                    sums[(group, day)][0] += total
                    sums[(group, day)][1] += lost
        rows = [
            UsageRow(group, day, total, (total - lost) / total if total > 0 else None)
            for (group, day), (total, lost) in sorted(sums.items())
        ]
        per_day: dict[str, float] = defaultdict(float)
        per_group: dict[str, float] = defaultdict(float)
        for row in rows:
            per_group[row.group] += row.chip_hours
            if row.group.startswith("owner "):
                per_day[row.day] += row.chip_hours
        return UsagePage(
            days=charts.bars(sorted(per_day.items())),
            owners=charts.bars((g.removeprefix("owner "), v) for g, v in per_group.items() if g.startswith("owner ")),
            labels=charts.bars((g.removeprefix("label "), v) for g, v in per_group.items() if g.startswith("label ")),
            rows=rows,
        )

    def _row(self, job: Job, document: Mapping[str, Any]) -> JobRow:
        accounting = job.accounting(None if job.state in TERMINAL else self.clock())
        spec = document.get("spec") or {}
        return JobRow(
            job_id=job.job_id,
            name=job.name,
            owner=job.owner,
            state=job.state.value,
            pool=str(document.get("warm_pool") or ""),
            labels=dict(spec.get("labels") or {}),
            created_at=job.created_at.strftime("%Y-%m-%d %H:%M:%S") if job.created_at else "",
            chip_hours=accounting.chip_hours,
            goodput=accounting.goodput,
        )

    def _output(self, caller: str, job: Job) -> dict[int, list[str]] | None:
        """The current attempt's last lines per worker, for its owner or an admin; None for others."""
        if self.logs is None or not may_cancel(job.owner, caller, self.api.settings.admins):
            return None
        out = {}
        for worker in range(min(job.total_workers, OUTPUT_WORKERS)):
            text, _ = self.logs.show(job, job.attempt, worker)
            out[worker] = text.decode("utf-8", errors="replace").splitlines()[-OUTPUT_LINES:]
        return out


def _usage_since(pool: Pool, now: datetime) -> Callable[[datetime], tuple[float, float]]:
    """The pool's (busy, idle) chip-hours from a time to now, open stretches included."""

    def since(start: datetime) -> tuple[float, float]:
        usage = usage_since(pool, start, now)
        return usage.busy_chip_hours, usage.idle_chip_hours

    return since


_TERMINAL = frozenset(state.value for state in TERMINAL)

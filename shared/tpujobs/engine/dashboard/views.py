"""What each dashboard page shows a caller, as plain view objects built from the API's own parts.

Rights are the `jobs` API's, reused and never restated: a job as `JobActions.shown` shows it (env
values and warm-pool placement hidden from those the API hides them from), a job page as `describe`
answers it, pools as `pool-list` shows them. Output lines, like env values, only for the job's
owner or an admin (`domain.access.may_cancel`, the rule of env values). Webhook URLs, which may be
credentials, show by their host only, to everyone: a page is easily shared or left on a screen.
Teams, which the API shows admins alone, show a non-admin their own team only (`dashboard.teams`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tpujobs.domain.access import may_cancel
from tpujobs.domain.console_links import storage_console_url
from tpujobs.domain.job_output import attempt_output_link, wanted
from tpujobs.domain.naming import job_prefix
from tpujobs.domain.notify import hidden_webhooks
from tpujobs.domain.pools import Pool, usage_since
from tpujobs.domain.states import TERMINAL
from tpujobs.engine.dashboard import charts
from tpujobs.engine.dashboard.teams import TeamsPage, teams_page
from tpujobs.engine.dashboard.usage import UsagePage, usage_page, window_days
from tpujobs.engine.jobs_api.answers import ApiError
from tpujobs.engine.jobs_api.requests import JobRequest, ListRequest, NothingRequest, validated
from tpujobs.engine.ports import JobFilter

if TYPE_CHECKING:
    from tpujobs.domain.job import Job
    from tpujobs.engine.api import JobsApi
    from tpujobs.engine.budgets import BudgetTally
    from tpujobs.engine.dashboard.output_tail import RecentOutput
    from tpujobs.engine.ports import Clock
    from tpujobs.engine.usage_report import UsageJobs

OUTPUT_WORKERS = 8  # workers whose output a job page reads (a big slice has hundreds)
LINKED_WORKERS = 8  # workers whose exported log is linked one by one; the attempt's folder has all


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
class LogLink:
    """Where some of a job's output is: a page a person can open, or only its text (locally)."""

    what: str
    text: str  # the gs:// URI, or the name of the page
    url: str | None  # the Cloud Console's page; None where none opens it (the local stack)


@dataclass(frozen=True)
class JobPage:
    row: JobRow
    spec_text: str
    state_reason: str
    events: list[Mapping[str, Any]]
    lanes: list[charts.Lane]
    queue_wait_seconds: float
    lost_chip_hours: float
    log_links: list[LogLink]
    output: dict[int, list[str]] | None  # worker K -> last lines; None: not for this caller
    moving: bool


@dataclass(frozen=True)
class PoolView:
    name: str
    summary: Mapping[str, Any]
    hours: list[charts.Bar]

    @property
    def held(self) -> bool:
        """Whether a job is on one of its units (hidden or not): the pools page then refreshes."""
        return any(unit.get("job_id") for unit in self.summary.get("units") or ())


class DashboardViews:
    """Builds each page's view for a caller on the jobs API's parts (its store, settings, rules)."""

    def __init__(
        self,
        api: JobsApi,
        clock: Clock,
        usage_jobs: UsageJobs,
        output: RecentOutput | None = None,
        budgets: BudgetTally | None = None,
    ) -> None:
        """`budgets`: the teams' monthly tallies, for the teams page (None: it shows no month)."""
        self.api = api
        self.clock = clock
        self.usage_jobs = usage_jobs
        self.output = output
        self.budgets = budgets

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
        return JobPage(
            row=self._row(job, document),
            spec_text=json.dumps(hidden_webhooks(document.get("spec") or {}), indent=2, sort_keys=True, default=str),
            state_reason=str(document.get("state_reason") or ""),
            events=list(answer["events"]),
            lanes=charts.attempts_timeline(job.usage, now),
            queue_wait_seconds=accounting.queue_wait_seconds,
            lost_chip_hours=accounting.lost_chip_hours,
            log_links=self._log_links(job, answer["attempts"]),
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

    def usage(self, caller: str, query: Mapping[str, str] | None = None) -> UsagePage:
        """Chip-hours and goodput per owner and per label, per day, over every job of the last
        `days` days (`engine.dashboard.usage`). Anyone sees them, as anyone may `list` jobs with
        their usage."""
        return usage_page(self.usage_jobs, self.clock(), window_days((query or {}).get("days")))

    def teams(self, caller: str) -> TeamsPage:
        """Each team's chips under its limits now and its month against its budget, on the API's
        own teams and quota pools (`engine.dashboard.teams`): every team for an admin, the
        caller's own team for anyone else."""
        service = self.api.service
        return teams_page(service.teams, service.pools, self.budgets, caller, self.api.settings.admins, self.clock())

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
        if self.output is None or not may_cancel(job.owner, caller, self.api.settings.admins):
            return None
        workers = min(job.total_workers, OUTPUT_WORKERS)
        return self.output.last_lines(job, job.attempt, workers, ended=job.state in TERMINAL)

    def _log_links(self, job: Job, attempts: list[Mapping[str, Any]]) -> list[LogLink]:
        """Per attempt: its output folder, its exported logs (once written), and its lines in Logs
        Explorer where the job's output goes to Cloud Logging. The Cloud Console opens nothing of
        the local stack's emulators, so there the gs:// URIs are shown as text, unlinked, and the
        Logging query is left out (`tpujobs logs` reads both)."""
        config = self.api.settings
        local = config.local_stack
        bucket = config.logs_bucket or f"{config.project}-tpujobs-logs"

        def gs(what: str, uri: str) -> LogLink:
            return LogLink(what, uri, None if local else storage_console_url(uri, config.project))

        exported = {a.get("attempt"): a for a in attempts}
        links = []
        for usage in job.usage:
            number = usage.attempt
            folder = f"gs://{bucket}/{job_prefix(job.job_id, job.spec.service_account)}attempt-{number}/"
            links.append(gs(f"attempt {number}: output folder", folder))
            logs = exported.get(number) or {}
            if logs.get("log_uri"):
                links.append(gs(f"attempt {number}: every worker's log", str(logs["log_uri"])))
            for worker, uri in sorted((logs.get("worker_logs") or {}).items(), key=lambda kv: int(kv[0])):
                if int(worker) < LINKED_WORKERS:
                    links.append(gs(f"attempt {number}: worker {worker}'s log", str(uri)))
            if not local and wanted(job.spec.cloud_logging, config.cloud_logging):
                url = attempt_output_link(config.project, config.prefix, job.job_id, number, usage.waiting_since)
                links.append(LogLink(f"attempt {number}: Cloud Logging", "Logs Explorer", url))
        return links


def _usage_since(pool: Pool, now: datetime) -> Callable[[datetime], tuple[float, float]]:
    """The pool's (busy, idle) chip-hours from a time to now, open stretches included."""

    def since(start: datetime) -> tuple[float, float]:
        usage = usage_since(pool, start, now)
        return usage.busy_chip_hours, usage.idle_chip_hours

    return since


_TERMINAL = frozenset(state.value for state in TERMINAL)

"""The job page's log links: Cloud Console pages of the logs bucket and Logs Explorer, built in
the domain, URL-quoted; in the local stack, the gs:// text with no link."""

from __future__ import annotations

import urllib.parse
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from tpujobs.domain.accounting import AttemptUsage
from tpujobs.domain.console_links import split_gs_uri, storage_console_url
from tpujobs.domain.job import new_job
from tpujobs.domain.job_output import attempt_output_link, job_filter
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import JobState
from tpujobs.engine.api import JobsApi
from tpujobs.engine.dashboard.views import DashboardViews, LogLink
from tpujobs.engine.ports import AttemptLogs
from tpujobs.engine.settings import Settings
from tpujobs.local.fakes import InMemoryJobStore
from tpujobs.local.fakes.usage_jobs import InMemoryUsageJobs

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
CONSOLE = "https://console.cloud.google.com/storage/browser/"


def test_a_folder_opens_the_storage_browser_and_an_object_its_details_page() -> None:
    """A trailing slash is a folder; the project is a query parameter."""
    assert storage_console_url("gs://b-logs/logs/jobs/j-1/attempt-2/", "proj") == (
        CONSOLE + "b-logs/logs/jobs/j-1/attempt-2/?project=proj"
    )
    assert storage_console_url("gs://b-logs/logs/jobs/j-1/attempt-2/attempt.log", "proj") == (
        CONSOLE + "_details/b-logs/logs/jobs/j-1/attempt-2/attempt.log?project=proj"
    )
    assert storage_console_url("gs://b-logs/", "proj") == CONSOLE + "b-logs/?project=proj"


def test_every_part_of_a_console_link_is_url_quoted() -> None:
    """A job account's email, spaces, `?`, `#` and `&` in a name cannot end the path or add a
    parameter: unquoting the path gives the object name back."""
    name = "logs/accounts/team@p.iam.gserviceaccount.com/jobs/a b?c#d&project=evil/attempt-1/"
    url = storage_console_url(f"gs://b-logs/{name}", "my proj&x=1")
    assert url is not None
    path, _, query = url.removeprefix(CONSOLE).partition("?")
    assert "?" not in path and "#" not in path and " " not in path and "&" not in path
    assert urllib.parse.unquote(path) == f"b-logs/{name}"
    assert urllib.parse.parse_qs(query) == {"project": ["my proj&x=1"]}


def test_anything_but_a_gs_uri_has_no_console_link() -> None:
    """An https URL, a bare path, an empty string or a bad bucket name: None, never a guess."""
    for uri in ("https://evil.example/x", "/logs/x", "", "gs://", "gs://Bucket/x", "gs:///x", "gs://b/x", "gs:b/x"):
        assert storage_console_url(uri, "p") is None, uri
    assert split_gs_uri("gs://bucket-1/a/b") == ("bucket-1", "a/b")


def test_an_attempts_logs_explorer_link_carries_its_filter_from_the_attempts_start() -> None:
    """The query is `job_filter`'s for that attempt with `timestamp>=`, so the Explorer's default
    last hour hides no line; the same builder as `describe`'s link, not a copy."""
    url = attempt_output_link("proj", "dev-", "j-1", 2, T0)
    assert url.startswith("https://console.cloud.google.com/logs/query;query=")
    quoted = url.split(";query=", 1)[1].split("?project=", 1)
    assert urllib.parse.unquote(quoted[0]) == job_filter("proj", "dev-", "j-1", 2, T0)
    assert "timestamp>=" in urllib.parse.unquote(quoted[0]) and quoted[1] == "proj"


def _page_links(local: bool, cloud_logging: bool) -> list[LogLink]:
    store = InMemoryJobStore()
    spec = parse_spec(
        {"job_id": "j-1", "name": "train", "owner": "a@x.com", "accelerator_type": "v4-16", "command": "true"}
    )
    job, event = new_job(spec, "us-central2-b", T0)
    first = AttemptUsage(1, 8, T0, held_from=T0, ended_at=T0 + timedelta(minutes=5), capacity_lost=True)
    second = AttemptUsage(2, 8, T0 + timedelta(minutes=6), held_from=T0 + timedelta(minutes=7))
    store.create(job.evolve(state=JobState.RUNNING, attempt=2, usage=(first, second)), event)
    folder = "gs://p-logs/logs/jobs/j-1/attempt-1/"
    store.record_attempt_logs(
        "j-1", AttemptLogs(1, folder + "attempt.log", {0: folder + "worker-0.log", 1: folder + "worker-1.log"}, T0)
    )
    settings = Settings(project="p", logs_bucket="p-logs", local_stack=local, cloud_logging=cloud_logging)
    api = JobsApi(SimpleNamespace(warm=None, access=None), store, settings)  # type: ignore[arg-type]
    return (
        DashboardViews(api, lambda: T0 + timedelta(minutes=30), InMemoryUsageJobs(store))
        .job("a@x.com", "j-1")
        .log_links
    )


def test_the_job_page_links_each_attempts_folder_its_exported_logs_and_its_cloud_logging() -> None:
    """Attempt 1 (exported): folder, combined log, two workers' logs, Logs Explorer; attempt 2
    (running): its folder, where its chunks are, and Logs Explorer. Every link opens a console page."""
    links = _page_links(local=False, cloud_logging=True)
    assert [link.what for link in links] == [
        "attempt 1: output folder",
        "attempt 1: every worker's log",
        "attempt 1: worker 0's log",
        "attempt 1: worker 1's log",
        "attempt 1: Cloud Logging",
        "attempt 2: output folder",
        "attempt 2: Cloud Logging",
    ]
    assert links[0].text == "gs://p-logs/logs/jobs/j-1/attempt-1/"
    assert links[0].url == CONSOLE + "p-logs/logs/jobs/j-1/attempt-1/?project=p"
    assert links[2].url == CONSOLE + "_details/p-logs/logs/jobs/j-1/attempt-1/worker-0.log?project=p"
    assert links[6].url == attempt_output_link("p", "", "j-1", 2, T0 + timedelta(minutes=6))


def test_without_cloud_logging_no_explorer_link_and_locally_no_link_at_all() -> None:
    """Output not sent to Cloud Logging: no Explorer link. The local stack: the same gs:// URIs
    as text, none linked (the console opens nothing of the emulators), no Explorer link."""
    assert all("Cloud Logging" not in link.what for link in _page_links(local=False, cloud_logging=False))
    local = _page_links(local=True, cloud_logging=True)
    assert [link.what for link in local][:4] == [link.what for link in _page_links(False, False)][:4]
    assert all(link.url is None and link.text.startswith("gs://") for link in local)

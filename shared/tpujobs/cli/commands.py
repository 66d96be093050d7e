"""The `tpujobs` command line (contract section 5).

It submits by publishing to `tpujobs-submit`, exactly as any other client would, and
reads job documents from Firestore. Pointed at the local stack by the environment that
`tpujobs dev env` prints, or by the stack file `tpujobs dev up` leaves behind.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Column, Table

from tpujobs.config import Settings
from tpujobs.domain.job import Job, JobEvent
from tpujobs.domain.spec import SpecError, derive_job_id, parse_spec
from tpujobs.domain.states import JobState
from tpujobs.terminal import shown, uncontrolled
from tpujobs.topology import CONTROL, SUBMIT

app = typer.Typer(help="Run training jobs on Cloud TPUs that survive preemption.", no_args_is_help=True)
out = Console()
err = Console(stderr=True)

_TYPED_FIELDS = {
    "slices",
    "max_restarts",
    "zones",
    "on_demand_after_preemptions",
    "preemption_window_minutes",
}  # --set values parsed as YAML, not text


def _settings() -> Settings:
    """Settings from the environment, filled from a running local stack where unset."""
    from tpujobs.dev.stack import stack_environment

    for name, value in stack_environment().items():
        os.environ.setdefault(name, value)
    return Settings.from_env()


def _store(settings: Settings) -> Any:
    from google.cloud import firestore

    from tpujobs.adapters.firestore_store import FirestoreJobStore

    return FirestoreJobStore(firestore.Client(project=settings.project))


def apply_overrides(spec: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`--set key=value` onto a spec dict; `env.NAME=value` and `labels.key=value` set map entries."""
    result = dict(spec)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--set {item!r} is not of the form key=value")
        value: Any = yaml.safe_load(raw) if key in _TYPED_FIELDS else raw
        head, dot, rest = key.partition(".")
        if dot:
            result[head] = {**(result.get(head) or {}), rest: value}
        else:
            result[key] = value
    return result


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Job spec, YAML or JSON.")],
    set_: Annotated[list[str], typer.Option("--set", help="Override a field: key=value.")] = [],  # noqa: B006
    wait: Annotated[bool, typer.Option(help="Follow the job until it ends.")] = False,
) -> None:
    """Submit a job: through the jobs API when TPUJOBS_API_URL is set (the owner verified), else
    by publishing its spec to tpujobs-submit."""
    from tpujobs.adapters.pubsub import Publisher

    loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
    if not isinstance(loaded, dict):
        raise typer.BadParameter(f"{file} must hold a mapping of job spec fields")
    spec = apply_overrides(loaded, set_)
    code_dir = spec.pop("code_dir", None)  # a CLI convenience: uploaded, then named by code_uri
    if code_dir is not None:
        spec["code_uri"] = "gs://placeholder/code.tar.gz"  # validated below, replaced after upload
    try:  # the function validates again; this only saves a round trip for obvious mistakes
        parse_spec(spec, message_id="local-check")
    except SpecError as error:
        err.print(f"[red]Invalid spec:[/red] {shown(error)}")
        raise typer.Exit(2) from None
    for name in credential_like_env_names(spec.get("env")):
        err.print(
            f"[yellow]Warning:[/yellow] env {shown(name)} looks like a credential. env values are stored "
            "with the job and shown to its owner and admins; put it in Secret Manager "
            f"(tpujobs secret set) and name it under secrets: {{{shown(name)}: ...}} instead."
        )
    settings = _settings()
    if code_dir is not None:
        spec["code_uri"], spec["code_sha256"] = upload_code(settings, (file.parent / str(code_dir)).resolve())
    url = os.environ.get("TPUJOBS_API_URL", "").strip()
    if url:  # the jobs API: the owner is who calls, verified
        request = {"action": "submit", "request_id": uuid.uuid4().hex, **spec}
        answer = _ask_api(settings, url, request, str(spec.get("owner", "")))
        job_id = str(answer.get("job_id"))
        out.print(f"Submitted [bold]{shown(job_id)}[/bold] through the jobs API ({shown(answer.get('state'))})")
    else:  # the topic: the owner is a claim (owner_verified: false)
        message_id = Publisher.build(settings.project, settings.prefix).publish_json(SUBMIT, spec)
        job_id = spec.get("job_id") or derive_job_id(spec["name"], message_id)
        out.print(f"Submitted [bold]{shown(job_id)}[/bold] (message {shown(message_id)})")
    if wait:
        _follow(settings, job_id, until=lambda job: job.state.is_terminal)


def upload_code(settings: Settings, directory: Path) -> tuple[str, str]:
    """Upload a local code directory to the logs bucket; its gs:// URI and SHA-256."""
    from tpujobs.adapters.storage import build_client, upload_code_dir

    if not directory.is_dir():
        raise typer.BadParameter(f"code_dir {directory} is not a directory")
    uri, digest = upload_code_dir(build_client(settings.project), settings.logs_bucket, directory)
    out.print(f"Uploaded {shown(directory)} to {shown(uri)} (sha256 {shown(digest[:12])}...)")
    return uri, digest


_CREDENTIAL_NAME = re.compile(r".*(_TOKEN|_KEY)$|.*(SECRET|PASSWORD).*")


def credential_like_env_names(env: object) -> list[str]:
    """Names of `env` that look like credentials (*_TOKEN, *_KEY, *SECRET*, *PASSWORD*)."""
    if not isinstance(env, dict):
        return []
    return sorted(name for name in env if isinstance(name, str) and _CREDENTIAL_NAME.fullmatch(name))


def _follow(settings: Settings, job_id: str, until: Any, timeout: float = 24 * 3600) -> Job | None:
    """Print the job's new timeline entries until `until(job)` holds."""
    store = _store(settings)
    seen = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = store.get(job_id)
        if job is not None:
            for event in store.events(job_id)[seen:]:
                out.print(f"{_when(event.at)}  {event.to_state.value:<13} {shown(event.reason)}")
                seen += 1
            if until(job):
                return job
        time.sleep(0.5)
    return None


@app.command()
def cancel(
    job_id: str,
    owner: Annotated[
        str | None,
        typer.Option(
            help="Who asks, locally: the job's owner or an admin. Default: $TPUJOBS_OWNER, else your "
            "login. Deployed, your ID token says who you are and this is ignored."
        ),
    ] = None,
    wait: Annotated[bool, typer.Option(help="Without an API URL: wait until the job is CANCELLED.")] = True,
) -> None:
    """Cancel a job: its queued resource is deleted and its workers stop.

    With TPUJOBS_API_URL set (the local stack sets it), the `jobs` HTTP function cancels at
    once and says why not (not signed in, not yours, no such job). Locally it is told who
    you are by --owner; deployed, by a Google ID token for that URL (audience
    $TPUJOBS_API_AUDIENCE if set): a service account's from google-auth (the metadata
    server, or GOOGLE_APPLICATION_CREDENTIALS), else `gcloud auth print-identity-token`.
    Without an API URL the request is published to tpujobs-control.
    """
    import getpass

    from tpujobs.adapters.pubsub import Publisher

    settings = _settings()
    who = owner or os.environ.get("TPUJOBS_OWNER") or getpass.getuser()
    api_url = os.environ.get("TPUJOBS_API_URL", "").strip()
    if api_url:
        _cancel_over_http(settings, api_url, job_id, who)
        return
    Publisher.build(settings.project, settings.prefix).publish_json(
        CONTROL, {"action": "cancel", "job_id": job_id, "owner": who}
    )
    out.print(f"Asked to cancel [bold]{shown(job_id)}[/bold] as {shown(who)}.")
    if wait:
        job = _follow(settings, job_id, until=lambda job: job.state.is_terminal, timeout=60)
        if job is None or job.state is not JobState.CANCELLED:
            state = job.state.value if job else "unknown"
            err.print(
                f"[red]{shown(job_id)} is {state}, not CANCELLED[/red] "
                f"(see `tpujobs describe {shown(job_id)}` and the rejections collection)."
            )
            raise typer.Exit(1)


_REFUSALS = {
    401: "Not signed in",
    403: "Not allowed",
    404: "No such job",
    409: "Not cancelled",
}


def _cancel_over_http(settings: Settings, url: str, job_id: str, who: str) -> None:
    """POST a cancel to the `jobs` function; print its answer, exit 1 unless it cancelled."""
    import json
    import urllib.error
    import urllib.request

    from tpujobs.api import CALLER_HEADER

    headers = {"Content-Type": "application/json"}
    if settings.local_stack:
        headers[CALLER_HEADER] = who
    else:
        headers["Authorization"] = f"Bearer {_id_token(url)}"
    data = json.dumps({"action": "cancel", "job_id": job_id}).encode()
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    # The local stack is on loopback: never through a proxy.
    opener = urllib.request.build_opener(*([urllib.request.ProxyHandler({})] if settings.local_stack else []))
    try:
        with opener.open(request, timeout=60) as answer:
            status, raw = answer.status, answer.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    except OSError as error:
        err.print(f"[red]Could not reach the jobs API at {shown(url)}:[/red] {shown(error)}")
        raise typer.Exit(1) from None
    try:
        body = json.loads(raw)
    except ValueError:
        body = {"error": raw.decode("utf-8", "replace")[:500]}
    if status == 200:
        before = body.get("previous_state")
        if before == "CANCELLED":
            out.print(f"[bold]{shown(job_id)}[/bold] was already CANCELLED.")
        else:
            out.print(f"Cancelled [bold]{shown(job_id)}[/bold] (it was {shown(before)}).")
        return
    reason = body.get("error") or f"HTTP {status}"
    err.print(f"[red]{_REFUSALS.get(status, f'Failed (HTTP {status})')}:[/red] {shown(reason)}")
    raise typer.Exit(1)


def _id_token(url: str) -> str:
    """A Google ID token for the jobs API: a service account's, else the gcloud user's."""
    import subprocess

    from google.auth import exceptions
    from google.auth.transport.requests import Request
    from google.oauth2 import id_token

    audience = (os.environ.get("TPUJOBS_API_AUDIENCE", "").split(",")[0].strip()) or url
    try:
        return id_token.fetch_id_token(Request(), audience)
    except exceptions.GoogleAuthError:
        pass  # user credentials cannot mint a token for an audience: ask gcloud
    try:
        found = subprocess.run(["gcloud", "auth", "print-identity-token"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        found = None
    token = found.stdout.strip() if found is not None and found.returncode == 0 else ""
    if not token:
        err.print(
            "[red]No Google ID token:[/red] run `gcloud auth login`, or set "
            "GOOGLE_APPLICATION_CREDENTIALS to a service account key."
        )
        raise typer.Exit(1)
    return token


@app.command("list")
def list_jobs(
    state: Annotated[str | None, typer.Option(help="Only jobs in this state.")] = None,
    owner: Annotated[str | None, typer.Option(help="Only jobs of this owner.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many jobs.")] = 50,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Keep the table on screen, refreshed, until Ctrl-C.")
    ] = False,
    interval: Annotated[float, typer.Option(min=0.2, help="Seconds between refreshes with --watch.")] = 2.0,
) -> None:
    """List jobs, newest first: state, attempt, age, chip-hours and owner."""
    if state and state.upper() not in JobState.__members__:
        raise typer.BadParameter(f"--state must be one of {', '.join(JobState.__members__)}")
    store = _store(_settings())

    def current() -> Any:
        jobs = store.list(state=state.upper() if state else None, owner=owner, limit=limit)
        return jobs_table(jobs, datetime.now(timezone.utc)) if jobs else "No jobs."

    if not watch:
        out.print(current())
        return
    watch_screen(current, interval)


def watch_screen(render: Any, interval: float, refreshes: int | None = None) -> None:
    """Redraw `render()` in place every `interval` seconds, like a queue monitor; Ctrl-C ends it."""
    import time

    from rich.live import Live

    redrawn = 0
    try:
        with Live(render(), console=out, auto_refresh=False, transient=False) as live:
            while refreshes is None or redrawn < refreshes:
                time.sleep(interval)
                live.update(render(), refresh=True)
                redrawn += 1
    except KeyboardInterrupt:
        pass


def jobs_table(jobs: list[Job], now: datetime) -> Table:
    """One row per job; chip-hours count a running attempt up to `now`."""
    counts = {s: sum(job.state is s for job in jobs) for s in JobState}
    summary = "  ".join(f"{_styled(s)} {n}" for s, n in counts.items() if n)
    # Job ids are what people copy into other commands: never cut them.
    longest = max((len(uncontrolled(job.job_id)) for job in jobs), default=3)
    table = Table(
        Column("JOB", no_wrap=True, min_width=longest),
        Column("STATE", no_wrap=True),
        Column("ATTEMPT", justify="right"),
        Column("ACCELERATOR", no_wrap=True),
        Column("ZONE", no_wrap=True),
        Column("OWNER"),
        Column("AGE", justify="right"),
        Column("CHIP-H", justify="right"),
        Column("GOODPUT", justify="right"),
        caption=f"{summary}   as of {_when(now)[:19]} UTC",
        caption_justify="left",
    )
    for job in jobs:
        totals = job.accounting(now=None if job.state.is_terminal else now)
        table.add_row(  # every field from a spec or a message goes through shown()
            shown(job.job_id),
            _styled(job.state),
            str(job.attempt),
            shown(f"{job.spec.slices} x {job.spec.accelerator_type}"),
            shown(job.zone),
            shown(job.owner),
            _age(job.created_at, now),
            _chip_hours(totals.chip_hours),
            _share(totals.goodput),
        )
    return table


@app.command()
def describe(
    job_id: str,
    owner: Annotated[
        str | None,
        typer.Option(
            help="Who asks, locally, when TPUJOBS_API_URL is set. Default: $TPUJOBS_OWNER, else "
            "your login. Deployed, your ID token says who you are and this is ignored."
        ),
    ] = None,
) -> None:
    """Show a job's fields, what it cost per attempt, and its timeline.

    With TPUJOBS_API_URL set (the local stack sets it), the `jobs` HTTP function answers, as
    for `tpujobs cancel`, and env values are shown only to the job's owner or an admin.
    Without it, Firestore is read directly.
    """
    settings = _settings()
    api_url = os.environ.get("TPUJOBS_API_URL", "").strip()
    if api_url:
        import getpass

        who = owner or os.environ.get("TPUJOBS_OWNER") or getpass.getuser()
        job, events, logs = _describe_over_http(settings, api_url, job_id, who)
        out.print(describe_tables(job, events, logs, datetime.now(timezone.utc)))
        return
    store = _store(settings)
    found = store.get(job_id)
    if found is None:
        err.print(f"[red]No job {shown(repr(job_id))}.[/red]")
        raise typer.Exit(1)
    logs = {u.attempt: store.attempt_logs(job_id, u.attempt) for u in found.usage}
    out.print(describe_tables(found, store.events(job_id), logs, datetime.now(timezone.utc)))


def _describe_over_http(settings: Settings, url: str, job_id: str, who: str) -> Any:
    """The job, its timeline and its exported attempts, from the `jobs` function; exit 1 on refusal."""
    from tpujobs import api_client

    return api_client.described(_ask_api(settings, url, {"action": "describe", "job_id": job_id}, who))


def _ask_api(settings: Settings, url: str, request: dict[str, Any], who: str) -> dict[str, Any]:
    """POST one request to the `jobs` function as `who` (locally the caller header, deployed an
    ID token); its JSON answer, or a printed refusal and exit 1."""
    from tpujobs import api_client
    from tpujobs.api import CALLER_HEADER

    headers = {CALLER_HEADER: who} if settings.local_stack else {"Authorization": f"Bearer {_id_token(url)}"}
    try:
        status, body = api_client.post(url, request, headers, direct=settings.local_stack)
    except api_client.Unreachable as error:
        err.print(f"[red]Could not reach the jobs API at {shown(url)}:[/red] {shown(error)}")
        raise typer.Exit(1) from None
    if status != 200:
        reason = body.get("error") or f"HTTP {status}"
        err.print(f"[red]{_REFUSALS.get(status, f'Failed (HTTP {status})')}:[/red] {shown(reason)}")
        raise typer.Exit(1)
    return body


def describe_tables(
    job: Job, events: list[JobEvent], logs: dict[int, Any] | None = None, now: datetime | None = None
) -> Table:
    """The job's fields, its attempts (chip-hours, lost time, logs) and its timeline."""
    until = None if job.state.is_terminal else now
    totals = job.accounting(now=until)
    fields = Table(show_header=False, box=None, title=f"Job {shown(job.job_id)}", title_justify="left")
    fields.add_column(style="bold")
    fields.add_column()
    spec = job.spec
    # Every value from a spec, a message or a report goes through shown(): no markup, no control characters.
    rows: list[tuple[str, Any]] = [
        ("name", shown(job.name)),
        ("state", _styled(job.state)),
        ("reason", shown(job.state_reason)),
        ("owner", shown(job.owner)),
        ("accelerator", shown(f"{spec.slices} x {spec.accelerator_type} ({spec.chips} chips, {spec.capacity})")),
        ("zone", shown(job.zone)),
        ("attempt", f"{job.attempt} (restarts {job.restarts} of {spec.max_restarts})"),
        ("queued resource", shown(f"{job.queued_resource} [{job.capacity_state or '-'}]")),
        ("command", shown(spec.command)),
        ("rules", shown(f"on_preemption={spec.on_preemption} on_error={spec.on_error}")),
        ("labels", shown(", ".join(f"{k}={v}" for k, v in sorted(spec.labels.items())) or "-")),
        ("env", shown(", ".join(f"{k}={v}" for k, v in sorted(spec.env.items())) or "-")),
        ("created", _when(job.created_at)),
        ("started", _when(job.started_at)),
        ("ended", _when(job.ended_at)),
        ("exit code", "-" if job.exit_code is None else str(job.exit_code)),
        (
            "chip-hours",
            f"{_chip_hours(totals.chip_hours)} ({_chip_hours(totals.useful_chip_hours)} useful, "
            f"{_chip_hours(totals.lost_chip_hours)} lost to preemption)",
        ),
        ("goodput", _share(totals.goodput)),
        ("queue wait", _duration(totals.queue_wait_seconds)),
        ("time lost", _duration(totals.lost_seconds)),
        ("logs", shown(job.log_uri or "-")),
    ]
    for name, value in rows:
        fields.add_row(name, value)
    attempts = Table(
        Column("#", justify="right"),
        Column("ZONE", no_wrap=True),
        Column("WAITED", justify="right"),
        Column("HELD FROM (UTC)", no_wrap=True),
        Column("ENDED (UTC)", no_wrap=True),
        Column("CHIP-H", justify="right"),
        Column("LAST CHECKPOINT", no_wrap=True),
        Column("LOST", justify="right"),
        Column("LOGS", overflow="fold"),
        title="Attempts",
        title_justify="left",
    )
    for usage in job.usage:
        at = usage.ended_at or until or job.updated_at or usage.waiting_since
        exported = (logs or {}).get(usage.attempt)
        lost = _duration(usage.lost_seconds()) if usage.capacity_lost else "-"
        if usage.capacity_lost and not usage.work_kept:
            lost += " (rerun)"
        attempts.add_row(
            str(usage.attempt),
            shown(usage.zone or job.zone),
            _duration(usage.queue_wait_seconds(at)),
            _when(usage.held_from)[5:19] if usage.held_from else "-",
            _when(usage.ended_at)[5:19] if usage.ended_at else "-",
            _chip_hours(usage.chip_hours(at)),
            _when(usage.last_checkpoint_at)[5:19] if usage.last_checkpoint_at else "-",
            lost,
            shown(exported.log_uri) if exported else ("not exported yet" if usage.ended_at else "running"),
        )
    # Narrow terminals keep the reason readable by dropping what it already says.
    wide = out.width >= 140
    columns = ["#", "AT (UTC)", *(["FROM"] if wide else []), "TO", *(["SOURCE", "ATTEMPT"] if wide else [])]
    timeline = Table(
        *(Column(name, no_wrap=True) for name in columns),
        Column("REASON", ratio=1, min_width=30),
        title="Timeline",
        title_justify="left",
    )
    for event in events:
        cells = [
            str(event.seq),
            _when(event.at)[11:],  # the date is in `created`; the time of day reads faster
            *([event.from_state.value if event.from_state else "-"] if wide else []),
            _styled(event.to_state),
            *([shown(event.source), str(event.attempt)] if wide else []),
            shown(event.reason),
        ]
        timeline.add_row(*cells)
    grid = Table.grid(padding=(1, 0))
    grid.add_row(fields)
    if job.usage:
        grid.add_row(attempts)
    grid.add_row(timeline)
    return grid


def _chip_hours(value: float) -> str:
    return f"{value:.2f}" if value >= 0.01 or value == 0 else f"{value:.4f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


_STATE_STYLE = {
    JobState.QUEUED: "yellow",
    JobState.PROVISIONING: "cyan",
    JobState.RUNNING: "green",
    JobState.RECOVERING: "magenta",
    JobState.SUCCEEDED: "bold green",
    JobState.FAILED: "bold red",
    JobState.CANCELLED: "dim",
}


def _styled(state: JobState) -> str:
    return f"[{_STATE_STYLE[state]}]{state.value}[/]"


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _age(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "-"
    seconds = int((now - moment).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@app.command("logs")
def show_logs(
    job_id: str,
    attempt: Annotated[int | None, typer.Option(min=1, help="Which attempt. Default: the job's current one.")] = None,
    worker: Annotated[
        int | None,
        typer.Option(min=0, help="Only worker K's output (K = slice x hosts per slice + worker)."),
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Print new output as it arrives, until the attempt ends.")
    ] = False,
) -> None:
    """Show a job's output: an attempt's exported log, or its output chunks as they are."""
    from tpujobs.adapters.storage import build_client
    from tpujobs.logs_export import LogObjects, LogReader, attempt_has_ended

    settings = _settings()
    store = _store(settings)
    job = store.get(job_id)
    if job is None:
        err.print(f"[red]No job {shown(repr(job_id))}.[/red]")
        raise typer.Exit(1)
    number = attempt or job.attempt
    if number > job.attempt:
        err.print(f"[red]{shown(job_id)} has no attempt {number}[/red] (it is at attempt {job.attempt}).")
        raise typer.Exit(1)
    if worker is not None and worker >= job.total_workers:
        err.print(f"[red]{shown(job_id)} has workers 0 to {job.total_workers - 1}, not {worker}.[/red]")
        raise typer.Exit(1)
    reader = LogReader(LogObjects(build_client(settings.project), settings.logs_bucket), store)
    if follow and not attempt_has_ended(job, number):
        err.print(f"[dim]Following attempt {number} of {shown(job_id)} until it ends.[/dim]")
        reader.follow(job, number, _write_raw, worker)
        return
    text, exported = reader.show(job, number, worker)
    if not exported:
        what = "output" if worker is None else f"worker {worker}'s output"
        if text:
            err.print(f"[dim]Attempt {number} is not exported yet: its {what} as uploaded so far.[/dim]")
        else:
            err.print(f"No {what} for attempt {number} yet.")
    _write_raw(text)


def _write_raw(data: bytes) -> None:
    """A job's output as it is: bytes, never rich markup."""
    import sys

    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        sys.stdout.write(data.decode("utf-8", "replace"))
        sys.stdout.flush()
        return
    buffer.write(data)
    buffer.flush()


@app.command("dead-letters")
def dead_letters(
    topic: Annotated[str | None, typer.Option(help="Only those from this topic, e.g. tpujobs-submit.")] = None,
    replay: Annotated[
        str | None, typer.Option(metavar="ID", help="Publish this dead letter again to its original topic.")
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many.")] = 50,
) -> None:
    """List messages that failed too many deliveries, newest first; --replay ID sends one again."""
    from rich.text import Text

    from tpujobs import dead_letters as letters
    from tpujobs.errors import PermanentError, TransientError
    from tpujobs.runtime import utc_now

    service = letters.build(_settings(), utc_now)
    if replay is not None:
        try:
            letter, new_id = service.replay(replay)
        except letters.UnknownDeadLetter:
            err.print(f"[red]No dead letter {shown(repr(replay))}.[/red] `tpujobs dead-letters` lists them.")
            raise typer.Exit(1) from None
        except (PermanentError, TransientError) as error:
            err.print(f"[red]Not replayed:[/red] {shown(error)}")
            raise typer.Exit(1) from None
        again = f" (replayed before at {_when(letter.replayed_at)})" if letter.replayed_at else ""
        out.print(
            f"Replayed dead letter [bold]{shown(letter.message_id)}[/bold] to {shown(letter.topic)} "
            f"as message {shown(new_id)}{again}."
        )
        return
    found = service.list(topic=topic, limit=limit)
    if not found:
        out.print(f"No dead letters{f' from {shown(topic)}' if topic else ''}.")
        return
    # Ids and topics are what people copy: never cut them. The payload gets what is left
    # of the terminal (at most 60 characters); a narrow one drops the year and REPLAYED.
    id_width = max(2, *(len(uncontrolled(letter.message_id)) for letter in found))
    topic_width = max(5, *(len(uncontrolled(letter.topic or "?")) for letter in found))
    wide = out.width >= 120
    when = (lambda moment: _when(moment)[:16]) if wide else (lambda moment: _when(moment)[5:16])
    columns = 6 if wide else 5
    fixed = id_width + (16 if wide else 11) + topic_width + 8 + (16 if wide else 0) + 3 * columns + 1
    excerpt_width = max(8, min(60, out.width - fixed))
    table = Table(
        Column("ID", no_wrap=True, min_width=id_width),
        Column("WHEN (UTC)", no_wrap=True),
        Column("TOPIC", no_wrap=True, min_width=topic_width),
        Column("ATTEMPTS", justify="right", no_wrap=True),
        Column("PAYLOAD", no_wrap=True, overflow="ellipsis"),
        *([Column("REPLAYED", no_wrap=True)] if wide else []),
    )
    for letter in found:
        # One line: newlines and runs of spaces folded, then any other control character made visible.
        excerpt = uncontrolled(" ".join(letter.payload.split()))
        if len(excerpt) > excerpt_width:
            excerpt = excerpt[: excerpt_width - 1] + "…"
        table.add_row(
            shown(letter.message_id),
            when(letter.at),
            shown(letter.topic or "?"),
            "-" if letter.delivery_attempts is None else str(letter.delivery_attempts),
            Text(excerpt),  # a payload is data, never rich markup
            *([when(letter.replayed_at)] if wide else []),
        )
    out.print(table)


def _mount_subcommands() -> None:
    from tpujobs.demo import demo
    from tpujobs.dev.cli import dev_app
    from tpujobs.quota_cli import quota_app
    from tpujobs.secret_cli import secret_app

    app.add_typer(dev_app, name="dev", help="The local stack: emulators, TPU simulator, functions.")
    app.add_typer(quota_app, name="quota", help="Chip quotas per accelerator family and zone.")
    app.add_typer(secret_app, name="secret", help="Secrets for a job's `secrets` field, in Secret Manager.")
    app.command()(demo)


_mount_subcommands()

"""The job verbs of `tpujobs`: submit, validate, list, describe, cancel, logs, dead letters, rejections.

Writes go to the `jobs` API when TPUJOBS_API_URL is set (the owner verified), else to the
topics, exactly as any other client would. Reads go through `cli.reads`: the API when one is
configured, else Firestore. What is printed is `cli.tables`' business.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml

from tpujobs.cli import tables
from tpujobs.cli.common import (
    Format,
    Group,
    Output,
    Stop,
    api_url,
    ask_api,
    caller,
    choose_project,
    err,
    out,
    print_document,
    settings,
)
from tpujobs.cli.reads import reads
from tpujobs.cli.tables import describe_tables, jobs_table, show
from tpujobs.cli.terminal import shown
from tpujobs.domain.job import Job
from tpujobs.domain.spec import SpecError, derive_job_id, parse_spec
from tpujobs.domain.states import JobState
from tpujobs.engine.ports import JobFilter
from tpujobs.engine.settings import Settings
from tpujobs.engine.topology import CONTROL, SUBMIT

if TYPE_CHECKING:
    from tpujobs.cli.cloud_output import OutputRead

__all__ = ["app", "describe_tables", "jobs_table", "watch_screen"]

# Help texts are Markdown: a docstring's paragraphs reflow to the terminal's width. Typer's default
# ("rich") keeps the source's line breaks, which broke summaries mid-sentence (tests/unit/cli/test_cli_help.py).
# The mode holds for every group mounted here.
app = typer.Typer(
    cls=Group,
    help="Run training jobs on Cloud TPUs that survive preemption.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)

_TYPED_FIELDS = {
    "slices",
    "max_restarts",
    "zones",
    "on_demand_after_preemptions",
    "preemption_window_minutes",
    "internal_ips",
    "tags",
    "data_disks",
    "boot_disk_size_gb",
}  # --set values parsed as YAML, not text

Owner = Annotated[
    str | None,
    typer.Option(
        help="Who asks, locally, when TPUJOBS_API_URL is set. Default: $TPUJOBS_OWNER, else your login. "
        "Deployed, your ID token says who you are and this is ignored."
    ),
]
# Who asks to change a job (cancel, resume, rerun): its owner or an admin.
OwnerOrAdmin = Annotated[
    str | None,
    typer.Option(
        help="Who asks, locally: the job's owner or an admin. Default: $TPUJOBS_OWNER, else your login. "
        "Deployed, your ID token says who you are and this is ignored."
    ),
]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"tpujobs {version('tpujobs')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            from tpujobs import __version__

            typer.echo(f"tpujobs {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    project: Annotated[
        str | None,
        typer.Option(
            "--project",
            help="The Google Cloud project. Default: $GOOGLE_CLOUD_PROJECT, else gcloud's, else the local stack's.",
        ),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Run training jobs on Cloud TPUs that survive preemption."""
    choose_project(project)


# --- submit and validate -------------------------------------------------------------------


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


def checked_spec(file: Path, overrides: list[str]) -> tuple[dict[str, Any], str | None]:
    """The spec in `file` with the overrides, checked as the submit function checks it (exit 2
    with the function's sentence if not); and its `code_dir`, a CLI convenience, if any."""
    try:
        loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise Stop(f"Invalid spec: {file} is not YAML or JSON ({str(error).splitlines()[0]}).", code=2) from None
    if not isinstance(loaded, dict):
        raise Stop(f"Invalid spec: {file} must hold a mapping of job spec fields.", code=2)
    spec = apply_overrides(loaded, overrides)
    code_dir = spec.pop("code_dir", None)
    candidate = dict(spec)
    if code_dir is not None:
        candidate["code_uri"] = "gs://placeholder/code.tar.gz"  # replaced by the upload's
    try:
        parse_spec(candidate, message_id="local-check")
    except SpecError as error:
        raise Stop(f"Invalid spec: {error}", code=2) from None
    for name in credential_like_env_names(spec.get("env")):
        err.print(
            f"[yellow]Warning:[/yellow] env {shown(name)} looks like a credential. env values are stored "
            "with the job and shown to its owner and admins; put it in Secret Manager "
            f"(tpujobs secret set) and name it under secrets: {{{shown(name)}: ...}} instead."
        )
    return spec, None if code_dir is None else str(code_dir)


SpecFile = Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Job spec, YAML or JSON.")]
Overrides = Annotated[list[str], typer.Option("--set", help="Override a field: key=value.")]


@app.command()
def validate(file: SpecFile, set_: Overrides = []) -> None:  # noqa: B006
    """Check a job spec without submitting it: the same errors as submit, exit 2 if invalid."""
    spec, _ = checked_spec(file, set_)
    out.print(f"{shown(file)} is a valid job spec ({shown(spec.get('accelerator_type'))}).")


@app.command()
def submit(
    file: SpecFile,
    set_: Overrides = [],  # noqa: B006
    wait: Annotated[bool, typer.Option(help="Follow the job until it ends; stop with the reason if refused.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only check the spec, as `tpujobs validate`.")] = False,
) -> None:
    """Submit a job: through the jobs API when TPUJOBS_API_URL is set (the owner verified), else
    by publishing its spec to tpujobs-submit."""
    spec, code_dir = checked_spec(file, set_)
    if dry_run:
        out.print(f"{shown(file)} is a valid job spec: nothing submitted (--dry-run).")
        return
    config = settings()
    if code_dir is not None:
        spec.update(upload_code(config, (file.parent / code_dir).resolve(), spec.get("service_account")))
    else:
        spec.update(pinned_code(config, spec))
    message_id = None
    url = api_url()
    if url:  # the jobs API: the owner is who calls, verified; a refusal is its answer
        request = {"action": "submit", "request_id": uuid.uuid4().hex, **spec}
        answer = ask_api(config, url, request, str(spec.get("owner", ""))) or {}
        job_id = str(answer.get("job_id"))
        out.print(f"Submitted [bold]{shown(job_id)}[/bold] through the jobs API ({shown(answer.get('state'))})")
    else:  # the topic: the owner is a claim (owner_verified: false)
        from tpujobs.adapters.pubsub import Publisher

        message_id = Publisher.build(config.project, config.prefix).publish_json(SUBMIT, spec)
        job_id = spec.get("job_id") or derive_job_id(spec["name"], message_id)
        out.print(f"Submitted [bold]{shown(job_id)}[/bold] (message {shown(message_id)})")
    _print_explorer_link(config, job_id, spec.get("cloud_logging"))
    if wait:
        follow(config, job_id, until=lambda job: job.state.is_terminal, message_id=message_id)


def pinned_code(config: Settings, spec: dict[str, Any]) -> dict[str, Any]:
    """For a `code_uri` the user gave: refuse one in another account's code prefix of the
    deployment's bucket (exit 2, as the submit function would), and record the tarball's
    `code_sha256` when the user gave none and this terminal can read it, so the agent refuses
    the tarball if it changes after submission. Unreadable: left to the user, with a warning."""
    from tpujobs.domain.naming import code_location_refusal

    code_uri, account = spec.get("code_uri"), spec.get("service_account")
    if not isinstance(code_uri, str):
        return {}
    refused = code_location_refusal(code_uri, config.logs_bucket, account if isinstance(account, str) else None)
    if refused is not None:
        raise Stop(f"Invalid spec: {refused}.", code=2)
    if spec.get("code_sha256") is not None or code_uri.endswith("/"):
        return {}
    from google.auth.exceptions import GoogleAuthError

    from tpujobs.adapters.storage import build_client
    from tpujobs.cli.code_upload import stored_tarball_sha256

    try:
        client = build_client(config.project)
    except GoogleAuthError:  # no credentials here: the same as an object this terminal cannot read
        client = None
    digest = None if client is None else stored_tarball_sha256(client, code_uri)
    if digest is None:
        err.print(
            f"[yellow]Warning:[/yellow] could not read {shown(code_uri)} to record its SHA-256: the hosts "
            "will unpack whatever is there when the job runs. Give code_sha256 in the spec to pin it."
        )
        return {}
    out.print(f"Recorded the SHA-256 of {shown(code_uri)} ({shown(digest[:12])}...) as code_sha256")
    return {"code_sha256": digest}


def upload_code(config: Settings, directory: Path, service_account: str | None = None) -> dict[str, Any]:
    """Pack a local code directory (.gitignore, .tpujobsignore, never .git; the size limit
    checked before anything is uploaded) and upload it under the code prefix of the account the
    job runs as (`service_account`, else the deployment's default): the spec fields it sets,
    `code_uri` and `code_sha256`, and `code_git_commit` and `code_git_dirty` when the directory
    is in a git checkout."""
    from tpujobs.adapters.storage import build_client
    from tpujobs.cli.code_packer import CodeDirError, max_code_bytes, pack
    from tpujobs.cli.code_upload import upload_code_package

    try:
        package = pack(directory, max_code_bytes(os.environ))
    except CodeDirError as error:
        raise Stop(str(error), code=2) from None
    now = datetime.now(timezone.utc)
    uri = upload_code_package(build_client(config.project), config.logs_bucket, package, now, service_account)
    fields: dict[str, Any] = {"code_uri": uri, "code_sha256": package.sha256}
    origin = ""
    if package.git_commit is not None:
        fields["code_git_commit"] = package.git_commit
        fields["code_git_dirty"] = package.git_dirty
        origin = f", git {package.git_commit[:12]}{' with uncommitted changes' if package.git_dirty else ''}"
    out.print(
        f"Uploaded {shown(directory)} ({len(package.files)} files{shown(origin)}) to {shown(uri)} "
        f"(sha256 {shown(package.sha256[:12])}...)"
    )
    return fields


_CREDENTIAL_NAME = re.compile(r".*(_TOKEN|_KEY)$|.*(SECRET|PASSWORD).*")


def credential_like_env_names(env: object) -> list[str]:
    """Names of `env` that look like credentials (*_TOKEN, *_KEY, *SECRET*, *PASSWORD*)."""
    if not isinstance(env, dict):
        return []
    return sorted(name for name in env if isinstance(name, str) and _CREDENTIAL_NAME.fullmatch(name))


def follow(
    config: Settings,
    job_id: str,
    until: Callable[[Job], bool],
    timeout: float = 24 * 3600,
    message_id: str | None = None,
    owner: str | None = None,
) -> Job | None:
    """Print the job's new timeline entries until `until(job)` holds. A message that was refused
    (its rejection recorded) ends it with the reason, exit 1."""
    from tpujobs.cli.api_client import described

    source = reads(config, owner)
    seen = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = source.describe(job_id)
        if answer is not None:
            job, events, _ = described(answer)
            for event in events[seen:]:
                out.print(f"{tables.when(event.at)}  {event.to_state.value:<13} {shown(event.reason)}")
                seen += 1
            if until(job):
                return job
        elif message_id is not None:
            refused = source.rejection(message_id)
            if refused is not None:
                raise Stop(f"Refused: {refused['reason']}")
        time.sleep(0.5)
    return None


# --- cancel ----------------------------------------------------------------------------------


@app.command()
def cancel(
    job_id: str,
    owner: OwnerOrAdmin = None,
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
    config = settings()
    who = caller(owner)
    url = api_url()
    if url:
        answer = ask_api(config, url, {"action": "cancel", "job_id": job_id}, who) or {}
        before = answer.get("previous_state")
        if before == "CANCELLED":
            out.print(f"[bold]{shown(job_id)}[/bold] was already CANCELLED.")
        else:
            out.print(f"Cancelled [bold]{shown(job_id)}[/bold] (it was {shown(before)}).")
        return
    from tpujobs.adapters.pubsub import Publisher

    Publisher.build(config.project, config.prefix).publish_json(
        CONTROL, {"action": "cancel", "job_id": job_id, "owner": who}
    )
    out.print(f"Asked to cancel [bold]{shown(job_id)}[/bold] as {shown(who)}.")
    if wait:
        job = follow(config, job_id, until=lambda job: job.state.is_terminal, timeout=60)
        if job is None or job.state is not JobState.CANCELLED:
            state = job.state.value if job else "unknown"
            raise Stop(
                f"{job_id} is {state}, not CANCELLED (see `tpujobs describe {job_id}` and `tpujobs rejections`)."
            )


# --- resume and rerun ------------------------------------------------------------------------

# The options resume and rerun share, declared once (typer reads the Annotated metadata of each alias).
_Zone = Annotated[str | None, typer.Option(help="Run the new attempt in this zone (replaces zones).")]
_Zones = Annotated[str | None, typer.Option(help="Zones in order of preference, comma separated.")]
_Capacity = Annotated[str | None, typer.Option(help="on-demand, spot or reserved.")]
_MaxRestarts = Annotated[int | None, typer.Option(help="The new attempt's restart budget.")]
_TimeLimit = Annotated[str | None, typer.Option(help="Replaces the spec's time_limit: 90s, 45m, 2h.")]
_RequestId = Annotated[
    str | None, typer.Option(help="Send the same id again to retry safely: one attempt is started at most.")
]
_Wait = Annotated[bool, typer.Option(help="Follow the job until it ends again.")]


@app.command()
def resume(
    job_id: str,
    owner: OwnerOrAdmin = None,
    zone: _Zone = None,
    zones: _Zones = None,
    capacity: _Capacity = None,
    max_restarts: _MaxRestarts = None,
    time_limit: _TimeLimit = None,
    request_id: _RequestId = None,
    wait: _Wait = False,
) -> None:
    """Continue a FAILED or CANCELLED job from its checkpoint: a new attempt, same job_id.

    The attempt gets TPUJOBS_RESUME=1 and the job's TPUJOBS_CHECKPOINT_URI, a fresh restart
    budget, and waits for admission like a new job. Only the owner or an admin may; only
    --zone/--zones, --capacity, --max-restarts and --time-limit may change.
    """
    overrides = _overrides(zone, zones, capacity, max_restarts, time_limit)
    _restart("resume", job_id, caller(owner), overrides, request_id or uuid.uuid4().hex, wait)


@app.command()
def rerun(
    job_id: str,
    owner: OwnerOrAdmin = None,
    zone: _Zone = None,
    zones: _Zones = None,
    capacity: _Capacity = None,
    max_restarts: _MaxRestarts = None,
    time_limit: _TimeLimit = None,
    request_id: _RequestId = None,
    wait: _Wait = False,
) -> None:
    """Run an ended job (SUCCEEDED, FAILED or CANCELLED) again from scratch, same job_id.

    As `resume`, but the new attempt starts fresh (TPUJOBS_RESUME=0) under the same
    checkpoint prefix: the command decides what to do with what is there.
    """
    overrides = _overrides(zone, zones, capacity, max_restarts, time_limit)
    _restart("rerun", job_id, caller(owner), overrides, request_id or uuid.uuid4().hex, wait)


def _overrides(
    zone: str | None, zones: str | None, capacity: str | None, max_restarts: int | None, time_limit: str | None
) -> dict[str, Any]:
    """The flags given, as the request's `overrides` (the service checks them as a spec)."""
    given = {
        "zone": zone,
        "zones": [z.strip() for z in zones.split(",") if z.strip()] if zones is not None else None,
        "capacity": capacity,
        "max_restarts": max_restarts,
        "time_limit": time_limit,
    }
    return {name: value for name, value in given.items() if value is not None}


def _restart(action: str, job_id: str, who: str, overrides: dict[str, Any], request_id: str, wait: bool) -> None:
    """Ask the jobs API (TPUJOBS_API_URL) or, without one, publish to tpujobs-control."""
    config = settings()
    url = api_url()
    request: dict[str, Any] = {"action": action, "job_id": job_id, "request_id": request_id}
    if overrides:
        request["overrides"] = overrides
    done = "Resumed" if action == "resume" else "Rerun"
    if url:
        answer = ask_api(config, url, request, who) or {}
        if answer.get("outcome") == "duplicate":
            out.print(f"[bold]{shown(job_id)}[/bold]: request {shown(request_id)} had already started its attempt.")
        else:
            out.print(
                f"{done} [bold]{shown(job_id)}[/bold]: attempt {shown(answer.get('attempt'))} is "
                f"{shown(answer.get('state'))} (request {shown(request_id)})."
            )
    else:
        from tpujobs.adapters.pubsub import Publisher

        message_id = Publisher.build(config.project, config.prefix).publish_json(CONTROL, {**request, "owner": who})
        out.print(f"Asked to {action} [bold]{shown(job_id)}[/bold] as {shown(who)} (request {shown(request_id)}).")
        started = follow(config, job_id, until=lambda job: request_id in job.restart_requests, timeout=60)
        if started is None:
            raise Stop(
                f"{job_id} did not start a new attempt for request {request_id} (message {message_id}): "
                "see `tpujobs rejections` and `tpujobs describe`."
            )
    if wait:
        follow(config, job_id, until=lambda job: job.state.is_terminal and request_id in job.restart_requests)


# --- list and describe -------------------------------------------------------------------------


@app.command("list")
def list_jobs(
    state: Annotated[list[str], typer.Option(help="Only jobs in this state (repeat for any of several).")] = [],  # noqa: B006
    owner: Annotated[str | None, typer.Option(help="Only jobs of this owner.")] = None,
    name: Annotated[str | None, typer.Option(help="Only jobs whose name starts with this.")] = None,
    label: Annotated[
        list[str], typer.Option(help="Only jobs with this label, key=value (repeat: every one must match).")
    ] = [],  # noqa: B006
    active: Annotated[bool, typer.Option("--active", help="Only jobs not ended: " + ", ".join(ACTIVE_GROUP))] = False,
    finished: Annotated[bool, typer.Option("--finished", help="Only ended jobs: " + ", ".join(FINISHED_GROUP))] = False,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many jobs.")] = 50,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Keep the table on screen, refreshed, until Ctrl-C.")
    ] = False,
    interval: Annotated[float, typer.Option(min=0.2, help="Seconds between refreshes with --watch.")] = 2.0,
    output: Output = Format.table,
    as_who: Annotated[
        str | None, typer.Option("--as", help="Who asks, locally, when TPUJOBS_API_URL is set (as --owner elsewhere).")
    ] = None,
) -> None:
    """List jobs, newest first: state, attempt, age, chip-hours, goodput, priority, owner and reason."""
    from tpujobs.cli.api_client import listed

    where = job_filter(state, owner, name, label, active=active, finished=finished)
    source = reads(settings(), as_who)

    def answer() -> dict[str, Any]:
        return source.jobs(where, limit)

    if output is not Format.table:
        print_document(answer(), output)
        return

    def current() -> tables.Sheet | str:
        jobs = listed(answer())
        return tables.jobs_sheet(jobs, datetime.now(timezone.utc)) if jobs else "No jobs."

    if not watch:
        show(out, current())
        return

    def screen() -> Any:
        shown_now = current()
        return shown_now.table(out.width) if isinstance(shown_now, tables.Sheet) else shown_now

    watch_screen(screen, interval)


ACTIVE_GROUP = ("QUEUED", "PROVISIONING", "RUNNING", "RECOVERING")  # list --active
FINISHED_GROUP = ("SUCCEEDED", "FAILED", "CANCELLED")  # list --finished


def job_filter(
    states: list[str],
    owner: str | None,
    name: str | None,
    labels: list[str],
    *,
    active: bool = False,
    finished: bool = False,
) -> JobFilter:
    """`list`'s options as one filter; typer.BadParameter naming the option that is wrong."""
    from tpujobs.domain.labels import LabelError, parse_label_pairs

    unknown = [s for s in states if s.upper() not in JobState.__members__]
    if unknown:
        raise typer.BadParameter(f"--state {unknown[0]!r} must be one of {', '.join(JobState.__members__)}")
    if active and finished:
        raise typer.BadParameter("--active and --finished exclude each other: give one")
    chosen = [s.upper() for s in states]
    group = ACTIVE_GROUP if active else FINISHED_GROUP if finished else ()
    if group and chosen:
        chosen = [s for s in chosen if s in group]
        if not chosen:
            raise typer.BadParameter(f"--state {states[0]} is never {'--active' if active else '--finished'}")
    try:
        wanted = parse_label_pairs(labels)
    except LabelError as error:
        raise typer.BadParameter(f"--label: {error}") from None
    if name is not None and not name:
        raise typer.BadParameter("--name must be the start of a job name, not empty")
    return JobFilter(states=tuple(chosen or group), owner=owner, name_prefix=name, labels=wanted)


def watch_screen(render: Callable[[], Any], interval: float, refreshes: int | None = None) -> None:
    """Redraw `render()` in place every `interval` seconds, like a queue monitor; Ctrl-C ends it."""
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


@app.command()
def describe(job_id: str, owner: Owner = None, output: Output = Format.table) -> None:
    """Show a job's fields, what it cost per attempt, and its timeline.

    With TPUJOBS_API_URL set (the local stack sets it), the `jobs` HTTP function answers, as
    for `tpujobs cancel`, and env values are shown only to the job's owner or an admin.
    Without it, Firestore is read directly.
    """
    from tpujobs.cli.api_client import described

    answer = reads(settings(), owner).describe(job_id)
    if answer is None:
        raise Stop(f"No such job: No job {job_id!r}.")
    if output is not Format.table:
        print_document(answer, output)
        return
    job, events, logs = described(answer)
    width = out.width if out.is_terminal else tables.WIDE
    show(out, describe_tables(job, events, logs, datetime.now(timezone.utc), width=width))
    from tpujobs.cli.notifications import notification_lines

    for line in notification_lines(answer):
        typer.echo(line)
    _print_output_link(answer.get("output_link"))


def _print_explorer_link(config: Settings, job_id: str, switch: object) -> None:
    """The job's output in the Logs Explorer, when it goes to Cloud Logging (for `submit`, which
    publishes to the CLI's own project)."""
    from tpujobs.cli.cloud_output import explorer_link

    _print_output_link(explorer_link(config, job_id, switch if isinstance(switch, bool) else None))


def _print_output_link(link: object) -> None:
    """The link as the describe answer gives it (the API builds it with the deployment's project)."""
    if isinstance(link, str) and link:
        typer.echo(f"Output in Cloud Logging (unverified there; `tpujobs logs` checks signatures): {link}")


# --- logs --------------------------------------------------------------------------------------


@app.command("logs")
def show_logs(
    job_id: str,
    attempt: Annotated[int | None, typer.Option(min=1, help="Which attempt. Default: the job's current one.")] = None,
    worker: Annotated[
        int | None,
        typer.Option(min=0, help="Only worker K's output (K = slice x hosts per slice + worker)."),
    ] = None,
    follow_: Annotated[
        bool, typer.Option("--follow", "-f", help="Print new output as it arrives, until the attempt ends.")
    ] = False,
    links: Annotated[
        bool, typer.Option("--links", help="Only the gs:// links of the exported logs (through the jobs API if set).")
    ] = False,
    owner: Owner = None,
) -> None:
    """Show a job's output: its verified lines in Cloud Logging, an attempt's exported log, or its
    output chunks as they are."""
    config = settings()
    if links:
        _print_links(config, job_id, attempt, owner)
        return
    url = api_url()
    if url and not follow_ and _api_output(config, url, job_id, attempt, worker, owner):
        return
    from google.cloud import firestore

    from tpujobs.adapters.firestore_store import FirestoreJobStore
    from tpujobs.engine.output_export import LogReader, attempt_has_ended
    from tpujobs.runtime.instances import build_log_objects

    store = FirestoreJobStore(firestore.Client(project=config.project))
    job = store.get(job_id)
    if job is None:
        raise Stop(f"No such job: No job {job_id!r}.")
    number = attempt or job.attempt
    if number > job.attempt:
        raise Stop(f"{job_id} has no attempt {number} (it is at attempt {job.attempt}).")
    if worker is not None and worker >= job.total_workers:
        raise Stop(f"{job_id} has workers 0 to {job.total_workers - 1}, not {worker}.")
    if not follow_ and _cloud_output(config, job, number, worker):
        return
    reader = LogReader(build_log_objects(config), store)
    if follow_ and not attempt_has_ended(job, number):
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


def _cloud_output(config: Settings, job: Job, attempt: int, worker: int | None) -> bool:
    """The attempt's output from Cloud Logging when the job's goes there and its entries can be
    verified here; False: read the Cloud Storage copy instead."""
    from tpujobs.cli.cloud_output import read_verified
    from tpujobs.domain.job_output import wanted

    if not wanted(job.spec.cloud_logging, config.cloud_logging):
        return False
    found = read_verified(config, job, attempt, worker, _write_raw)
    if found is None:  # no master key here to check entries with: the Cloud Storage copy is the same output
        return False
    return _shown_verified(found)


def _api_output(
    config: Settings, url: str, job_id: str, attempt: int | None, worker: int | None, owner: str | None
) -> bool:
    """The attempt's output as the jobs API's `logs` answers it, each entry's signature checked
    there (users hold no master key); False: not in Cloud Logging, or the API would not answer
    (not the job's owner or an admin, no master key there, an API older than `logs`): then it is
    read directly with the caller's own credentials, as admin reads the API refuses are."""
    from tpujobs.cli.cloud_output import read_through_api
    from tpujobs.cli.common import Refused

    who = caller(owner)
    written: list[int] = []

    def write(data: bytes) -> None:
        written.append(len(data))
        _write_raw(data)

    try:
        found = read_through_api(lambda request: ask_api(config, url, request, who), job_id, attempt, worker, write)
    except Refused as refused:
        if refused.status not in (400, 403, 503) or written:  # a later page refused: never print twice
            raise
        if refused.status == 503:  # the deployment's to mend (no master key, or no log view): say so
            err.print(f"[dim]The jobs API could not read the output ({refused}); reading it directly.[/dim]")
        return False
    return found is not None and _shown_verified(found)


def _shown_verified(found: OutputRead) -> bool:
    """Whether verified output was shown (else the Cloud Storage copy is read); forged entries, and
    output cut short, are said."""
    if not found.lines and not found.forged and not found.cut:  # nothing there (an older job, or not yet)
        return False
    if found.forged:
        err.print(
            f"[yellow]{found.forged} Cloud Logging entries with this job's labels failed their signature and were"
            " dropped: something other than its agents wrote them.[/yellow]"
        )
    if found.cut:
        err.print(f"[yellow]{found.cut}[/yellow]")  # our sentence: no markup in it
    return True


def _print_links(config: Settings, job_id: str, attempt: int | None, owner: str | None) -> None:
    """Each exported attempt's log and per-worker logs, one gs:// link a line."""
    from tpujobs.cli.api_client import described

    answer = reads(config, owner).describe(job_id)
    if answer is None:
        raise Stop(f"No such job: No job {job_id!r}.")
    _, _, logs = described(answer)
    chosen = {n: logs[n] for n in logs if attempt in (None, n)}
    if not chosen:
        raise Stop(f"No exported logs for {job_id}{f' attempt {attempt}' if attempt else ''} yet.")
    for number, exported in sorted(chosen.items()):
        typer.echo(f"{number}\tattempt\t{exported.log_uri}")
        for worker_id, uri in sorted(exported.worker_logs.items()):
            typer.echo(f"{number}\tworker-{worker_id}\t{uri}")


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


# --- messages that did not become jobs -----------------------------------------------------------


@app.command("dead-letters")
def dead_letters(
    topic: Annotated[str | None, typer.Option(help="Only those from this topic, e.g. tpujobs-submit.")] = None,
    replay: Annotated[
        str | None, typer.Option(metavar="ID", help="Publish this dead letter again to its original topic.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many.")] = 50,
    output: Output = Format.table,
    owner: Owner = None,
) -> None:
    """List messages that failed too many deliveries, newest first; --replay ID sends one again
    (replaying needs Pub/Sub and Firestore access: an admin's)."""
    config = settings()
    if replay is not None:
        _replay(config, replay)
        return
    answer = reads(config, owner).dead_letters(topic, limit)
    if output is not Format.table:
        print_document(answer, output)
        return
    found = answer.get("dead_letters") or []
    if not found:
        out.print(f"No dead letters{f' from {shown(topic)}' if topic else ''}.")
        return
    show(out, tables.dead_letters_sheet(found))


def _replay(config: Settings, message_id: str) -> None:
    from tpujobs.engine import dead_letters as letters
    from tpujobs.engine.errors import PermanentError, TransientError
    from tpujobs.runtime.instances import build_dead_letters, utc_now

    try:
        letter, new_id = build_dead_letters(config, utc_now).replay(message_id)
    except letters.UnknownDeadLetter:
        raise Stop(f"No dead letter {message_id!r}. `tpujobs dead-letters` lists them.") from None
    except (PermanentError, TransientError) as error:
        raise Stop(f"Not replayed: {error}") from None
    again = f" (replayed before at {tables.when(letter.replayed_at)})" if letter.replayed_at else ""
    out.print(
        f"Replayed dead letter [bold]{shown(letter.message_id)}[/bold] to {shown(letter.topic)} "
        f"as message {shown(new_id)}{again}."
    )


@app.command()
def rejections(
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many.")] = 50,
    output: Output = Format.table,
    owner: Owner = None,
) -> None:
    """List messages that could not become jobs, newest first, with the reason for each."""
    answer = reads(settings(), owner).rejections(limit)
    if output is not Format.table:
        print_document(answer, output)
        return
    found = answer.get("rejections") or []
    if not found:
        out.print("No rejections.")
        return
    show(out, tables.rejections_sheet(found))


# --- labels ------------------------------------------------------------------------------------


@app.command()
def label(
    job_id: str,
    labels: Annotated[list[str] | None, typer.Argument(help="Labels to set, key=value.")] = None,
    remove: Annotated[list[str], typer.Option("--remove", help="A label to remove (repeatable).")] = [],  # noqa: B006
    owner: Owner = None,
) -> None:
    """Change a job's labels after submission: `tpujobs label JOB team=x --remove old`.

    The job's owner or an admin may, as for cancel: through the jobs API when TPUJOBS_API_URL
    is set, else straight to Firestore with your credentials. The change is in the timeline,
    with who made it. Capacity already requested keeps the labels it was created with; the
    job's next attempt (and `list --label`) uses the new ones.
    """
    from tpujobs.domain.labels import LabelError, checked_labels, parse_label_pairs

    try:
        put = parse_label_pairs(labels or [])
        checked_labels(put)
    except LabelError as error:
        raise typer.BadParameter(str(error)) from None
    if not put and not remove:
        raise typer.BadParameter("give labels to set (key=value) or --remove KEY")
    config = settings()
    who = caller(owner)
    url = api_url()
    if url:
        request = {"action": "label", "job_id": job_id, "labels": put, "remove": list(remove)}
        answer = ask_api(config, url, request, who) or {}
        after, changed = answer.get("labels") or {}, bool(answer.get("changed"))
    else:
        after, changed = _label_in_firestore(config, job_id, put, list(remove), who)
    now = ", ".join(f"{k}={v}" for k, v in sorted(after.items())) or "none"
    verb = "Labelled" if changed else "Unchanged:"
    out.print(f"{verb} [bold]{shown(job_id)}[/bold]; its labels: {shown(now)}.")


def _label_in_firestore(
    config: Settings, job_id: str, put: dict[str, str], remove: list[str], who: str
) -> tuple[dict[str, str], bool]:
    """Without an API: the owner-or-admin rule checked here, the change written with the
    caller's own Firestore credentials (IAM is what guards Firestore itself)."""
    from google.cloud import firestore

    from tpujobs.adapters.firestore_store import FirestoreJobStore
    from tpujobs.domain.access import may_cancel
    from tpujobs.domain.labels import LabelError
    from tpujobs.domain.transitions import Decision
    from tpujobs.runtime.instances import utc_now

    store = FirestoreJobStore(firestore.Client(project=config.project))
    job = store.get(job_id)
    if job is None:
        raise Stop(f"No job {job_id!r}.")
    if not may_cancel(job.owner, who, config.admins):
        raise Stop(f"{who} may not label {job_id}: only its owner or an admin may.")
    try:
        outcome = store.relabel(job_id, put, remove, who, utc_now)
    except LabelError as error:
        raise Stop(f"Invalid labels: {error}.") from None
    if isinstance(outcome, Decision):
        return dict(outcome.job.spec.labels), True
    after = store.get(job_id)
    return (dict(after.spec.labels) if after else {}), False

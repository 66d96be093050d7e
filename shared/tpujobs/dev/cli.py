"""`tpujobs dev up | down | env | preempt`: the local stack from the shell.

Progress goes to stderr and only `export` lines to stdout, so `eval "$(tpujobs dev up)"`
both starts the stack and points the shell at it.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn
from urllib.parse import quote, urlencode

import typer
from rich.console import Console

from tpujobs.config import Settings
from tpujobs.dev import stack
from tpujobs.dev.processes import StackError

dev_app = typer.Typer(
    help="The local stack: emulators, TPU simulator and functions on loopback.",
    no_args_is_help=True,
)

StateDir = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="Where stack.json and the logs live [default: $TPUJOBS_STATE_DIR or ./.tpujobs].",
    ),
]


@dev_app.command()
def up(
    state_dir: StateDir = None,
    functions_source: Annotated[
        Path | None,
        typer.Option(
            help="The functions file to serve [default: $TPUJOBS_FUNCTIONS_SOURCE or functions/main.py]."
        ),
    ] = None,
) -> None:
    """Start the local stack (or find it running) and print its export lines."""
    err = Console(stderr=True)
    try:
        state = stack.up(
            state_dir or stack.default_state_dir(),
            Settings.from_env(),
            functions_source=functions_source,
            report=_progress(err),
        )
    except StackError as error:
        _fail(err, "tpujobs dev up failed", error)
    for line in stack.env_lines(state):
        typer.echo(line)


@dev_app.command()
def down(state_dir: StateDir = None) -> None:
    """Stop what `tpujobs dev up` started; emulators it reused keep running."""
    err = Console(stderr=True)
    try:
        stack.down(state_dir or stack.default_state_dir(), report=_progress(err))
    except StackError as error:
        _fail(err, "tpujobs dev down failed", error)


@dev_app.command()
def env(state_dir: StateDir = None) -> None:
    """Print the export lines of the running local stack."""
    err = Console(stderr=True)
    directory = state_dir or stack.default_state_dir()
    try:
        state = stack.load(directory)
    except StackError as error:
        _fail(err, "tpujobs dev env failed", error)
    if state is None:
        _fail(err, "no local stack", f"nothing recorded in {directory}; run `tpujobs dev up`")
    if not stack.is_alive(state):
        _fail(
            err,
            "the local stack is not running",
            f"some process recorded in {directory / stack.STACK_FILE} is gone; "
            "run `tpujobs dev up` to restart it",
        )
    for line in stack.env_lines(state):
        typer.echo(line)


@dev_app.command()
def preempt(
    job_id: Annotated[str, typer.Argument(help="The job whose queued resource to preempt.")],
    silent: Annotated[
        bool,
        typer.Option(
            "--silent",
            help="Kill worker host 0 of slice 0 without notice instead "
            "(no SIGTERM, metadata stays FALSE, QR stays ACTIVE): the polling path.",
        ),
    ] = False,
    state_dir: StateDir = None,
) -> None:
    """Preempt a job's current queued resource in the TPU simulator, as Google reclaims spot TPUs."""
    err = Console(stderr=True)
    directory = state_dir or stack.default_state_dir()
    env = stack.stack_environment(directory)
    if not env:
        _fail(err, "no local stack", f"none is running from {directory}; run `tpujobs dev up`")
    os.environ.update(env)  # the Firestore client finds the emulator here
    project = env.get("GOOGLE_CLOUD_PROJECT", "")
    endpoint = env.get("TPUJOBS_TPU_ENDPOINT", "")
    if not project or not endpoint:
        _fail(
            err,
            "the local stack is incomplete",
            "GOOGLE_CLOUD_PROJECT or TPUJOBS_TPU_ENDPOINT unset",
        )
    try:
        job = _job_document(project, job_id)
    except Exception as error:  # the emulator is gone or refuses: say so, not a traceback
        _fail(err, "could not read the job", f"{type(error).__name__}: {error}")
    if job is None:
        _fail(err, "no such job", f"{job_id!r} is not in the jobs collection of project {project}")
    qr_id, zone = str(job.get("queued_resource") or ""), str(job.get("zone") or "")
    if not qr_id or not zone:
        _fail(
            err,
            "nothing to preempt",
            f"job {job_id} (state {job.get('state')}) has no queued resource yet",
        )
    verb, query = ("kill-host", {"slice": 0, "worker": 0}) if silent else ("preempt", {})
    url = (
        f"{endpoint.rstrip('/')}/simulator/v1/queuedResources/{quote(zone, safe='')}/"
        f"{quote(qr_id, safe='')}:{verb}?{urlencode({**query, 'project': project})}"
    )
    try:
        answer = _post(url)
    except urllib.error.HTTPError as error:
        _fail(err, f"the simulator refused to {verb} {qr_id}", _error_message(error))
    except OSError as error:
        _fail(err, "the TPU simulator does not answer", f"{endpoint}: {error}")
    if silent:
        err.print(
            f"killed worker 0 of node {answer.get('name', qr_id)} without notice "
            f"(node {answer.get('state')}, job {job_id})",
            markup=False,
            highlight=False,
        )
    else:
        state = answer.get("state", {}).get("state")
        err.print(
            f"preempted {answer.get('name', qr_id)} ({state}, job {job_id})",
            markup=False,
            highlight=False,
        )


def _job_document(project: str, job_id: str) -> dict[str, Any] | None:
    from google.cloud import firestore  # slow to import: only this command needs it

    snapshot = firestore.Client(project=project).collection("jobs").document(job_id).get(timeout=10)
    return snapshot.to_dict() if snapshot.exists else None


def _post(url: str) -> dict[str, Any]:
    request = urllib.request.Request(url, data=b"{}", method="POST")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.load(response)
    return answer


def _error_message(error: urllib.error.HTTPError) -> str:
    try:
        return str(json.load(error)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {error.code}"


def _progress(err: Console) -> Callable[[str], None]:
    def say(line: str) -> None:
        err.print("dev:", style="dim", end=" ")
        err.print(line, markup=False, highlight=False, soft_wrap=True)

    return say


def _fail(err: Console, what: str, why: object) -> NoReturn:
    err.print(f"{what}:", style="bold red", end=" ")
    err.print(str(why), markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(1)

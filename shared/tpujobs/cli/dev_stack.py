"""`tpujobs dev up | down | env | preempt | fault ...`: the local stack from the shell.

Progress goes to stderr and only `export` lines to stdout, so `eval "$(tpujobs dev up)"`
both starts the stack and points the shell at it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from tpujobs.engine.settings import Settings
from tpujobs.local import faults, stack
from tpujobs.local.processes import StackError

dev_app = typer.Typer(
    help="The local stack: emulators, TPU simulator and functions on loopback.",
    no_args_is_help=True,
)
dev_app.add_typer(faults.fault_app, name="fault")

StateDir = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="Where stack.json and the logs live (default: $TPUJOBS_STATE_DIR or ./.tpujobs).",
    ),
]


@dev_app.command()
def up(
    state_dir: StateDir = None,
    functions_source: Annotated[
        Path | None,
        typer.Option(help="The functions file to serve (default: $TPUJOBS_FUNCTIONS_SOURCE or functions/main.py)."),
    ] = None,
) -> None:
    """Start the local stack (or find it running) and print its export lines.

    Images: the machine's Docker Engine (dockerd started if none answers) and a registry, TPUJOBS_REGISTRY.
    """
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
            f"some process recorded in {directory / stack.STACK_FILE} is gone; run `tpujobs dev up` to restart it",
        )
    for line in stack.env_lines(state):
        typer.echo(line)


@dev_app.command()
def preempt(
    job_id: Annotated[
        str, typer.Argument(help="The job whose capacity to preempt (its own, or its warm-pool unit's).")
    ],
    silent: Annotated[
        bool,
        typer.Option(
            "--silent",
            help="Kill worker host 0 of slice 0 without notice instead (no SIGTERM, metadata stays FALSE; "
            "the queued resource stays ACTIVE, or on Compute Engine that VM is TERMINATED by a host error): "
            "the polling path.",
        ),
    ] = False,
    state_dir: StateDir = None,
) -> None:
    """Preempt a job's capacity in the simulator as Google reclaims Spot TPUs: its queued resource on
    the TPU API, every slice's MIG on Compute Engine."""
    faults.preempt_job(job_id, silent, state_dir)


def _progress(err: Console) -> Callable[[str], None]:
    def say(line: str) -> None:
        err.print("dev:", style="dim", end=" ")
        err.print(line, markup=False, highlight=False, soft_wrap=True)

    return say


def _fail(err: Console, what: str, why: object) -> NoReturn:
    err.print(f"{what}:", style="bold red", end=" ")
    err.print(str(why), markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(1)

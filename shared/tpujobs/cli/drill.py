"""`tpujobs drill FILE`: prove a job resumes correctly on the local stack before it spends TPU hours.

Thin: the spec is checked and its code uploaded as `tpujobs submit` does; the stack is started as
`tpujobs demo` starts it; `tpujobs.local.drill` runs and judges; this prints. Exit 0 passed, 1 with
findings, 2 when the drill could not run. docs/resumable.md says what it checks.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Annotated, Any

import typer
from rich.table import Table

from tpujobs.cli.commands import SpecFile, checked_spec, pinned_code, upload_code
from tpujobs.cli.common import Format, Output, Stop, err, out, print_document, settings
from tpujobs.cli.terminal import shown, uncontrolled
from tpujobs.engine.settings import Settings


def drill(
    file: SpecFile,
    faults: Annotated[
        str,
        typer.Option(help="Faults in order, one per attempt: preempt, maintenance, silent, reboot, sigterm."),
    ] = "preempt,sigterm",
    at: Annotated[
        str,
        typer.Option(
            help="Where each fault hits its attempt, in order (the last repeats): checkpoint:K (after the "
            "attempt's K-th checkpoint), step:N (once it printed step N), or Ns (N seconds after RUNNING)."
        ),
    ] = "checkpoint:1",
    timeout: Annotated[float, typer.Option(help="Seconds both runs may take, start to end.")] = 600.0,
    keep: Annotated[bool, typer.Option(help="Leave a local stack this drill started running afterwards.")] = False,
    output: Output = Format.table,
) -> None:
    """Run the job twice on the local stack, once left alone and once hit by faults, and check that it
    resumes from its newest checkpoint, with one writer per checkpoint, and ends with the same result."""
    from tpujobs.local import stack
    from tpujobs.local.drill import Drill, DrillError, fault_plan

    try:
        plan = fault_plan(faults, at)
    except ValueError as error:
        raise Stop(str(error), code=2) from None
    spec, code_dir = checked_spec(file, [])
    state_dir = stack.default_state_dir()
    started_here = False
    if not stack.stack_environment(state_dir):
        err.print("[bold]Starting the local stack[/bold] (emulators, TPU simulator, functions)...")
        try:
            state = stack.up(state_dir, Settings.from_env(), report=lambda line: err.print(f"  {line}", markup=False))
        except Exception as error:  # any reason it would not start: the drill cannot run
            raise Stop(f"The local stack would not start: {error}", code=2) from None
        started_here = not state.already_running
        os.environ.update(state.env)
    try:
        config = settings()
        with contextlib.redirect_stdout(sys.stderr):  # stdout is for the result alone (-o json)
            if code_dir is not None:
                spec.update(upload_code(config, (file.parent / code_dir).resolve(), spec.get("service_account")))
            else:
                spec.update(pinned_code(config, spec))
        result = Drill(config, state_dir, spec, plan, timeout, lambda line: err.print(line, markup=False)).run()
    except DrillError as error:
        raise Stop(f"The drill could not run: {error}", code=2) from None
    except Stop as stop:  # the submit path's own refusals: the drill could not run either
        raise Stop(stop.message, code=2) from None
    except typer.Exit:
        raise
    except Exception as error:  # an emulator gone, a service refusing: exit 2, never 1 (findings)
        raise Stop(f"The drill could not run: {type(error).__name__}: {error}", code=2) from None
    finally:
        if started_here and not keep:
            err.print("Stopping the local stack this drill started (--keep leaves it running).")
            stack.down(state_dir)
    if output is Format.table:
        show_result(result.to_json())
    else:
        print_document(result.to_json(), output)
    if not result.verdict.passed:
        raise typer.Exit(1)


def show_result(answer: dict[str, Any]) -> None:
    """The attempts, the totals, and each finding with its evidence, for people."""
    jobs = answer["jobs"]
    table = Table(title=f"drill of {shown(jobs['drilled'])} (against {shown(jobs['uninterrupted'])}, left alone)")
    for column in ("attempt", "started from", "last step", "checkpoints", "steps redone", "ended"):
        table.add_column(column)
    for a in answer["attempts"]:
        ckpts = a["checkpoints"]
        table.add_row(
            str(a["attempt"]),
            _text(a["started_from"]),
            _text(a["last_step"]),
            _steps(ckpts),
            _text(a["steps_redone"]),
            shown(a["ended"]) or "-",
        )
    out.print(table)
    faults = ", ".join(f"{f['fault']} at {f['at']} (attempt {f['attempt']})" for f in answer["faults"])
    goodput = "n/a" if answer["goodput"] is None else f"{100 * answer['goodput']:.1f}%"
    matches = {True: "yes", False: "NO", None: "unknown"}[answer["result_matches"]]
    out.print(f"faults: {faults}")
    out.print(
        f"steps redone: {answer['steps_redone']} (allowed per resume: "
        f"{_text(answer['allowed_steps_redone_per_resume'])}); goodput: {goodput}; result matches: {matches}"
    )
    if answer["passed"]:
        out.print("[bold green]PASSED[/bold green]: the job resumes correctly.")
        return
    out.print(f"[bold red]FAILED[/bold red]: {len(answer['findings'])} finding(s)")
    for finding in answer["findings"]:
        out.print(f"\n[bold]{finding['kind']}[/bold]: {shown(finding['sentence'])}")
        for line in finding["lines"]:
            where = f"{line['run']} attempt {line['attempt']} worker {line['worker']}"
            out.print(f"    {where}: {uncontrolled(line['text'])}", markup=False, highlight=False)
        for entry in finding["timeline"]:
            out.print(
                f"    timeline: attempt {entry['attempt']} {entry['at']} {entry['state']}: "
                f"{uncontrolled(entry['reason'])}",
                markup=False,
                highlight=False,
            )


def _steps(steps: list[int]) -> str:
    """A few checkpoint steps as they are; many as the first, the last and how many."""
    if len(steps) <= 3:
        return ", ".join(str(s) for s in steps) or "-"
    return f"{steps[0]} .. {steps[-1]} ({len(steps)})"


def _text(value: object) -> str:
    return "-" if value is None else str(value)


__all__ = ["drill", "show_result"]

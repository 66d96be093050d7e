"""`tpujobs demo`: the whole story of a job on the local stack, told live to a new user.

It starts the local stack if none is running, submits `examples/train.yaml` (a small
training loop that checkpoints its step counter) exactly as `tpujobs submit` does,
preempts it midway through the TPU simulator, and shows live how the job recovers from
its checkpoint and finishes. Then it prints the timeline and where the logs are. It
exits non-zero if the story does not happen: no preemption, no recovery, no resume
from a checkpoint, or no success.

`tpujobs demo --platform compute` tells the same story on Compute Engine: a v7x-16 job (two
hosts, one MIG) whose Spot VMs the simulator preempts. `tpujobs demo --pool` tells another
story instead, on a warm pool (`tpujobs.cli.demo_pool`).
"""

from __future__ import annotations

import os
import time
import uuid
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from tpujobs.cli.terminal import shown
from tpujobs.domain.naming import job_prefix, node_id
from tpujobs.engine.settings import Settings
from tpujobs.local.simulator.client import SimulatorControl

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
STEPS = 60
# The job each platform runs: two worker hosts either way.
ACCELERATOR = {"tpu-api": "v4-16", "compute": "v7x-16"}
PLATFORM_NAMES = {"tpu-api": "the TPU API", "compute": "Compute Engine"}


class DemoPlatform(str, Enum):
    """The --platform choices (domain.platforms.PLATFORMS)."""

    TPU_API = "tpu-api"
    COMPUTE = "compute"


def demo(
    keep: Annotated[bool, typer.Option(help="Leave the local stack running afterwards.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds the whole story may take.")] = 110.0,
    pool: Annotated[
        bool, typer.Option("--pool", help="Instead: run three jobs on a warm pool and show how fast each starts.")
    ] = False,
    platform: Annotated[
        DemoPlatform,
        typer.Option(
            "--platform",
            help="Where the job runs: the TPU API (a v4-16 queued resource) or Compute Engine (a v7x-16 MIG).",
        ),
    ] = DemoPlatform.TPU_API,
) -> None:
    """Run a job, preempt it midway, and watch it recover from its checkpoint and finish
    (with --pool: run three quick jobs on a warm pool, printing each one's start latency)."""
    from tpujobs.local import stack

    err = Console(stderr=True)
    state_dir = stack.default_state_dir()
    running = stack.stack_environment()
    started_here = False
    if not running:
        err.print("[bold]Starting the local stack[/bold] (emulators, TPU simulator, functions)...")
        state = stack.up(state_dir, Settings.from_env(), report=lambda line: err.print(f"  {line}"))
        running = dict(state.env)
        # `up` may find it running after all (a slow emulator's health probe made it look gone):
        # then it is someone else's, and this demo must not stop it.
        started_here = not state.already_running
    os.environ.update(running)
    try:
        if pool:
            from tpujobs.cli.demo_pool import story

            ok = story(Settings.from_env(), running, timeout)
        else:
            ok = _story(Settings.from_env(), timeout, state_dir, platform.value)
    finally:
        if started_here and not keep:
            err.print("Stopping the local stack this demo started (--keep leaves it running).")
            stack.down(state_dir)
    if not ok:
        raise typer.Exit(1)


def _story(settings: Settings, timeout: float, state_dir: Path, platform: str = "tpu-api") -> bool:
    from google.cloud import firestore

    from tpujobs.adapters.firestore_store import FirestoreJobStore
    from tpujobs.adapters.pubsub import Publisher
    from tpujobs.adapters.storage import build_client
    from tpujobs.cli.code_upload import upload_code_dir
    from tpujobs.cli.tables import describe_tables
    from tpujobs.domain.states import JobState
    from tpujobs.engine.topology import SUBMIT

    out, err = Console(), Console(stderr=True)
    store = FirestoreJobStore(firestore.Client(project=settings.project))
    storage = build_client(settings.project)
    spec: dict[str, Any] = yaml.safe_load((EXAMPLES / "train.yaml").read_text(encoding="utf-8"))
    code_dir = EXAMPLES / spec.pop("code_dir")
    spec["code_uri"], spec["code_sha256"] = upload_code_dir(storage, settings.logs_bucket, code_dir)
    spec["job_id"] = f"train-demo-{uuid.uuid4().hex[:6]}"
    spec["accelerator_type"], spec["platform"] = ACCELERATOR[platform], platform
    spec["command"] = f"python3 train.py --steps {STEPS} --step-seconds 0.25 --checkpoint-every 5"
    job_id = spec["job_id"]
    Publisher.build(settings.project, settings.prefix).publish_json(SUBMIT, spec)
    err.print(
        f"Submitted [bold]{job_id}[/bold]: {STEPS} steps on 1 x {spec['accelerator_type']} spot on "
        f"{PLATFORM_NAMES[platform]}, on_preemption={spec['on_preemption']}. The simulator will preempt it midway."
    )

    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("step {task.completed:.0f}/{task.total:.0f}")
    )
    bar = progress.add_task("checkpointed", total=STEPS)
    preempted_at: int | None = None
    job = None
    deadline = time.monotonic() + timeout
    with Live(console=out, refresh_per_second=8, transient=False) as live:
        while time.monotonic() < deadline:
            job = store.get(job_id)
            step = _checkpointed_step(store, job_id)
            progress.update(bar, completed=step)
            if job is not None:
                if preempted_at is None and job.state is JobState.RUNNING and step >= STEPS // 3:
                    _preempt(settings, job.zone, job.queued_resource, platform, job.spec.slices)
                    preempted_at = step
                live.update(_view(job, store.events(job_id), progress, preempted_at))
                if job.state.is_terminal:
                    break
            time.sleep(0.3)

    if job is None or not job.state.is_terminal:
        err.print(f"[red]The job did not finish within {timeout:.0f} s.[/red]")
        return False
    time.sleep(2.0)  # the last attempt's export and any checkpoint saved on SIGTERM land
    job = store.get(job_id) or job
    exported = {u.attempt: store.attempt_logs(job_id, u.attempt) for u in job.usage}
    out.print(describe_tables(job, store.events(job_id), exported))
    resumed = _resumed_step(storage, settings.logs_bucket, job_id, attempt=2)
    out.print(f"\nLogs of every attempt and worker: gs://{settings.logs_bucket}/{job_prefix(job_id)}attempt-N/chunks/")
    where = "mig.{job}-cN.*" if platform == "compute" else "{job}-aN"
    out.print(f"Worker hosts' own logs on this machine: {state_dir / 'workers'}/{where.format(job=job_id)}/")
    story = [
        (preempted_at is not None, f"preempted midway (after step {preempted_at})"),
        (job.restarts >= 1 and job.attempt >= 2, f"recovered: attempt {job.attempt}, {job.restarts} restart(s)"),
        (resumed is not None and resumed > 0, f"attempt 2 resumed from its checkpoint at step {resumed}"),
        (job.state is JobState.SUCCEEDED, f"finished {job.state.value}"),
    ]
    for happened, what in story:
        out.print(("[green]✓[/green] " if happened else "[red]✗[/red] ") + what)
    return all(happened for happened, _ in story)


def _view(job: Any, events: list[Any], progress: Progress, preempted_at: int | None) -> Panel:
    timeline = Table("AT", "TO", "REASON", box=None, padding=(0, 1))
    for event in events[-8:]:
        timeline.add_row(event.at.strftime("%H:%M:%S.%f")[:-3], event.to_state.value, shown(event.reason))
    note = f" - preempted after step {preempted_at}" if preempted_at is not None else ""
    title = f"{shown(job.job_id)}  {job.state.value}  attempt {job.attempt}{note}"
    return Panel(Group(progress, timeline), title=title, title_align="left")


def _checkpointed_step(store: Any, job_id: str) -> int:
    """The highest step any worker reported as checkpointed."""
    steps = [w.get("checkpoint_step") or 0 for w in store.workers(job_id)]
    return max(steps, default=0)


def _preempt(settings: Settings, zone: str, holding: str, platform: str, slices: int) -> None:
    """Spot preemption of what holds the job: its queued resource, or every slice's MIG."""
    control = SimulatorControl(settings.tpu_endpoint)
    if platform == "compute":
        for index in range(slices):
            control.preempt_group(zone, node_id(holding, index, slices), settings.project)
    else:
        control.preempt(zone, holding, settings.project)


def _resumed_step(storage: Any, bucket: str, job_id: str, attempt: int) -> int | None:
    """The step attempt `attempt` says it resumed from, read from its output in Storage."""
    prefix = f"{job_prefix(job_id)}attempt-{attempt}/chunks/slice-0-worker-0/"
    for blob in sorted(storage.list_blobs(bucket, prefix=prefix), key=lambda b: b.name):
        text = blob.download_as_text()
        if "resumes from step " in text:
            return int(text.split("resumes from step ")[1].split()[0])
    return None

"""`tpujobs demo`: the story of one job on the local stack, told to a new user.

It starts the local stack if none is running, submits `examples/hello.yaml` through
Pub/Sub exactly like `tpujobs submit`, waits for the job to reach PROVISIONING,
shows its record and timeline from Firestore and its queued resource from the TPU
simulator through the real client, and exits non-zero if any of that does not happen.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console
from rich.table import Column, Table

from tpujobs.config import Settings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hello.yaml"


def demo(
    keep: Annotated[bool, typer.Option(help="Leave the local stack running afterwards.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each step.")] = 60.0,
) -> None:
    """Submit a job on the local stack and show its record and its queued resource."""
    from tpujobs.adapters.firestore_store import FirestoreJobStore
    from tpujobs.adapters.pubsub import Publisher
    from tpujobs.adapters.tpu import build_client
    from tpujobs.cli import describe_tables
    from tpujobs.dev import stack
    from tpujobs.domain.states import JobState
    from tpujobs.topology import SUBMIT

    out, err = Console(), Console(stderr=True)
    state_dir = stack.default_state_dir()
    running = stack.stack_environment()
    started_here = not running
    if started_here:
        err.print("[bold]1. Starting the local stack[/bold] (emulators, TPU simulator, functions)...")
        state = stack.up(state_dir, Settings.from_env(), report=lambda line: err.print(f"   {line}"))
        running = dict(state.env)
    else:
        err.print("[bold]1. Using the running local stack.[/bold]")
    os.environ.update(running)
    settings = Settings.from_env()
    try:
        spec = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
        spec["job_id"] = f"hello-{uuid.uuid4().hex[:6]}"
        err.print(f"[bold]2. Publishing[/bold] {EXAMPLE.name} to {settings.prefix}{SUBMIT} as job {spec['job_id']}")
        from google.cloud import firestore

        store = FirestoreJobStore(firestore.Client(project=settings.project))
        started = time.monotonic()
        Publisher.build(settings.project, settings.prefix).publish_json(SUBMIT, spec)
        job = None
        while time.monotonic() - started < timeout:
            job = store.get(spec["job_id"])
            if job is not None and job.state is not JobState.QUEUED:
                break
            time.sleep(0.05)
        if job is None or job.state is not JobState.PROVISIONING:
            err.print(f"[red]The job did not reach PROVISIONING within {timeout:.0f} s (now: {job and job.state.value}).[/red]")
            raise typer.Exit(1)
        err.print(f"[bold]3. The submit_job function recorded it[/bold] ({time.monotonic() - started:.2f} s after publishing):")
        out.print(describe_tables(job, store.events(job.job_id)))

        client = build_client(settings.tpu_endpoint)
        name = f"projects/{settings.project}/locations/{job.zone}/queuedResources/{job.queued_resource}"
        resource = None
        while time.monotonic() - started < timeout:
            resource = client.get_queued_resource(name=name)
            if resource.state.state.name == "ACTIVE":
                break
            time.sleep(0.1)
        err.print("[bold]4. Its queued resource in the TPU simulator[/bold] (read with google-cloud-tpu):")
        table = Table(
            Column("QUEUED RESOURCE", no_wrap=True),
            Column("STATE", no_wrap=True),
            Column("NODE", no_wrap=True),
            Column("ACCELERATOR", no_wrap=True),
            Column("HOSTS", no_wrap=True),
            Column("LABELS", ratio=1),
        )
        for node_spec in resource.tpu.node_spec:
            node_name = f"{node_spec.parent}/nodes/{node_spec.node_id}"
            hosts = len(client.get_node(name=node_name).network_endpoints) if node_spec.node_id else 0
            table.add_row(
                job.queued_resource,
                resource.state.state.name,
                node_spec.node_id or f"{node_spec.multislice_params.node_id_prefix}-*",
                node_spec.node.accelerator_type,
                str(hosts),
                " ".join(f"{k}={v}" for k, v in sorted(node_spec.node.labels.items())),
            )
        out.print(table)
        if resource.state.state.name != "ACTIVE":
            err.print("[red]The queued resource did not become ACTIVE.[/red]")
            raise typer.Exit(1)
        err.print("[green]Done:[/green] one message, one job document, one queued resource.")
    finally:
        if started_here and not keep:
            err.print("Stopping the local stack this demo started (use --keep to leave it running).")
            stack.down(state_dir)

"""`tpujobs demo --pool`: a warm pool on the local stack, three jobs on it, and how fast each starts.

It creates a pool of two v4-8 units through the jobs API, waits until both are idle, submits three quick
jobs on it one after another and prints each one's start latency (as bench/pools.py measures it), then
deletes the pool and checks that its capacity is gone; it exits non-zero where any of that does not
happen. `LocalPools` is the story's toolkit, shared with the end-to-end tests and bench/pools.py.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from tpujobs.engine.settings import Settings
from tpujobs.local.testing import wait_for

OWNER = "demo@example.com"
ACCELERATOR = "v4-8"
JOBS = 3


class PoolApiError(Exception):
    """The jobs API refused a request; the message is its answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class LocalPools:
    """Warm pools and their jobs on the running local stack, as `owner` through the jobs API.

    The caller is named in the local stack's caller header, so its jobs have a verified owner
    (a job on a pool needs one). Reads of jobs and worker records go to Firestore directly."""

    def __init__(self, settings: Settings, env: Mapping[str, str], owner: str = OWNER) -> None:
        from google.cloud import firestore

        from tpujobs.adapters.firestore_store import FirestoreJobStore
        from tpujobs.local.simulator.client import SimulatorControl

        self.settings = settings
        self.owner = owner
        self.url = env["TPUJOBS_API_URL"]
        self.firestore = firestore.Client(project=settings.project)
        self.store = FirestoreJobStore(self.firestore)
        self.simulator = SimulatorControl(env["TPUJOBS_TPU_ENDPOINT"])

    # -- the jobs API ------------------------------------------------------------------

    def call(self, action: str, **body: Any) -> dict[str, Any]:
        """POST one action as the owner; its JSON answer, or PoolApiError with the refusal."""
        from tpujobs.cli.api_client import post
        from tpujobs.engine.api import CALLER_HEADER

        status, answer = post(self.url, {"action": action, **body}, {CALLER_HEADER: self.owner}, direct=True)
        if status != 200:
            raise PoolApiError(status, f"{action}: {status} {answer.get('error', answer)}")
        return answer

    def allow(self) -> None:
        """Let the owner create pools: add it to `config/policies.pools`, as an admin would in
        the console (local stack only; the rest of the document is kept)."""
        from google.cloud import firestore

        ref = self.firestore.collection("config").document("policies")
        ref.set({"pools": firestore.ArrayUnion([self.owner])}, merge=True)

    def create(self, name: str, count: int, accelerator_type: str = ACCELERATOR, **options: Any) -> dict[str, Any]:
        """`tpujobs pool create`: the pool as the API shows it."""
        return dict(
            self.call("pool-create", name=name, accelerator_type=accelerator_type, count=count, **options)["pool"]
        )

    def describe(self, name: str) -> dict[str, Any] | None:
        """The pool as `tpujobs pool describe` shows it, or None once it is gone."""
        try:
            return dict(self.call("pool-describe", name=name)["pool"])
        except PoolApiError as error:
            if error.status == 404:
                return None
            raise

    def delete(self, name: str) -> None:
        self.call("pool-delete", name=name)

    def submit(self, spec: Mapping[str, Any]) -> tuple[str, float]:
        """Submit a job through the API; its id and the wall-clock time just before the call."""
        job_id = str(spec.get("job_id") or f"pooljob-{uuid.uuid4().hex[:8]}")
        submitted = time.time()
        self.call("submit", **{**spec, "job_id": job_id})
        return job_id, submitted

    # -- waits and reads -----------------------------------------------------------------

    def wait_idle(self, name: str, count: int, timeout: float) -> dict[str, Any]:
        """The pool once `count` of its units are IDLE (ACTIVE capacity, agents waiting)."""

        def probe() -> dict[str, Any] | None:
            pool = self.describe(name)
            idle = [u for u in pool["units"] if u["state"] == "IDLE"] if pool else []
            return pool if len(idle) >= count else None

        return wait_for(probe, timeout=timeout, interval=0.2, what=f"{count} unit(s) of pool {name} idle")

    def wait_gone(self, name: str, timeout: float) -> None:
        """Until the pool's document is gone and the simulator holds no queued resource of it."""

        def probe() -> bool:
            return self.describe(name) is None and not self.queued_resources(f"{name}-u")

        wait_for(probe, timeout=timeout, interval=0.2, what=f"pool {name} deleted and its capacity released")

    def ended(self, job_id: str, timeout: float) -> Any:
        """The job once it is in an end state."""

        def probe() -> Any:
            job = self.store.get(job_id)
            return job if job is not None and job.state.is_terminal else None

        return wait_for(probe, timeout=timeout, interval=0.05, what=f"{job_id} to end")

    def started_at(self, job_id: str, attempt: int = 1, timeout: float = 30.0) -> float:
        """The agent's own stamp of the attempt's `started` report (epoch seconds; the first
        worker's, for a job of several)."""

        def probe() -> float | None:
            stamps = [r.started_at for r in self.store.attempt_workers(job_id, attempt) if r.started_at is not None]
            return min(stamps).timestamp() if stamps else None

        return wait_for(probe, timeout=timeout, interval=0.05, what=f"{job_id}'s started report")

    def queued_resources(self, prefix: str = "") -> set[str]:
        """The names of the simulator's queued resources (every state) starting with `prefix`."""
        names = (qr["name"].rsplit("/", 1)[-1] for qr in self.simulator.state()["queuedResources"])
        return {name for name in names if name.startswith(prefix)}


def story(settings: Settings, env: Mapping[str, str], timeout: float) -> bool:
    """The demo's story; True when every step happened. The pool is deleted whatever happens."""
    err = Console(stderr=True)
    pools = LocalPools(settings, env)
    name = f"demo-{uuid.uuid4().hex[:6]}"
    try:
        pools.allow()
        err.print(f"Allowed {pools.owner} to create pools (config/policies.pools, as an admin would).")
        pools.create(name, count=2)
    except PoolApiError as error:
        err.print(f"[red]The pool could not be created: {error}[/red]")
        return False
    err.print(f"Created pool [bold]{name}[/bold]: 2 units of 1 x {ACCELERATOR}. Waiting for both to be idle...")
    checks: list[tuple[bool, str]] = []
    try:
        checks += _jobs_on(pools, name, timeout)
    except (AssertionError, PoolApiError) as error:  # a wait that timed out, a refusal
        err.print(f"[red]{error}[/red]")
        checks.append((False, "the story stopped there"))
    finally:
        err.print(f"Deleting pool {name}...")
        try:
            pools.delete(name)
            pools.wait_gone(name, timeout)
            checks.append((True, "the pool was deleted and its units released"))
        except (AssertionError, PoolApiError) as error:
            checks.append((False, f"the pool was not deleted and released: {error}"))
    out = Console()
    for happened, what in checks:
        out.print(("[green]✓[/green] " if happened else "[red]✗[/red] ") + what)
    return all(happened for happened, _ in checks)


def _jobs_on(pools: LocalPools, name: str, timeout: float) -> list[tuple[bool, str]]:
    """Both units idle, then three jobs one after another, each timed: what happened."""
    from tpujobs.domain.states import JobState

    out, err = Console(), Console(stderr=True)
    begun = time.monotonic()
    pools.wait_idle(name, 2, timeout)
    err.print(f"Both units idle after {time.monotonic() - begun:.1f} s; their agents wait for assignments.")
    units_before = pools.queued_resources(f"{name}-u")
    table = Table("JOB", "STATE", "START LATENCY", "UNIT", title=f"Jobs on warm pool {name}", title_justify="left")
    latencies: list[float] = []
    jobs: list[str] = []
    on_pool = True
    for index in range(1, JOBS + 1):
        spec = {
            "name": "pool-demo",
            "accelerator_type": ACCELERATOR,
            "pool": name,
            "command": 'echo "job $TPUJOBS_JOB_ID, attempt $TPUJOBS_ATTEMPT, running in $PWD"',
            "on_error": "fail",
        }
        job_id, submitted = pools.submit(spec)
        jobs.append(job_id)
        job = pools.ended(job_id, timeout)
        ran_on = [usage.pool for usage in job.usage]
        on_pool = on_pool and job.state is JobState.SUCCEEDED and ran_on == [name]
        latency = pools.started_at(job_id) - submitted if job.state is JobState.SUCCEEDED else None
        shown = f"{latency:.2f} s" if latency is not None else "-"
        if latency is not None:
            latencies.append(latency)
        table.add_row(job_id, job.state.value, shown, job.warm_pool_unit)
        err.print(f"  job {index}/{JOBS} {job_id}: {job.state.value}, started {shown} after submit")
    out.print(table)
    day = (pools.describe(name) or {}).get("last_day", {})
    utilisation = day.get("utilisation")
    if utilisation is not None:
        out.print(
            f"Pool utilisation over the last day: {utilisation * 100:.1f} % busy "
            f"({day['busy_chip_hours']:.4f} busy and {day['idle_chip_hours']:.4f} idle chip-hours)"
        )
    units_after = pools.queued_resources(f"{name}-u")
    made = {qr for job_id in jobs for qr in pools.queued_resources(f"{job_id}-a")}
    median = statistics.median(latencies) if latencies else None
    return [
        (True, f"pool {name} held 2 idle units ({', '.join(sorted(units_before))})"),
        (on_pool, f"{JOBS} jobs SUCCEEDED on the pool, one after another"),
        (
            units_after == units_before and not made,
            "no queued resource was made for any job: they ran on the units already held",
        ),
        (
            median is not None and len(latencies) == JOBS,
            f"median start latency {median:.2f} s (submit -> the agent's started report)"
            if median is not None
            else "no start latency",
        ),
    ]

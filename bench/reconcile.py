"""Reconcile cost as jobs pile up: tick time, Firestore reads and TPU API calls per tick.

One reconciler tick (`Reconciler.tick`, the real service on the real adapters) is timed
against a Firestore emulator and an in-process TPU simulator holding N active jobs
(10, 100, 1,000, 5,000) beside 10,000 finished ones. Every job is as the control plane
leaves it, so each tick finds nothing to repair (checked): what is measured is the cost of
looking, the part every tick pays. The claim under test (tpujobs/reconciler.py): a tick
costs O(active jobs), one query for the active jobs, two TPU list calls per zone and one
query that returns only silent workers, whatever the number of finished jobs.

The fleet, in one project and one zone:
  finished  SUCCEEDED, with its 4 events and its worker's document (live false); its
            queued resource is gone, as after a real run
  active    80% RUNNING (queued resource ACTIVE, a live worker that reported seconds ago),
            20% PROVISIONING (queued resource WAITING_FOR_RESOURCES); v4-8, half spot
Firestore documents are written as the adapter writes them (job_to_document,
event_to_document, WorkerRecord), in batches of 500. The queued resources are the ones
the adapter asks for (queued_resource_for: labels, startup script), read the way the
simulator reads a create request, and handed to the simulator as a restored state (its
StateStore): creating them one by one through the model costs O(n) each (its create and
its admission scan every queued resource), over a minute for 4,000 in a trial here.
The simulator answers a list in one page, whatever its length.
Active jobs are added size by size; the first size is also measured before the finished
jobs exist, so the table shows what 10,000 finished jobs add.

The clock the reconciler sees is fixed at the start, so no worker turns silent while the
fleet is seeded.

    .venv/bin/python bench/reconcile.py [--sizes 10,100,1000,5000] [--finished 10000] [--ticks 5]

It starts a Firestore emulator (or uses the one FIRESTORE_EMULATOR_HOST names, if it
answers, and deletes its documents afterwards) and stops what it started.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from google.cloud import firestore
from google.protobuf import json_format

from tpujobs.adapters.firestore_store import (
    EVENTS,
    JOBS,
    WORKERS,
    FirestoreJobStore,
    event_to_document,
    job_to_document,
)
from tpujobs.adapters.tpu import (
    NODE_FIELDS,
    QUEUED_RESOURCE_FIELDS,
    CloudTpu,
    build_client,
    queued_resource_for,
)
from tpujobs.agent.startup import host_boot
from tpujobs.config import DEFAULT_ZONE, Settings
from tpujobs.dev import processes
from tpujobs.domain.job import Job, JobEvent, Source, new_job
from tpujobs.domain.spec import JobSpec
from tpujobs.domain.states import JobState
from tpujobs.ports import CapacityStatus, HostBoot, WorkerRecord
from tpujobs.reconciler import ReconcileReport
from tpujobs.service import JobService
from tpujobs.simulator import (
    Initiator,
    NodeRecord,
    NodeState,
    QrState,
    QueuedResourceRecord,
    Simulator,
    SimulatorConfig,
    SimulatorServer,
    fields,
)
from tpujobs.simulator.model import FIRST_NODE_NUMBER, FIRST_WORKER_ADDRESS, STATE_FILE_VERSION
from tpujobs.simulator.server import (
    node_json,
    parse_queued_resource,
    queued_resource_json,
)
from tpujobs.testing import local_settings, reconciler_for

ZONE = DEFAULT_ZONE


def masked(payload: dict, mask: str, response: str) -> dict:
    """The payload as the simulator answers it under the adapter's field mask."""
    return fields.apply(payload, fields.check(mask, response))


OWNER = "bench@example.com"
BATCH = 500  # Firestore's limit of writes in one batch
SEED_THREADS = 4
RUNNING_SHARE = 0.8
HELD_S = 7 * 86_400.0  # how long the PROVISIONING jobs' resources keep waiting for chips


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


# -- the fleet -------------------------------------------------------------------------------


def spec(job_id: str, spot: bool) -> JobSpec:
    return JobSpec.model_validate(
        {
            "job_id": job_id,
            "name": "bench-reconcile",
            "owner": OWNER,
            "accelerator_type": "v4-8",
            "capacity": "spot" if spot else "on-demand",
            "command": "python3 train.py --steps 100000",
        }
    )


def history(
    job_id: str, state: JobState, created: datetime, spot: bool, settings: Settings
) -> tuple[Job, list[JobEvent]]:
    """A job as the control plane leaves it in `state`, with its timeline."""
    logs = f"gs://{settings.logs_bucket}/logs/jobs/{job_id}/"  # naming.job_prefix
    job, submitted = new_job(spec(job_id, spot), settings.default_zone, created, logs)
    events = [submitted]

    def move(to: JobState, at: datetime, reason: str, source: Source, **changes: Any) -> None:
        nonlocal job
        seq = job.event_seq + 1
        events.append(JobEvent(seq, at, job.state, to, reason, source, job.attempt))
        job = job.evolve(state=to, state_reason=reason, updated_at=at, event_seq=seq, **changes)

    requested = f"Requested queued resource {job.queued_resource}."
    move(
        JobState.PROVISIONING,
        created + timedelta(seconds=1),
        requested,
        "submit",
        capacity_state="WAITING_FOR_RESOURCES",
    )
    if state is not JobState.PROVISIONING:
        started = created + timedelta(seconds=90)
        move(
            JobState.RUNNING,
            started,
            "Every worker started the command.",
            "agent",
            capacity_state="ACTIVE",
            started_at=started,
        )
    if state is JobState.SUCCEEDED:
        ended = created + timedelta(hours=2)
        move(
            JobState.SUCCEEDED,
            ended,
            "Every worker exited 0.",
            "agent",
            ended_at=ended,
            exit_code=0,
        )
    assert job.state is state
    return job, events


def worker_document(job: Job, last_report_at: datetime) -> dict[str, Any]:
    """`jobs/{id}/workers/a1-0-0` as record_worker leaves it (None fields are not written)."""
    done = job.state.is_terminal
    record = WorkerRecord(
        attempt=job.attempt,
        worker="0-0",
        slice_id=0,
        worker_id=0,
        last_report_at=last_report_at,
        started_at=job.started_at,
        exited_at=job.ended_at if done else None,
        exit_code=0 if done else None,
        live=not done,
    )
    return {k: v for k, v in record.fields().items() if v is not None}


class Fleet:
    """Seeds jobs into Firestore and keeps the simulator records of the active ones."""

    def __init__(self, client: Any, settings: Settings, now: datetime) -> None:
        self.client = client
        self.settings = settings
        self.now = now
        self.jobs = client.collection(JOBS)
        self.active = 0
        self.finished = 0
        self.queued_resources: list[QueuedResourceRecord] = []
        self.nodes: list[NodeRecord] = []
        self.seeded = 0  # documents written in batches, and the time it took
        self.seeding_s = 0.0

    def single_write_ms(self, writes: int = 20) -> float:
        """Median time of one small document write on its own (one commit each)."""
        probe = self.client.collection("bench-probe")
        times = []
        for index in range(writes):
            started = time.perf_counter()
            probe.document(f"probe-{index}").set({"at": self.now, "index": index})
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)

    def _write(self, writes: list[tuple[Any, dict[str, Any]]]) -> None:
        def commit(chunk: Sequence[tuple[Any, dict[str, Any]]]) -> None:
            batch = self.client.batch()
            for ref, data in chunk:
                batch.set(ref, data)
            batch.commit()

        chunks = [writes[i : i + BATCH] for i in range(0, len(writes), BATCH)]
        started = time.perf_counter()
        with ThreadPoolExecutor(SEED_THREADS) as pool:
            list(pool.map(commit, chunks))
        self.seeding_s += time.perf_counter() - started
        self.seeded += len(writes)

    def _documents(
        self, job: Job, events: list[JobEvent], last_report_at: datetime | None
    ) -> list[tuple[Any, dict[str, Any]]]:
        ref = self.jobs.document(job.job_id)
        writes = [(ref, job_to_document(job))]
        writes += [(ref.collection(EVENTS).document(e.document_id), event_to_document(e)) for e in events]
        if last_report_at is not None:
            writes.append((ref.collection(WORKERS).document("a1-0-0"), worker_document(job, last_report_at)))
        return writes

    def add_finished(self, count: int) -> int:
        """`count` SUCCEEDED jobs, ended over the last weeks; returns documents written."""
        writes = []
        for index in range(self.finished, self.finished + count):
            created = self.now - timedelta(days=30) + timedelta(minutes=4 * index)
            job, events = history(f"done-{index:06d}", JobState.SUCCEEDED, created, index % 2 == 0, self.settings)
            assert job.ended_at is not None
            writes += self._documents(job, events, job.ended_at)
        self._write(writes)
        self.finished += count
        return len(writes)

    def add_active(self, count: int) -> int:
        """`count` more active jobs (80% RUNNING, 20% PROVISIONING); returns documents written."""
        writes = []
        for index in range(self.active, self.active + count):
            running = index % 10 < RUNNING_SHARE * 10
            state = JobState.RUNNING if running else JobState.PROVISIONING
            created = self.now - timedelta(hours=3) + timedelta(seconds=index)
            job, events = history(f"live-{index:06d}", state, created, index % 2 == 0, self.settings)
            # a live worker reports every 10 s: its last report is a few seconds old
            beat = self.now - timedelta(seconds=2 + index % 9) if running else None
            writes += self._documents(job, events, beat)
            self._add_queued_resource(job, index)
        self._write(writes)
        self.active += count
        return len(writes)

    def _add_queued_resource(self, job: Job, index: int) -> None:
        """The job's queued resource as the adapter requests it and the simulator stores it."""
        project = self.settings.project
        resource = queued_resource_for(job, project, host_boot(job, self.settings))
        body = json_format.MessageToDict(type(resource).pb(resource), use_integers_for_enums=True)
        request = parse_queued_resource(body, f"projects/{project}/locations/{job.zone}")
        wall = (job.updated_at or self.now).timestamp()
        active = job.state is JobState.RUNNING
        self.queued_resources.append(
            QueuedResourceRecord(
                project=project,
                zone=job.zone,
                qr_id=job.queued_resource,
                request=request,
                state=QrState.ACTIVE if active else QrState.WAITING_FOR_RESOURCES,
                initiator=Initiator.USER,
                create_time=wall,
                queue_number=index + 1,
                next_at=None if active else HELD_S,  # relative: rebased in snapshot()
                holds_capacity=active,
            )
        )
        if active:
            (slice_request,) = request.slices
            self.nodes.append(
                NodeRecord(
                    project=project,
                    zone=job.zone,
                    node_id=slice_request.node_id,
                    qr_id=job.queued_resource,
                    number=FIRST_NODE_NUMBER + index + 1,
                    accelerator_type=slice_request.accelerator_type,
                    runtime_version=slice_request.runtime_version,
                    template=slice_request.template,
                    state=NodeState.READY,
                    host_addresses=(str(FIRST_WORKER_ADDRESS + index + 1),),
                    create_time=wall,
                    multislice=False,
                    spot=request.spot,
                )
            )

    def snapshot(self, clock: float) -> dict[str, Any]:
        """The simulator's state file contents holding every active job's queued resource."""

        def record(qr: QueuedResourceRecord) -> dict[str, Any]:
            data = dataclasses.asdict(qr)
            if qr.next_at is not None:
                data["next_at"] = clock + qr.next_at
            return data

        count = len(self.queued_resources)
        return {
            "version": STATE_FILE_VERSION,
            "clock": clock,
            "counters": {"queue": count, "operation": 0, "node": count, "address": count},
            "queued_resources": [record(qr) for qr in self.queued_resources],
            "nodes": [dataclasses.asdict(node) for node in self.nodes],
            "operations": [],
        }

    def listed_megabytes(self) -> float:
        """What one tick's two list calls carry (JSON), with the field masks the adapter sends."""
        queued = {"queuedResources": [queued_resource_json(qr) for qr in self.queued_resources]}
        nodes = {"nodes": [node_json(node) for node in self.nodes]}
        size = len(json.dumps(masked(queued, QUEUED_RESOURCE_FIELDS, "ListQueuedResourcesResponse")))
        size += len(json.dumps(masked(nodes, NODE_FIELDS, "ListNodesResponse")))
        return size / 1e6


class Restored:
    """A simulator StateStore that hands over a prepared state and keeps nothing."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self._snapshot: dict[str, Any] | None = snapshot

    def load(self) -> dict[str, Any] | None:
        snapshot, self._snapshot = self._snapshot, None
        return snapshot

    def save(self, snapshot: dict[str, Any]) -> None:
        pass


# -- counting --------------------------------------------------------------------------------


class CountingStore:
    """The real job store, counting the documents a tick reads, its queries and anything else."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.reset()

    def reset(self) -> None:
        self.documents = 0
        self.queries = 0
        self.seconds: Counter[str] = Counter()  # by method
        self.other: Counter[str] = Counter()  # writes or reads the steady state should not make

    def _timed(self, name: str, call: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return call()
        finally:
            self.seconds[name] += time.perf_counter() - started

    def list_active(self, limit: int = 10_000) -> list[Job]:
        jobs = self._timed("list_active", lambda: self._store.list_active(limit))
        self.queries += 1
        self.documents += len(jobs)
        return jobs

    def silent_workers(self, before: datetime, limit: int = 1000) -> list[Any]:
        found = self._timed("silent_workers", lambda: self._store.silent_workers(before, limit))
        self.queries += 1
        self.documents += len(found)
        return found

    def get(self, job_id: str) -> Job | None:
        self.documents += 1
        self.other["get"] += 1
        return self._timed("get", lambda: self._store.get(job_id))

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            self.other[name] += 1
            return self._timed(name, lambda: attribute(*args, **kwargs))

        return call


class CountingClient:
    """The google-cloud-tpu client, counting API requests by method: each page of a list is one."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.requests: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attribute(*args, **kwargs)
            if not name.startswith("list_"):
                self.requests[name] += 1
                return result
            items: list[Any] = []
            for page in result.pages:  # list_nodes -> page.nodes, list_queued_resources -> ...
                self.requests[name] += 1
                items.extend(getattr(page, name.removeprefix("list_")))
            return items

        return call


class CountingTpu:
    """The Tpu port, counting its calls and the time they take."""

    def __init__(self, tpu: Any) -> None:
        self._tpu = tpu
        self.calls: Counter[str] = Counter()
        self.seconds = 0.0

    def _timed(self, name: str, call: Callable[[], Any]) -> Any:
        self.calls[name] += 1
        started = time.perf_counter()
        try:
            return call()
        finally:
            self.seconds += time.perf_counter() - started

    def list_capacity(self, zone: str) -> Sequence[CapacityStatus]:
        return self._timed("list", lambda: self._tpu.list_capacity(zone))

    def status(self, zone: str, name: str) -> CapacityStatus | None:
        return self._timed("status", lambda: self._tpu.status(zone, name))

    def request(self, job: Job, boot: HostBoot) -> CapacityStatus:
        return self._timed("request", lambda: self._tpu.request(job, boot))

    def release(self, zone: str, name: str) -> None:
        self._timed("release", lambda: self._tpu.release(zone, name))


# -- measuring ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """The ticks of one fleet size."""

    active: int
    finished: int
    ticks_ms: list[float]
    active_query_ms: list[float]  # list_active, per tick
    silent_query_ms: list[float]  # silent_workers, per tick
    tpu_ms: list[float]  # the Tpu port's list, per tick
    rest_ms: list[float]  # the rest of each tick: comparing, in this process
    documents: int  # Firestore documents read per tick (the same every tick)
    queries: int
    tpu_lists: int  # TPU API list requests (pages) per tick
    tpu_calls: int  # Tpu port list() calls per tick (one per zone)
    listed_mb: float

    @property
    def median_ms(self) -> float:
        return statistics.median(self.ticks_ms)


def steady(report: ReconcileReport, store: CountingStore, client: CountingClient, active: int) -> None:
    """The tick saw every job and changed nothing; else the numbers would not be the cost of looking."""
    problems = {
        "jobs": report.jobs if report.jobs != active else None,
        "zones_skipped": report.zones_skipped,
        "observed": report.observed[:3],
        "re_requested": report.re_requested[:3],
        "converged": report.converged[:3],
        "released": report.released[:3],
        "store calls": dict(store.other),
        "TPU calls": {k: v for k, v in client.requests.items() if not k.startswith("list_")},
    }
    found = {k: v for k, v in problems.items() if v}
    if found:
        raise SystemExit(f"not a steady state at {active} active jobs (expected {active} jobs, no action): {found}")


def measure(fleet: Fleet, tpu_url: str, ticks: int) -> Point:
    settings = dataclasses.replace(fleet.settings, tpu_endpoint=tpu_url)
    store = CountingStore(FirestoreJobStore(fleet.client))
    client = CountingClient(build_client(tpu_url))
    tpu = CountingTpu(CloudTpu(client, settings.project))
    now = fleet.now
    service = JobService(store, tpu, settings, lambda: now, lambda seconds: None)
    reconciler = reconciler_for(service)

    steady(reconciler.tick(), store, client, fleet.active)  # warm-up: connections, first reads
    ticks_ms, active_ms, silent_ms, tpu_ms, rest_ms = [], [], [], [], []
    counts: set[tuple[int, int, int, int]] = set()
    for _ in range(ticks):
        store.reset()
        client.requests.clear()
        tpu.calls.clear()
        tpu.seconds = 0.0
        started = time.perf_counter()
        report = reconciler.tick()
        ticks_ms.append((time.perf_counter() - started) * 1000)
        steady(report, store, client, fleet.active)
        active_ms.append(store.seconds["list_active"] * 1000)
        silent_ms.append(store.seconds["silent_workers"] * 1000)
        tpu_ms.append(tpu.seconds * 1000)
        rest_ms.append(ticks_ms[-1] - active_ms[-1] - silent_ms[-1] - tpu_ms[-1])
        lists = sum(v for k, v in client.requests.items() if k.startswith("list_"))
        counts.add((store.documents, store.queries, lists, tpu.calls["list"]))
    documents, queries, lists, calls = max(counts)
    if len(counts) > 1:
        print(f"  note: reads varied between ticks: {sorted(counts)}", file=sys.stderr)
    return Point(
        fleet.active,
        fleet.finished,
        ticks_ms,
        active_ms,
        silent_ms,
        tpu_ms,
        rest_ms,
        documents,
        queries,
        lists,
        calls,
        fleet.listed_megabytes(),
    )


@contextlib.contextmanager
def simulator(fleet: Fleet) -> Iterator[str]:
    """A TPU simulator in this process holding the fleet's queued resources; its base URL."""
    config = SimulatorConfig(waiting_seconds=0.05, provisioning_seconds=0.1, tick_seconds=0.5)
    restored = Restored(fleet.snapshot(time.monotonic()))
    server = SimulatorServer(simulator=Simulator(config, store=restored), run_workers=False)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@contextlib.contextmanager
def firestore_emulator() -> Iterator[bool]:
    """FIRESTORE_EMULATOR_HOST of an answering emulator, started here if need be; yields
    whether it was already running (then the bench deletes its project's documents)."""
    host = os.environ.get("FIRESTORE_EMULATOR_HOST")
    if host and processes.http_get(processes.emulator_url(host) + "/") is not None:
        yield True
        return
    processes.require_gcloud_emulators(("firestore",))
    port = processes.free_port()
    logs = Path(tempfile.mkdtemp(prefix="tpujobs-bench-reconcile-"))
    print(f"starting a Firestore emulator on port {port} (logs in {logs}) ...", file=sys.stderr)
    started = processes.start([processes.firestore_emulator(port)], logs)
    saved = os.environ.get("FIRESTORE_EMULATOR_HOST")
    os.environ["FIRESTORE_EMULATOR_HOST"] = f"{processes.LOOPBACK}:{port}"
    try:
        yield False
    finally:
        processes.stop(started)
        if saved is None:
            os.environ.pop("FIRESTORE_EMULATOR_HOST", None)
        else:
            os.environ["FIRESTORE_EMULATOR_HOST"] = saved
        shutil.rmtree(logs, ignore_errors=True)


def delete_documents(project: str) -> None:
    """Clear the project's documents in a shared emulator (its own DELETE endpoint)."""
    url = processes.emulator_url(os.environ["FIRESTORE_EMULATOR_HOST"])
    request = urllib.request.Request(
        f"{url}/emulator/v1/projects/{project}/databases/(default)/documents", method="DELETE"
    )
    with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=60) as answer:
        answer.read()


# -- the report --------------------------------------------------------------------------------


def ms_list(values: list[float]) -> str:
    return ", ".join(f"{v:.0f}" for v in values) + " ms"


def ratio(new: float, old: float) -> str:
    return f"x{new / old:.1f}" if old else "-"


def report(points: list[Point], ticks: int, single_ms: float, batched_ms: float) -> None:
    print(f"\nreconcile: one steady-state tick (nothing to repair), median of {ticks} ticks after a warm-up")
    print("  one zone; active jobs 80% RUNNING, 20% PROVISIONING; v4-8 (one worker host each)\n")
    header = (
        f"  {'active jobs':>11} | {'finished jobs':>13} | {'tick median ms':>14} | {'p95 ms':>8} | "
        f"{'Firestore docs read':>19} | {'TPU list calls':>14} | {'ms per active job':>17}"
    )
    print(header)
    print("  " + "-" * (len(header) - 2))
    for p in points:
        print(
            f"  {p.active:>11,} | {p.finished:>13,} | {p.median_ms:>14.0f} | "
            f"{percentile(p.ticks_ms, 0.95):>8.0f} | {p.documents:>19,} | {p.tpu_lists:>14} | "
            f"{p.median_ms / p.active:>17.2f}"
        )

    print("\n  where a tick's time goes (medians, ms), and what it fetches:")
    print(
        f"  {'active jobs':>11} | {'finished jobs':>13} | {'list_active':>11} | {'silent_workers':>14} | "
        f"{'TPU list':>8} | {'the rest':>8} | {'Firestore queries':>17} | {'TPU listing MB':>14}"
    )
    for p in points:
        print(
            f"  {p.active:>11,} | {p.finished:>13,} | {statistics.median(p.active_query_ms):>11.0f} | "
            f"{statistics.median(p.silent_query_ms):>14.0f} | {statistics.median(p.tpu_ms):>8.0f} | "
            f"{statistics.median(p.rest_ms):>8.0f} | {p.queries:>17} | {p.listed_mb:>14.1f}"
        )
    largest = points[-1]
    print(
        f"  (TPU listing: the JSON of both list answers; {largest.listed_mb * 1000 / largest.active:.1f} KB "
        "an active job: the adapter's field masks leave each resource's startup script behind)"
    )

    with_history = [p for p in points if p.finished == max(q.finished for q in points)]
    print("\n  growth between sizes (same finished jobs):")
    for old, new in itertools.pairwise(with_history):
        print(
            f"    {old.active:>5,} -> {new.active:>5,} active: jobs {ratio(new.active, old.active):>6}, "
            f"tick {ratio(new.median_ms, old.median_ms):>6}, docs read {ratio(new.documents, old.documents):>6}, "
            f"TPU list calls {ratio(new.tpu_lists, old.tpu_lists)}"
        )
    if len(with_history) >= 2:
        fit = statistics.linear_regression([p.active for p in with_history], [p.median_ms for p in with_history])
        print(f"    least-squares fit: tick = {fit.intercept:.0f} ms + {fit.slope:.2f} ms x active jobs")
    first = with_history[0]
    baseline = next((p for p in points if p.active == first.active and p.finished < first.finished), None)
    if baseline is not None:
        print(
            f"\n  finished jobs: {first.active:,} active with {baseline.finished:,} finished -> "
            f"{first.finished:,} finished: tick {baseline.median_ms:.0f} -> {first.median_ms:.0f} ms "
            f"({ratio(first.median_ms, baseline.median_ms)}), docs read {baseline.documents} -> "
            f"{first.documents}, TPU list calls {baseline.tpu_lists} -> {first.tpu_lists}"
        )
    print(
        f"\n  note: the Firestore emulator is much slower than the service ({single_ms:.0f} ms a "
        f"write here, {batched_ms:.1f} ms a document in batches of {BATCH}), single-threaded and "
        "without indexes (its queries scan), and the TPU simulator serves from this process "
        "(same GIL): absolute times are pessimistic. What matters is the growth: linear in "
        "active jobs, flat in finished ones (documents read, TPU calls)."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sizes",
        default="10,100,1000,5000",
        help="active jobs, ascending, comma-separated (default 10,100,1000,5000)",
    )
    parser.add_argument("--finished", type=int, default=10_000, help="finished jobs (default 10000)")
    parser.add_argument("--ticks", type=int, default=5, help="measured ticks per size (default 5)")
    args = parser.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error("--sizes must be whole numbers separated by commas")
    if not sizes or sizes != sorted(set(sizes)) or sizes[0] < 1:
        parser.error("--sizes must be ascending, distinct and at least 1")
    if args.ticks < 1 or args.finished < 0:
        parser.error("--ticks must be at least 1 and --finished not negative")

    project = f"bench-reconcile-{uuid.uuid4().hex[:8]}"
    with firestore_emulator() as shared:
        now = datetime.now(timezone.utc)
        settings = local_settings(project=project, default_zone=ZONE, logs_bucket=f"{project}-logs")
        fleet = Fleet(firestore.Client(project=project), settings, now)
        points: list[Point] = []
        try:
            single_ms = fleet.single_write_ms()
            for size in sizes:
                started = time.monotonic()
                written = fleet.add_active(size - fleet.active)
                print(
                    f"seeded {size:,} active jobs ({written:,} documents) in {time.monotonic() - started:.1f} s",
                    file=sys.stderr,
                )
                with simulator(fleet) as url:
                    if fleet.finished < args.finished:
                        if size == sizes[0]:  # before the history exists: the baseline
                            points.append(measure(fleet, url, args.ticks))
                            print(
                                f"  {size:,} active, {fleet.finished:,} finished: median "
                                f"{points[-1].median_ms:.0f} ms (ticks {ms_list(points[-1].ticks_ms)})",
                                file=sys.stderr,
                            )
                        started = time.monotonic()
                        written = fleet.add_finished(args.finished - fleet.finished)
                        took = time.monotonic() - started
                        print(
                            f"seeded {fleet.finished:,} finished jobs ({written:,} documents) in {took:.0f} s "
                            f"({took / written * 1000:.1f} ms a document)",
                            file=sys.stderr,
                        )
                    points.append(measure(fleet, url, args.ticks))
                print(
                    f"  {size:,} active, {fleet.finished:,} finished: median "
                    f"{points[-1].median_ms:.0f} ms (ticks {ms_list(points[-1].ticks_ms)})",
                    file=sys.stderr,
                )
        finally:
            if shared:
                delete_documents(project)
    report(points, args.ticks, single_ms, fleet.seeding_s * 1000 / max(1, fleet.seeded))
    return 0


if __name__ == "__main__":
    sys.exit(main())

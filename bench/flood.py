"""Forged-report flood: how long real worker reports wait while 20,000 forgeries arrive in 60 s.

Issue 26 item 2: any VM account may publish to tpujobs-worker-events, and each unsigned or
forged report used to cost a job read and a rejection write. The bench runs the engine in this
process on the real Firestore adapter against a Firestore emulator (capacity: the in-memory
fake, its holdings ACTIVE; heartbeats do not call it), with --jobs v4-8 jobs RUNNING. Their hosts
send signed heartbeats (`tpujobs.local.testing.signed`, as each commit's agents sign them),
one job after another, --real-rate a second in all. Every message goes into one FIFO queue,
emptied by --instances threads, each calling `on_worker_event`'s handler
(`engine.worker_events.on_worker_report`) one message at a time: a function at concurrency 1
and that many max instances. A handler that raises puts its message back at the tail (a
redelivery), its first enqueue time kept.

First a --warmup of heartbeats and 50 forgeries a second, not reported (the emulator's JVM is
slow on first use, which would count against whichever phase came first). Each run then has
two phases of --seconds: heartbeats alone (baseline), then heartbeats beside
--forged forgeries spread evenly over the phase (unsigned; a signature of zeros; signed with
a wrong key, naming the current key version and the job's creation time where the tree has
them), each naming a real job's attempt. A phase ends when the queue is empty again (at most
--drain more seconds). For each real report: enqueue-to-handled time; the table shows the
median and p95 of each phase (the median over --runs of each), and the job store's calls
(Firestore reads and writes) per message, by kind.

    .venv/bin/python bench/flood.py [--seconds 60] [--forged 20000] [--runs 3] [--jobs 20]
        [--real-rate 10] [--instances 8] [--warmup 20] [--drain 900]

To compare with an earlier commit, run this file on its tree (extracted, no worktree):
`mkdir -p /tmp/before && git archive a2757b5 | tar -x -C /tmp/before`, then
`PYTHONPATH=/tmp/before/shared .venv/bin/python bench/flood.py`. It starts a Firestore
emulator (or uses the one FIRESTORE_EMULATOR_HOST names, if it answers) and stops what it started.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import logging
import math
import queue
import secrets
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from reconcile import firestore_emulator  # the bench folder's own helper

EVENTS = "tpujobs-worker-events"
OWNER = "bench@example.com"
FORGERY_KINDS = ("unsigned", "zero signature", "wrong key")
WARMUP_FORGED_RATE = 50.0  # forgeries a second in the warm-up: below what the old engine handles here
TARGET = "a report's signature checked before any Firestore read; no Firestore write per forgery"


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of `values` (fraction 0.95: the p95)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def schedule(count: int, seconds: float) -> list[float]:
    """When each of `count` messages is due, in seconds from the start, spread evenly over `seconds`."""
    return [index * seconds / count for index in range(count)]


# -- the store, counted ------------------------------------------------------------------------


class CountingStore:
    """The real job store, counting calls by (the kind of message being handled, method).

    Each instance thread says what it handles in `handling.kind`; the engine holds this proxy
    as its store, so every Firestore read and write it makes is counted against that kind."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._lock = threading.Lock()
        self.handling = threading.local()
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            kind = getattr(self.handling, "kind", "setup")
            with self._lock:
                self.calls[(kind, name)] += 1
            return attribute(*args, **kwargs)

        return call


class KnownJobs:
    """`store.get` from jobs read once: lets `testing.signed` sign without a Firestore read each."""

    def __init__(self, jobs: dict[str, Any]) -> None:
        self._jobs = jobs

    def get(self, job_id: str) -> Any:
        return self._jobs.get(job_id)


# -- the messages ------------------------------------------------------------------------------


def heartbeat(job_id: str) -> dict[str, Any]:
    return {"kind": "heartbeat", "job_id": job_id, "attempt": 1, "slice_id": 0, "worker_id": 0}


def forgery(kind: str, job: Any, keys: Any, now: str) -> Any:
    """A forged heartbeat naming `job`'s attempt 1, as another job's code could publish it."""
    from tpujobs.domain import signing
    from tpujobs.engine.inbound import InboundMessage

    body = {**heartbeat(job.job_id), "at": now, "nonce": secrets.token_hex(16)}
    data = json.dumps(body).encode()
    attributes: dict[str, str] = {}
    if kind == "zero signature":
        attributes[signing.SIGNATURE_ATTRIBUTE] = signing.SIGNATURE_PREFIX + "0" * 64
    elif kind == "wrong key":
        attributes[signing.SIGNATURE_ATTRIBUTE] = signing.sign(secrets.token_bytes(32), data)
        if keys is not None:  # a tree with key versions: name the real ones (public facts)
            attributes[signing.KEY_VERSION_ATTRIBUTE] = keys.current_version
            attributes[signing.JOB_CREATED_ATTRIBUTE] = str(signing.created_micros(job.created_at))
    return InboundMessage(str(uuid.uuid4().int % 10**15), EVENTS, data, attributes)


def forgeries(count: int, jobs: list[Any], keys: Any) -> list[Any]:
    """`count` forgeries, the kinds in turn, naming the jobs in turn, timed now."""
    from tpujobs.runtime.instances import utc_now

    now = utc_now().isoformat()
    kinds = itertools.cycle(FORGERY_KINDS)
    return [forgery(next(kinds), jobs[index % len(jobs)], keys, now) for index in range(count)]


# -- one phase ---------------------------------------------------------------------------------


@dataclass
class Phase:
    """What one phase measured."""

    name: str
    latencies_s: list[float] = field(default_factory=list)  # each real report's enqueue to handled
    real: int = 0  # real reports sent
    forged: int = 0  # forgeries sent
    send_s: float = 0.0  # how long sending took (the forged rate achieved: forged / send_s)
    drain_s: float = 0.0  # after sending, until the queue was empty
    unhandled: int = 0  # real reports not handled when --drain ran out
    redelivered: int = 0  # handler errors: messages put back
    calls: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)

    @property
    def median_s(self) -> float:
        return statistics.median(self.latencies_s) if self.latencies_s else float("nan")

    @property
    def p95_s(self) -> float:
        return percentile(self.latencies_s, 0.95) if self.latencies_s else float("nan")


class Instances:
    """--instances threads taking (kind, enqueued at, message) from one FIFO queue."""

    def __init__(self, service: Any, store: CountingStore, count: int) -> None:
        self.service = service
        self.store = store
        self.inbox: queue.Queue[tuple[str, float, Any] | None] = queue.Queue()
        self.lock = threading.Lock()
        self.phase = Phase("idle")
        self.threads = [threading.Thread(target=self._serve, daemon=True) for _ in range(count)]
        for thread in self.threads:
            thread.start()

    def _serve(self) -> None:
        while (item := self.inbox.get()) is not None:
            kind, enqueued, message = item
            self.store.handling.kind = kind
            try:
                self.service.worker_events.on_worker_report(message)
            except Exception:  # a transient error: Pub/Sub would redeliver it
                with self.lock:
                    self.phase.redelivered += 1
                self.inbox.put(item)
            else:
                if kind == "real":
                    done = time.perf_counter() - enqueued
                    with self.lock:
                        self.phase.latencies_s.append(done)
            finally:
                self.inbox.task_done()

    def close(self) -> None:
        for _ in self.threads:
            self.inbox.put(None)
        for thread in self.threads:
            thread.join(timeout=30)


def run_phase(
    name: str, instances: Instances, signer: Any, jobs: list[Any], forged: list[Any], args: argparse.Namespace
) -> Phase:
    """Heartbeats at --real-rate for --seconds, with `forged` spread over them; then drain."""
    from tpujobs.local.testing import signed

    phase = instances.phase = Phase(name)
    before = collections.Counter(instances.store.calls)
    real_count = max(1, round(args.real_rate * args.seconds))
    due = sorted(
        [(at, "real", index) for index, at in enumerate(schedule(real_count, args.seconds))]
        + [(at, "forged", index) for index, at in enumerate(schedule(len(forged), args.seconds))]
    )
    started = time.perf_counter()
    for at, kind, index in due:
        delay = started + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        if kind == "real":
            message = signed(signer, EVENTS, heartbeat(jobs[index % len(jobs)].job_id))
            phase.real += 1
        else:
            message = forged[index]
            phase.forged += 1
        instances.inbox.put((kind, time.perf_counter(), message))
    phase.send_s = time.perf_counter() - started
    sent = time.perf_counter()
    deadline = sent + args.drain
    while instances.inbox.unfinished_tasks and time.perf_counter() < deadline:
        time.sleep(0.05)
    phase.drain_s = time.perf_counter() - sent
    with instances.lock:
        phase.unhandled = phase.real - len(phase.latencies_s)
    phase.calls = collections.Counter(instances.store.calls)
    phase.calls.subtract(before)
    if instances.inbox.unfinished_tasks:  # empty the queue so the next phase starts clean
        with contextlib.suppress(queue.Empty):
            while True:
                instances.inbox.get_nowait()
                instances.inbox.task_done()
        instances.inbox.join()
    print(
        f"  {name}: {phase.real} real, {phase.forged} forged in {phase.send_s:.1f} s, drained in "
        f"{phase.drain_s:.1f} s; real p50 {phase.median_s * 1000:.0f} ms, p95 {phase.p95_s * 1000:.0f} ms",
        file=sys.stderr,
    )
    return phase


# -- the setup ---------------------------------------------------------------------------------


def running_jobs(service: Any, count: int) -> list[Any]:
    """`count` v4-8 jobs submitted and RUNNING (each host's signed `started`), as stored."""
    from tpujobs.domain.states import JobState
    from tpujobs.local.testing import inbound, signed

    suffix = uuid.uuid4().hex[:6]
    ids = [f"flood-{suffix}-{index:03d}" for index in range(count)]
    for job_id in ids:
        spec = {"job_id": job_id, "name": "bench-flood", "owner": OWNER, "accelerator_type": "v4-8",
                "command": "python3 train.py"}  # fmt: skip
        service.submission.submit(inbound("tpujobs-submit", spec))
        service.worker_events.on_worker_report(signed(service, EVENTS, {**heartbeat(job_id), "kind": "started"}))
    jobs = [service.store.get(job_id) for job_id in ids]
    not_running = [job.job_id for job in jobs if job is None or job.state is not JobState.RUNNING]
    if not_running:
        raise SystemExit(f"jobs not RUNNING after their started reports: {not_running[:3]}")
    return jobs


def measure(args: argparse.Namespace) -> tuple[list[tuple[Phase, Phase]], str]:
    from google.cloud import firestore

    from tpujobs.adapters.firestore_store import FirestoreJobStore
    from tpujobs.engine.services import Engine
    from tpujobs.local.fakes import InMemoryCapacity
    from tpujobs.local.testing import local_settings
    from tpujobs.runtime.instances import utc_now

    project = f"bench-flood-{uuid.uuid4().hex[:8]}"
    settings = local_settings(project=project, default_zone="us-central2-b", logs_bucket="logs")
    store = CountingStore(FirestoreJobStore(firestore.Client(project=project)))
    service = Engine(store, InMemoryCapacity("ACTIVE"), settings, utc_now, lambda seconds: None)
    jobs = running_jobs(service, args.jobs)
    signer = SimpleNamespace(store=KnownJobs({job.job_id: job for job in jobs}), clock=utc_now, settings=settings)
    keys = settings.master_keys() if hasattr(settings, "master_keys") else None
    tree = "with key versions" if keys is not None else "without key versions"
    instances = Instances(service, store, args.instances)
    results = []
    try:
        if args.warmup > 0:  # the emulator's JVM compiles its read and write paths on first use
            print("warm-up (not reported):", file=sys.stderr)
            warm = argparse.Namespace(**{**vars(args), "seconds": args.warmup})
            run_phase(
                "warm-up", instances, signer, jobs, forgeries(int(WARMUP_FORGED_RATE * args.warmup), jobs, keys), warm
            )
        for run in range(args.runs):
            print(f"run {run + 1} of {args.runs}:", file=sys.stderr)
            baseline = run_phase("no flood", instances, signer, jobs, [], args)
            flood = run_phase("flood", instances, signer, jobs, forgeries(args.forged, jobs, keys), args)
            results.append((baseline, flood))
    finally:
        instances.close()
    return results, tree


# -- the report --------------------------------------------------------------------------------


def per_message(phase: Phase, kind: str, count: int) -> str:
    """The store calls of one kind of message, per message, by method."""
    calls = {method: n for (k, method), n in sorted(phase.calls.items()) if k == kind and n}
    if not count:
        return "none sent"
    return ", ".join(f"{method} {n:,} ({n / count:.3f} each)" for method, n in calls.items()) or "no store call"


def report(results: list[tuple[Phase, Phase]], args: argparse.Namespace, tree: str) -> None:
    print(
        f"\nflood: {args.jobs} RUNNING jobs, heartbeats at {args.real_rate:g}/s; {args.instances} instances at "
        f"concurrency 1; {args.seconds:g} s phases, {args.runs} run(s); engine {tree}"
    )
    header = (
        f"  {'phase':<9} | {'real':>5} | {'forged':>6} | {'forged/s':>8} | {'drain s':>7} | {'p50 ms':>8} | "
        f"{'p95 ms':>8} | {'unhandled':>9} | {'redelivered':>11}"
    )
    print(header)
    print("  " + "-" * (len(header) - 2))
    for name, index in (("no flood", 0), ("flood", 1)):
        phases = [pair[index] for pair in results]
        rate = statistics.median(p.forged / p.send_s if p.send_s else 0.0 for p in phases)
        print(
            f"  {name:<9} | {phases[0].real:>5} | {phases[0].forged:>6} | {rate:>8.0f} | "
            f"{statistics.median(p.drain_s for p in phases):>7.1f} | "
            f"{statistics.median(p.median_s for p in phases) * 1000:>8.0f} | "
            f"{statistics.median(p.p95_s for p in phases) * 1000:>8.0f} | "
            f"{max(p.unhandled for p in phases):>9} | {max(p.redelivered for p in phases):>11}"
        )
    print("  (p50 and p95: the median over runs of each run's figure; unhandled, redelivered: the most in a run)")
    for run, (baseline, flood) in enumerate(results, 1):
        print(f"  run {run}: p95 {baseline.p95_s * 1000:.0f} ms without, {flood.p95_s * 1000:.0f} ms with the flood")
    last = results[-1][1]
    print("\n  job store calls (Firestore reads and writes) per message, in the last flood:")
    print(f"    real:   {per_message(last, 'real', last.real)}")
    print(f"    forged: {per_message(last, 'forged', last.forged)}")
    forged_calls = sum(n for (kind, _), n in last.calls.items() if kind == "forged")
    reads = last.calls[("forged", "get")]
    # at most one record per (topic, reason) a minute, and the first of each: a few, whatever the flood
    allowed = len(FORGERY_KINDS) * (1 + math.ceil((last.send_s + last.drain_s) / 60))
    met = "met" if reads == 0 and forged_calls <= allowed else "NOT met"
    print(f"\n  target (issue 26): {TARGET}: {met} ({reads:,} job reads, {forged_calls:,} store calls in all)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="each phase's length (default 60)")
    parser.add_argument("--forged", type=int, default=20_000, help="forgeries in the flood phase (default 20000)")
    parser.add_argument("--runs", type=int, default=3, help="runs of both phases (default 3)")
    parser.add_argument("--jobs", type=int, default=20, help="RUNNING jobs (default 20)")
    parser.add_argument("--real-rate", type=float, default=10.0, help="real heartbeats a second (default 10)")
    parser.add_argument("--instances", type=int, default=8, help="handler threads: max instances (default 8)")
    parser.add_argument("--warmup", type=float, default=20.0, help="unreported warm-up seconds (default 20)")
    parser.add_argument("--drain", type=float, default=900.0, help="most seconds to wait for the queue (default 900)")
    args = parser.parse_args()
    if args.seconds <= 0 or args.real_rate <= 0 or args.drain < 0 or args.warmup < 0:
        parser.error("--seconds and --real-rate must be positive, --drain and --warmup not negative")
    if args.forged < 0 or args.runs < 1 or args.jobs < 1 or args.instances < 1:
        parser.error("--runs, --jobs and --instances must be at least 1, --forged not negative")
    # Every rejection logs a warning (the old tree: one per forgery); to stderr here would be
    # 20,000 lines. Production writes them to Cloud Logging; the bench keeps only errors.
    logging.getLogger("tpujobs").setLevel(logging.ERROR)
    with firestore_emulator():
        results, tree = measure(args)
    report(results, args, tree)
    return 0


if __name__ == "__main__":
    sys.exit(main())

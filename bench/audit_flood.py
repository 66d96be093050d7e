"""Forged audit-entry flood: what each forged TPU audit entry on tpujobs-qr-state costs the engine.

Issue 37 item 1: a job's code could write entries shaped like the TPU API's audit entries, which
the log sink forwarded to tpujobs-qr-state, and the handler read the holding in whatever zone the
entry named: nothing there, so the victim's attempt was lost, again and again until
`max_restarts` failed it. The sink now takes the admin-activity audit log only, but the handler
must hold whatever reaches the topic. This bench counts what it does per entry.

The engine runs in this process on the in-memory fakes (`tpujobs.local.fakes`: the job store and
the capacity, its holdings ACTIVE), with no emulator: the figures are the engine's own work per
entry, counted, not Firestore's latency. Each run builds a fresh engine with --jobs v4-8 jobs
RUNNING (each host's signed `started`), and --real more set apart. It then sends --forged forged
entries, one at a time to `capacity_events.on_qr_state`, the kinds in turn, each naming a job's
current holding (read just before, as a forger would guess it: `{job}-a{attempt}`), in turn:

- another zone: the holding's name, in a zone it was not requested in;
- another project: the holding in its own zone, under another project;
- another log: the holding in its own zone and project, from a log a job may write;
- not held: the job's next attempt (`{job}-a{attempt+1}`), in its own zone.

Then --real real entries: for each set-apart job, Google deletes its holding and Google's entry of
the deletion (this project's admin-activity log, the holding's own zone) arrives: it must move the
job to its next attempt. Counted per entry, by kind: capacity reads (`status` calls on the
capacity), other capacity calls (requests, releases), job-store writes (every call that may write:
a transaction counts once, whether or not it changed anything), rejection records written (of
those writes), jobs whose attempt or state changed (for a forgery: the damage), and the handler's
time (median and p95 over the entries of a run; the table shows the median over --runs of each).
Counts are the most in any run.

    .venv/bin/python bench/audit_flood.py [--forged 5000] [--jobs 20] [--real 5] [--runs 3]

To compare with an earlier commit, run this file on its tree (extracted, no worktree):
`mkdir -p /tmp/before && git archive 8f95025 | tar -x -C /tmp/before`, then
`PYTHONPATH=/tmp/before/shared .venv/bin/python bench/audit_flood.py`. The engine is built only
through what both trees have (the `Engine` constructor, `capacity_events.on_qr_state`, the
fakes, `local.testing`), not the tests' harness; nothing else is started.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import logging
import math
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

QR_STATE = "tpujobs-qr-state"
EVENTS = "tpujobs-worker-events"
PROJECT = "bench-project"
ZONE = "us-central2-b"
OTHER_ZONE = "us-east5-a"
OWNER = "bench@example.com"
FORGERY_KINDS = ("another zone", "another project", "another log", "not held")
ACTIVITY_LOG = f"projects/{PROJECT}/logs/cloudaudit.googleapis.com%2Factivity"
JOB_LOG = f"projects/{PROJECT}/logs/tpu-audit"  # any log id a job's logWriter role may write
TARGET = "a forged audit entry reads no capacity, ends no attempt, and costs no write per entry"
# The job store's methods that only read (`engine.ports`); every other call counts as a write.
STORE_READS = frozenset({
    "get", "events", "unannounced_events", "attempt_workers", "attempt_workers_heard", "attempt_workers_succeeded",
    "silent_workers", "list_jobs", "active_placements", "active_in_shard", "outlines", "ended_between",
    "recall_report", "unit_secret_sha256", "attempt_logs", "rejections", "rejection_documents",
})  # fmt: skip


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of `values` (fraction 0.95: the p95)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


# -- the ports, counted ------------------------------------------------------------------------


class Counted:
    """A port (the job store, the capacity), counting its calls by (`tally.kind`, port, method)."""

    def __init__(self, port: Any, name: str, tally: Tally) -> None:
        self._port = port
        self._name = name
        self._tally = tally

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._port, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            self._tally.calls[(self._tally.kind, self._name, name)] += 1
            return attribute(*args, **kwargs)

        return call


@dataclass
class Tally:
    """What is being sent now, and the calls each kind made."""

    kind: str = "setup"
    calls: collections.Counter[tuple[str, str, str]] = field(default_factory=collections.Counter)


# -- the entries -------------------------------------------------------------------------------


def audit_entry(holding: str, zone: str = ZONE, project: str = PROJECT, log_name: str = ACTIVITY_LOG) -> bytes:
    """A TPU audit entry of a queued resource's deletion, as the log sink publishes it."""
    return json.dumps(
        {
            "insertId": uuid.uuid4().hex[:12],
            "logName": log_name,
            "operation": {"id": f"operations/{uuid.uuid4().hex[:8]}", "producer": "tpu.googleapis.com", "last": True},
            "protoPayload": {
                "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
                "serviceName": "tpu.googleapis.com",
                "methodName": "google.cloud.tpu.v2.Tpu.DeleteQueuedResource",
                "resourceName": f"projects/{project}/locations/{zone}/queuedResources/{holding}",
            },
            "severity": "NOTICE",
            "timestamp": "2026-11-22T05:00:00Z",
        }
    ).encode()


def forged_entry(kind: str, job: Any) -> bytes:
    """A forged entry of `kind` naming `job`'s holding as it is now (its next attempt's: 'not held')."""
    holding = job.queued_resource or f"{job.job_id}-a{job.attempt}"
    if kind == "another zone":
        return audit_entry(holding, zone=OTHER_ZONE)
    if kind == "another project":
        return audit_entry(holding, project="someone-else")
    if kind == "another log":
        return audit_entry(holding, log_name=JOB_LOG)
    return audit_entry(f"{job.job_id}-a{job.attempt + 1}")


# -- one run -----------------------------------------------------------------------------------


@dataclass
class Sent:
    """What one kind of entry did in one run."""

    count: int = 0
    times_s: list[float] = field(default_factory=list)  # each entry's handler time
    moved: set[str] = field(default_factory=set)  # jobs whose attempt or state an entry changed
    failed: set[str] = field(default_factory=set)  # of those, jobs that ended FAILED
    errors: int = 0  # handler raised
    calls: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)  # (port, method)

    def total(self, counted: Any) -> int:
        return sum(n for call, n in self.calls.items() if counted(*call))

    def per_entry(self, counted: Any) -> float:
        return self.total(counted) / self.count if self.count else 0.0


@dataclass
class Run:
    sent: dict[str, Sent]
    seconds: float  # the flood's wall time, handler and forger both


class Bench:
    """A fresh engine on the in-memory fakes, its store and capacity counted."""

    def __init__(self) -> None:
        from tpujobs.engine.services import Engine
        from tpujobs.local.fakes import InMemoryCapacity, InMemoryJobStore
        from tpujobs.local.testing import local_settings
        from tpujobs.runtime.instances import utc_now

        self.tally = Tally()
        self.raw_store = InMemoryJobStore()
        self.raw_capacity = InMemoryCapacity("ACTIVE")
        settings = local_settings(project=PROJECT, default_zone=ZONE, logs_bucket="logs")
        store, capacity = (
            Counted(self.raw_store, "store", self.tally),
            Counted(self.raw_capacity, "capacity", self.tally),
        )
        self.service = Engine(store, capacity, settings, utc_now, lambda seconds: None)

    def running(self, prefix: str, count: int) -> list[str]:
        """`count` v4-8 jobs submitted and RUNNING (each host's signed `started`): their ids."""
        from tpujobs.domain.states import JobState
        from tpujobs.local.testing import inbound, signed

        ids = [f"{prefix}-{index:03d}" for index in range(count)]
        for job_id in ids:
            spec = {"job_id": job_id, "name": "bench-audit", "owner": OWNER, "accelerator_type": "v4-8",
                    "command": "python3 train.py"}  # fmt: skip
            self.service.submission.submit(inbound("tpujobs-submit", spec))
            started = {"kind": "started", "job_id": job_id, "attempt": 1, "slice_id": 0, "worker_id": 0}
            self.service.worker_events.on_worker_report(signed(self.service, EVENTS, started))
        not_running = [i for i in ids if (job := self.raw_store.get(i)) is None or job.state is not JobState.RUNNING]
        if not_running:
            raise SystemExit(f"jobs not RUNNING after their started reports: {not_running[:3]}")
        return ids

    def send(self, kind: str, job_id: str, data: bytes, sent: Sent, message_id: str) -> None:
        """One entry to the tpujobs-qr-state handler, timed; what it changed of `job_id`."""
        from tpujobs.domain.states import JobState
        from tpujobs.engine.inbound import InboundMessage

        before = self.raw_store.get(job_id)
        message = InboundMessage(message_id, QR_STATE, data, {})
        self.tally.kind = kind
        started = time.perf_counter()
        try:
            self.service.capacity_events.on_qr_state(message)
        except Exception:
            sent.errors += 1
        sent.times_s.append(time.perf_counter() - started)
        self.tally.kind = "between"
        after = self.raw_store.get(job_id)
        sent.count += 1
        if before is not None and after is not None and (after.attempt, after.state) != (before.attempt, before.state):
            sent.moved.add(job_id)
            if after.state is JobState.FAILED:
                sent.failed.add(job_id)


def one_run(args: argparse.Namespace) -> Run:
    """A fresh engine: --forged forged entries against --jobs jobs, then --real of Google's own."""
    bench = Bench()
    suffix = uuid.uuid4().hex[:6]
    targets = bench.running(f"audit-{suffix}", args.jobs)
    apart = bench.running(f"real-{suffix}", args.real)
    ids = (f"bench-{n}" for n in itertools.count())
    sent = {kind: Sent() for kind in (*FORGERY_KINDS, "real")}
    started = time.perf_counter()
    for index in range(args.forged):  # every job gets every kind in turn
        kind = FORGERY_KINDS[index % len(FORGERY_KINDS)]
        job_id = targets[(index // len(FORGERY_KINDS)) % len(targets)]
        job = bench.raw_store.get(job_id)  # what the forger sees of its victim (not counted)
        bench.send(kind, job_id, forged_entry(kind, job), sent[kind], next(ids))
    seconds = time.perf_counter() - started
    for job_id in apart:  # Google deletes the holding, and its own entry of that arrives
        job = bench.raw_store.get(job_id)
        if job is None or not job.queued_resource or not job.zone:
            raise SystemExit(f"{job_id} holds nothing to delete")
        bench.raw_capacity.vanish(job.queued_resource)
        bench.send("real", job_id, audit_entry(job.queued_resource, zone=job.zone), sent["real"], next(ids))
    for (kind, port, method), n in bench.tally.calls.items():
        if kind in sent:
            sent[kind].calls[(port, method)] += n
    return Run(sent, seconds)


# -- the report --------------------------------------------------------------------------------


def capacity_read(port: str, method: str) -> bool:
    return port == "capacity" and method == "status"


def capacity_other(port: str, method: str) -> bool:
    return port == "capacity" and method != "status"


def store_write(port: str, method: str) -> bool:
    return port == "store" and method not in STORE_READS


def rejection(port: str, method: str) -> bool:
    return port == "store" and method == "reject"


def row(name: str, runs: list[Run], kinds: tuple[str, ...]) -> tuple[str, dict[str, float]]:
    """One line of the table for `kinds` together; and its figures (the worst run's counts)."""
    merged = []
    for run in runs:
        total = Sent()
        for kind in kinds:
            part = run.sent[kind]
            total.count += part.count
            total.times_s += part.times_s
            total.moved |= part.moved
            total.failed |= part.failed
            total.errors += part.errors
            total.calls.update(part.calls)
        merged.append(total)
    if not merged[0].count:
        return f"  {name:<17} | {'none sent':>7} |", {}
    figures = {
        "sent": merged[0].count,
        "reads": max(s.per_entry(capacity_read) for s in merged),
        "capacity other": max(s.per_entry(capacity_other) for s in merged),
        "writes": max(s.per_entry(store_write) for s in merged),
        "write calls": max(s.total(store_write) for s in merged),
        "rejections": max(s.total(rejection) for s in merged),
        "moved": max(len(s.moved) for s in merged),
        "failed": max(len(s.failed) for s in merged),
        "errors": max(s.errors for s in merged),
        "p50": statistics.median(statistics.median(s.times_s) for s in merged) * 1e6,
        "p95": statistics.median(percentile(s.times_s, 0.95) for s in merged) * 1e6,
    }
    line = (
        f"  {name:<17} | {figures['sent']:>7,} | {figures['reads']:>9.3f} | {figures['capacity other']:>9.3f} | "
        f"{figures['writes']:>9.3f} | {figures['rejections']:>10,} | {figures['moved']:>10} | "
        f"{figures['failed']:>6} | {figures['errors']:>6} | {figures['p50']:>7.0f} | {figures['p95']:>7.0f}"
    )
    return line, figures


def report(runs: list[Run], args: argparse.Namespace, tree: str) -> None:
    print(
        f"\naudit flood: {args.jobs} RUNNING jobs, {args.forged:,} forged entries on {QR_STATE} (the 4 kinds in "
        f"turn), then {args.real} of Google's own (a deletion, the holding's zone); {args.runs} run(s); engine {tree}"
    )
    header = (
        f"  {'entries':<17} | {'sent':>7} | {'cap reads':>9} | {'cap other':>9} | {'writes':>9} | "
        f"{'rejections':>10} | {'jobs moved':>10} | {'FAILED':>6} | {'errors':>6} | {'p50 us':>7} | {'p95 us':>7}"
    )
    print(header)
    print("  " + "-" * (len(header) - 2))
    forged_line, forged = row("forged, all", runs, FORGERY_KINDS)
    print(forged_line)
    for kind in FORGERY_KINDS:
        print(row(f"  {kind}", runs, (kind,))[0])
    real_line, real = row("real (Google's)", runs, ("real",))
    print(real_line)
    print(
        "  (cap reads, cap other, writes: per entry; rejections: records written in a run; jobs moved: attempt or "
        "state changed; counts the most in a run, times the median over runs of each run's p50 and p95)"
    )
    # the first record of each reason, then at most one count a minute per reason
    longest = max(run.seconds for run in runs)
    allowed = len(FORGERY_KINDS) * (1 + math.ceil(longest / 60))
    met = forged and forged["reads"] == 0 and forged["moved"] == 0 and forged["write calls"] <= allowed
    print(
        f"\n  target (issue 37): {TARGET}: {'met' if met else 'NOT met'} ({forged.get('reads', 0):.3f} capacity reads "
        f"and {forged.get('writes', 0):.3f} writes per entry, {forged.get('write calls', 0):,.0f} writes in all, "
        f"{forged.get('moved', 0):.0f} of {args.jobs} jobs moved)"
    )
    if args.real:
        print(f"  real entries: {real.get('moved', 0):.0f} of {args.real} moved their job, as they must")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--forged", type=int, default=5_000, help="forged entries a run (default 5000)")
    parser.add_argument("--jobs", type=int, default=20, help="RUNNING jobs the forgeries name (default 20)")
    parser.add_argument("--real", type=int, default=5, help="real entries a run, one per job set apart (default 5)")
    parser.add_argument("--runs", type=int, default=3, help="runs, each on a fresh engine (default 3)")
    args = parser.parse_args()
    if args.forged < 1 or args.jobs < 1 or args.real < 0 or args.runs < 1:
        parser.error("--forged, --jobs and --runs must be at least 1, --real not negative")
    # Every refusal and every lost attempt logs a warning; the bench keeps only errors.
    logging.getLogger("tpujobs").setLevel(logging.ERROR)
    import tpujobs.engine.jobs.capacity_events as capacity_events

    tree = "with AuditEntries" if hasattr(capacity_events, "AuditEntries") else "without AuditEntries"
    runs = []
    for run in range(args.runs):
        runs.append(one_run(args))
        print(f"run {run + 1} of {args.runs}: the flood took {runs[-1].seconds:.1f} s", file=sys.stderr)
    report(runs, args, tree)
    return 0


if __name__ == "__main__":
    sys.exit(main())

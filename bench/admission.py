"""Admission under a quota: 1,000 queued jobs, room for 10 at a time.

Runs the job service in this process against a Firestore emulator and an in-process TPU
simulator (no worker processes), with a quota of 40 v4 chips (ten v4-8 jobs of 4 chips).
It submits 1,000 jobs (10 are admitted, 990 wait QUEUED), then, trial after trial, ends
one running job the way its last worker would (an `exited 0` report) and measures:

  latency      from the SUCCEEDED commit of the ending job to the ADMITTED (PROVISIONING)
               commit of the next one, both stamped by the service's clock: the admission
               is done inside the handler of the event that freed the chips, no tick involved
  operations   Firestore operations per admission, counted at the adapters: a document read
               per document a get, view or query returned (a query that returns nothing
               still costs one), a write per document a commit wrote

    .venv/bin/python bench/admission.py [--jobs 1000 --trials 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from datetime import datetime, timezone
from typing import Any, ClassVar

from google.cloud import firestore

from reconcile import firestore_emulator  # the bench folder's own helper
from tpujobs.adapters.firestore_pools import FirestorePools
from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.adapters.tpu import CloudTpu, build_client
from tpujobs.domain.quotas import pool_key
from tpujobs.domain.states import JobState
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.services import Engine
from tpujobs.local.simulator import SimulatorConfig, SimulatorServer
from tpujobs.local.testing import local_settings, signed

ZONE = "us-central2-b"
QUOTA_CHIPS = 40  # ten v4-8 jobs


class Counted:
    """Counts Firestore reads and writes of the adapter calls made through it."""

    READS: ClassVar[dict[str, int]] = {"get": 1, "view": 1, "quotas": 1}
    WRITES: ClassVar[dict[str, int]] = {"reject": 1, "record_worker": 1, "mark_announced": 1}

    def __init__(self, inner: Any, counts: Counter) -> None:
        self._inner, self._counts = inner, counts

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)
        if not callable(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            if name in ("queue", "active_in", "list", "active_placements", "active_in_shard", "outlines"):
                self._counts["reads"] += max(1, len(result))
            elif name == "apply":
                self._counts["reads"] += 1
                self._counts["writes"] += 2 if hasattr(result, "event") else 0  # the job and its event
            elif name == "create":
                self._counts["writes"] += 2
            elif name == "change":
                self._counts["writes"] += 1
                self._counts["cas_lost"] += result is False
            else:
                self._counts["reads"] += self.READS.get(name, 0)
                self._counts["writes"] += self.WRITES.get(name, 0)
            return result

        return call


def message(topic: str, payload: dict) -> InboundMessage:
    return InboundMessage(uuid.uuid4().hex, topic, json.dumps(payload).encode())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--concurrent", type=int, default=10, help="writers at once in the contention test")
    args = parser.parse_args()
    project = f"bench-admission-{uuid.uuid4().hex[:8]}"
    counts: Counter = Counter()
    config = SimulatorConfig(waiting_seconds=0.05, provisioning_seconds=0.1, tick_seconds=0.5)
    with firestore_emulator(), SimulatorServer(config, run_workers=False) as simulator:
        client = firestore.Client(project=project)
        pools = FirestorePools(client)
        pools.set_quota(ZONE, "v4", "on-demand", QUOTA_CHIPS)
        settings = local_settings(project=project, default_zone=ZONE, tpu_endpoint=simulator.url, logs_bucket="logs")
        service = Engine(
            Counted(FirestoreJobStore(client), counts),
            CloudTpu(build_client(simulator.url), project),
            settings,
            lambda: datetime.now(timezone.utc),
            lambda _: None,
            pools=Counted(pools, counts),
        )
        started = time.perf_counter()
        for n in range(args.jobs):
            service.submission.submit(
                message(
                    "tpujobs-submit",
                    {
                        "job_id": f"job-{n:05d}",
                        "name": "queued",
                        "owner": "bench@example.com",
                        "accelerator_type": "v4-8",
                        "command": "python train.py",
                    },
                )
            )
        print(f"submitted {args.jobs} jobs in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        running = [j.job_id for j in service.store.list_jobs(state="PROVISIONING", limit=100)]
        queued = len(service.store.list_jobs(state="QUEUED", limit=args.jobs))
        print(f"admitted {len(running)}, waiting {queued}", file=sys.stderr)

        latencies, reads, writes, handler = [], [], [], []
        for _ in range(args.trials):
            ending = running.pop(0)
            before_ids = {j.job_id for j in service.store.list_jobs(state="PROVISIONING", limit=100)}
            counts.clear()
            t0 = time.perf_counter()
            service.worker_events.on_worker_report(
                signed(
                    service,
                    "tpujobs-worker-events",
                    {
                        "kind": "exited",
                        "job_id": ending,
                        "attempt": 1,
                        "slice_id": 0,
                        "worker_id": 0,
                        "exit_code": 0,
                    },
                )
            )
            handler.append(time.perf_counter() - t0)
            ops = Counter(counts)
            now_ids = {j.job_id for j in service.store.list_jobs(state="PROVISIONING", limit=100)}
            (admitted,) = now_ids - before_ids
            running.append(admitted)
            ended_at = next(e.at for e in service.store.events(ending) if e.to_state is JobState.SUCCEEDED)
            admitted_at = next(e.at for e in service.store.events(admitted) if e.to_state is JobState.PROVISIONING)
            latencies.append((admitted_at - ended_at).total_seconds())
            reads.append(ops["reads"])
            writes.append(ops["writes"])

        print("\nconcurrency: one document under concurrent writers", file=sys.stderr)
        hot = transactions_on_one_document(client, args.concurrent)
        burst = concurrent_endings(service, running, args.concurrent, counts)

    def ms(values: list[float]) -> str:
        ordered = sorted(values)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        return f"median {statistics.median(values) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms"

    print(f"\nadmission after a job ends ({args.trials} trials, {args.jobs} jobs, quota for 10 at a time)")
    print(f"  SUCCEEDED commit -> next job ADMITTED: {ms(latencies)}")
    print(f"  the whole handler of the ending report: {ms(handler)}")
    print(
        f"  Firestore per admission (the ending included): reads median {statistics.median(reads):.0f}, "
        f"writes median {statistics.median(writes):.0f}"
    )
    print(f"\n{args.concurrent} writers at once on one document")
    print(
        f"  read-write transactions: {hot['ok']} committed, {hot['failed']} failed"
        f" ({', '.join(hot['errors']) or 'no error'})"
    )
    print(
        f"  {args.concurrent} jobs ending at once through admission (compare-and-set on the pool document):"
        f" {burst['admitted']} admitted, {burst['errors']} errors, {burst['cas_lost']} lost races retried,"
        f" chips held {burst['held']} of {QUOTA_CHIPS}"
    )
    return 0


def transactions_on_one_document(client: firestore.Client, writers: int) -> dict[str, Any]:
    """What admission would meet with a counter in a read-write transaction: lock waits."""
    ref = client.collection("bench_hot").document("counter")
    ref.set({"n": 0})
    outcome: dict[str, Any] = {"ok": 0, "failed": 0, "errors": set()}
    lock = threading.Lock()

    def add_one() -> None:
        @firestore.transactional
        def increment(transaction: firestore.Transaction) -> None:
            snapshot = ref.get(transaction=transaction)
            time.sleep(0.05)  # the work between read and write: a TPU request, say
            transaction.update(ref, {"n": snapshot.get("n") + 1})

        try:
            increment(client.transaction(max_attempts=5))
            with lock:
                outcome["ok"] += 1
        except Exception as error:  # counted and named below
            with lock:
                outcome["failed"] += 1
                outcome["errors"].add(f"{type(error).__name__}: {str(error)[:60]}")

    threads = [threading.Thread(target=add_one) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    outcome["errors"] = sorted(outcome["errors"])
    return outcome


def concurrent_endings(service: Engine, running: list[str], writers: int, counts: Counter) -> dict[str, int]:
    """`writers` running jobs end at the same moment; each handler admits the next job."""
    pool = pool_key("v4", "on-demand", ZONE).id
    ending = running[:writers]
    before = {j.job_id for j in service.store.list_jobs(state="PROVISIONING", limit=100)}
    errors: list[BaseException] = []
    counts.clear()

    def end(job_id: str) -> None:
        try:
            service.worker_events.on_worker_report(
                signed(
                    service,
                    "tpujobs-worker-events",
                    {
                        "kind": "exited",
                        "job_id": job_id,
                        "attempt": 1,
                        "slice_id": 0,
                        "worker_id": 0,
                        "exit_code": 0,
                    },
                )
            )
        except BaseException as error:  # counted below
            errors.append(error)

    threads = [threading.Thread(target=end, args=(job_id,)) for job_id in ending]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after = {j.job_id for j in service.store.list_jobs(state="PROVISIONING", limit=100)}
    held = sum(h.chips for h in service.pools.view(pool).holders)
    return {"admitted": len(after - before), "errors": len(errors), "cas_lost": counts["cas_lost"], "held": held}


if __name__ == "__main__":
    sys.exit(main())

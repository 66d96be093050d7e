"""Publish-to-PROVISIONING latency and throughput of job submission on the local stack.

Each job is timed from just before its spec is published to `tpujobs-submit` until the
`at` of its PROVISIONING event, which the submit function stamps when it commits the
transition (same machine, same clock): no polling interval is in the number.

Two runs:
  sequential  one job at a time: the latency a user sees on a quiet system
  burst       all N published at once: throughput, and latency under load

    .venv/bin/python bench/submit.py [-n 200] [--repeats 3]

It starts the local stack in a temporary directory (or uses the one named by the
environment) and stops what it started.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

from tpujobs.config import Settings
from tpujobs.dev import stack
from tpujobs.simulator.client import SimulatorControl
from tpujobs.topology import SUBMIT


def spec(job_id: str) -> dict[str, object]:
    return {
        "job_id": job_id,
        "name": "bench",
        "owner": "bench@example.com",
        "accelerator_type": "v4-8",
        "command": "true",
    }


def simulator_config(endpoint: str, changes: dict[str, object]) -> dict[str, object]:
    """Change the TPU simulator's settings; the settings as they were before."""
    control = SimulatorControl(endpoint)
    before = control.config()
    control.configure(**changes)
    return before


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def provisioned_at(firestore_client, job_id: str, deadline: float) -> tuple[datetime, datetime]:
    """When the function started on the job (its QUEUED event) and when it was PROVISIONING."""
    events = firestore_client.collection("jobs").document(job_id).collection("events")
    while time.monotonic() < deadline:
        doc = events.document("0002-provisioning").get()
        if doc.exists:
            return events.document("0001-queued").get().to_dict()["at"], doc.to_dict()["at"]
        time.sleep(0.02)
    raise TimeoutError(f"{job_id} did not reach PROVISIONING")


def run(mode: str, n: int, publisher, firestore_client) -> dict[str, float]:
    """Latencies (ms) of n submissions, one by one or all at once."""
    run_id = uuid.uuid4().hex[:6]
    job_ids = [f"bench-{run_id}-{i}" for i in range(n)]
    published: dict[str, datetime] = {}

    def publish(job_id: str) -> None:
        published[job_id] = datetime.now(timezone.utc)
        publisher.publish_bytes(SUBMIT, json.dumps(spec(job_id)).encode())

    started = time.monotonic()
    if mode == "sequential":
        for job_id in job_ids:
            publish(job_id)
            provisioned_at(firestore_client, job_id, time.monotonic() + 60)
    else:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(publish, job_ids))
    deadline = time.monotonic() + 300
    done = {job_id: provisioned_at(firestore_client, job_id, deadline) for job_id in job_ids}
    latencies = [(done[j][1] - published[j]).total_seconds() * 1000 for j in job_ids]
    # where the time goes: Pub/Sub push delivery, then the function's own work
    delivery = [(done[j][0] - published[j]).total_seconds() * 1000 for j in job_ids]
    handling = [(done[j][1] - done[j][0]).total_seconds() * 1000 for j in job_ids]
    span = (max(at for _, at in done.values()) - min(published.values())).total_seconds()
    return {
        "delivery_ms": statistics.median(delivery),
        "handling_ms": statistics.median(handling),
        "median_ms": statistics.median(latencies),
        "p95_ms": percentile(latencies, 0.95),
        "max_ms": max(latencies),
        "jobs_per_s": n / span,
        "wall_s": time.monotonic() - started,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=200, help="jobs per run (default 200)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each mode (default 3)")
    args = parser.parse_args()

    with stack.running():
        from google.cloud import firestore

        from tpujobs.adapters.pubsub import Publisher

        settings = Settings.from_env()
        publisher = Publisher.build(settings.project, settings.prefix)
        client = firestore.Client(project=settings.project)
        # Measure submission only: capacity stays PROVISIONING, so no simulated worker hosts
        # start and compete with the functions for this machine's cores (real VMs would not).
        saved = simulator_config(settings.tpu_endpoint, {"provisioning_seconds": 3600})
        run("sequential", 5, publisher, client)  # warm-up: first requests pay for imports
        results: dict[str, list[dict[str, float]]] = {"sequential": [], "burst": []}
        for repeat in range(args.repeats):
            for mode in results:
                result = run(mode, args.n, publisher, client)
                results[mode].append(result)
                print(
                    f"{mode:<10} run {repeat + 1}: median {result['median_ms']:.0f} ms, "
                    f"p95 {result['p95_ms']:.0f} ms, {result['jobs_per_s']:.1f} jobs/s "
                    f"(delivery {result['delivery_ms']:.0f} ms, handling {result['handling_ms']:.0f} ms)",
                    file=sys.stderr,
                )
        print(f"\nsubmit: publish -> PROVISIONING, n={args.n}, {args.repeats} runs each (medians of runs)")
        for mode, runs in results.items():
            med = statistics.median(r["median_ms"] for r in runs)
            p95 = statistics.median(r["p95_ms"] for r in runs)
            rate = statistics.median(r["jobs_per_s"] for r in runs)
            print(f"  {mode:<10} median {med:6.0f} ms   p95 {p95:6.0f} ms   throughput {rate:5.1f} jobs/s")
        print("  target: median <= 150 ms")
        simulator_config(settings.tpu_endpoint, {"provisioning_seconds": saved["provisioning_seconds"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Publish-to-PROVISIONING latency and throughput of job submission on the local stack, on each
platform side by side: the TPU API (v4-8 queued resources) and Compute Engine (v7x-8 slices,
each a template and a MIG).

Delivery is the local stack's pusher (tpujobs.local.pusher): each subscription pushed to its
function as many at once as production serves (max instances x concurrency, infra/functions.tf),
not the Pub/Sub emulator's own push of 2 at a time.

Each job is timed from just before its spec is published to `tpujobs-submit` until the `at`
of its PROVISIONING event, which the submit function stamps when it commits the transition
(same machine, same clock): no polling interval is in the number. While a run
is under way the bench only counts the run's PROVISIONING jobs (one aggregation query every
half second); the events are read once every job is there, so the bench's own reads do not
compete with the functions for the Firestore emulator.

Two runs:
  sequential  one job at a time (-s jobs): the latency a user sees on a quiet system
  burst       all N published at once (-n jobs): throughput, span and latency under load

and the Firestore round trips of one submission, counted on a gRPC channel under the real
client (the service in this process, wired like the function, on the stack's emulators), and
the Compute Engine calls of one fresh v7x-8 request (the adapter in this process, on the
stack's simulator). The compute sequential median has a target of its own (issue 38: <= 0.3 s).

    .venv/bin/python bench/submit.py [-n 1000] [-s 10] [--repeats 1] [--platforms tpu-api,compute]

It starts the local stack in a temporary directory (or uses the one named by the
environment) and stops what it started.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import secrets
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from tpujobs.engine.settings import Settings
from tpujobs.engine.topology import SUBMIT, topic_name
from tpujobs.local import stack
from tpujobs.local.simulator.client import SimulatorControl

TARGET = "1,000 jobs PROVISIONING within 30 s, median latency < 10 s"
ANCHOR = "SkyPilot: scheduling gaps > 20 s at 1,000 jobs"
TARGET_SPAN_S = 30.0
TARGET_MEDIAN_S = 10.0
TARGET_COMPUTE_SEQUENTIAL_S = 0.3  # issue 38: Compute Engine as fast as the TPU API path
PLATFORMS = ("tpu-api", "compute")
ACCELERATOR = {"tpu-api": "v4-8", "compute": "v7x-8"}  # one host each


def spec(job_id: str, name: str, platform: str = "tpu-api") -> dict[str, object]:
    return {
        "job_id": job_id,
        "name": name,
        "owner": "bench@example.com",
        "accelerator_type": ACCELERATOR[platform],
        "platform": platform,
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


def wait_provisioning(firestore_client: Any, name: str, n: int, timeout_s: float) -> None:
    """Until the n jobs named `name` are PROVISIONING (counted by the emulator, not read)."""
    from google.cloud import firestore

    query = (
        firestore_client.collection("jobs")
        .where(filter=firestore.FieldFilter("name", "==", name))
        .where(filter=firestore.FieldFilter("state", "==", "PROVISIONING"))
        .count()
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if query.get()[0][0].value >= n:
            return
        time.sleep(0.5)
    raise TimeoutError(f"not every job of {name} reached PROVISIONING within {timeout_s:.0f} s")


def event_times(firestore_client: Any, job_ids: list[str]) -> dict[str, tuple[datetime, datetime]]:
    """Each job's QUEUED and PROVISIONING `at`, read in batches once the run is over."""
    found: dict[str, dict[str, datetime]] = collections.defaultdict(dict)
    jobs = firestore_client.collection("jobs")
    refs = [
        jobs.document(j).collection("events").document(e) for j in job_ids for e in ("0001-queued", "0002-provisioning")
    ]
    for start in range(0, len(refs), 300):
        for doc in firestore_client.get_all(refs[start : start + 300]):
            if doc.exists:
                found[doc.reference.parent.parent.id][doc.id] = doc.to_dict()["at"]
    missing = [j for j in job_ids if len(found[j]) < 2]
    if missing:
        raise RuntimeError(f"{len(missing)} jobs lack their QUEUED or PROVISIONING event, e.g. {missing[0]}")
    return {j: (found[j]["0001-queued"], found[j]["0002-provisioning"]) for j in job_ids}


def run(mode: str, n: int, publisher: Any, topic: str, firestore_client: Any, platform: str) -> dict[str, float]:
    """Latencies (s) of n submissions on one platform, one by one or all at once, and the run's span."""
    name = f"bench-{uuid.uuid4().hex[:6]}"
    job_ids = [f"{name}-{i}" for i in range(n)]
    published: dict[str, datetime] = {}

    def publish(job_id: str) -> Any:
        published[job_id] = datetime.now(timezone.utc)
        return publisher.publish(topic, json.dumps(spec(job_id, name, platform)).encode())

    if mode == "sequential":
        for i, job_id in enumerate(job_ids):
            publish(job_id).result(timeout=30)
            wait_provisioning(firestore_client, name, i + 1, 60)
    else:
        for future in [publish(job_id) for job_id in job_ids]:  # all in flight at once
            future.result(timeout=60)
        wait_provisioning(firestore_client, name, n, 600)
    done = event_times(firestore_client, job_ids)
    latencies = [(done[j][1] - published[j]).total_seconds() for j in job_ids]
    # where the time goes: publish -> the function starts (the local pusher's pull and post, as
    # many at once as production serves: tpujobs.local.pusher), then the function's own work
    delivery = [(done[j][0] - published[j]).total_seconds() for j in job_ids]
    handling = [(done[j][1] - done[j][0]).total_seconds() for j in job_ids]
    span = (max(at for _, at in done.values()) - min(published.values())).total_seconds()
    return {
        "delivery_s": statistics.median(delivery),
        "handling_s": statistics.median(handling),
        "median_s": statistics.median(latencies),
        "p95_s": percentile(latencies, 0.95),
        "max_s": max(latencies),
        "jobs_per_s": n / span,
        "span_s": span,
        "load": os.getloadavg()[0],  # the machine's 1-minute load at the end: it may be shared
    }


def round_trips(settings: Settings) -> dict[str, int]:
    """Firestore calls of one fresh submission, by gRPC method: the service wired as
    `runtime.instances.engine()` wires it, in this process, on a counted channel of the real client.
    On the TPU API: the store's calls do not depend on the platform."""
    import grpc
    from google.cloud import firestore

    from tpujobs.adapters.firestore_config import FirestoreAccessPolicies
    from tpujobs.adapters.firestore_pools import FirestorePools
    from tpujobs.adapters.firestore_store import FirestoreJobStore
    from tpujobs.adapters.firestore_warm_pools import FirestoreWarmPools
    from tpujobs.adapters.pubsub import Publisher
    from tpujobs.adapters.tpu import CloudTpu, build_client
    from tpujobs.engine.services import Engine
    from tpujobs.local.testing import inbound
    from tpujobs.runtime.instances import utc_now

    calls: collections.Counter[str] = collections.Counter()

    class Counter(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
        def intercept_unary_unary(self, proceed: Callable[..., Any], details: Any, request: Any) -> Any:
            calls[details.method.rsplit("/", 1)[-1]] += 1
            return proceed(details, request)

        intercept_unary_stream = intercept_unary_unary

    class CountedClient(firestore.Client):
        def _emulator_channel(self, transport: Any) -> Any:
            return grpc.intercept_channel(super()._emulator_channel(transport), Counter())

    # The functions' signing key is theirs alone: this in-process service signs with a key of its own.
    settings = dataclasses.replace(settings, report_key=secrets.token_urlsafe(48))
    client = CountedClient(project=settings.project)
    publisher = Publisher.build(settings.project, settings.prefix)
    service = Engine(
        FirestoreJobStore(client),
        CloudTpu(build_client(settings.tpu_endpoint), settings.project),
        settings,
        utc_now,
        status=publisher,
        exports=publisher,
        pools=FirestorePools(client),
        access=FirestoreAccessPolicies(client),
        warm_pools=FirestoreWarmPools(client),
    )
    service.submission.submit(
        inbound(SUBMIT, spec(f"bench-rt-{uuid.uuid4().hex[:6]}", "bench-rt"))
    )  # the client's first calls
    calls.clear()
    outcome = service.submission.submit(inbound(SUBMIT, spec(f"bench-rt-{uuid.uuid4().hex[:6]}", "bench-rt")))
    if outcome.kind != "provisioning":
        raise RuntimeError(f"the counted submission ended {outcome.kind}: {outcome.reason}")
    return dict(calls)


def compute_calls(settings: Settings) -> dict[str, int]:
    """Compute Engine calls of one fresh request of a v7x-8 holding (one slice, one host), by
    client method: the adapter wired as the functions wire it, in this process, on the stack's
    simulator; the holding is released afterwards (its calls not counted)."""
    from tpujobs.adapters.compute import ComputeEngine, build_clients
    from tpujobs.domain.job import new_job
    from tpujobs.domain.spec import parse_spec
    from tpujobs.engine.ports import HostBoot

    calls: collections.Counter[str] = collections.Counter()
    clients = build_clients(settings.compute_endpoint)
    for field in dataclasses.fields(clients):
        client = getattr(clients, field.name)
        for method in ("insert_unary", "get", "list", "list_managed_instances", "delete_unary", "wait"):
            if hasattr(client, method):
                setattr(client, method, _counted(calls, f"{field.name}.{method}", getattr(client, method)))
    compute = ComputeEngine(clients, settings.project)
    job_spec = parse_spec({**spec(f"bench-gce-{uuid.uuid4().hex[:6]}", "bench-gce", "compute"), "capacity": "spot"})
    job, _ = new_job(job_spec, settings.default_zone, datetime.now(timezone.utc))
    boot = HostBoot("bench@example.iam.gserviceaccount.com", {"startup-script": "#!/bin/sh\ntrue"})
    try:
        compute.request(job, boot)
        counted = dict(calls)
    finally:
        compute.release(job.zone, job.queued_resource)
    return counted


def _counted(calls: collections.Counter[str], name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return method(*args, **kwargs)

    return counted


def summary(platform: str, results: dict[str, list[dict[str, float]]], sizes: dict[str, int]) -> None:
    """One platform's figures, each the median of its runs."""
    print(f"  {platform}:")
    for mode, runs in results.items():
        figures = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        print(
            f"  {mode:<10} n={sizes[mode]:<5} throughput {figures['jobs_per_s']:6.1f} jobs/s   "
            f"span {figures['span_s']:6.1f} s   latency median {figures['median_s']:6.2f} s   "
            f"p95 {figures['p95_s']:6.2f} s   max {figures['max_s']:6.2f} s"
        )
        print(
            f"  {'':<10} where: publish -> function starts {figures['delivery_s']:.2f} s (median), "
            f"the function's work {1000 * figures['handling_s']:.0f} ms (median)"
        )


def side_by_side(by_platform: dict[str, dict[str, list[dict[str, float]]]], sizes: dict[str, int]) -> None:
    """One table: each mode's median, p95 and throughput on each platform, and compute's ratio to tpu-api."""
    platforms = [p for p in PLATFORMS if p in by_platform]
    head = "".join(f"{p + ' median':>16}{'p95':>8}{'jobs/s':>8}" for p in platforms)
    ratio = "   compute/tpu-api (median, p95)" if len(platforms) == 2 else ""
    print(f"\nsubmit, side by side (seconds from publish to PROVISIONING)\n  {'mode':<16}{head}{ratio}")
    for mode, n in sizes.items():
        row, figures = f"  {mode + f' n={n}':<16}", []
        for platform in platforms:
            runs = by_platform[platform][mode]
            median, p95 = (statistics.median(r[key] for r in runs) for key in ("median_s", "p95_s"))
            throughput = statistics.median(r["jobs_per_s"] for r in runs)
            figures.append((median, p95))
            row += f"{median:16.2f}{p95:8.2f}{throughput:8.1f}"
        if len(figures) == 2 and figures[0][0] > 0 and figures[0][1] > 0:
            row += f"   {figures[1][0] / figures[0][0]:6.2f}x, {figures[1][1] / figures[0][1]:6.2f}x"
        print(row)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=1000, help="jobs in a burst (default 1000)")
    parser.add_argument("-s", "--sequential", type=int, default=10, help="jobs submitted one by one (default 10)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each mode (default 1)")
    parser.add_argument("--platforms", default=",".join(PLATFORMS), help=f"comma list of {', '.join(PLATFORMS)}")
    args = parser.parse_args()
    if args.n < 1 or args.sequential < 0 or args.repeats < 1:
        parser.error("-n and --repeats must be at least 1, and -s at least 0")
    platforms = [p.strip() for p in args.platforms.split(",") if p.strip()]
    if not platforms or any(p not in PLATFORMS for p in platforms):
        parser.error(f"--platforms must name some of {', '.join(PLATFORMS)}")

    with stack.running():
        from google.cloud import firestore, pubsub_v1

        settings = Settings.from_env()
        publisher = pubsub_v1.PublisherClient()
        topic = publisher.topic_path(settings.project, topic_name(SUBMIT, settings.prefix))
        client = firestore.Client(project=settings.project)
        modes = {"sequential": args.sequential, "burst": args.n} if args.sequential else {"burst": args.n}
        by_platform: dict[str, dict[str, list[dict[str, float]]]] = {}
        # Measure submission only: capacity stays PROVISIONING, so no simulated worker hosts
        # start and compete with the functions for this machine's cores (real VMs would not).
        saved = simulator_config(settings.tpu_endpoint, {"provisioning_seconds": 3600})
        try:
            for platform in platforms:
                run("sequential", 4, publisher, topic, client, platform)  # warm-up: first requests pay for imports
            rounds = round_trips(settings)
            gce_calls = compute_calls(settings) if "compute" in platforms else {}
            for platform in platforms:
                results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
                by_platform[platform] = results
                for repeat in range(args.repeats):
                    for mode, n in modes.items():
                        result = run(mode, n, publisher, topic, client, platform)
                        results[mode].append(result)
                        print(
                            f"{platform} {mode:<10} run {repeat + 1} (n={n}): median {result['median_s']:.2f} s, "
                            f"p95 {result['p95_s']:.2f} s, max {result['max_s']:.2f} s, "
                            f"span {result['span_s']:.1f} s, {result['jobs_per_s']:.1f} jobs/s "
                            f"(delivery {result['delivery_s']:.2f} s, handling {result['handling_s']:.3f} s; "
                            f"load {result['load']:.1f} on {os.cpu_count()} cores)",
                            file=sys.stderr,
                        )
        finally:
            simulator_config(settings.tpu_endpoint, {"provisioning_seconds": saved["provisioning_seconds"]})
        print(f"\nsubmit: publish -> PROVISIONING, {args.repeats} run(s) each (medians of runs)")
        for platform, results in by_platform.items():
            summary(platform, results, modes)
        side_by_side(by_platform, modes)
        total = sum(rounds.values())
        detail = ", ".join(f"{method} {count}" for method, count in sorted(rounds.items()))
        print(f"\n  Firestore round trips per submission (TPU API): {total} ({detail})")
        if gce_calls:
            detail = ", ".join(f"{method} {count}" for method, count in sorted(gce_calls.items()))
            print(f"  Compute Engine calls per fresh request (v7x-8): {sum(gce_calls.values())} ({detail})")
        if "compute" in by_platform and "sequential" in modes:
            median = statistics.median(r["median_s"] for r in by_platform["compute"]["sequential"])
            verdict = "met" if median <= TARGET_COMPUTE_SEQUENTIAL_S else "NOT met"
            print(
                f"  target: compute sequential median <= {TARGET_COMPUTE_SEQUENTIAL_S:g} s "
                f"(issue 38): {verdict} ({median:.2f} s)"
            )
        print(f"  target: {TARGET}")
        print(f"  anchor: {ANCHOR}")
        for platform, results in by_platform.items():
            span = statistics.median(r["span_s"] for r in results["burst"])
            median = statistics.median(r["median_s"] for r in results["burst"])
            if args.n >= 1000:
                met = span <= TARGET_SPAN_S * args.n / 1000 and median < TARGET_MEDIAN_S
                print(f"  {platform}: target {'met' if met else 'NOT met'}: span {span:.1f} s, median {median:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

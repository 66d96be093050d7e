"""A job of 1,000 hosts against Firestore's limits: the report stream of a 64 x 16 attempt.

    .venv/bin/python bench/big_job.py [--slices 64] [--accelerator v4-128] [--export-workers 1024]
                                      [--export-chunks 4] [--chunk-kib 16]

Drives the real JobService on a Firestore emulator (started here, stopped at the end) and an
in-process TPU simulator without worker processes: every host's signed `started` at once, one
checkpoint step from every host, every host's `exited 0`, by 16 threads. It prints reports/s
through the service, the writes of the job document (a real listener counts its versions), its
size and longest array, and the peak Python memory (tracemalloc) of exporting an attempt of
`--export-workers` workers on a storage emulator. Each figure is printed beside Firestore's
limit. It also measures one idle agent process's resident memory, which is why this is a model
and not the simulator running 1,024 agents.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from tpujobs.adapters.firestore_store import JOBS, FirestoreJobStore
from tpujobs.adapters.output_bucket import GcsOutputBucket
from tpujobs.adapters.tpu import CloudTpu, build_client
from tpujobs.domain.states import EventKind
from tpujobs.domain.transitions import Observation
from tpujobs.engine.output_export import OutputExporter, OutputObjects
from tpujobs.engine.services import Engine
from tpujobs.local import processes, wiring
from tpujobs.local.testing import inbound, local_settings, signed

PROJECT = "bench-big"
EVENTS = "tpujobs-worker-events"
UPLOAD_THREADS = 2  # seeding the storage emulator's chunks
THREADS = 16
DOC_LIMIT = 1024 * 1024  # Firestore: 1 MiB a document
INDEX_LIMIT = 40_000  # Firestore: index entries a document
WRITES_PER_SECOND = 1.0  # Firestore: sustained writes a document


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def agent_rss_mib() -> float:
    """Resident memory of one Python process that loaded the agent and waits (an idle host)."""
    code = "import tpujobs.agent.main, time; time.sleep(3)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(1.5)
        for line in Path(f"/proc/{child.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")
    finally:
        child.kill()
        child.wait()


def drive(service: Engine, firestore: Any, job_id: str, slices: int, accelerator: str) -> dict[str, Any]:
    versions: set[datetime] = set()
    watch = (
        firestore.collection(JOBS)
        .document(job_id)
        .on_snapshot(lambda snaps, changes, read_time: versions.update(s.update_time for s in snaps if s.exists))
    )
    spec = {"job_id": job_id, "name": "big", "owner": "ada@example.com", "accelerator_type": accelerator,
            "slices": slices, "command": "python train.py"}  # fmt: skip
    assert service.submission.submit(inbound("tpujobs-submit", spec)).kind == "provisioning"
    job = service.store.get(job_id)
    assert job is not None
    hosts = [(s, w) for s in range(slices) for w in range(job.spec.hosts_per_slice)]
    start = utc_now()

    def burst(kind: str, offset: float, **fields: Any) -> float:
        payloads = [{"kind": kind, "job_id": job_id, "attempt": 1, "slice_id": s, "worker_id": w,
                     "at": (start + timedelta(seconds=offset)).isoformat(), **fields} for s, w in hosts]  # fmt: skip
        messages = [signed(service, EVENTS, p) for p in payloads]
        began = time.perf_counter()
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(service.worker_events.on_worker_report, messages))
        return len(messages) / (time.perf_counter() - began)

    rates = {
        "started": burst("started", 0.5),
        "checkpoint": burst("checkpoint", 5, step=100),
        "exited 0": burst("exited", 10, exit_code=0),
    }
    time.sleep(1.0)  # the listener's last snapshots
    watch.unsubscribe()
    final = service.store.get(job_id)
    assert final is not None
    document = firestore.collection(JOBS).document(job_id).get().to_dict() or {}
    arrays = {k: len(v) for k, v in document.items() if isinstance(v, list)}
    return {
        "hosts": len(hosts),
        "state": final.state.value,
        "all_started": final.usage_of() is not None and final.usage_of().all_started_at is not None,  # type: ignore[union-attr]
        "rates": rates,
        "job_writes": len(versions),
        "events": len(service.store.events(job_id)),
        "doc_bytes": len(repr(document)),
        "longest_array": max(arrays.items(), key=lambda kv: kv[1]) if arrays else ("-", 0),
    }


def export_peak(store: FirestoreJobStore, storage_url: str, workers: int, chunks: int, chunk_kib: int) -> tuple:
    client = wiring.storage_client(storage_url, PROJECT)
    bucket = client.create_bucket(f"logs-{uuid.uuid4().hex[:10]}")
    job_id = f"wide-{uuid.uuid4().hex[:6]}"
    from tpujobs.domain.job import new_job
    from tpujobs.domain.spec import parse_spec

    spec = {"job_id": job_id, "name": "wide", "owner": "ada@example.com", "accelerator_type": "v4-8",
            "slices": min(workers, 64), "command": "python train.py"}  # fmt: skip
    job, event = new_job(parse_spec(spec), "us-central2-b", utc_now(), None)
    store.create(job, event)
    store.apply(job_id, Observation(EventKind.CANCEL_REQUESTED, None, "user"), utc_now)
    prefix = f"logs/jobs/{job_id}/attempt-1/chunks/"
    line = b"step 000000 loss 1.234567 " + b"x" * 37 + b"\n"
    piece = line * (chunk_kib * 1024 // len(line))
    uploads = [(f"{prefix}slice-{k}-worker-0/{seq:06d}.log", piece) for k in range(workers) for seq in range(chunks)]
    uploads += [(f"{prefix}slice-{k}-worker-0/complete.json", b'{"chunks": %d}' % chunks) for k in range(workers)]
    # gcp-storage-emulator serves one request at a time: more than a few uploads at once only
    # queue connections past its backlog (16 threads timed out connecting on 4,096 chunks).
    with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
        list(pool.map(lambda item: bucket.blob(item[0]).upload_from_string(item[1]), uploads))
    exporter = OutputExporter(OutputObjects(GcsOutputBucket(client, bucket.name)), store, utc_now,
                           sleep=lambda s: None, settle_seconds=0.0)  # fmt: skip
    tracemalloc.start()
    began = time.perf_counter()
    exporter.export(job_id, 1)
    took = time.perf_counter() - began
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return workers * chunks * len(piece), peak, took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", type=int, default=64)
    parser.add_argument("--accelerator", default="v4-128", help="v4-128: 16 hosts a slice")
    parser.add_argument("--export-workers", type=int, default=1024)
    parser.add_argument("--export-chunks", type=int, default=4)
    parser.add_argument("--chunk-kib", type=int, default=16)
    args = parser.parse_args(argv)

    from tpujobs.local.simulator import SimulatorConfig, SimulatorServer

    logs = Path(tempfile.mkdtemp(prefix="bench-big-"))
    fs_port, gcs_port = processes.free_port(), processes.free_port()
    processes.require_gcloud_emulators(("firestore",))
    started = processes.start([processes.firestore_emulator(fs_port), processes.storage_emulator(gcs_port)], logs)
    os.environ["FIRESTORE_EMULATOR_HOST"] = f"{processes.LOOPBACK}:{fs_port}"
    try:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import firestore

        client = firestore.Client(project=PROJECT, credentials=AnonymousCredentials())
        store = FirestoreJobStore(client)
        config = SimulatorConfig(waiting_seconds=0.05, provisioning_seconds=0.1)
        with SimulatorServer(config, run_workers=False) as simulator:
            settings = local_settings(project=PROJECT, default_zone="us-central2-b", tpu_endpoint=simulator.url,
                                      logs_bucket="logs")  # fmt: skip
            service = Engine(store, CloudTpu(build_client(simulator.url), PROJECT), settings, utc_now,
                                 lambda s: None)  # fmt: skip
            figures = drive(service, client, f"big-{uuid.uuid4().hex[:6]}", args.slices, args.accelerator)
        size, peak, took = export_peak(
            store, f"http://{processes.LOOPBACK}:{gcs_port}", args.export_workers, args.export_chunks, args.chunk_kib
        )
        rss = agent_rss_mib()
    finally:
        processes.stop(started)

    hosts = figures["hosts"]
    print(f"A {args.slices} x {args.accelerator} attempt: {hosts} hosts; ended {figures['state']}, "
          f"all_started_at set: {figures['all_started']}")  # fmt: skip
    for kind, rate in figures["rates"].items():
        print(f"  {hosts} x {kind:<10} {rate:7.1f} reports/s through the service ({THREADS} threads; emulator)")
    print(f"  job document writes over the attempt: {figures['job_writes']} (timeline events: {figures['events']}); "
          f"target O(1), not {hosts}; Firestore sustains {WRITES_PER_SECOND:.0f} write/s a document")  # fmt: skip
    name, longest = figures["longest_array"]
    print(f"  job document: {figures['doc_bytes']} bytes (limit {DOC_LIMIT}); longest array {name} = {longest} "
          f"entries (limit {INDEX_LIMIT} index entries a document)")  # fmt: skip
    print(f"Export of {args.export_workers} workers x {args.export_chunks} chunks ({size / 2**20:.1f} MiB of output): "
          f"peak Python memory {peak / 2**20:.1f} MiB (target: far below the log's size), {took:.1f} s")  # fmt: skip
    print(
        f"One idle agent process: {rss:.1f} MiB resident; {hosts} of them would need {rss * hosts / 1024:.1f} GiB, "
        "so the attempt is a model of its report stream, not the simulator running its agents"
    )
    print("Caveat: 2 shared cores, emulators: rates are noisy; writes, sizes and memory are not.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the slice gate adds to a host's key request (issue 38 items 2 and 3).

`attempt-key` hands out an attempt's key only once its holding is ACTIVE: one capacity status
read per request (`engine.jobs_api.slice_readiness`), shared by the requests of one function
instance that ask within 2 s. This times that read through the real google-cloud-tpu and
google-cloud-compute clients against the local simulator (in this process, over HTTP on
loopback), for an ACTIVE TPU API queued resource (v4-16) and an ACTIVE Compute Engine slice
(v7x-16: its MIG, its VMs, its template and policy), and a whole key grant (`KeyApi.handle`, on
the in-memory job store) before the gate (no capacity read) and with it, first host and a host
asking within 2 s of it.

    .venv/bin/python bench/key_readiness.py [--runs 30]

Figures are medians in milliseconds; the machine's other load shows in them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from tpujobs.adapters.capacity_router import PlatformCapacity
from tpujobs.adapters.compute import ComputeEngine, build_clients
from tpujobs.adapters.tpu import CloudTpu, build_client
from tpujobs.domain.job import Job, JobEvent, new_job
from tpujobs.domain.naming import node_id, queued_resource_name
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import JobState
from tpujobs.engine.jobs_api.slice_readiness import SliceReadiness
from tpujobs.engine.key_api import KeyApi
from tpujobs.engine.ports import HostBoot
from tpujobs.local.fakes import InMemoryJobStore
from tpujobs.local.simulator import SimulatorConfig, SimulatorServer
from tpujobs.local.testing import local_settings

PROJECT = "bench-project"
ZONE = "us-central1-c"
KEY_URL = "http://127.0.0.1/attempt-key"
ACCOUNT = f"tpujobs-tpu-vm@{PROJECT}.iam.gserviceaccount.com"


def a_job(job_id: str, accelerator: str, platform: str) -> tuple[Job, JobEvent]:
    spec = parse_spec(
        {"job_id": job_id, "name": job_id, "owner": "ada", "accelerator_type": accelerator, "platform": platform}
        | {"command": "true", "capacity": "spot"}
    )
    job, event = new_job(spec, ZONE, datetime.now(timezone.utc))
    name = queued_resource_name(job_id, 1, platform)
    return job.evolve(attempt=1, queued_resource=name, state=JobState.PROVISIONING), event


def until_active(capacity: PlatformCapacity, job: Job) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = capacity.status(job.zone, job.queued_resource)
        if status is not None and status.state == "ACTIVE":
            return
        time.sleep(0.1)
    raise SystemExit(f"{job.queued_resource} never became ACTIVE")


def median_ms(call: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


class Tokens:
    """Every identity token verifies as the job's worker 0 VM (the grant's other rules pass)."""

    def __init__(self, job: Job) -> None:
        self.job = job

    def __call__(self, token: str, audiences: Any) -> dict[str, Any]:
        engine = {
            "project_id": PROJECT,
            "zone": ZONE,
            "instance_id": "1001",
            "instance_name": token,
            "instance_creation_timestamp": int(time.time()),
        }
        return {"email": ACCOUNT, "email_verified": True, "google": {"compute_engine": engine}}


def grant_ms(made: tuple[Job, JobEvent], vm_name: str, holdings: Any, runs: int, fresh: bool) -> float:
    """The median of KeyApi.handle for the job's worker 0; `fresh`: a new function instance each
    time (no read shared), else one instance (every read after the first shared)."""
    job = made[0]
    store = InMemoryJobStore()
    store.create(*made)
    stored = store.get(job.job_id)
    assert stored is not None
    settings = local_settings(project=PROJECT, key_url=KEY_URL, local_stack=True, tpu_service_account=ACCOUNT)
    body = {"action": "attempt-key", "identity": vm_name, "job_id": job.job_id, "attempt": 1}
    body |= {"slice_id": 0, "worker_id": 0}
    headers = {"X-Tpujobs-Caller": ACCOUNT}

    def api() -> KeyApi:
        return KeyApi(store, settings, lambda: datetime.now(timezone.utc), Tokens(stored), holdings=holdings)

    shared = api()

    def ask() -> None:
        answer = (api() if fresh else shared).handle("POST", KEY_URL, headers, json.dumps(body).encode())
        assert answer.status in (200, 403), answer.body  # 403: another VM holds it (a repeat): the same work
        if answer.status == 403:
            assert "another VM" in answer.body["error"], answer.body

    return median_ms(ask, runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    runs = parser.parse_args().runs
    config = SimulatorConfig(waiting_seconds=0.05, provisioning_seconds=0.1, topology_activation_seconds=0.1)
    with SimulatorServer(config, run_workers=False) as server:
        tpu = CloudTpu(build_client(server.url), PROJECT)
        compute = ComputeEngine(build_clients(server.url), PROJECT)
        capacity = PlatformCapacity(tpu, compute)
        boot = HostBoot(ACCOUNT, {"startup-script": "#!/bin/bash\ntrue\n"})
        jobs = {
            "TPU API v4-16": a_job("bench-tpu", "v4-16", "tpu-api"),
            "Compute v7x-16": a_job("bench-c", "v7x-16", "compute"),
        }
        for job, _ in jobs.values():
            capacity.request(job, boot)
            until_active(capacity, job)
        print(f"median of {runs} runs, ms")
        for label, made in jobs.items():
            job = made[0]
            read = median_ms(
                lambda job=job: SliceReadiness(capacity, lambda: datetime.now(timezone.utc)).not_ready(job, "w"), runs
            )
            vm = "t1v-n-0a1b2c3d-w-0" if "TPU" in label else f"{node_id(job.queued_resource, 0, 1)}-abcd"
            before = grant_ms(made, vm, None, runs, fresh=True)
            first = grant_ms(made, vm, capacity, runs, fresh=True)
            shared = grant_ms(made, vm, capacity, runs, fresh=False)
            print(
                f"{label}: status read {read:.1f}; key grant before {before:.1f}, with the gate {first:.1f} "
                f"(first host of a slice), {shared:.1f} (a host asking within 2 s of another)"
            )


if __name__ == "__main__":
    main()

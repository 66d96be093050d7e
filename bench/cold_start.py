"""Cold start: what a new function instance pays before it handles its first message.

Two figures, each the median of fresh processes:

  import   importing functions/main.py, against importing functions_framework alone (which
           main.py imports too), each in a fresh interpreter: the ratio is what tpujobs adds
           to the framework's own start. Target: 1.35x or less.
  first    process start -> first message handled: `functions-framework --target T` started
           on the local stack's emulators and TPU simulator, a Pub/Sub push envelope POSTed
           as soon as it listens, timed until its 2xx answer. For submit_job and
           on_worker_event, against a bare functions-framework function (written into the
           bench's temporary directory) that makes the same Google calls:
             submit_job       a Firestore transaction (get, create) and a TPU
                              create_queued_resource on the simulator
             on_worker_event  a Firestore get and set
           tpujobs's submit validates the spec and also publishes the job's status change;
           its worker event is a signed heartbeat of the job the first submit created.

    .venv/bin/python bench/cold_start.py [--import-runs 10] [--start-runs 5]

It starts the local stack in a temporary directory (or uses the one named by the
environment) and stops what it started, including every function process and every bare
queued resource it made. The jobs tpujobs's submits create stay in the stack (a started
stack is removed whole).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from tpujobs.engine.topology import SUBMIT, WORKER_EVENTS, push_subscription_name, route_of_target, topic_name
from tpujobs.local import stack
from tpujobs.local.processes import LOOPBACK, free_port

ROOT = Path(__file__).resolve().parents[1]
FUNCTIONS = ROOT / "functions"
FRAMEWORK = str(Path(sys.executable).with_name("functions-framework"))
TARGET_IMPORT_RATIO = 1.35
ANCHOR = "import functions_framework alone; a bare functions-framework function making the same Google calls"
TARGETS = ("submit_job", "on_worker_event")
ZONE = "us-central2-b"

# The bare function: what a plain functions-framework function making the same calls looks like.
BARE = """
import base64, json, os
import functions_framework
from google.auth.credentials import AnonymousCredentials
from google.cloud import firestore

_db = firestore.Client(project=os.environ["GOOGLE_CLOUD_PROJECT"])


@functions_framework.cloud_event
def submit_job(event):
    from google.cloud import tpu_v2

    spec = json.loads(base64.b64decode(event.data["message"]["data"]))
    ref = _db.collection("bench-bare-jobs").document(spec["job_id"])

    @firestore.transactional
    def create(transaction):
        if ref.get(transaction=transaction).exists:
            return
        transaction.create(ref, {"spec": spec, "state": "PROVISIONING"})

    create(_db.transaction())
    tpu = tpu_v2.TpuClient(
        transport="rest", client_options={"api_endpoint": os.environ["TPUJOBS_TPU_ENDPOINT"]},
        credentials=AnonymousCredentials(),
    )
    parent = f"projects/{os.environ['GOOGLE_CLOUD_PROJECT']}/locations/__ZONE__"
    node = tpu_v2.Node(accelerator_type=spec["accelerator_type"], runtime_version="tpu-ubuntu2204-base")
    resource = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(
            parent=parent, node_id=spec["job_id"], node=node)])
    )
    tpu.create_queued_resource(parent=parent, queued_resource_id=spec["job_id"], queued_resource=resource)


@functions_framework.cloud_event
def on_worker_event(event):
    report = json.loads(base64.b64decode(event.data["message"]["data"]))
    ref = _db.collection("bench-bare-jobs").document(report["job_id"])
    ref.get()
    ref.collection("workers").document("0-0").set({"kind": report["kind"], "at": report["at"]})
""".replace("__ZONE__", ZONE)


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def import_seconds(module: str, runs: int) -> list[float]:
    """Seconds to import `module` in `runs` fresh interpreters, functions/ on the path."""
    probe = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); start = time.perf_counter(); "
        f"import {module}; print(time.perf_counter() - start)"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("FUNCTION_TARGET", "K_SERVICE")}
    times = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", probe, str(FUNCTIONS)], capture_output=True, text=True, check=True, env=env
        )
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return times


def envelope(target: str, data: bytes, attributes: dict[str, str], project: str, prefix: str) -> bytes:
    """A Pub/Sub push envelope as production's push subscription (and the local stack's) posts it."""
    subscription = push_subscription_name(route_of_target(target), prefix)
    message = {
        "data": base64.b64encode(data).decode(),
        "messageId": str(uuid.uuid4().int % 10**16),
        "attributes": attributes,
        "publishTime": "2025-01-01T00:00:00Z",
    }
    return json.dumps({"message": message, "subscription": f"projects/{project}/subscriptions/{subscription}"}).encode()


def first_message_seconds(source: Path, target: str, body: bytes, env: dict[str, str], log: Path) -> float:
    """Start functions-framework on `target` of `source`, POST `body` as soon as it listens;
    seconds from the start to the 2xx answer. The process is stopped before returning."""
    port = free_port()
    argv = [FRAMEWORK, "--source", str(source / "main.py"), "--target", target, "--signature-type", "cloudevent"]
    argv += ["--host", LOOPBACK, "--port", str(port)]
    with log.open("ab") as out:
        start = time.perf_counter()
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{target} of {source} exited with {process.returncode}; see {log}")
            try:
                socket.create_connection((LOOPBACK, port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.002)
        request = urllib.request.Request(
            f"http://{LOOPBACK}:{port}/", data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            status = answer.status
        elapsed = time.perf_counter() - start
        if not 200 <= status < 300:
            raise RuntimeError(f"{target} of {source} answered {status}; see {log}")
        return elapsed
    except urllib.error.HTTPError as error:
        raise RuntimeError(f"{target} of {source} answered {error.code}; see {log}") from None
    finally:
        os.killpg(process.pid, 15)
        process.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--import-runs", type=int, default=10, help="fresh interpreters per import figure")
    parser.add_argument("--start-runs", type=int, default=5, help="function processes per target and kind")
    args = parser.parse_args()

    import_seconds("functions_framework", 1), import_seconds("main", 1)  # warm the file cache
    framework: list[float] = []
    tpujobs_main: list[float] = []
    for _ in range(args.import_runs):  # interleaved, so a busy moment weighs on both alike
        framework += import_seconds("functions_framework", 1)
        tpujobs_main += import_seconds("main", 1)
    ratio = median_ms(tpujobs_main) / median_ms(framework)
    print(f"import (median of {args.import_runs} fresh interpreters)")
    print(f"  functions_framework   {median_ms(framework):7.1f} ms   (anchor)")
    print(
        f"  functions/main.py     {median_ms(tpujobs_main):7.1f} ms   {ratio:.2f}x  (target <= {TARGET_IMPORT_RATIO}x)"
    )

    with stack.running() as stack_env, tempfile.TemporaryDirectory(prefix="tpujobs-cold-") as tmp:
        work = Path(tmp)
        bare = work / "bare"
        bare.mkdir()
        (bare / "main.py").write_text(BARE, encoding="utf-8")
        log = work / "functions.log"
        report_key = stack_env.get(stack.REPORT_KEY_VARIABLE) or uuid.uuid4().hex * 2
        env = {**os.environ, **stack_env, stack.REPORT_KEY_VARIABLE: report_key, "WORKERS": "1", "THREADS": "1"}
        os.environ[stack.REPORT_KEY_VARIABLE] = report_key
        project, prefix = env.get("GOOGLE_CLOUD_PROJECT", "tpujobs-local"), env.get("TPUJOBS_PREFIX", "")
        run = uuid.uuid4().hex[:6]
        times: dict[tuple[str, str], list[float]] = {}
        bare_jobs = []
        first_job = ""
        try:
            for i in range(args.start_runs):
                for kind, source in (("tpujobs", FUNCTIONS), ("bare", bare)):
                    job_id = f"cold-{run}-{kind[0]}{i}"
                    spec = {"job_id": job_id, "name": "cold", "owner": "bench@example.com"}
                    spec |= {"accelerator_type": "v4-8", "command": "true", "zone": ZONE}
                    body = envelope("submit_job", json.dumps(spec).encode(), {}, project, prefix)
                    times.setdefault(("submit_job", kind), []).append(
                        first_message_seconds(source, "submit_job", body, env, log)
                    )
                    if kind == "bare":
                        bare_jobs.append(job_id)
                    elif not first_job:
                        first_job = job_id
            for _ in range(args.start_runs):
                for kind, source in (("tpujobs", FUNCTIONS), ("bare", bare)):
                    data, attributes = heartbeat(first_job if kind == "tpujobs" else bare_jobs[0])
                    body = envelope("on_worker_event", data, attributes, project, prefix)
                    times.setdefault(("on_worker_event", kind), []).append(
                        first_message_seconds(source, "on_worker_event", body, env, log)
                    )
        finally:
            remove_queued_resources(env, project, bare_jobs)

    print(f"process start -> first message answered 2xx (median of {args.start_runs} processes each)")
    for target in TARGETS:
        ours, theirs = median_ms(times[(target, "tpujobs")]), median_ms(times[(target, "bare")])
        topic = topic_name(SUBMIT if target == "submit_job" else WORKER_EVENTS, prefix)
        print(
            f"  {target:<16} tpujobs {ours:7.0f} ms   bare {theirs:7.0f} ms (anchor)   {ours / theirs:.2f}x  ({topic})"
        )
    return 0 if ratio <= TARGET_IMPORT_RATIO else 1


def heartbeat(job_id: str) -> tuple[bytes, dict[str, str]]:
    """A heartbeat of the job's attempt 1 from host 0-0, signed as its agent signs it (the key
    derived from this process's TPUJOBS_REPORT_KEY, which the function processes share)."""
    from tpujobs.local.testing import signed
    from tpujobs.runtime import instances

    payload = {"kind": "heartbeat", "job_id": job_id, "attempt": 1, "slice_id": 0, "worker_id": 0}
    message = signed(instances.engine(), WORKER_EVENTS, payload)
    assert message.data is not None
    return message.data, dict(message.attributes)


def remove_queued_resources(env: dict[str, str], project: str, names: list[str]) -> None:
    """Delete the bare function's queued resources on the simulator (tpujobs's jobs end by themselves)."""
    if not names:
        return
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import tpu_v2

    client = tpu_v2.TpuClient(
        transport="rest",
        client_options={"api_endpoint": env["TPUJOBS_TPU_ENDPOINT"]},
        credentials=AnonymousCredentials(),
    )
    for name in names:
        try:
            path = f"projects/{project}/locations/{ZONE}/queuedResources/{name}"
            client.delete_queued_resource(request={"name": path, "force": True})  # its node too
        except Exception as error:  # the bench's cleanup must not hide its figures
            print(f"could not delete queued resource {name}: {error}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

"""Publish -> PROVISIONING on the local stack, with and without a client watching the job.

`tpujobs submit --wait` follows a job by reading it again and again. This bench asks what
such a watcher costs the submission it watches. Each job is timed as bench/submit.py times
it: from just before its spec is published until the `at` of its PROVISIONING event, which
the submit function stamps when it commits (no polling interval is in that number). The
same jobs are run in rounds, each round one job per mode, so that the machine's load
drifts over every mode alike:

  quiet      nobody reads the job until its PROVISIONING event is there (one read every 0.5 s)
  firestore  a thread reads the job document from the Firestore emulator every `--interval`
  other      the same, of another document: the emulator's and the machine's load alone
  api        a thread asks the jobs API (`describe`, what submit --wait does on the local
             stack) every `--interval`
  listen     a Firestore snapshot listener on the job document: the emulator pushes each change

For each mode: the median latency, its two halves (publish -> the function starts, i.e. the
QUEUED event; then the function's own work), when the job document's PROVISIONING write was
committed (its update time), the median time a watcher took to see the job PROVISIONING, and
the ratio of each mode's median to the quiet one.

    .venv/bin/python bench/watched_submit.py [--rounds 10] [--interval 0.01]

It starts the local stack in a temporary directory (or uses the one named by the
environment) and stops what it started.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tpujobs.engine.settings import Settings
from tpujobs.engine.topology import SUBMIT, topic_name
from tpujobs.local import stack
from tpujobs.local.simulator.client import SimulatorControl

MODES = ("quiet", "firestore", "other", "api", "listen")
OWNER = "bench@example.com"


def spec(job_id: str) -> dict[str, object]:
    return {"job_id": job_id, "name": "watched", "owner": OWNER, "accelerator_type": "v4-8", "command": "true"}


@dataclass
class Watcher:
    """Reads the job with `read` every `interval` s in a thread; notes when it first saw it PROVISIONING."""

    read: Callable[[], str | None]  # the job's state, None while there is no job
    interval: float
    seen: float | None = None  # time.time() of the first read that showed PROVISIONING
    reads: list[float] = field(default_factory=list)  # how long each read took, s
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Watcher:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.perf_counter()
            state = self.read()
            self.reads.append(time.perf_counter() - began)
            if state == "PROVISIONING":
                self.seen = time.time()
                return
            self._stop.wait(self.interval)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        self._stop.set()


class Listener:
    """A snapshot listener on the job document; notes when a change first showed it PROVISIONING."""

    def __init__(self, client: Any, job_id: str) -> None:
        self.seen: float | None = None
        self.reads: list[float] = []  # it reads nothing: the emulator sends each change
        self._ready = threading.Event()
        self._done = threading.Event()
        self._watch = client.collection("jobs").document(job_id).on_snapshot(self._changed)
        self._ready.wait(10)  # listening (its first snapshot: no job yet) before anything is published

    def _changed(self, docs: list[Any], changes: Any, read_time: Any) -> None:
        self._ready.set()
        if self.seen is None and any(d.exists and d.get("state") == "PROVISIONING" for d in docs):
            self.seen = time.time()
            self._done.set()

    def join(self, timeout: float) -> None:
        self._done.wait(timeout)
        self._watch.unsubscribe()


def firestore_reader(client: Any, job_id: str, until: str | None = None) -> Callable[[], str | None]:
    """Reads `job_id`'s document; with `until`, reads that (absent) one instead, and answers
    PROVISIONING once `until`'s PROVISIONING event is there (looked at every 20th read)."""
    ref = client.collection("jobs").document(job_id)
    done = None if until is None else client.document(f"jobs/{until}/events/0002-provisioning")
    count = 0

    def read() -> str | None:
        nonlocal count
        doc = ref.get()
        count += 1
        if done is not None:
            return "PROVISIONING" if count % 20 == 0 and done.get().exists else None
        return doc.get("state") if doc.exists else None

    return read


def api_reader(url: str, job_id: str) -> Callable[[], str | None]:
    import requests

    from tpujobs.engine.api import CALLER_HEADER

    session = requests.Session()  # one connection, kept alive, as a client that polls would
    body = {"action": "describe", "job_id": job_id}

    def read() -> str | None:
        answer = session.post(url, json=body, headers={CALLER_HEADER: OWNER}, timeout=30)
        return answer.json()["job"]["state"] if answer.status_code == 200 else None

    return read


def event_times(client: Any, job_id: str, timeout_s: float = 60.0) -> tuple[datetime, datetime]:
    """The job's QUEUED and PROVISIONING `at`, read every half second until both are there."""
    events = client.collection("jobs").document(job_id).collection("events")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        docs = client.get_all([events.document("0001-queued"), events.document("0002-provisioning")])
        found = {doc.id: doc.to_dict()["at"] for doc in docs if doc.exists}
        if len(found) == 2:
            return found["0001-queued"], found["0002-provisioning"]
        time.sleep(0.5)
    raise TimeoutError(f"{job_id} did not reach PROVISIONING within {timeout_s:.0f} s")


def one(mode: str, publisher: Any, topic: str, client: Any, api_url: str, interval: float) -> dict[str, float]:
    """Submit one job with `mode`'s watcher; its latency (s) and where it went."""
    job_id = f"watched-{mode}-{uuid.uuid4().hex[:6]}"
    watcher: Watcher | Listener | None = None
    if mode == "listen":
        watcher = Listener(client, job_id)
    elif mode == "firestore":
        watcher = Watcher(firestore_reader(client, job_id), interval).start()
    elif mode == "other":
        watcher = Watcher(firestore_reader(client, f"{job_id}-elsewhere", until=job_id), interval).start()
    elif mode == "api":
        watcher = Watcher(api_reader(api_url, job_id), interval).start()
    published = datetime.now(timezone.utc)
    publisher.publish(topic, json.dumps(spec(job_id)).encode()).result(timeout=30)
    if watcher is not None:
        watcher.join(60)
    queued, provisioning = event_times(client, job_id)
    committed = client.collection("jobs").document(job_id).get().update_time  # nothing writes it after PROVISIONING
    result = {
        "latency_s": (provisioning - published).total_seconds(),
        "committed_s": (committed - published).total_seconds(),
        "delivery_s": (queued - published).total_seconds(),
        "handling_s": (provisioning - queued).total_seconds(),
    }
    if watcher is not None:
        if watcher.seen is None:
            raise RuntimeError(f"the {mode} watcher never saw {job_id} PROVISIONING")
        if mode != "other":
            result["seen_s"] = watcher.seen - published.timestamp()
        if watcher.reads:
            result["reads"] = len(watcher.reads)
            result["read_s"] = statistics.median(watcher.reads)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10, help="jobs per mode (default 10)")
    parser.add_argument("--interval", type=float, default=0.01, help="seconds between a watcher's reads (0.01)")
    args = parser.parse_args()
    if args.rounds < 1 or args.interval < 0:
        parser.error("--rounds must be at least 1 and --interval at least 0")

    with stack.running():
        from google.cloud import firestore, pubsub_v1

        settings = Settings.from_env()
        publisher = pubsub_v1.PublisherClient()
        topic = publisher.topic_path(settings.project, topic_name(SUBMIT, settings.prefix))
        client = firestore.Client(project=settings.project)
        api_url = os.environ["TPUJOBS_API_URL"]
        # Capacity stays PROVISIONING: no simulated hosts start and compete for the cores.
        control = SimulatorControl(settings.tpu_endpoint)
        saved = control.config()["provisioning_seconds"]
        control.configure(provisioning_seconds=3600)
        results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        try:
            for mode in MODES:  # warm-up: the first requests of each path pay for imports
                one(mode, publisher, topic, client, api_url, args.interval)
            for round_ in range(args.rounds):
                for mode in MODES[round_ % len(MODES) :] + MODES[: round_ % len(MODES)]:
                    results[mode].append(one(mode, publisher, topic, client, api_url, args.interval))
        finally:
            control.configure(provisioning_seconds=saved)

    quiet = statistics.median(r["latency_s"] for r in results["quiet"])
    print(
        f"watched submit: publish -> PROVISIONING, {args.rounds} jobs per mode, watchers read every {args.interval} s"
    )
    for mode, runs in results.items():
        figure = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        line = (
            f"  {mode:<9} latency median {1000 * figure['latency_s']:5.0f} ms"
            f" ({figure['latency_s'] / quiet:4.2f}x quiet)"
            f"  delivery {1000 * figure['delivery_s']:5.0f} ms  handling {1000 * figure['handling_s']:5.0f} ms"
            f"  committed {1000 * figure['committed_s']:5.0f} ms"
        )
        if "seen_s" in figure:
            line += f"  seen by the watcher {1000 * figure['seen_s']:5.0f} ms"
        if "reads" in figure:
            line += f"  ({figure['reads']:.0f} reads of {1000 * figure['read_s']:.1f} ms)"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

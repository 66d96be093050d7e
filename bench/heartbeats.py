"""Heartbeat cost: messages on tpujobs-worker-events per 1,000 hosts per minute, while jobs just run.

Every message on that topic is one invocation of `on_worker_event` (push) and, for a
heartbeat, one write of a worker document; so counting the messages counts both. The
bench submits one multi-host job (default: 2 slices of v4-32, 4 hosts each = 8 hosts) and
one single-host job (v4-8), each running `sleep`, waits until both are RUNNING and their
`started` reports are in, lets them settle, then counts every message on the topic for
`--seconds` on a pull subscription of its own, by job and kind, and scales:

    invocations per 1,000 hosts per minute = messages / hosts / minutes x 1,000

It measures the steady state: the functions get TPUJOBS_HEARTBEAT_FAST_WINDOW_SECONDS=0 (so
the agents are past their frequent first minutes at once; set --fast-window to measure
those instead). An older commit ignores that variable and beats every 10 s throughout.
To compare with an earlier commit, run this file there: `git worktree add /tmp/before COMMIT`,
then `PYTHONPATH=/tmp/before/shared .venv/bin/python bench/heartbeats.py`.

    .venv/bin/python bench/heartbeats.py [--accelerator v4-32] [--slices 2] [--seconds 60]

It starts the local stack in a temporary directory (or uses the one named by the
environment) and stops what it started; the jobs are cancelled at the end.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
import threading
import time
import uuid
from typing import Any

OWNER = "bench@example.com"
TARGET_FACTOR = 10.0  # invocations per 1,000 hosts per minute: at least tenfold fewer for multi-host slices
BEFORE_PER_HOST_MINUTE = 6.0  # every host, every 10 s: 100 invocations a second at 1,000 hosts
ANCHORS = "SkyPilot polls job status every 15 s; dstack every 10 s (per job or instance, from the server)"


class Counter:
    """Every message on one topic, from a pull subscription of the bench's own, by (job, kind)."""

    def __init__(self, project: str, topic: str) -> None:
        from google.cloud import pubsub_v1

        self._subscriber = pubsub_v1.SubscriberClient()
        self._name = self._subscriber.subscription_path(project, f"bench-heartbeats-{uuid.uuid4().hex[:8]}")
        self._subscriber.create_subscription(request={"name": self._name, "topic": topic})
        self._lock = threading.Lock()
        self._counting = False
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.seen: collections.Counter[tuple[str, str]] = collections.Counter()  # from the start
        self._future = self._subscriber.subscribe(self._name, self._received)

    def _received(self, message: Any) -> None:
        key = (message.attributes.get("job_id", "?"), message.attributes.get("kind", "?"))
        with self._lock:
            self.seen[key] += 1
            if self._counting:
                self.counts[key] += 1
        message.ack()

    def count(self, seconds: float) -> None:
        with self._lock:
            self._counting = True
        time.sleep(seconds)
        with self._lock:
            self._counting = False

    def close(self) -> None:
        self._future.cancel()
        with contextlib.suppress(Exception):
            self._future.result(timeout=5)
        try:
            self._subscriber.delete_subscription(request={"subscription": self._name})
        finally:
            self._subscriber.close()


def per_thousand(messages: int, hosts: int, seconds: float) -> float:
    """Messages per 1,000 hosts per minute."""
    return messages / hosts / (seconds / 60.0) * 1000.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accelerator", default="v4-32", help="the multi-host job's accelerator type (default v4-32)")
    parser.add_argument("--slices", type=int, default=2, help="its slices (default 2)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to count (default 60)")
    parser.add_argument("--settle", type=float, default=15.0, help="wait after all started (default 15 s)")
    parser.add_argument("--fast-window", type=float, default=0.0, help="TPUJOBS_HEARTBEAT_FAST_WINDOW_SECONDS")
    args = parser.parse_args()
    if args.slices < 1 or args.seconds <= 0:
        parser.error("--slices must be at least 1 and --seconds positive")

    from tpujobs.domain.accelerators import parse_accelerator_type

    hosts_per_slice = parse_accelerator_type(args.accelerator).hosts
    os.environ["TPUJOBS_HEARTBEAT_FAST_WINDOW_SECONDS"] = f"{args.fast_window:g}"

    from tpujobs.engine.settings import Settings
    from tpujobs.engine.topology import CONTROL, SUBMIT, WORKER_EVENTS
    from tpujobs.local import stack
    from tpujobs.local.testing import wait_for

    counter = None
    with stack.running() as _env:
        from google.cloud import firestore

        from tpujobs.adapters.firestore_store import FirestoreJobStore
        from tpujobs.adapters.pubsub import Publisher
        from tpujobs.domain.states import JobState

        settings = Settings.from_env()
        publisher = Publisher.build(settings.project, settings.prefix)
        store = FirestoreJobStore(firestore.Client(project=settings.project))
        suffix = uuid.uuid4().hex[:6]
        jobs = {
            f"beat-multi-{suffix}": (args.accelerator, args.slices, hosts_per_slice * args.slices),
            f"beat-single-{suffix}": ("v4-8", 1, 1),
        }
        try:
            counter = Counter(settings.project, publisher.topic_path(WORKER_EVENTS))
            for job_id, (accelerator, slices, _hosts) in jobs.items():
                spec = {"job_id": job_id, "name": "bench-heartbeats", "owner": OWNER, "command": "sleep 3600"}
                publisher.publish_json(SUBMIT, {**spec, "accelerator_type": accelerator, "slices": slices})
            for job_id, (_a, _s, hosts) in jobs.items():

                def started(job_id: str = job_id, hosts: int = hosts) -> bool | None:
                    job = store.get(job_id)
                    if job is not None and job.state.is_terminal:
                        raise RuntimeError(f"{job_id} ended {job.state.value}: {job.state_reason}")
                    running = job is not None and job.state is JobState.RUNNING
                    assert counter is not None
                    return (running and counter.seen[(job_id, "started")] >= hosts) or None

                wait_for(started, timeout=180, what=f"{job_id} RUNNING with all {hosts} hosts started")
            time.sleep(args.settle)
            print(f"counting messages on {WORKER_EVENTS} for {args.seconds:g} s ...", file=sys.stderr)
            counter.count(args.seconds)
        finally:
            for job_id in jobs:
                publisher.publish_json(CONTROL, {"action": "cancel", "job_id": job_id, "owner": OWNER})
            if counter is not None:
                counter.close()

    print(f"\nheartbeat cost: messages on {WORKER_EVENTS} (each an invocation; a heartbeat also a worker write)")
    print(f"  counted for {args.seconds:g} s, steady state (fast window {args.fast_window:g} s), after a settle")
    figures = {}
    for job_id, (accelerator, slices, hosts) in jobs.items():
        kinds = {kind: n for (job, kind), n in counter.counts.items() if job == job_id} if counter else {}
        total = sum(kinds.values())
        figures[job_id] = per_thousand(total, hosts, args.seconds)
        shape = f"{slices} x {accelerator} ({hosts} hosts)"
        print(f"  {shape:<28} {total:>4} messages {json.dumps(kinds, sort_keys=True)}")
        print(f"  {'':<28} = {figures[job_id]:8.1f} invocations per 1,000 hosts per minute")
    before = BEFORE_PER_HOST_MINUTE * 1000
    multi = figures[next(iter(jobs))]
    factor = before / multi if multi else float("inf")
    print(f"\n  anchor: every host every 10 s = {before:.0f} per 1,000 hosts per minute (100 a second); {ANCHORS}")
    verdict = "met" if factor >= TARGET_FACTOR else "NOT met"
    print(f"  target: multi-host slices at least {TARGET_FACTOR:g}x fewer: {verdict} ({factor:.1f}x)")
    single = figures[list(jobs)[1]]
    print(
        f"  single-host slices: {before / single if single else float('inf'):.1f}x fewer (each host speaks for itself)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

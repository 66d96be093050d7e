"""Time to recovery: from the loss of a running spot job's capacity to the request of its next,
on each platform side by side.

Each trial submits a new job (one worker host, `sleep 600`, spot, on_preemption resume,
max_restarts 3), waits until it is RUNNING at attempt 1, takes its capacity away through the
simulator, and times from just before that call (time.time()) to the request of attempt 2's
capacity, which the simulator stamps with its wall clock when the request arrives (same
machine, same clock): no polling interval is in the number. The job is cancelled afterwards.
A new job per trial, because restarts after the first back off by design (1 s, 2 s, ...).

The platforms (--platforms):
  tpu-api  a v4-8 (v4-16 for two hosts) queued resource; attempt 2 is requested when the
           `{job_id}-a2` create operation arrives.
  compute  a v7x-8 (v7x-16 for two hosts) slice on Compute Engine, a MIG; attempt 2 is
           requested when the first of `{job_id}-c2`'s template, workload policy and MIG is
           inserted (their creationTimestamp).

The paths:
  notice  :preempt (a MIG's Spot VMs on Compute Engine): the simulator sends SIGTERM to the
          worker, whose agent publishes a preemption notice at once; on_preemption deletes the
          old capacity and requests the next.
  silent  :kill-host: the worker host dies without a word; only the reconciler's polling
          tick sees it (TPU API: node REPAIRING, UNHEALTHY_MAINTENANCE; Compute Engine: the VM
          TERMINATED by a host error). The host is killed at a random phase of the tick, so the
          wait for the tick is what a user would see on average.
          The ticks are read from a pull subscription of the bench's own on the reconcile
          topic, which splits the latency into the wait for the tick and the handling.

  hung-peer   a hung host of a 2-host slice (v4-16): the agent of worker 1 is frozen (SIGSTOP)
          while its node stays healthy, so no TPU state and no notice say anything; only
          silence tells. Worker 0 of the slice hears nothing from it over the slice's network
          and reports it (`peer_silent`) after the peer timeout (TPUJOBS_PEER_TIMEOUT_SECONDS,
          10 s); before that design, the reconciler found its worker record silent after the
          heartbeat timeout (60 s), at its next tick.
  hung-single the same for the one host of a v4-8 (its agent frozen): the reconciler finds its
          record past `silent_after` (the heartbeat timeout, 60 s) at its next tick, as before.

    .venv/bin/python bench/recovery.py [--trials 20] [--paths notice,silent,hung-peer,hung-single]
                                       [--platforms tpu-api,compute]

To compare with an earlier commit, run the same file there: `git worktree add /tmp/before
COMMIT`, then `PYTHONPATH=/tmp/before/shared .venv/bin/python bench/recovery.py --paths ...`.

It starts the local stack in a temporary directory (or uses the one named by the
environment) and stops what it started. Trials run one at a time: concurrent jobs would
share the reconciler's tick and the functions' processes, and distort the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tpujobs.domain.naming import queued_resource_name
from tpujobs.domain.states import JobState
from tpujobs.engine.settings import Settings
from tpujobs.engine.topology import CONTROL, RECONCILE, SUBMIT
from tpujobs.local import stack
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.testing import wait_for

OWNER = "bench@example.com"
LOCAL_TICK_S = stack.RECONCILE_INTERVAL_S
PRODUCTION_TICK_S = 60.0  # Cloud Scheduler's shortest interval
TARGET_NOTICE_MEDIAN_S = 0.5
TARGET_COMPUTE_NOTICE_S = 0.2  # issue 38: Compute Engine as fast as the TPU API path
PATHS = ("notice", "silent", "hung-peer", "hung-single")
PLATFORMS = ("tpu-api", "compute")
ONE_HOST = {"tpu-api": "v4-8", "compute": "v7x-8"}
TWO_HOSTS = {"tpu-api": "v4-16", "compute": "v7x-16"}
COMPUTE_KINDS = ("instanceTemplates", "resourcePolicies", "instanceGroupManagers", "instances")
TARGET_HUNG_PEER_S = 20.0
TARGET_HUNG_SINGLE_S = 60.0 + LOCAL_TICK_S + 2.0
HUNG_TIMEOUT_S = 180.0  # a hung host is found in about a minute at worst (the heartbeat timeout)
ANCHORS = (
    "SkyPilot managed jobs poll job status every 15 s; dstack every 10 s with a 2-minute "
    "grace; hand-run monitors every 10-30 min"
)


@dataclass(frozen=True)
class Trial:
    """One loss and recovery; times in seconds from the loss (the :preempt or :kill-host call)."""

    job_id: str
    platform: str
    latency: float  # loss -> attempt 2's capacity requested
    recovering: float  # loss -> the RECOVERING event's `at`
    source: str  # who recorded RECOVERING: "agent" (the notice) or "reconciler"
    tick: float | None  # loss -> the reconcile tick that found it (silent path)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def rfc3339(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 time as the simulator writes it (...Z)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Ticks:
    """The reconcile ticks the local scheduler publishes, from a subscription of our own."""

    def __init__(self, project: str, topic: str) -> None:
        from google.cloud import pubsub_v1

        self._subscriber = pubsub_v1.SubscriberClient()
        self._name = self._subscriber.subscription_path(project, f"bench-recovery-ticks-{uuid.uuid4().hex[:8]}")
        self._subscriber.create_subscription(request={"name": self._name, "topic": topic})
        self._lock = threading.Lock()
        self._times: list[float] = []
        self._future = self._subscriber.subscribe(self._name, self._received)

    def _received(self, message: Any) -> None:
        try:
            at = datetime.fromisoformat(json.loads(message.data)["tick"]).timestamp()
        except (ValueError, KeyError, TypeError):
            pass
        else:
            with self._lock:
                self._times.append(at)
        message.ack()

    def last_before(self, when: float) -> float | None:
        with self._lock:
            earlier = [t for t in self._times if t <= when]
        return max(earlier) if earlier else None

    def close(self) -> None:
        self._future.cancel()
        with contextlib.suppress(Exception):  # cancelled, or the stream had failed: it is over
            self._future.result(timeout=5)
        try:
            self._subscriber.delete_subscription(request={"subscription": self._name})
        finally:
            self._subscriber.close()


class Bench:
    def __init__(self, settings: Settings, env: dict[str, str], ticks: Ticks) -> None:
        from google.cloud import firestore

        from tpujobs.adapters.firestore_store import FirestoreJobStore
        from tpujobs.adapters.pubsub import Publisher

        self.publisher = Publisher.build(settings.project, settings.prefix)
        self.store = FirestoreJobStore(firestore.Client(project=settings.project))
        self.simulator = SimulatorControl(env["TPUJOBS_TPU_ENDPOINT"])
        self.zone = env["TPUJOBS_DEFAULT_ZONE"]
        self.ticks = ticks

    # -- the simulator -------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        return self.simulator.state()

    def _requested_at(self, holding: str) -> float | None:
        """When the first request for the holding arrived (its queued resource's create, or the
        first insert of its Compute resources), or None if none has yet."""
        state = self._state()
        if holding.rsplit("-", 1)[-1].startswith("c"):
            created = [
                rfc3339(item["creationTimestamp"])
                for kind in COMPUTE_KINDS[:3]
                for item in state["compute"][kind]
                if item["name"] == holding
            ]
            return min(created, default=None)
        suffix = f"/queuedResources/{holding}"
        for op in state["operations"]:
            meta = op.get("metadata", {})
            if meta.get("verb") == "create" and meta.get("target", "").endswith(suffix):
                return rfc3339(meta["createTime"])
        for qr in state["queuedResources"]:
            if qr["name"].endswith(suffix):
                return rfc3339(qr["createTime"])
        return None

    def _holds_anything(self, job_id: str) -> bool:
        """Whether any queued resource or Compute resource of the job is left."""
        state = self._state()
        names = [qr["name"].rsplit("/", 1)[-1] for qr in state["queuedResources"]]
        names += [item["name"] for kind in COMPUTE_KINDS for item in state["compute"][kind]]
        return any(n.startswith((f"{job_id}-a", f"{job_id}-c")) for n in names)

    def _workers(self, holding: str, platform: str) -> list[dict[str, Any]]:
        """The worker processes of a one-slice holding (on Compute Engine its MIG has its name)."""
        if platform == "compute":
            return self.simulator.group_workers(self.zone, holding)
        return self.simulator.workers(self.zone, holding)

    def _preempt(self, holding: str, platform: str) -> None:
        if platform == "compute":
            self.simulator.preempt_group(self.zone, holding)
        else:
            self.simulator.preempt(self.zone, holding)

    def _kill_host(self, holding: str, platform: str) -> None:
        if platform == "compute":
            self.simulator.kill_group_host(self.zone, holding, 0)
        else:
            self.simulator.kill_host(self.zone, holding, worker=0, slice_index=0)

    # -- jobs ----------------------------------------------------------------------------

    def _submit(self, job_id: str, accelerator_type: str, platform: str) -> None:
        self.publisher.publish_json(
            SUBMIT,
            {
                "job_id": job_id,
                "name": "bench-recovery",
                "owner": OWNER,
                "accelerator_type": accelerator_type,
                "platform": platform,
                "capacity": "spot",
                "command": "sleep 600",
                "on_preemption": "resume",
                "max_restarts": 3,
            },
        )

    def _running(self, job_id: str) -> Any:
        def probe() -> Any:
            job = self.store.get(job_id)
            if job is not None and job.state.is_terminal:
                raise RuntimeError(f"{job_id} ended {job.state.value}: {job.state_reason}")
            return job if job and job.state is JobState.RUNNING and job.attempt == 1 else None

        return wait_for(probe, timeout=60, what=f"{job_id} RUNNING at attempt 1")

    def _cancel_and_settle(self, job_id: str) -> None:
        """Cancel the job and wait until it is over and none of its queued resources is left."""
        self.publisher.publish_json(CONTROL, {"action": "cancel", "job_id": job_id, "owner": OWNER})

        def settled() -> bool | None:
            job = self.store.get(job_id)
            if job is None or not job.state.is_terminal:
                return None
            return None if self._holds_anything(job_id) else True

        wait_for(settled, timeout=60, interval=0.1, what=f"{job_id} cancelled and its capacity released")

    def _freeze_agent(self, holding: str, platform: str, worker: int) -> float:
        """SIGSTOP the agent of one host (the startup script execs it: the script's pid); its
        command runs on and its node stays healthy. The time just before."""
        found = [w for w in self._workers(holding, platform) if w["worker"] == worker]
        if not found or not found[0]["alive"]:
            raise RuntimeError(f"no live worker {worker} of {holding}")
        lost = time.time()
        os.kill(int(found[0]["pid"]), signal.SIGSTOP)
        return lost

    def trial(self, platform: str, path: str) -> Trial:
        job_id = f"rec-{path}-{uuid.uuid4().hex[:8]}"
        self._submit(job_id, (TWO_HOSTS if path == "hung-peer" else ONE_HOST)[platform], platform)
        try:
            job = self._running(job_id)
            if path == "notice":
                lost = time.time()
                self._preempt(job.queued_resource, platform)
            elif path.startswith("hung"):
                time.sleep(3.0 + random.uniform(0, LOCAL_TICK_S))  # the peers have met; a random phase of the tick
                lost = self._freeze_agent(job.queued_resource, platform, 1 if path == "hung-peer" else 0)
            else:
                time.sleep(random.uniform(0, LOCAL_TICK_S))  # a random phase of the tick
                lost = time.time()
                self._kill_host(job.queued_resource, platform)
            next_holding = queued_resource_name(job_id, 2, platform)
            requested = wait_for(
                lambda: self._requested_at(next_holding),
                timeout=HUNG_TIMEOUT_S if path.startswith("hung") else 30 + LOCAL_TICK_S,
                what=f"{next_holding} to be requested",
            )
        finally:
            self._cancel_and_settle(job_id)
        event = next(e for e in self.store.events(job_id) if e.to_state is JobState.RECOVERING)
        recovering = event.at.timestamp()
        tick = self.ticks.last_before(recovering) if path == "silent" else None
        return Trial(
            job_id=job_id,
            platform=platform,
            latency=requested - lost,
            recovering=recovering - lost,
            source=str(event.source),
            tick=None if tick is None else tick - lost,
        )


def spread(values: list[float]) -> str:
    return (
        f"median {statistics.median(values):6.3f} s   p95 {percentile(values, 0.95):6.3f} s   "
        f"min {min(values):6.3f} s   max {max(values):6.3f} s   N={len(values)}"
    )


def report_hung(results: dict[str, list[Trial]], platform: str) -> None:
    """The hung-host paths: their spread, who noticed, and the target (not slower than before)."""
    for path in ("hung-peer", "hung-single"):
        trials = results.get(path)
        if not trials:
            continue
        what = (
            f"worker 1 of a {TWO_HOSTS[platform]} frozen"
            if path == "hung-peer"
            else f"the one host of a {ONE_HOST[platform]} frozen"
        )
        print(f"\n  {path:<11} ({what})  {spread([t.latency for t in trials])}")
        sources = sorted({t.source for t in trials})
        to_event = statistics.median(t.recovering for t in trials)
        print(f"          RECOVERING after {to_event:.3f} s (median), recorded by {', '.join(sources)}")
    print(
        "\n  hung hosts: before slice heartbeats, both were found by the reconciler after the heartbeat "
        "timeout (60 s) + its tick; now a peer is found by worker 0 after the peer timeout (10 s)"
    )
    for path, bound, what in (
        ("hung-peer", TARGET_HUNG_PEER_S, "the peer timeout (10 s) + handling"),
        ("hung-single", TARGET_HUNG_SINGLE_S, "the heartbeat timeout (60 s) + the local tick: no slower than before"),
    ):
        if results.get(path):
            median = statistics.median(t.latency for t in results[path])
            verdict = "met" if median <= bound else "NOT met"
            print(f"  target: {path} median <= {bound:g} s ({what}): {verdict} ({median:.1f} s)")


def report(results: dict[str, list[Trial]], platform: str) -> None:
    held = "{job}-c2's first insert" if platform == "compute" else "{job}-a2 create time"
    print(f"\nrecovery on {platform}: capacity lost -> next attempt requested ({held} in the simulator)")
    print("  one trial at a time, a new job each; one warm-up trial per path not counted\n")
    report_hung(results, platform)
    notice, silent = results.get("notice"), results.get("silent")
    if notice:
        report_notice(notice)
    if silent:
        report_silent(silent)
    print(f"\n  anchors: {ANCHORS}")
    if notice:
        median = statistics.median(t.latency for t in notice)
        verdict = "met" if median <= TARGET_NOTICE_MEDIAN_S else "NOT met"
        print(f"  target: notice-path median <= {TARGET_NOTICE_MEDIAN_S} s: {verdict} ({median:.3f} s)")


def report_notice(notice: list[Trial]) -> None:
    """The notice path: its spread and where the time goes."""
    latencies = [t.latency for t in notice]
    print(f"  notice  (:preempt, the worker's notice)      {spread(latencies)}")
    by_agent = sum(t.source == "agent" for t in notice)
    to_event = statistics.median(t.recovering for t in notice)
    to_request = statistics.median(t.latency - t.recovering for t in notice)
    print(
        f"          breakdown (medians): notice -> RECOVERING event {to_event:.3f} s, "
        f"RECOVERING -> attempt 2 requested {to_request:.3f} s"
    )
    print(f"          RECOVERING recorded from the agent's notice in {by_agent}/{len(notice)} trials")


def report_silent(silent: list[Trial]) -> None:
    """The silent path: its spread, split into the wait for the tick and the handling."""
    latencies = [t.latency for t in silent]
    print(f"\n  silent  (:kill-host, no notice)              {spread(latencies)}")
    ticked = [t for t in silent if t.tick is not None]
    handling = [t.latency - t.tick for t in ticked if t.tick is not None]
    if handling:
        wait = statistics.median(t.tick for t in ticked if t.tick is not None)
        to_event = statistics.median(t.recovering - t.tick for t in ticked if t.tick is not None)
        to_request = statistics.median(t.latency - t.recovering for t in ticked)
        print(
            f"          breakdown (medians): kill -> reconcile tick {wait:.3f} s, tick -> RECOVERING "
            f"event {to_event:.3f} s, RECOVERING -> attempt 2 requested {to_request:.3f} s"
        )
        print(f"          handling (tick -> attempt 2 requested) {spread(handling)}")
        handled = statistics.median(handling)
    else:  # no tick was seen: the handling is what is left after half a tick
        handled = statistics.median(latencies) - LOCAL_TICK_S / 2
        print("          (no reconcile tick was seen; handling estimated as median - tick/2)")
    print(
        f"          bounded by the local reconcile tick ({LOCAL_TICK_S:g} s): the loss waits for "
        f"the next tick, {LOCAL_TICK_S / 2:g} s on average"
    )
    print(
        f"          production ticks once a minute (Cloud Scheduler's minimum): expected median "
        f"= {PRODUCTION_TICK_S / 2:g} s + {handled:.3f} s handling = {PRODUCTION_TICK_S / 2 + handled:.1f} s "
        f"(at worst {PRODUCTION_TICK_S + handled:.1f} s)"
    )


def side_by_side(by_platform: dict[str, dict[str, list[Trial]]]) -> None:
    """One table: each path's median and p95 on each platform, and the platforms' ratio."""
    platforms = [p for p in PLATFORMS if p in by_platform]
    head = "".join(f"{p + ' median':>16}{'p95':>9}" for p in platforms)
    ratio = "   compute/tpu-api (median, p95)" if len(platforms) == 2 else ""
    print(f"\nrecovery, side by side (seconds from the loss to attempt 2 requested)\n  {'path':<12}{head}{ratio}")
    paths = [path for path in PATHS if any(by_platform[p].get(path) for p in platforms)]
    for path in paths:
        row, figures = f"  {path:<12}", []
        for platform in platforms:
            latencies = [t.latency for t in by_platform[platform].get(path, [])]
            if latencies:
                median, p95 = statistics.median(latencies), percentile(latencies, 0.95)
                figures.append((median, p95))
                row += f"{median:16.3f}{p95:9.3f}"
            else:
                row += f"{'-':>16}{'-':>9}"
        if len(figures) == 2 and figures[0][0] > 0 and figures[0][1] > 0:
            row += f"   {figures[1][0] / figures[0][0]:6.2f}x, {figures[1][1] / figures[0][1]:6.2f}x"
        print(row)
    notice = by_platform.get("compute", {}).get("notice")
    if notice:
        median = statistics.median(t.latency for t in notice)
        verdict = "met" if median <= TARGET_COMPUTE_NOTICE_S else "NOT met"
        print(
            f"  target: compute notice median <= {TARGET_COMPUTE_NOTICE_S:g} s (issue 38): {verdict} ({median:.3f} s)"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20, help="trials per path and platform (default 20)")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma list of {', '.join(PATHS)}")
    parser.add_argument("--platforms", default=",".join(PLATFORMS), help=f"comma list of {', '.join(PLATFORMS)}")
    args = parser.parse_args()
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if not paths or any(p not in PATHS for p in paths):
        parser.error(f"--paths must name some of {', '.join(PATHS)}")
    platforms = [p.strip() for p in args.platforms.split(",") if p.strip()]
    if not platforms or any(p not in PLATFORMS for p in platforms):
        parser.error(f"--platforms must name some of {', '.join(PLATFORMS)}")

    ticks = None
    with stack.running() as env:
        try:
            from tpujobs.adapters.pubsub import Publisher

            settings = Settings.from_env()
            topic = Publisher.build(settings.project, settings.prefix).topic_path(RECONCILE)
            ticks = Ticks(settings.project, topic)
            bench = Bench(settings, env, ticks)
            by_platform: dict[str, dict[str, list[Trial]]] = {p: {path: [] for path in paths} for p in platforms}
            started = time.monotonic()
            for platform, results in by_platform.items():
                for path, trials in results.items():
                    if not path.startswith("hung"):  # a minute each: the notice and silent paths warm up for them
                        bench.trial(platform, path)  # warm-up: the first requests of each function pay for clients
                    for i in range(args.trials):
                        trial = bench.trial(platform, path)
                        trials.append(trial)
                        tick = "" if trial.tick is None else f", tick at {trial.tick:.3f} s"
                        print(
                            f"{platform} {path} {i + 1:>2}/{args.trials}: attempt 2 requested after "
                            f"{trial.latency:.3f} s (RECOVERING at {trial.recovering:.3f} s by {trial.source}{tick})",
                            file=sys.stderr,
                        )
            print(f"{time.monotonic() - started:.0f} s of trials", file=sys.stderr)
            for platform, results in by_platform.items():
                report(results, platform)
            side_by_side(by_platform)
        finally:
            if ticks is not None:
                ticks.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

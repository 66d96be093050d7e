"""How fast a job starts on a warm pool's unit, against the same job on fresh capacity.

A warm pool holds queued resources whose agents already run and wait for an assignment, so a
job on it should start in the time it takes the control plane to give it a unit and write the
unit's node metadata, which the agents wait on. The issue's target is a median of 2 s or less;
fresh capacity takes minutes on Google. This measures both on the local stack.

Each trial submits a new one-worker job (v4-8) whose command prints a line and exits 0,
through the jobs API as `tpujobs submit` does there (a job on a pool needs a verified owner,
which only the API gives), and times it from just before the submit call (time.time()) to:

  started    the worker's `started` report, as the agent stamped it (the `started_at` of its
             record in jobs/{id}/workers, the agent's own clock, the same machine's): the
             moment the agent launched the command. No Pub/Sub delivery or function time of
             the report is in it. The RUNNING event's `at` is kept beside it as `running`.
  succeeded  the `at` of the job's SUCCEEDED event: what a user waiting on the job sees.

Two variants:

  warm   `pool: NAME` on a pool of one v4-8 unit made for the bench, idle before each trial
         (20 trials by default, `--jobs`)
  fresh  the same job without `pool`: a queued resource of its own, its VM booting the agent
         (5 trials by default, `--fresh`: each costs a provisioning and a release)

The local simulator provisions a queued resource in about a second and its "VMs" are local
processes that start at once, while real fresh capacity takes minutes (the queued resource
waits for capacity and is provisioned, then the TPU VMs boot and run the startup script). The
local `fresh` figure is therefore a floor: what the control plane and the agent add, without
the cloud's provisioning and boot. The `warm` figure has no such part missing: on Google a
warm job's start is the same function calls, an UpdateNode and the metadata server's answer.

    .venv/bin/python bench/pools.py [--jobs 20] [--fresh 5] [--json]

It starts the local stack in a temporary directory (or uses the one named by the environment)
and stops what it started; it lets its caller create pools (`config/policies.pools`) and
deletes its pool at the end. Trials run one at a time, and each waits until the previous
one's unit is idle again or its capacity is released, so no trial shares the machine with
another's clean-up. One trial of each variant is run first as a warm-up and not counted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from tpujobs.cli.demo_pool import LocalPools
from tpujobs.domain.states import JobState
from tpujobs.engine.settings import Settings
from tpujobs.local import stack
from tpujobs.local.testing import wait_for

OWNER = "bench@example.com"
VARIANTS = ("warm", "fresh")
DESCRIPTIONS = {"warm": "pool: an idle warm unit", "fresh": "a queued resource of its own"}
JOB_TIMEOUT_S = 120.0
TARGET_MEDIAN_S = 2.0  # the target for `warm`


@dataclass(frozen=True)
class Trial:
    """One job; times in seconds from just before its submit call."""

    variant: str
    job_id: str
    started: float  # the agent's `started` report (its own stamp)
    running: float | None  # the RUNNING event committed (None: the exit was committed first)
    succeeded: float  # the SUCCEEDED event committed


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile (p95 of 20 values is the 19th smallest)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


class Bench:
    def __init__(self, settings: Settings, env: dict[str, str]) -> None:
        self.pools = LocalPools(settings, env, owner=OWNER)
        self.pools.allow()
        self.pool = f"bench-{uuid.uuid4().hex[:6]}"
        self.pools.create(self.pool, count=1)
        self.pools.wait_idle(self.pool, 1, JOB_TIMEOUT_S)

    def close(self) -> None:
        self.pools.delete(self.pool)
        self.pools.wait_gone(self.pool, JOB_TIMEOUT_S)

    def _spec(self, variant: str) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "name": "bench-pools",
            "accelerator_type": "v4-8",
            "command": f"echo hello from {variant}",
            "on_error": "fail",
        }
        if variant == "warm":
            spec["pool"] = self.pool
        return spec

    def _settle(self, job_id: str) -> None:
        """Wait until the trial's capacity is as before: the unit idle again, or the job's own
        queued resource released."""

        def settled() -> bool:
            if self.pools.queued_resources(f"{job_id}-a"):
                return False
            described = self.pools.describe(self.pool)
            return described is not None and all(u["state"] == "IDLE" for u in described["units"])

        wait_for(settled, timeout=60, interval=0.05, what=f"{job_id}'s capacity idle or released")

    def trial(self, variant: str) -> Trial:
        job_id, submitted = self.pools.submit(
            {**self._spec(variant), "job_id": f"pools-{variant}-{uuid.uuid4().hex[:8]}"}
        )
        try:
            job = self.pools.ended(job_id, JOB_TIMEOUT_S)
            if job.state is not JobState.SUCCEEDED:
                raise RuntimeError(f"{job_id} ended {job.state.value}: {job.state_reason}")
            on_pool = [u.pool for u in job.usage]
            if on_pool != ([self.pool] if variant == "warm" else [""]):
                raise RuntimeError(f"{job_id} ({variant}) ran on pools {on_pool}")
            started = self.pools.started_at(job_id)
        finally:
            self._settle(job_id)
        events = {e.to_state: e.at.timestamp() for e in self.pools.store.events(job_id)}
        running = events.get(JobState.RUNNING)
        return Trial(
            variant=variant,
            job_id=job_id,
            started=started - submitted,
            running=None if running is None else running - submitted,
            succeeded=events[JobState.SUCCEEDED] - submitted,
        )


def summary(results: dict[str, list[Trial]]) -> dict[str, Any]:
    """Per variant: median and p95 of each time; warm's started median against fresh's."""
    out: dict[str, Any] = {}
    for variant, trials in results.items():
        figures: dict[str, Any] = {"trials": len(trials)}
        for name in ("started", "running", "succeeded"):
            values = [v for v in (getattr(t, name) for t in trials) if v is not None]
            figures[name] = {
                "median_s": statistics.median(values) if values else None,
                "p95_s": percentile(values, 0.95) if values else None,
            }
        out[variant] = figures
    warm, fresh = out["warm"]["started"]["median_s"], out["fresh"]["started"]["median_s"]
    out["warm"]["meets_target"] = warm is not None and warm <= TARGET_MEDIAN_S
    out["fresh_over_warm"] = fresh / warm if warm and fresh is not None else None
    return out


def table(numbers: dict[str, Any]) -> None:
    print("\npools: submit -> worker started / job SUCCEEDED, one-worker v4-8, one trial at a time")
    print("  one warm-up trial of each variant not counted\n")
    print(f"  {'variant':<6} {'':<30}{'trials':>7}{'started med':>13}{'p95':>8}{'succeeded med':>15}{'p95':>8}")
    for variant in VARIANTS:
        row = numbers[variant]
        print(
            f"  {variant:<6} {DESCRIPTIONS[variant]:<30}{row['trials']:>7}"
            f"{row['started']['median_s']:12.3f}s{row['started']['p95_s']:7.3f}s"
            f"{row['succeeded']['median_s']:14.3f}s{row['succeeded']['p95_s']:7.3f}s"
        )
    ratio = numbers["fresh_over_warm"]
    target = "meets" if numbers["warm"]["meets_target"] else "misses"
    print(f"\n  warm {target} the target median of {TARGET_MEDIAN_S:g} s to started")
    if ratio is not None:
        print(f"  fresh capacity starts {ratio:.1f}x later here, where the simulator provisions in about a second;")
    print(
        "  on Google, fresh capacity takes minutes (queued resource, then VM boot): the local fresh figure is a floor"
    )


def interleaved(warm: int, fresh: int) -> list[str]:
    """The trials' order: the fresh ones spread evenly among the warm ones."""
    order: list[str] = []
    placed = 0
    for index in range(warm):
        order.append("warm")
        if placed < fresh and index + 1 >= round((placed + 1) * warm / fresh):
            order.append("fresh")
            placed += 1
    return order + ["fresh"] * (fresh - placed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20, help="jobs on the warm unit (default 20)")
    parser.add_argument("--fresh", type=int, default=5, help="jobs on fresh capacity (default 5)")
    parser.add_argument("--json", action="store_true", help="print the trials and the summary as JSON")
    args = parser.parse_args()
    if args.jobs < 1 or args.fresh < 1:
        parser.error("--jobs and --fresh must be at least 1")

    with stack.running() as env:
        bench = Bench(Settings.from_env(), env)
        try:
            for variant in VARIANTS:
                bench.trial(variant)  # warm-up: the first requests of each path pay for clients
            results: dict[str, list[Trial]] = {variant: [] for variant in VARIANTS}
            plan = interleaved(args.jobs, args.fresh)  # so drift hits both variants alike
            begun = time.monotonic()
            for done, variant in enumerate(plan, 1):
                trial = bench.trial(variant)
                results[variant].append(trial)
                print(
                    f"trial {done:>2}/{len(plan)} {variant:<5}: started {trial.started:.3f} s, "
                    f"SUCCEEDED {trial.succeeded:.3f} s",
                    file=sys.stderr,
                )
            print(f"{time.monotonic() - begun:.0f} s of trials", file=sys.stderr)
        finally:
            bench.close()
    numbers = summary(results)
    if args.json:
        trials = {variant: [asdict(t) for t in runs] for variant, runs in results.items()}
        print(json.dumps({"jobs": args.jobs, "fresh": args.fresh, "summary": numbers, "trials": trials}, indent=2))
    else:
        table(numbers)
    return 0


if __name__ == "__main__":
    sys.exit(main())

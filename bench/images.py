"""What running a job in a container image costs per attempt, against bash on the host.

Each trial publishes a new one-worker job (v4-8) whose command prints a line and exits 0,
and times it from just before the publish (time.time()) to two points:

  started    the worker's `started` report, as the agent stamped it (the `started_at` of
             its record in jobs/{id}/workers, the agent's own clock with milliseconds, the
             same machine's): the moment the agent launched the command (bash, or `docker
             run` after the pull). This is the most precise signal: it has no Pub/Sub
             delivery or function time in it. The RUNNING event's `at` (when the control
             function committed the report) is kept beside it as `running`.
  succeeded  the `at` of the job's SUCCEEDED event, which the control function stamps when
             it commits the worker's exit: what a user waiting on the job sees.

Three variants, one trial of each per round, their order rotated from round to round so
drift (another process, a warm cache) hits all alike:

  host       no image: setup and command run with bash on the host
  cached     image, image_pull_policy if-missing, the image already on the engine: no pull
  pulled     image, image_pull_policy always, removed from the engine before each trial
             (`remove_local_image`): a real pull from the stack's loopback registry

The two images are tiny (a static busybox root filesystem, built here and pushed to
TPUJOBS_REGISTRY) and differ in one file, so removing one leaves no layer of it behind.
Real images are hundreds of megabytes to gigabytes pulled over a network: the `pulled`
figure is the floor of a pull, what the agent and docker add around the bytes.

    .venv/bin/python bench/images.py [--trials 10] [--json]

It starts the local stack in a temporary directory (or uses the one named by the
environment) and stops what it started. It needs Docker Engine (see tpujobs.local.containers).
Trials run one at a time: concurrent jobs would share the machine's cores and the engine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from tpujobs.domain.states import JobState
from tpujobs.engine.settings import Settings
from tpujobs.engine.topology import CONTROL, SUBMIT
from tpujobs.local import containers, stack
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.testing import wait_for

OWNER = "bench@example.com"
VARIANTS = ("host", "cached", "pulled")
DESCRIPTIONS = {
    "host": "no image (bash on the host)",
    "cached": "image, if-missing, on the engine",
    "pulled": "image, always, removed first",
}
JOB_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Trial:
    """One job; times in seconds from just before its spec was published."""

    variant: str
    job_id: str
    started: float  # the agent's `started` report (its own stamp)
    running: float | None  # the RUNNING event committed (None: the exit was committed first)
    succeeded: float  # the SUCCEEDED event committed
    command: float  # started -> exited, both by the agent's clock: the command (or container) ran


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def on_engine(reference: str) -> bool:
    """Whether the local Docker Engine has `reference` (so an if-missing policy pulls nothing)."""
    docker = containers.docker_binary()
    if docker is None:
        return False
    done = subprocess.run([docker, "image", "inspect", reference], capture_output=True, check=False)
    return done.returncode == 0


class Bench:
    def __init__(self, settings: Settings, env: dict[str, str], registry: str) -> None:
        from google.cloud import firestore

        from tpujobs.adapters.firestore_store import FirestoreJobStore
        from tpujobs.adapters.pubsub import Publisher

        self.publisher = Publisher.build(settings.project, settings.prefix)
        self.store = FirestoreJobStore(firestore.Client(project=settings.project))
        self.simulator = SimulatorControl(env["TPUJOBS_TPU_ENDPOINT"])
        run = uuid.uuid4().hex[:8]
        # Two images that differ in a file: removing one does not leave its only layer behind.
        self.images = {variant: f"{registry}/tpujobs-bench/images-{variant}:{run}" for variant in ("cached", "pulled")}
        for variant, reference in self.images.items():
            containers.build_tiny_image(reference, {"/etc/bench-image": f"{variant} {run}\n"})

    def close(self) -> None:
        for reference in self.images.values():
            containers.remove_local_image(reference)

    def _spec(self, job_id: str, variant: str) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "job_id": job_id,
            "name": "bench-images",
            "owner": OWNER,
            "accelerator_type": "v4-8",
            "command": f"echo hello from {variant}",
            "on_error": "fail",
        }
        if variant == "cached":
            spec.update(image=self.images["cached"], image_pull_policy="if-missing")
        elif variant == "pulled":
            spec.update(image=self.images["pulled"], image_pull_policy="always")
        return spec

    def _prepare(self, variant: str) -> None:
        """The engine as the variant needs it: the cached image there, the pulled one gone."""
        if variant == "cached" and not on_engine(self.images["cached"]):
            raise RuntimeError(f"{self.images['cached']} is not on the engine, so the cached variant would pull")
        if variant == "pulled":
            containers.remove_local_image(self.images["pulled"])
            if on_engine(self.images["pulled"]):
                raise RuntimeError(f"{self.images['pulled']} is still on the engine after removing it")

    def _ended(self, job_id: str) -> Any:
        def probe() -> Any:
            job = self.store.get(job_id)
            return job if job is not None and job.state.is_terminal else None

        job = wait_for(probe, timeout=JOB_TIMEOUT_S, interval=0.05, what=f"{job_id} to end")
        if job.state is not JobState.SUCCEEDED:
            raise RuntimeError(f"{job_id} ended {job.state.value}: {job.state_reason}")
        return job

    def _worker(self, job_id: str) -> Any:
        """The worker's record once it holds both the agent's stamps (written after the job's commit)."""

        def probe() -> Any:
            records = self.store.attempt_workers(job_id, 1)
            done = [r for r in records if r.started_at is not None and r.exited_at is not None]
            return done[0] if done else None

        return wait_for(probe, timeout=30, interval=0.05, what=f"{job_id}'s worker record with started and exited")

    def _settle(self, job_id: str) -> None:
        """Cancel the job if it is still going, and wait until none of its queued resources is
        left: the next trial must not share the machine with this one's clean-up."""
        job = self.store.get(job_id)
        if job is None or not job.state.is_terminal:
            self.publisher.publish_json(CONTROL, {"action": "cancel", "job_id": job_id, "owner": OWNER})

        def settled() -> bool | None:
            job = self.store.get(job_id)
            if job is None or not job.state.is_terminal:
                return None
            names = (qr["name"].rsplit("/", 1)[-1] for qr in self.simulator.state()["queuedResources"])
            return None if any(n.startswith(f"{job_id}-a") for n in names) else True

        wait_for(settled, timeout=60, interval=0.1, what=f"{job_id} over and its capacity released")

    def trial(self, variant: str) -> Trial:
        job_id = f"img-{variant}-{uuid.uuid4().hex[:8]}"
        self._prepare(variant)
        spec = self._spec(job_id, variant)
        published = time.time()
        self.publisher.publish_json(SUBMIT, spec)
        try:
            self._ended(job_id)
            worker = self._worker(job_id)
        finally:
            self._settle(job_id)
        if variant == "pulled" and not on_engine(self.images["pulled"]):
            raise RuntimeError(f"{self.images['pulled']} is not on the engine after its job: the host did not pull it")
        events = {e.to_state: e.at.timestamp() for e in self.store.events(job_id)}
        running = events.get(JobState.RUNNING)
        return Trial(
            variant=variant,
            job_id=job_id,
            started=worker.started_at.timestamp() - published,
            running=None if running is None else running - published,
            succeeded=events[JobState.SUCCEEDED] - published,
            command=(worker.exited_at - worker.started_at).total_seconds(),
        )


def summary(results: dict[str, list[Trial]]) -> dict[str, Any]:
    """Per variant: medians and p90s, and the image variants' medians against the host's."""
    out: dict[str, Any] = {}
    for variant, trials in results.items():
        figures: dict[str, Any] = {"trials": len(trials)}
        for name in ("started", "running", "succeeded", "command"):
            values = [v for v in (getattr(t, name) for t in trials) if v is not None]
            figures[name] = {
                "median_s": statistics.median(values) if values else None,
                "p90_s": percentile(values, 0.9) if values else None,
            }
        out[variant] = figures
    base = out["host"]
    for variant in ("cached", "pulled"):
        for name in ("started", "succeeded"):
            mine, theirs = out[variant][name]["median_s"], base[name]["median_s"]
            out[variant][name]["ratio_to_host"] = mine / theirs if mine is not None and theirs else None
            out[variant][name]["extra_s"] = mine - theirs if mine is not None and theirs is not None else None
    return out


def ratio(figure: dict[str, Any]) -> str:
    value = figure.get("ratio_to_host")
    return f"{value:7.2f}x" if value is not None else f"{'-':>8}"


def table(numbers: dict[str, Any], trials: int) -> None:
    print(f"\nimages: publish -> worker started / job SUCCEEDED, one-worker v4-8, {trials} trials per variant")
    print("  one trial at a time, variants interleaved per round; one warm-up round not counted\n")
    head = f"  {'variant':<8} {'':<34}{'started med':>12}{'p90':>8}{'x host':>8}{'succeeded med':>15}{'p90':>8}"
    print(head + f"{'x host':>8}{'command med':>13}")
    for variant in VARIANTS:
        row = numbers[variant]
        print(
            f"  {variant:<8} {DESCRIPTIONS[variant]:<34}"
            f"{row['started']['median_s']:11.3f}s{row['started']['p90_s']:7.3f}s{ratio(row['started'])}"
            f"{row['succeeded']['median_s']:14.3f}s{row['succeeded']['p90_s']:7.3f}s{ratio(row['succeeded'])}"
            f"{row['command']['median_s']:12.3f}s"
        )
    running = numbers["host"]["running"]["median_s"]
    started = numbers["host"]["started"]["median_s"]
    if running is not None:
        print(
            f"\n  started = the agent's own stamp of its `started` report; the RUNNING event is committed "
            f"{running - started:.3f} s later (host median): delivery and the control function"
        )
    print("  command = started -> exited by the agent's clock: bash, or docker run of the container")
    for variant in ("cached", "pulled"):
        extra = numbers[variant]
        print(
            f"  {variant}: +{extra['started']['extra_s']:.3f} s to started, "
            f"+{extra['succeeded']['extra_s']:.3f} s to SUCCEEDED (medians, against no image)"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10, help="trials per variant (default 10)")
    parser.add_argument("--json", action="store_true", help="print the trials and the summary as JSON")
    args = parser.parse_args()
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    problem = containers.docker_problem()
    if problem is not None:
        print(f"jobs with an image need Docker Engine: {problem}", file=sys.stderr)
        return 1

    with stack.running() as env:
        registry = env.get("TPUJOBS_REGISTRY")
        if not registry:
            print(f"the local stack exports no TPUJOBS_REGISTRY: {containers.INSTALL_HINT}", file=sys.stderr)
            return 1
        bench = Bench(Settings.from_env(), env, registry)
        try:
            for variant in VARIANTS:
                bench.trial(variant)  # warm-up: the first requests of each path pay for clients
            results: dict[str, list[Trial]] = {variant: [] for variant in VARIANTS}
            begun = time.monotonic()
            for round_index in range(args.trials):
                shift = round_index % len(VARIANTS)
                for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                    trial = bench.trial(variant)
                    results[variant].append(trial)
                    print(
                        f"round {round_index + 1:>2}/{args.trials} {variant:<6}: started {trial.started:.3f} s, "
                        f"SUCCEEDED {trial.succeeded:.3f} s, command {trial.command:.3f} s",
                        file=sys.stderr,
                    )
            print(f"{time.monotonic() - begun:.0f} s of trials", file=sys.stderr)
        finally:
            bench.close()
    numbers = summary(results)
    if args.json:
        trials = {variant: [asdict(t) for t in runs] for variant, runs in results.items()}
        print(json.dumps({"trials_per_variant": args.trials, "summary": numbers, "trials": trials}, indent=2))
    else:
        table(numbers, args.trials)
    return 0


if __name__ == "__main__":
    sys.exit(main())

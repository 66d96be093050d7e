"""Time to recovery from a host maintenance event: from the moment a running job's VM is told
TERMINATE_ON_HOST_MAINTENANCE to the request of the job's next attempt.

Each trial is bench/recovery.py's (a new spot v4-8 job, one worker host, `sleep 600`,
on_preemption resume, RUNNING at attempt 1), with another loss: the simulator announces host
maintenance on the job's node (`:maintenance`, a 60 s notice, as GCE announces it before it
stops a VM). The node's `instance/maintenance-event` turns TERMINATE_ON_HOST_MAINTENANCE; the
agent, waiting on it with `wait_for_change`, publishes its one preemption notice; on_preemption
releases the old queued resource and requests `{job_id}-a2`, long before the notice is over.
The time runs from just before the call (time.time()) to the create time of `{job_id}-a2`'s
create operation, stamped by the simulator with its wall clock (same machine, same clock): no
polling interval is in the number. The job is cancelled afterwards.

For comparison the same run measures recovery.py's preemption-notice path (`:preempt`, the
agent gets SIGTERM), trial for trial in turn, so both see the same machine load.

    .venv/bin/python bench/maintenance.py [--trials 10]

It starts the local stack in a temporary directory (or uses the one named by the environment)
and stops what it started. Trials run one at a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from dataclasses import dataclass

from recovery import Bench, spread  # the bench folder's own helpers
from tpujobs.domain.states import JobState
from tpujobs.engine.settings import Settings
from tpujobs.local import stack
from tpujobs.local.testing import wait_for

NOTICE_S = 60.0  # the maintenance notice: the VM would stop only after it
MAINTENANCE_REASON = "TERMINATE_ON_HOST_MAINTENANCE"


@dataclass(frozen=True)
class Trial:
    """One loss and recovery; times in seconds from the loss (the :maintenance or :preempt call)."""

    job_id: str
    latency: float  # loss -> {job_id}-a2 requested
    recovering: float  # loss -> the RECOVERING event's `at`
    reason: str  # the RECOVERING event's reason


class MaintenanceBench(Bench):
    """recovery.py's trials, with host maintenance as one more way to lose the capacity."""

    def __init__(self, settings: Settings, env: dict[str, str]) -> None:
        super().__init__(settings, env, ticks=None)  # type: ignore[arg-type]  # no silent path here

    def maintenance_trial(self) -> Trial:
        job_id = f"maint-{uuid.uuid4().hex[:8]}"
        self._submit(job_id)
        try:
            job = self._running(job_id)
            lost = time.time()
            self.simulator.maintenance(self.zone, job.queued_resource, notice=NOTICE_S)
            requested = wait_for(lambda: self._requested_at(f"{job_id}-a2"), timeout=30, what=f"{job_id}-a2 requested")
        finally:
            self._cancel_and_settle(job_id)
        event = next(e for e in self.store.events(job_id) if e.to_state is JobState.RECOVERING)
        return Trial(job_id, requested - lost, event.at.timestamp() - lost, event.reason)

    def preemption_trial(self) -> Trial:
        trial = self.trial("notice")
        event = next(e for e in self.store.events(trial.job_id) if e.to_state is JobState.RECOVERING)
        return Trial(trial.job_id, trial.latency, trial.recovering, event.reason)


def report(maintenance: list[Trial], preemption: list[Trial]) -> None:
    print("\nrecovery: capacity lost -> next attempt requested ({job}-a2 create time in the simulator)")
    print("  one trial at a time, a new job each, the two paths in turn; one warm-up each not counted\n")
    for name, trials in (("maintenance", maintenance), ("preemption", preemption)):
        latencies = [t.latency for t in trials]
        print(f"  {name:<12} {spread(latencies)}")
        to_event = statistics.median(t.recovering for t in trials)
        to_request = statistics.median(t.latency - t.recovering for t in trials)
        print(
            f"               breakdown (medians): loss -> RECOVERING event {to_event:.3f} s, "
            f"RECOVERING -> a2 requested {to_request:.3f} s"
        )
    named = sum(MAINTENANCE_REASON in t.reason for t in maintenance)
    print(f"\n  the timeline names the maintenance event in {named}/{len(maintenance)} maintenance trials")
    difference = statistics.median(t.latency for t in maintenance) - statistics.median(t.latency for t in preemption)
    print(f"  maintenance median - preemption median: {difference:+.3f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10, help="trials per path (default 10)")
    args = parser.parse_args()
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    with stack.running() as env:
        bench = MaintenanceBench(Settings.from_env(), env)
        bench.maintenance_trial()  # warm-up: the first requests of each function pay for clients
        bench.preemption_trial()
        maintenance: list[Trial] = []
        preemption: list[Trial] = []
        started = time.monotonic()
        for i in range(args.trials):
            for name, run, trials in (
                ("maintenance", bench.maintenance_trial, maintenance),
                ("preemption", bench.preemption_trial, preemption),
            ):
                trial = run()
                trials.append(trial)
                print(
                    f"{name} {i + 1:>2}/{args.trials}: a2 requested after {trial.latency:.3f} s "
                    f"(RECOVERING at {trial.recovering:.3f} s)",
                    file=sys.stderr,
                )
        print(f"{time.monotonic() - started:.0f} s of trials", file=sys.stderr)
        report(maintenance, preemption)
    return 0


if __name__ == "__main__":
    sys.exit(main())

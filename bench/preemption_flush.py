"""What a preemption leaves of a job's output: the lines printed before the host died that reach Storage.

Each trial submits a spot job (v4-8, one host) whose command prints `line-N` every 0.1 s, and
appends the same line to a file beside the bench (the host's own record of what it printed). The
command traps SIGTERM and prints on, as a job saving a checkpoint that outlasts the window does.
Once it has printed for a few seconds, the bench preempts its queued resource through the
simulator, which does what Google does to a Spot TPU VM: the notice (`instance/preempted`, SIGTERM
to the agent) and the VM switched off 30 s later (`preemption_grace_seconds`, SIGKILL to every
process of the host). Then it counts the file's lines found in the attempt's output chunks.

Two modes, as the host's end comes:
  window  the VM lives its whole 30 s window: the simulator's delete grace is raised to 30 s for
          the run, so the control plane's delete of the preempted queued resource (on the notice)
          does not end the host sooner;
  delete  the local stack as it is: that delete ends the host `delete_grace_seconds` (2 s) after it.

    .venv/bin/python bench/preemption_flush.py [--trials 3] [--modes window,delete]

Before and after a change: `git worktree add --detach /tmp/before COMMIT`, then
`PYTHONPATH=/tmp/before/shared .venv/bin/python bench/preemption_flush.py`. It starts the local
stack in a temporary directory (or uses the running one) and stops what it started.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tpujobs.domain.naming import job_prefix
from tpujobs.domain.states import JobState
from tpujobs.engine.settings import Settings
from tpujobs.engine.topology import CONTROL, SUBMIT
from tpujobs.local import stack
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.testing import wait_for

OWNER = "bench@example.com"
PRINTING_BEFORE_NOTICE_S = 3.0
MODES = ("window", "delete")
WINDOW_S = 30.0  # the simulator's preemption_grace_seconds: Google's 30 s for a Spot VM
COMMAND = (
    "trap 'echo got-term' TERM; i=0; while true; do i=$((i+1)); echo line-$i; "
    "echo line-$i >> {record}-a$TPUJOBS_ATTEMPT; sleep 0.1; done"
)


class Bench:
    def __init__(self, settings: Settings, env: dict[str, str], records: Path) -> None:
        from google.cloud import firestore

        from tpujobs.adapters.firestore_store import FirestoreJobStore
        from tpujobs.adapters.pubsub import Publisher
        from tpujobs.local.wiring import storage_client

        self.settings = settings
        self.publisher = Publisher.build(settings.project, settings.prefix)
        self.store = FirestoreJobStore(firestore.Client(project=settings.project))
        self.storage = storage_client(env["STORAGE_EMULATOR_HOST"], settings.project)
        self.simulator = SimulatorControl(env["TPUJOBS_TPU_ENDPOINT"])
        self.zone = env["TPUJOBS_DEFAULT_ZONE"]
        self.records = records

    def trial(self, mode: str) -> tuple[int, int]:
        """(lines printed before the host died, of them found in Storage)."""
        job_id = f"flush-{uuid.uuid4().hex[:8]}"
        record = self.records / job_id
        self.publisher.publish_json(
            SUBMIT,
            {
                "job_id": job_id,
                "name": "bench-preemption-flush",
                "owner": OWNER,
                "accelerator_type": "v4-8",
                "capacity": "spot",
                "command": COMMAND.format(record=record),
                "on_preemption": "resume",
                "max_restarts": 1,
            },
        )
        printed = Path(f"{record}-a1")
        before = self.simulator.config()
        if mode == "window":
            self.simulator.configure(delete_grace_seconds=WINDOW_S)
        try:
            job = wait_for(lambda: self._running(job_id), timeout=90, what=f"{job_id} RUNNING at attempt 1")
            wait_for(printed.exists, timeout=60, interval=0.1, what=f"{job_id} printing")
            time.sleep(PRINTING_BEFORE_NOTICE_S)
            noticed = time.time()
            self.simulator.preempt(self.zone, job.queued_resource)
            time.sleep(WINDOW_S + 1.0)  # the host is switched off by now; its list of workers may be gone
            wait_for(lambda: _still(printed), timeout=30, interval=0.1, what=f"{job_id} to stop printing")
            stopped = printed.stat().st_mtime - noticed
            print(f"  {job_id}: its last line printed {stopped:.1f} s after the preemption", file=sys.stderr)
        finally:
            self.simulator.configure(delete_grace_seconds=before["delete_grace_seconds"])
            self.publisher.publish_json(CONTROL, {"action": "cancel", "job_id": job_id, "owner": OWNER})
        lines = printed.read_text().split()
        prefix = f"{job_prefix(job_id)}attempt-1/chunks/slice-0-worker-0/"
        blobs = sorted(self.storage.list_blobs(self.settings.logs_bucket, prefix=prefix), key=lambda b: b.name)
        shipped = set(b"".join(b.download_as_bytes() for b in blobs if b.name.endswith(".log")).decode().split())
        return len(lines), sum(line in shipped for line in lines)

    def _running(self, job_id: str) -> Any:
        job = self.store.get(job_id)
        if job is not None and job.state.is_terminal:
            raise RuntimeError(f"{job_id} ended {job.state.value}: {job.state_reason}")
        return job if job and job.state is JobState.RUNNING and job.attempt == 1 else None


def _still(path: Path, quiet_s: float = 1.0) -> bool:
    """Whether the file has not grown for quiet_s: its writer is gone."""
    size = path.stat().st_size
    time.sleep(quiet_s)
    return path.stat().st_size == size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3, help="trials per mode, one at a time (default 3)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if args.trials < 1 or not modes or any(m not in MODES for m in modes):
        parser.error(f"--trials must be at least 1 and --modes name some of {', '.join(MODES)}")
    results: dict[str, list[tuple[int, int]]] = {mode: [] for mode in modes}
    with stack.running() as env, tempfile.TemporaryDirectory(prefix="bench-flush-") as records:
        bench = Bench(Settings.from_env(), env, Path(records))
        for mode, trials in results.items():
            for i in range(args.trials):
                printed, shipped = bench.trial(mode)
                trials.append((printed, shipped))
                print(f"{mode} {i + 1}/{args.trials}: {shipped}/{printed} lines reached Storage", file=sys.stderr)
    print("\npreemption: lines printed before the host died (every 0.1 s, SIGTERM ignored) that reach Storage")
    for mode, trials in results.items():
        lost = [printed - shipped for printed, shipped in trials]
        kept = [shipped / printed for printed, shipped in trials]
        print(
            f"  {mode:<7} median kept {statistics.median(kept):6.1%}   median lost {statistics.median(lost):g} lines "
            f"(~{statistics.median(lost) * 0.1:.1f} s of output)   N={len(trials)}   "
            + ", ".join(f"{s}/{p}" for p, s in trials)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

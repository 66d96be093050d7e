"""A small "training loop" that behaves like a real one where it matters to tpujobs.

It counts steps, checkpoints the step counter every few steps to TPUJOBS_CHECKPOINT_URI
(worker 0 of slice 0 writes, as in data-parallel training), reports each checkpoint to
the agent with a `TPUJOBS_CHECKPOINT step=N` line, continues from the checkpoint when
TPUJOBS_RESUME=1, and exits cleanly on SIGTERM (the preemption notice).

With --save-on-sigterm the writer also checkpoints the step it has reached when SIGTERM
comes, so a preemption costs at most the step in progress instead of everything since the
last periodic checkpoint (bench/goodput.py measures the difference). Off by default: the
demo and the end-to-end tests expect a preempted run to resume from a periodic checkpoint.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import checkpoints

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--step-seconds", type=float, default=0.2)
parser.add_argument("--checkpoint-every", type=int, default=5)
parser.add_argument("--save-on-sigterm", action="store_true", help="checkpoint on the preemption notice")
args = parser.parse_args()

job = os.environ["TPUJOBS_JOB_ID"]
attempt = os.environ["TPUJOBS_ATTEMPT"]
worker = f"{os.environ['TPUJOBS_SLICE_ID']}-{os.environ['TPUJOBS_WORKER_ID']}"
writer = worker == "0-0"
uri = os.environ["TPUJOBS_CHECKPOINT_URI"]


def save(step: int, detail: str = "") -> None:
    checkpoints.save(uri, {"step": step, "job": job, "attempt": int(attempt)})
    print(f"TPUJOBS_CHECKPOINT step={step}{detail}", flush=True)


def stop(signum, _frame):
    if args.save_on_sigterm and writer and loaded:  # before the load, `step` means nothing yet
        save(step, " on SIGTERM")  # within the grace period before SIGKILL
    print(f"worker {worker}: got signal {signum}, stopping at step {step}", flush=True)
    sys.exit(143)


loaded = False
signal.signal(signal.SIGTERM, stop)

step = 0
if os.environ.get("TPUJOBS_RESUME") == "1":
    saved = checkpoints.load(uri)
    step = saved["step"] if saved else 0
    print(f"worker {worker}: attempt {attempt} resumes from step {step}", flush=True)
else:
    print(f"worker {worker}: attempt {attempt} starts from step 0", flush=True)
loaded = True

while step < args.steps:
    time.sleep(args.step_seconds)
    step += 1
    print(f"worker {worker}: step {step}", flush=True)
    if writer and step % args.checkpoint_every == 0:
        save(step)

print(f"worker {worker}: finished {args.steps} steps in attempt {attempt}", flush=True)

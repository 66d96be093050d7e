"""A small "training loop" that behaves like a real one where it matters to tpujobs.

It counts steps, checkpoints the step counter every few steps to TPUJOBS_CHECKPOINT_URI
(worker 0 of slice 0 writes, as in data-parallel training), reports each checkpoint to
the agent with a `TPUJOBS_CHECKPOINT step=N` line, continues from the checkpoint when
TPUJOBS_RESUME=1, and exits cleanly on SIGTERM (the preemption notice).
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
args = parser.parse_args()

job = os.environ["TPUJOBS_JOB_ID"]
attempt = os.environ["TPUJOBS_ATTEMPT"]
worker = f"{os.environ['TPUJOBS_SLICE_ID']}-{os.environ['TPUJOBS_WORKER_ID']}"
writer = worker == "0-0"
uri = os.environ["TPUJOBS_CHECKPOINT_URI"]


def stop(signum, _frame):
    print(f"worker {worker}: got signal {signum}, stopping at step {step}", flush=True)
    sys.exit(143)


signal.signal(signal.SIGTERM, stop)

step = 0
if os.environ.get("TPUJOBS_RESUME") == "1":
    saved = checkpoints.load(uri)
    step = saved["step"] if saved else 0
    print(f"worker {worker}: attempt {attempt} resumes from step {step}", flush=True)
else:
    print(f"worker {worker}: attempt {attempt} starts from step 0", flush=True)

while step < args.steps:
    time.sleep(args.step_seconds)
    step += 1
    print(f"worker {worker}: step {step}", flush=True)
    if writer and step % args.checkpoint_every == 0:
        checkpoints.save(uri, {"step": step, "job": job, "attempt": int(attempt)})
        print(f"TPUJOBS_CHECKPOINT step={step}", flush=True)

print(f"worker {worker}: finished {args.steps} steps in attempt {attempt}", flush=True)

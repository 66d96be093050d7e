"""A small "training loop" that behaves like a real one where it matters to tpujobs.

It counts steps, checkpoints the step counter every few steps to TPUJOBS_CHECKPOINT_URI
(worker 0 of slice 0 writes, as in data-parallel training), reports each checkpoint to
the agent with a `TPUJOBS_CHECKPOINT step=N` line, continues from the checkpoint when
TPUJOBS_RESUME=1, and exits cleanly on SIGTERM (the preemption notice).

It speaks the progress protocol `tpujobs drill` checks (docs/resumable.md): every worker prints
`TPUJOBS_START step=N` once restored, worker 0-0 `TPUJOBS_STEP step=N data=FINGERPRINT` after each
step, the writer `TPUJOBS_CHECKPOINT step=N`, and worker 0-0 `TPUJOBS_RESULT digest=HEX` at the end.
Its state is deterministic: each step's "batch" is a hash of the data position, folded into a running
hash that the checkpoint keeps, so a correct resume ends with the uninterrupted run's digest.

With --save-on-sigterm the writer also checkpoints the step it has reached when SIGTERM
comes, so a preemption costs at most the step in progress instead of everything since the
last periodic checkpoint (bench/goodput.py measures the difference). Off by default: the
demo and the end-to-end tests expect a preempted run to resume from a periodic checkpoint.
"""

from __future__ import annotations

import argparse
import hashlib
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


SEED = "tpujobs-toy-data"
progress = (0, hashlib.sha256(SEED.encode()).hexdigest())  # (steps done, running hash): one assignment, atomic


def batch(position: int) -> bytes:
    """The data loader: the batch at a position of the (endless, deterministic) data stream."""
    return hashlib.sha256(f"{SEED}:{position}".encode()).digest()


def save(detail: str = "") -> None:
    step, digest = progress
    checkpoints.save(uri, {"step": step, "digest": digest, "job": job, "attempt": int(attempt)})
    print(f"TPUJOBS_CHECKPOINT step={step}{detail}", flush=True)


def stop(signum, _frame):
    if args.save_on_sigterm and writer and loaded:  # before the load, `progress` means nothing yet
        save(" on SIGTERM")  # within the grace period before SIGKILL
    print(f"worker {worker}: got signal {signum}, stopping at step {progress[0]}", flush=True)
    sys.exit(143)


loaded = False
signal.signal(signal.SIGTERM, stop)

if os.environ.get("TPUJOBS_RESUME") == "1":
    saved = checkpoints.load(uri)
    if saved:
        progress = (saved["step"], saved.get("digest") or progress[1])
    print(f"worker {worker}: attempt {attempt} resumes from step {progress[0]}", flush=True)
else:
    print(f"worker {worker}: attempt {attempt} starts from step 0", flush=True)
loaded = True
print(f"TPUJOBS_START step={progress[0]}", flush=True)

while progress[0] < args.steps:
    time.sleep(args.step_seconds)
    step, digest = progress
    data = batch(step)  # the data position is the step: restored with it
    progress = (step + 1, hashlib.sha256(bytes.fromhex(digest) + data).hexdigest())
    step += 1
    print(f"worker {worker}: step {step}", flush=True)
    if worker == "0-0":
        print(f"TPUJOBS_STEP step={step} data={data.hex()[:12]}", flush=True)
    if writer and step % args.checkpoint_every == 0:
        save()

print(f"worker {worker}: finished {args.steps} steps in attempt {attempt}", flush=True)
if worker == "0-0":
    print(f"TPUJOBS_RESULT digest={progress[1]}", flush=True)

"""Train a tiny byte-level language model (Flax, optax) that resumes exactly where a preemption left it.

    python3 train.py --steps 300 --checkpoint-dir /tmp/jax_lm     # anywhere, a local directory
    tpujobs submit examples/jax_lm.yaml                           # checkpoints at TPUJOBS_CHECKPOINT_URI

What makes it resumable, each a rule of docs/resumable.md:
- orbax saves params, optimizer state and step every --checkpoint-every steps, from one writer;
- the batch of step N and its dropout are pure functions of (seed, N): resuming replays nothing;
- SIGTERM (the preemption notice) sets a flag; at the next step boundary the writer saves that step,
  waits until the save is durable, and the process exits 143, as a process ended by SIGTERM does,
  so that nothing mistakes a stopped run for a finished one (0 would say the job is done);
- an attempt with TPUJOBS_RESUME=1 restores the newest checkpoint an earlier attempt wrote; a fresh
  start (TPUJOBS_RESUME=0, a rerun) deletes the checkpoints of the run it replaces.

Who writes: on a multi-host TPU (more than one host, TPU devices present) every process joins
jax.distributed and orbax's collective save, which writes each shard once, and process 0 reports;
`--coordinator HOST:PORT` does the same on CPU hosts (gloo collectives), where no TPU metadata says
who the peers are. Elsewhere (one host; or the local stack, where each simulated host runs its own
CPU process) each process trains alone and only worker 0 of slice 0 writes; the others read.

It prints the progress protocol (docs/resumable.md): `TPUJOBS_START step=N` from every process,
`TPUJOBS_STEP step=N data=FINGERPRINT loss=L` and `TPUJOBS_RESULT digest=HEX` from process 0,
and `TPUJOBS_CHECKPOINT step=N` from the writer once checkpoint N is durable.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import signal
import sys
import time
from typing import Any

import checkpointing
import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from model import ByteLM, initial_state, optimizer, train_step_fn

import data

SIGTERM_EXIT = 128 + signal.SIGTERM  # 143: stopped, not finished


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--keep", type=int, default=3, help="checkpoints kept, the newest")
    parser.add_argument("--checkpoint-dir", help="a directory or gs:// prefix; default: $TPUJOBS_CHECKPOINT_URI")
    parser.add_argument("--batch-size", type=int, default=16, help="global; rounded up to a multiple of the devices")
    parser.add_argument("--length", type=int, default=64, help="bytes of context")
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="a pause per step, standing for a bigger model")
    parser.add_argument("--distributed", choices=("auto", "yes", "no"), default="auto",
                        help="jax.distributed.initialize(): auto = on a multi-host TPU")  # fmt: skip
    parser.add_argument("--coordinator", default="",
                        help="HOST:PORT of process 0, for jax.distributed off TPU (CPU hosts)")  # fmt: skip
    return parser.parse_args(argv)


class StopFlag:
    """SIGTERM, read at step boundaries, where stopping is safe.

    Alone, a Python handler sets a flag. Under jax.distributed, JAX's preemption notifier takes
    SIGTERM over (and, on a TPU VM, the maintenance notice too), and its sync protocol names one
    step, the same on every process, at which all stop: a signal to one host stops them all."""

    def __init__(self) -> None:
        self.raised = False
        signal.signal(signal.SIGTERM, self._on_signal)  # until jax.distributed's notifier replaces it

    def _on_signal(self, _signum: int, _frame: Any) -> None:
        self.raised = True

    def reached(self, step: int, distributed: bool) -> bool:
        """Whether to stop before step `step + 1`; under jax.distributed every process asks at every step."""
        if not distributed:
            return self.raised
        return bool(multihost_utils.reached_preemption_sync_point(step))


def start_distributed(mode: str, hosts: int, coordinator: str, process_id: int) -> bool:
    """jax.distributed on a multi-host TPU (it finds its peers from the TPU VM's metadata), or with
    the `coordinator` named (process `process_id` of `hosts`, one per host), else not."""
    if mode == "no":
        return False
    if coordinator:
        jax.distributed.initialize(coordinator, hosts, process_id, cluster_detection_method="deactivate")
        return True
    on_tpu = bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))
    if mode == "auto" and not (hosts > 1 and on_tpu):
        return False
    jax.distributed.initialize()
    return True


def result_digest(params: Any) -> str:
    """sha256 of the final parameters (every leaf's name and bytes): equal runs, equal digests."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(np.asarray(leaf.addressable_data(0)).tobytes())  # replicated: the local copy is the whole
    return digest.hexdigest()


def say(line: str) -> None:
    print(line, flush=True)


def main() -> None:
    args = parse_args()
    stop = StopFlag()
    env = os.environ
    location = (args.checkpoint_dir or env.get("TPUJOBS_CHECKPOINT_URI", "")).rstrip("/")
    if not location:
        sys.exit("no checkpoint location: pass --checkpoint-dir or set TPUJOBS_CHECKPOINT_URI")
    checkpointing.use_storage_emulator()
    attempt = int(env["TPUJOBS_ATTEMPT"]) if env.get("TPUJOBS_ATTEMPT") else None
    host = (int(env.get("TPUJOBS_SLICE_ID", "0")), int(env.get("TPUJOBS_WORKER_ID", "0")))
    per_slice = int(env.get("TPUJOBS_NUM_WORKERS", "1"))
    hosts = per_slice * int(env.get("TPUJOBS_NUM_SLICES", "1"))
    resume = env.get("TPUJOBS_RESUME", "1") == "1"  # outside tpujobs: continue from what the location holds

    distributed = start_distributed(args.distributed, hosts, args.coordinator, host[0] * per_slice + host[1])
    primary = jax.process_index() == 0 and (distributed or host == (0, 0))
    saves = distributed or primary  # orbax's save is collective under jax.distributed; it writes each shard once
    manager = checkpointing.open_manager(location, args.keep, writes=saves)

    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated, by_row = NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("data"))
    batch_size = -(-args.batch_size // jax.device_count()) * jax.device_count()
    model, tx = ByteLM(length=args.length), optimizer(args.learning_rate)
    init_key, dropout_key = jax.random.split(jax.random.PRNGKey(args.seed))
    state = jax.jit(lambda key: initial_state(model, tx, key), out_shardings=replicated)(init_key)
    train = jax.jit(train_step_fn(model, tx, dropout_key), out_shardings=(replicated, replicated))

    if not resume and saves and (dropped := checkpointing.discard_all(manager)):
        say(f"jax_lm: starting over; deleted the checkpoints of the run this one replaces: {dropped}")
    newest = checkpointing.newest_step(manager, attempt) if resume else None
    if newest is not None:
        state = checkpointing.restore(manager, newest, state)
    start_step = step = newest or 0
    role = "writes" if primary else "writes its shards of" if saves else "reads"
    devices = f"{jax.device_count()} {jax.devices()[0].platform} device(s)"
    say(f"jax_lm: process {jax.process_index()}/{jax.process_count()} on {devices}; {role} checkpoints at {location}")
    say(f"TPUJOBS_START step={start_step}")

    text = data.corpus(args.seed)
    pending: list[int] = []  # saves started, not yet reported durable

    def report_durable(wait: bool) -> None:
        """Say which saves are durable: all once waited for; else all but the newest while it is in
        progress (orbax finishes one save before it starts the next)."""
        if wait:
            manager.wait_until_finished()
        durable = pending[:-1] if pending and checkpointing.saving(manager) else pending[:]
        for done in durable if primary else ():
            say(f"TPUJOBS_CHECKPOINT step={done}")
        del pending[: len(durable)]

    while step < args.steps:
        if stop.reached(step, distributed):
            report_durable(wait=True)  # what is in flight first: the host may die during the next save
            if saves and checkpointing.save(manager, step, state, attempt):
                pending.append(step)
            report_durable(wait=True)
            say(f"jax_lm: SIGTERM; stopped at step {step}")
            manager.close()
            sys.exit(SIGTERM_EXIT)
        data_index = step  # the batch is a pure function of (seed, step): a resume replays and skips nothing
        batch = data.batch_at(text, args.seed, data_index, batch_size, args.length)
        rows = jax.make_array_from_callback(batch.shape, by_row, batch.__getitem__)  # each device its rows
        state, loss = train(state, rows, np.uint32(step))
        step += 1
        if primary:
            say(f"TPUJOBS_STEP step={step} data={data.fingerprint(batch)} loss={float(loss):.4f}")
        if saves and step % args.checkpoint_every == 0 and checkpointing.save(manager, step, state, attempt):
            pending.append(step)
        report_durable(wait=False)
        time.sleep(args.step_seconds)

    if saves and checkpointing.save(manager, step, state, attempt):
        pending.append(step)
    report_durable(wait=True)
    manager.close()
    if primary:
        say(f"TPUJOBS_RESULT digest={result_digest(state['params'])}")


if __name__ == "__main__":
    main()

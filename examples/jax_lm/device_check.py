"""A check beside the tests, for a machine with an accelerator (GPU or TPU) and the jax extra installed;
no network, no tpujobs stack. Not part of CI.

    python3 examples/jax_lm/device_check.py [--steps 300] [--out DIR]

Runs the example uninterrupted; then again, SIGTERMed once mid-run (as a preemption notice would) and
resumed; then SIGKILLed mid-run (no chance to save) and resumed. For each it prints the loss around the
stop (the stopped run's last steps, the resumed run's first, the uninterrupted run's at the same steps),
the steps done twice, and whether the final digests match. Exit status 0 when every digest matches.

Determinism on a GPU: XLA's deterministic ops, and one compilation cache for all runs, so every run
executes the same compiled programs (autotuning picks no other kernels). Takes well under 3 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parent
LINE = re.compile(r"^TPUJOBS_(START|STEP|CHECKPOINT|RESULT) (.*)$")


def run(checkpoints: Path, steps: int, env: dict[str, str], stop_with: int | None = None, stop_after: int = 0,
        extra: tuple[str, ...] = ()) -> dict:  # fmt: skip
    """One process of the example; with `stop_with`, that signal once it reports step `stop_after`."""
    argv = [sys.executable, "train.py", "--steps", str(steps), "--checkpoint-dir", str(checkpoints), *extra]
    started = time.monotonic()
    process = subprocess.Popen(argv, cwd=EXAMPLE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    found: dict[str, Any] = {"START": [], "STEP": {}, "CHECKPOINT": [], "RESULT": None}
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        match = LINE.match(line.strip())
        if not match:
            continue
        words = dict(word.split("=", 1) for word in match.group(2).split())
        kind = match.group(1)
        if kind == "STEP":
            step = int(words["step"])
            found["STEP"][step] = float(words["loss"])
            if stop_with is not None and step >= stop_after:
                process.send_signal(stop_with)
                stop_with = None
        elif kind == "RESULT":
            found["RESULT"] = words["digest"]
        else:
            found[kind].append(int(words["step"]))
    found["returncode"] = process.wait()
    found["seconds"] = round(time.monotonic() - started, 1)
    found["platform"] = next((line.strip() for line in lines if line.startswith("jax_lm: process")), "")
    if found["returncode"] not in (0, 143, -signal.SIGKILL):
        sys.stdout.write("".join(lines[-40:]))
    return found


def scenario(name: str, stop_with: signal.Signals, args: argparse.Namespace, env: dict[str, str], work: Path,
             reference: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Stop a paced run with `stop_with` half way, resume it, compare with `reference`."""
    checkpoints = work / name
    paced = ("--checkpoint-every", str(args.every), "--step-seconds", "0.05")  # the stop lands mid-run
    stop_after = args.steps // 2 + args.every // 2 - 1  # between two periodic checkpoints
    stopped = run(checkpoints, args.steps, env, stop_with, stop_after, paced)
    resumed = run(checkpoints, args.steps, {**env, "TPUJOBS_ATTEMPT": "2", "TPUJOBS_RESUME": "1"},
                  extra=("--checkpoint-every", str(args.every)))  # fmt: skip
    last = max(stopped["STEP"])
    start = resumed["START"][0] if resumed["START"] else None
    redone = sorted(set(stopped["STEP"]) & set(resumed["STEP"]))
    around = range(max(1, last - 2), min(args.steps, last + 3) + 1)
    print(f"\n== {name}: {stop_with.name} after step {last} (exit {stopped['returncode']}); "
          f"checkpoints before it {stopped['CHECKPOINT']}; resumed from step {start}")  # fmt: skip
    print(f"{'step':>6} {'uninterrupted':>14} {'stopped run':>12} {'resumed run':>12}")
    for step in around:
        losses = (reference["STEP"].get(step), stopped["STEP"].get(step), resumed["STEP"].get(step))
        uninterrupted, before, after = ("" if loss is None else f"{loss:.4f}" for loss in losses)
        print(f"{step:>6} {uninterrupted:>14} {before:>12} {after:>12}")
    matches = resumed["RESULT"] is not None and resumed["RESULT"] == reference["RESULT"]
    print(f"steps done twice: {len(redone)} {redone[:3]}{'...' if len(redone) > 3 else ''}; "
          f"result digest {'MATCHES' if matches else 'DIFFERS from'} the uninterrupted run's")  # fmt: skip
    same_losses = all(reference["STEP"].get(s) == v for s, v in {**stopped["STEP"], **resumed["STEP"]}.items())
    return {"stopped_at": last, "resumed_from": start, "checkpoints_before_stop": stopped["CHECKPOINT"],
            "steps_redone": len(redone), "losses_equal_uninterrupted": same_losses, "result_matches": matches,
            "stop_exit": stopped["returncode"], "seconds": stopped["seconds"] + resumed["seconds"]}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=50, help="--checkpoint-every")
    parser.add_argument("--out", default=os.environ.get("OUT"), help="where to write summary.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="jax_lm_check_"))
    env = {key: value for key, value in os.environ.items() if not key.startswith("TPUJOBS_")}
    flags = env.get("XLA_FLAGS", "")
    if "xla_gpu_deterministic_ops" not in flags:
        env["XLA_FLAGS"] = f"{flags} --xla_gpu_deterministic_ops=true".strip()
    env.update({"JAX_COMPILATION_CACHE_DIR": str(work / "jax-cache"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                "TPUJOBS_ATTEMPT": "1", "TPUJOBS_RESUME": "0", "PYTHONUNBUFFERED": "1"})  # fmt: skip
    try:
        reference = run(work / "uninterrupted", args.steps, env, extra=("--checkpoint-every", str(args.every)))
        print(reference["platform"])
        first, last = reference["STEP"].get(1), reference["STEP"].get(args.steps)
        print(f"uninterrupted: {args.steps} steps in {reference['seconds']} s, loss {first} -> {last}, "
              f"exit {reference['returncode']}, digest {reference['RESULT']}")  # fmt: skip
        summary = {
            "platform": reference["platform"],
            "steps": args.steps,
            "uninterrupted_seconds": reference["seconds"],
            "loss_first_last": [first, last],
            "sigterm": scenario("sigterm", signal.SIGTERM, args, env, work, reference),
            "sigkill": scenario("sigkill", signal.SIGKILL, args, env, work, reference),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print("\n" + json.dumps(summary))
    return 0 if summary["sigterm"]["result_matches"] and summary["sigkill"]["result_matches"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""examples/jax_lm as a multi-host job: two processes joined by jax.distributed (CPU, gloo), as
every host of a multi-host TPU slice joins it. SIGTERM reaches one host only, as a maintenance
event or a host's own shutdown does: both processes agree to stop at the same step, save it with
orbax's collective save, and the resumed pair ends with the uninterrupted run's result, bit for bit
(conftest's: one process on the pair's two devices, the same program per device).

This is the code path a TPU VM takes (`start_distributed`, `StopFlag.agreed`, the collective
save); here the peers are named with `--coordinator` where a TPU VM's metadata names them.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.jax_lm import DEVICES, EVERY, STEPS, Run, run_hosts
from support.planted_bugs import EXAMPLE

pytestmark = [
    pytest.mark.xdist_group("jax-lm-example"),  # after the single-process runs, on the same worker
    pytest.mark.skipif(
        any(importlib.util.find_spec(name) is None for name in ("jax", "flax", "optax", "orbax")),
        reason="the jax extra is not installed (pip install -e '.[jax]'; make test installs it)",
    ),
]
HOSTS, STOP_AFTER = DEVICES, 7  # one device each
EVERY_ARGS = ("--checkpoint-every", str(EVERY))
# Paced steps once SIGTERM is sent: 13 steps (5 s) still to go, so both stop long before the end.
PAUSED = (*EVERY_ARGS, "--step-seconds", "0.4")


@dataclass(frozen=True)
class Pairs:
    uninterrupted: Run  # one process on HOSTS devices
    stopped: list[Run]
    resumed: list[Run]


@pytest.fixture(scope="module")
def pairs(uninterrupted: Run, jax_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Pairs:
    """The uninterrupted run; a pair whose worker 1 is SIGTERMed after step STOP_AFTER; its resumption."""
    root = tmp_path_factory.mktemp("jax_lm_hosts")
    common = {"hosts": HOSTS, "steps": STEPS, "cache_dir": jax_cache}
    stopped = run_hosts(EXAMPLE, root / "ckpt", sigterm_after=STOP_AFTER, sigterm_worker=1, extra_args=PAUSED, **common)
    resumed = run_hosts(EXAMPLE, root / "ckpt", attempt=2, resume=True, extra_args=EVERY_ARGS, **common)
    return Pairs(uninterrupted, stopped, resumed)


def stop_step(run: Run) -> int:
    (line,) = [line for line in run.output.splitlines() if line.startswith("jax_lm: SIGTERM; stopped at step ")]
    return int(line.rsplit(" ", 1)[1])


@pytest.mark.timeout(600)
def test_sigterm_to_one_host_stops_both_at_one_step_after_one_collective_save(pairs: Pairs) -> None:
    """Worker 1 alone got SIGTERM; worker 0 stops at the same step boundary, both save it together,
    and process 0 alone reports the checkpoint once it is durable."""
    first, second = pairs.stopped
    for process, run in enumerate(pairs.stopped):
        assert run.returncode == 143, run.output[-3000:]
        assert f"process {process}/{HOSTS} on {HOSTS} cpu device(s)" in run.output
    step = stop_step(first)
    assert stop_step(second) == step and STOP_AFTER <= step < STEPS
    assert first.checkpoints == sorted({*range(EVERY, step + 1, EVERY), step})
    assert second.checkpoints == [] and second.steps == {}  # process 0 speaks for the slice


@pytest.mark.timeout(600)
def test_the_resumed_hosts_start_at_the_saved_step_and_end_with_the_uninterrupted_result(pairs: Pairs) -> None:
    """Both restore the collective checkpoint; process 0 sees the very batches and losses of the
    uninterrupted run and ends with its digest."""
    whole, resumed = pairs.uninterrupted, pairs.resumed[0]
    step = stop_step(pairs.stopped[0])
    assert whole.returncode == 0, whole.output[-3000:]
    assert all(run.returncode == 0 for run in pairs.resumed), resumed.output[-3000:]
    assert [run.start for run in pairs.resumed] == [step] * HOSTS
    assert sorted(resumed.steps) == list(range(step + 1, STEPS + 1))
    for n, words in {**pairs.stopped[0].steps, **resumed.steps}.items():
        assert words == whole.steps[n], f"step {n}"
    assert resumed.result is not None and resumed.result == whole.result

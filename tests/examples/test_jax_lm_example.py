"""examples/jax_lm resumes exactly: a run stopped by SIGTERM and resumed ends with the uninterrupted
run's parameters, bit for bit, having consumed the same batches; each planted bug breaks that visibly.

Plain processes with a local checkpoint directory: no local stack. Every JAX run of the test run
shares one compilation cache, so only the first of each program compiles; the uninterrupted run is
conftest's, shared with test_jax_lm_distributed.
"""

from __future__ import annotations

import difflib
import importlib.util
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

from support.jax_lm import DEVICES, EVERY, STEPS, Run, run_example
from support.planted_bugs import BUGS, EXAMPLE, PlantedBugError, planted_copy
from tpujobs.cli.commands import checked_spec
from tpujobs.domain.spec import parse_spec

needs_jax = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("jax", "flax", "optax", "orbax")),
    reason="the jax extra is not installed (pip install -e '.[jax]'; make test installs it)",
)
# One worker runs both files' tests back to back, so the runs of their fixtures are made once.
pytestmark = pytest.mark.xdist_group("jax-lm-example")
STOP_AFTER = 7  # SIGTERM once this step is reported: between two periodic checkpoints
# The stopped run pauses 0.8 s a step: once SIGTERM is sent it still has 13 steps (10 s) to go, so it
# stops at a step boundary long before it could finish, however slow or fast this machine is.
PAUSE = ("--checkpoint-every", str(EVERY), "--step-seconds", "0.8")


@dataclass(frozen=True)
class Runs:
    uninterrupted: Run
    stopped: Run
    resumed: Run
    at_stop: Path  # the checkpoint directory as the stopped run left it
    cache: Path  # JAX's compilation cache: a planted copy runs the same programs


@pytest.fixture(scope="module")
def runs(uninterrupted: Run, jax_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The uninterrupted run; a run SIGTERMed after step STOP_AFTER; its resumption (attempt 2)."""
    root = tmp_path_factory.mktemp("jax_lm")
    every = ("--checkpoint-every", str(EVERY))
    common = {"steps": STEPS, "cache_dir": jax_cache, "devices": DEVICES}
    stopped = run_example(EXAMPLE, root / "ckpt", sigterm_after=STOP_AFTER, extra_args=PAUSE, **common)
    shutil.copytree(root / "ckpt", root / "at-stop")
    resumed = run_example(EXAMPLE, root / "ckpt", attempt=2, resume=True, extra_args=every, **common)
    return Runs(uninterrupted, stopped, resumed, root / "at-stop", jax_cache)


@needs_jax
@pytest.mark.timeout(600)
def test_a_run_stopped_by_sigterm_saves_that_step_and_exits_143(runs: Runs) -> None:
    """SIGTERM between checkpoints: the writer saves the step it stopped at, reports it, and exits 143."""
    assert runs.uninterrupted.returncode == 0, runs.uninterrupted.output[-3000:]
    assert runs.stopped.returncode == 143, runs.stopped.output[-3000:]
    stop_step = max(runs.stopped.steps)
    assert STOP_AFTER <= stop_step < STEPS
    periodic = list(range(EVERY, stop_step + 1, EVERY))
    assert runs.stopped.checkpoints == sorted({*periodic, stop_step})  # the periodic ones, and SIGTERM's
    assert runs.stopped.result is None
    assert runs.uninterrupted.checkpoints == list(range(EVERY, STEPS + 1, EVERY))


@needs_jax
@pytest.mark.timeout(600)
def test_the_resumed_run_ends_with_the_uninterrupted_runs_result(runs: Runs) -> None:
    """It starts at the saved step, consumes the very batches the uninterrupted run did, with the same
    losses, and its final parameters' digest is the same."""
    stop_step = max(runs.stopped.steps)
    assert runs.resumed.returncode == 0, runs.resumed.output[-3000:]
    assert runs.uninterrupted.start == runs.stopped.start == 0
    assert runs.resumed.start == stop_step
    assert sorted(runs.resumed.steps) == list(range(stop_step + 1, STEPS + 1))  # no step done twice
    for step, words in {**runs.stopped.steps, **runs.resumed.steps}.items():
        assert words == runs.uninterrupted.steps[step], f"step {step}"
    assert runs.resumed.result is not None and runs.resumed.result == runs.uninterrupted.result


@needs_jax
@pytest.mark.timeout(600)
def test_a_planted_restore_skip_starts_the_resumed_attempt_from_step_0(runs: Runs, tmp_path: Path) -> None:
    """The copy whose resume ignores the checkpoint starts again from 0, with checkpoints at hand."""
    bugged = planted_copy(EXAMPLE, tmp_path / "bugged", "restore-skipped")
    shutil.copytree(runs.at_stop, tmp_path / "ckpt")
    resumed = run_example(
        bugged, tmp_path / "ckpt", steps=EVERY + 5, attempt=2, resume=True, cache_dir=runs.cache, devices=DEVICES
    )
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert resumed.start == 0 and min(resumed.steps) == 1
    assert EVERY not in resumed.checkpoints  # a checkpoint as new exists: nothing is saved until past it


@needs_jax
@pytest.mark.timeout(600)
def test_a_planted_data_order_reset_replays_the_first_batches_after_a_resume(runs: Runs, tmp_path: Path) -> None:
    """The copy whose batch index restarts after a resume consumes other batches than the uninterrupted
    run at the same steps, and ends with another result."""
    bugged = planted_copy(EXAMPLE, tmp_path / "bugged", "data-order-reset")
    shutil.copytree(runs.at_stop, tmp_path / "ckpt")
    resumed = run_example(
        bugged, tmp_path / "ckpt", steps=STEPS, attempt=2, resume=True, cache_dir=runs.cache, devices=DEVICES
    )
    stop_step = max(runs.stopped.steps)
    assert resumed.returncode == 0 and resumed.start == stop_step, resumed.output[-3000:]
    first = resumed.steps[stop_step + 1]["data"]
    assert first == runs.uninterrupted.steps[1]["data"] != runs.uninterrupted.steps[stop_step + 1]["data"]
    assert resumed.result != runs.uninterrupted.result


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_planted_copy_differs_from_the_example_in_one_line(bug: str, tmp_path: Path) -> None:
    """Each planted copy is the example with exactly one line of train.py changed, and only that."""
    bugged = planted_copy(EXAMPLE, tmp_path / "bugged", bug)
    changed = BUGS[bug].file
    original = (EXAMPLE / changed).read_text(encoding="utf-8").splitlines()
    planted = (bugged / changed).read_text(encoding="utf-8").splitlines()
    diff = [line for line in difflib.unified_diff(original, planted, lineterm="", n=0) if line[:1] in "+-"]
    assert [line[0] for line in diff[2:]] == ["-", "+"] and "planted bug" in diff[-1]
    for path in EXAMPLE.iterdir():
        if path.is_file() and path.name != changed:
            assert (bugged / path.name).read_bytes() == path.read_bytes()


def test_a_planted_copy_fails_loudly_when_the_line_to_change_is_gone(tmp_path: Path) -> None:
    """When the example no longer has the line a bug changes, planting it fails instead of copying
    the correct code under a bug's name."""
    source = tmp_path / "changed"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("__pycache__"))
    train = source / "train.py"
    train.write_text(train.read_text(encoding="utf-8").replace("data_index = step", "index = step"), encoding="utf-8")
    with pytest.raises(PlantedBugError, match="data-order-reset: expected exactly one line"):
        planted_copy(source, tmp_path / "bugged", "data-order-reset")
    with pytest.raises(PlantedBugError, match="no planted bug"):
        planted_copy(EXAMPLE, tmp_path / "other", "no-such-bug")


def test_the_job_file_runs_the_example_and_its_setup_installs_the_jax_extra() -> None:
    """examples/jax_lm.yaml resumes on preemption, ships this folder, runs train.py, and its setup
    installs exactly the jax extra's requirements (jax with its TPU runtime), only where missing."""
    data, code_dir = checked_spec(EXAMPLE.parent / "jax_lm.yaml", [])
    spec = parse_spec({**data, "code_uri": "gs://bucket/code.tar.gz"}, message_id="example")
    assert code_dir is not None and (EXAMPLE.parent / code_dir).resolve() == EXAMPLE  # relative to the file
    assert spec.on_preemption == "resume" and spec.capacity == "spot"
    assert spec.command.startswith("python3 train.py ")
    assert spec.setup is not None
    check, _, install = spec.setup.partition(" || ")
    assert check.startswith("python3 -c ") and "python3 -m pip install" in install
    pyproject = tomllib.loads((EXAMPLE.parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    extra = pyproject["project"]["optional-dependencies"]["jax"]
    installed = [word.replace("jax[tpu]", "jax") for word in shlex.split(install) if word[:1].isalpha() and "<" in word]
    assert sorted(installed) == sorted(extra)

"""examples/jax_lm through `tpujobs drill` on the local stack: the real JAX job passes the drill (it
resumes from its newest checkpoint on every host, one process writes, and its result after a
preemption and a SIGTERM equals the uninterrupted run's, bit for bit), and a copy whose data order
restarts after a resume fails it with `data-order`. Orbax writes to the Storage emulator's gs:// bucket."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from support.drill import drill, job_file
from support.jax_lm import DEVICES, compilation_cache, jax_env
from support.planted_bugs import EXAMPLE, planted_copy

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        any(importlib.util.find_spec(name) is None for name in ("jax", "flax", "optax", "orbax", "gcsfs")),
        reason="the jax extra is not installed (pip install -e '.[jax]'; make test installs it)",
    ),
]

STEPS, EVERY = 60, 10
# Paced steps (0.2 s each, which changes no result): each fault, sent once its attempt's first checkpoint
# shows, lands with steps still to go. `exec`: SIGTERM goes to the trainer, not to a shell whose exit would
# end the command before the trainer's save on SIGTERM is done.
COMMAND = f"exec python3 train.py --steps {STEPS} --checkpoint-every {EVERY} --keep 10 --step-seconds 0.2"


def jax_job(tmp_path: Path, name: str, code: Path, accelerator: str, cache: Path) -> Path:
    """A spot job of `code`; its hosts share the test run's JAX compilation cache (they run on this
    machine), each on as many CPU devices as the example's tests' runs, whose programs it then reuses."""
    return job_file(tmp_path, name, code, COMMAND, accelerator, jax_env(cache, DEVICES))


@pytest.mark.timeout(1000)
def test_the_jax_example_passes_the_drill_and_a_data_order_reset_fails_it(
    local_stack, tmp_path: Path, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Two hosts, preempted with notice and then SIGTERMed without one: each later attempt starts from the
    newest checkpoint on both hosts, worker 0 of slice 0 alone writes, and the digest equals the uninterrupted
    run's. The planted copy replays the first batches after its resume: `data-order` names the step."""
    cache = compilation_cache(request.config, tmp_path_factory)
    code, answer = drill(str(jax_job(tmp_path, "jaxlm", EXAMPLE, "v4-16", cache)), timeout=420)
    assert code == 0, answer["findings"]
    assert answer["passed"] is True and answer["result_matches"] is True
    assert [f["fault"] for f in answer["faults"]] == ["preempt", "sigterm"]
    resumed = answer["attempts"][1:]
    assert len(resumed) == 2 and all(a["started_from"] and a["started_from"] > 0 for a in resumed)
    assert all(a["checkpoints"] == sorted(a["checkpoints"]) for a in answer["attempts"])
    assert 0 <= answer["steps_redone"] <= 2 * answer["allowed_steps_redone_per_resume"]

    planted = planted_copy(EXAMPLE, tmp_path / "planted", "data-order-reset")
    code, answer = drill(str(jax_job(tmp_path, "jaxbug", planted, "v4-8", cache)), "--faults", "preempt", timeout=420)
    assert code == 1
    kinds = [f["kind"] for f in answer["findings"]]
    assert "data-order" in kinds and "result-mismatch" in kinds, kinds
    data_order = next(f for f in answer["findings"] if f["kind"] == "data-order")
    assert any(line["run"] == "drilled" and line["attempt"] == 2 for line in data_order["lines"])

"""What the example's tests share: the run's JAX compilation cache, and one uninterrupted run.

Both files run on one pytest-xdist worker (their group, `jax-lm-example`), so the uninterrupted run is
made once: one process on DEVICES CPU devices, the mesh the pair of hosts in test_jax_lm_distributed
makes with one device each. The program per device is the same and a sum of two is exact in either
order, so a resumed single process and a resumed pair both end with its digest, bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.jax_lm import DEVICES, EVERY, STEPS, Run, compilation_cache, run_example
from support.planted_bugs import EXAMPLE


@pytest.fixture(scope="session")
def jax_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compilation_cache(request.config, tmp_path_factory)


@pytest.fixture(scope="session")
def uninterrupted(jax_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """STEPS steps, a checkpoint every EVERY, never stopped: the result every resumed run must match."""
    root = tmp_path_factory.mktemp("jax_lm_whole")
    every = ("--checkpoint-every", str(EVERY))
    return run_example(EXAMPLE, root, steps=STEPS, extra_args=every, cache_dir=jax_cache, devices=DEVICES)

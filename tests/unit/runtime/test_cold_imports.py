"""A cold start pays only for what the invoked target uses (issue 17).

Each probe runs in a fresh interpreter, since a module once imported stays in `sys.modules`.
Building an adapter opens no connection, so the emulator variables point at closed ports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FUNCTIONS = Path(__file__).resolve().parents[3] / "functions"
PYDANTIC = "pydantic"
FIRESTORE = "google.cloud.firestore"
PUBSUB = "google.cloud.pubsub_v1"
TPU = "google.cloud.tpu_v2"
COMPUTE = "google.cloud.compute_v1"  # 2.8 s to import here: only a Compute Engine call may pay it
STORAGE = "google.cloud.storage"
WATCHED = (
    PYDANTIC,
    FIRESTORE,
    PUBSUB,
    TPU,
    COMPUTE,
    STORAGE,
    "tpujobs.engine.services",
    "tpujobs.engine.messages",
    "tpujobs.domain.spec",
)


def loaded_after(code: str) -> set[str]:
    """Which WATCHED modules a fresh interpreter holds after running `code` (functions/ on its path)."""
    env = {
        **os.environ,
        "GOOGLE_CLOUD_PROJECT": "cold-imports",
        "FIRESTORE_EMULATOR_HOST": "127.0.0.1:9",
        "PUBSUB_EMULATOR_HOST": "127.0.0.1:9",
        "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9",
        "TPUJOBS_TPU_ENDPOINT": "http://127.0.0.1:9",
    }
    probe = (
        f"import json, sys; sys.path.insert(0, {str(FUNCTIONS)!r})\n{code}\n"
        f"print(json.dumps([m for m in {list(WATCHED)!r} if m in sys.modules]))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


def test_importing_functions_main_loads_no_validation_models_nor_clients():
    """functions/main.py imports what decoding needs: no pydantic, no service, no Google client library."""
    loaded = loaded_after("import main")
    assert loaded == set(), loaded


# Each builder, what it must load, and what it must not (a later call may load more).
BUILDERS = [
    ("engine", {FIRESTORE, "tpujobs.engine.services"}, {TPU, PUBSUB, STORAGE}),
    ("reconciler", {FIRESTORE, "tpujobs.engine.services"}, {TPU, PUBSUB, STORAGE}),
    ("jobs_api", {FIRESTORE, "tpujobs.engine.services"}, {TPU, COMPUTE, PUBSUB, STORAGE}),
    ("key_api", {FIRESTORE}, {TPU, COMPUTE, PUBSUB, STORAGE, "tpujobs.engine.services"}),
    ("dead_letters", {FIRESTORE}, {TPU, PUBSUB, STORAGE, "tpujobs.engine.services"}),
    ("output_exporter", {FIRESTORE, STORAGE}, {TPU, PUBSUB, "tpujobs.engine.services"}),
]


@pytest.mark.parametrize(("builder", "needs", "never"), BUILDERS, ids=[b[0] for b in BUILDERS])
def test_building_a_target_loads_only_its_own_clients(builder, needs, never):
    """runtime.<builder>() imports its own client libraries and none that only other targets use."""
    loaded = loaded_after(f"from tpujobs.runtime import instances\ninstances.{builder}()")
    assert needs <= loaded, f"{builder} did not build with {sorted(needs - loaded)}"
    assert not loaded & never, f"{builder} loaded {sorted(loaded & never)}"


def test_the_tpu_and_pubsub_clients_are_built_at_their_first_use():
    """The engine's TPU and Pub/Sub adapters load their libraries when first touched, not before;
    a TPU API call never loads the Compute Engine client."""
    loaded = loaded_after(
        "from tpujobs.runtime import instances\n"
        "a, c = instances.adapters(), instances.capacity()\n"
        "assert 'google.cloud.tpu_v2' not in sys.modules\n"
        "c.backend(None).create_error, a.publisher.announce"
    )
    assert {TPU, PUBSUB} <= loaded, loaded
    assert COMPUTE not in loaded


def test_an_adapter_built_on_first_use_is_built_once_whoever_asks():
    """OnFirstUse calls its builder once, however many threads reach it at the same time."""
    import threading

    from tpujobs.runtime.instances import OnFirstUse

    calls: list[int] = []
    gate = threading.Barrier(8)

    def build() -> list[int]:
        calls.append(1)
        return [1, 2, 3]

    lazy: OnFirstUse[list[int]] = OnFirstUse(build)
    seen: list[int] = []

    def use() -> None:
        gate.wait()
        seen.append(lazy.count(2))

    threads = [threading.Thread(target=use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [1]
    assert seen == [1] * 8

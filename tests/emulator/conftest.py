"""Fixtures the emulator test modules share: a job service on the emulators.

The session's Firestore and Pub/Sub emulators and the per-test TPU simulator come from
tests/conftest.py; what is here builds on them. A module keeps a fixture of its own only when
it is genuinely its own (a hand-moved clock, a service with pools).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.adapters.firestore_warm_pools import FirestoreWarmPools
from tpujobs.adapters.tpu import CloudTpu
from tpujobs.engine.services import Engine
from tpujobs.local.testing import local_settings
from tpujobs.runtime.instances import utc_now

ZONE = "us-central2-b"


def _no_sleep(seconds: float) -> None:
    """Restart backoff and retry spreads return at once: the tests move time themselves."""


@pytest.fixture
def job_service(firestore_client, tpu_client, project_id, simulator_url) -> Callable[..., Engine]:
    """`job_service(**settings)`: the engine (`services.Engine`) on the Firestore emulator and this test's simulator.

    Its settings are the local stack's (zone us-central2-b, logs bucket "logs") with
    `settings` on top; `clock`, `sleep` (default: none), `tpu` and `access` replace the defaults.
    """

    def build(
        *,
        clock: Callable[[], Any] = utc_now,
        sleep: Callable[[float], None] = _no_sleep,
        tpu: CloudTpu | None = None,
        access: Any = None,
        **settings: Any,
    ) -> Engine:
        merged = {
            "project": project_id,
            "default_zone": ZONE,
            "tpu_endpoint": simulator_url,
            "logs_bucket": "logs",
            **settings,
        }
        return Engine(
            FirestoreJobStore(firestore_client),
            tpu or CloudTpu(tpu_client, project_id),
            local_settings(**merged),
            clock,
            sleep,
            access=access,
            warm_pools=FirestoreWarmPools(firestore_client),
        )

    return build


@pytest.fixture
def cli_without_api(project_id: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Callable[..., Any]:
    """`cli_without_api(verb, *args)`: the `tpujobs` CLI on the Firestore emulator, with no jobs API
    (its admin verbs then read and write Firestore directly) and no local stack's settings."""
    from typer.testing import CliRunner

    from tpujobs.cli import app

    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", project_id)
    monkeypatch.setenv("TPUJOBS_STATE_DIR", str(tmp_path))  # no local stack's settings leak in
    monkeypatch.delenv("TPUJOBS_API_URL", raising=False)
    return lambda verb, *args: CliRunner().invoke(app, [verb, *args], env={"COLUMNS": "200"})

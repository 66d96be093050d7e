"""The local stacks of the end-to-end tests, and how a test talks to one (tests/e2e/conftest.py)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import shared_run
from tpujobs.engine.settings import Settings
from tpujobs.local import stack

PROJECT = "tpujobs-e2e"
# Waits the local stack has its own values for, shorter here: what the tests show is the same
# (a host never booted is lost after the boot timeout; a passing condition that lasts past the
# grace loses the host), waited out sooner. Each is still many times what it stands for takes
# on a loaded machine (an agent's boot, a reconciler tick and a CLI call to end a condition).
E2E_WAITS = {
    "TPUJOBS_BOOT_TIMEOUT_SECONDS": "45",  # as `tpujobs dev up`: a warm-pool unit booting under load needs it
    "TPUJOBS_UNHEALTHY_GRACE_SECONDS": "10",  # `tpujobs dev up`: 20 s
}
# The stack's one admin (TPUJOBS_ADMINS): the tests that edit config/teams through the jobs API ask as
# it; no other test's caller is one, so what they show of non-admins holds.
ADMIN = "admin@example.com"


@contextlib.contextmanager
def running_stack(
    config: pytest.Config, base: Path, name: str, project: str, *, shared: bool
) -> Iterator[dict[str, str]]:
    """The local stack `name` (`tpujobs dev up` with E2E_WAITS) on the session's emulators, and its
    environment. Under pytest-xdist it is the run's, recorded where the controller stops it
    (support/shared_run.py): a `shared` one is started by the first worker to ask and left to the
    controller; another is stopped here when done, as it is in a run without workers."""
    folder = shared_run.worker_folder(config)
    state_dir = base / name if folder is None else shared_run.stack_folder(folder, name)
    # The functions write Cloud Logging's JSON, as on GCP: test_metric_filters_e2e reads it.
    extra = {**E2E_WAITS, "TPUJOBS_LOG_FORMAT": "json", "TPUJOBS_ADMINS": ADMIN}
    state = stack.up(state_dir, Settings(project=project), environ={**os.environ, **extra})
    try:
        yield {**state.env, "TPUJOBS_STATE_DIR": str(state_dir)}
    finally:
        if folder is None or not shared:
            stack.down(state_dir)


def clients_of(services: dict[str, str]) -> dict:
    """Clients of a local stack's services, and where things are, for the e2e tests."""
    from google.cloud import firestore

    from tpujobs.adapters.firestore_store import FirestoreJobStore
    from tpujobs.adapters.pubsub import Publisher
    from tpujobs.adapters.storage import build_client as storage_client
    from tpujobs.adapters.tpu import build_client as tpu_client
    from tpujobs.local.simulator.client import SimulatorControl

    project = services["GOOGLE_CLOUD_PROJECT"]
    return {
        "project": project,
        "bucket": services["TPUJOBS_LOGS_BUCKET"],
        "simulator": services["TPUJOBS_TPU_ENDPOINT"],
        "control": SimulatorControl(services["TPUJOBS_TPU_ENDPOINT"]),
        "zone": services["TPUJOBS_DEFAULT_ZONE"],
        "publisher": Publisher.build(project),
        "store": FirestoreJobStore(firestore.Client(project=project)),
        "storage": storage_client(project),
        "tpu": tpu_client(services["TPUJOBS_TPU_ENDPOINT"]),
    }


def submit(env: dict, prefix: str = "e2e", **spec: object) -> str:
    """Publish a spot v4-16 job (two worker hosts) with `spec`'s fields; its new job id."""
    from tpujobs.engine.topology import SUBMIT

    job_id = f"{prefix}-{uuid.uuid4().hex[:6]}"
    payload = {
        "job_id": job_id,
        "name": "e2e",
        "owner": "ada@example.com",
        "accelerator_type": "v4-16",
        "capacity": "spot",
        **spec,
    }
    env["publisher"].publish_json(SUBMIT, payload)
    return job_id

"""One local stack per worker for its end-to-end tests (its group: tests/conftest.py), on the session's emulators."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

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


@pytest.fixture(scope="session")
def local_stack(emulators, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The whole local stack, as `tpujobs dev up` starts it (with E2E_WAITS); its environment is exported."""
    state_dir = tmp_path_factory.mktemp("stack")
    # The functions write Cloud Logging's JSON, as on GCP: test_metric_filters_e2e reads it.
    environ = {**os.environ, **emulators, **E2E_WAITS, "TPUJOBS_LOG_FORMAT": "json", "TPUJOBS_ADMINS": ADMIN}
    state = stack.up(state_dir, Settings(project=PROJECT), environ=environ)
    saved = dict(os.environ)
    os.environ.update(state.env)
    os.environ["TPUJOBS_STATE_DIR"] = str(state_dir)
    try:
        yield dict(state.env)
    finally:
        stack.down(state_dir)
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def env(local_stack):
    """Clients of the local stack's services, and where things are, for the e2e tests."""
    from google.cloud import firestore

    from tpujobs.adapters.firestore_store import FirestoreJobStore
    from tpujobs.adapters.pubsub import Publisher
    from tpujobs.adapters.storage import build_client as storage_client
    from tpujobs.adapters.tpu import build_client as tpu_client
    from tpujobs.local.simulator.client import SimulatorControl

    project = local_stack["GOOGLE_CLOUD_PROJECT"]
    return {
        "project": project,
        "bucket": local_stack["TPUJOBS_LOGS_BUCKET"],
        "simulator": local_stack["TPUJOBS_TPU_ENDPOINT"],
        "control": SimulatorControl(local_stack["TPUJOBS_TPU_ENDPOINT"]),
        "zone": local_stack["TPUJOBS_DEFAULT_ZONE"],
        "publisher": Publisher.build(project),
        "store": FirestoreJobStore(firestore.Client(project=project)),
        "storage": storage_client(project),
        "tpu": tpu_client(local_stack["TPUJOBS_TPU_ENDPOINT"]),
    }


@pytest.fixture(scope="session")
def stack_admin(local_stack) -> str:
    """The e-mail the stack's jobs API answers as an admin (TPUJOBS_ADMINS)."""
    return ADMIN


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


@pytest.fixture(scope="session")
def submit_job(env):
    """`submit_job(prefix=..., **spec)`: publish a job to the local stack, get its id."""
    return lambda prefix="e2e", **spec: submit(env, prefix, **spec)

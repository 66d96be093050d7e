"""The `jobs` API's warm-pool actions on the Firestore emulator and the TPU simulator, where the
store matters: `tpujobs pool` driving them over HTTP as the caller, and a deployment built
without a pool store. Who may do what, and what each answer shows, is
tests/unit/engine/test_engine_pool_api.py, on the fakes.

The API is built as the local stack runs it (the caller header says who calls), on a job
service with the Firestore pool store and the access policies read as production reads them.
"""

from __future__ import annotations

import functools
import json
import re

import pytest
from test_cli_describe_api import serving
from typer.testing import CliRunner

from tpujobs.adapters.firestore_config import FirestoreAccessPolicies
from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.adapters.tpu import CloudTpu
from tpujobs.cli import app
from tpujobs.domain.pools import UnitState
from tpujobs.domain.states import JobState
from tpujobs.engine.api import CALLER_HEADER, JobsApi
from tpujobs.engine.services import Engine
from tpujobs.local.testing import inbound, local_settings, wait_for
from tpujobs.runtime.instances import utc_now

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"
ADA = "ada@example.com"  # allowed to create pools by config/policies.pools (through a group)
BOB = "bob@example.com"  # named a user of Ada's pool
EVE = "eve@example.com"  # nobody to the pool
ADMIN = "root@example.com"


@pytest.fixture
def service(job_service, firestore_client) -> Engine:
    return job_service(admins=(ADMIN,), access=FirestoreAccessPolicies(firestore_client))


@pytest.fixture
def api(service) -> JobsApi:
    return JobsApi(service, service.store, local_settings(local_stack=True, admins=(ADMIN,)))


@pytest.fixture
def allowed(firestore_client) -> None:
    """Ada may create pools: config/policies.pools names a group she is in."""
    firestore_client.collection("config").document("groups").set({"pool-makers": [ADA]})
    firestore_client.collection("config").document("policies").set({"pools": ["group:pool-makers"]})


def call(api: JobsApi, caller: str, action: str, **body):
    answer = api.handle(
        "POST", "http://localhost/", {CALLER_HEADER: caller}, json.dumps({"action": action, **body}).encode()
    )
    return answer.status, answer.body


def ready(service: Engine, name: str = "demo") -> None:
    """Every unit of the pool is IDLE: the simulator made its capacity ACTIVE and the pool saw it."""

    def all_idle() -> bool:
        pool = service.warm.store.get(name)
        for unit in pool.units:
            if unit.state is UnitState.REQUESTED:
                status = service.capacity.status(unit.zone, unit.queued_resource(name))
                if status is not None:
                    service.warm.observe_unit(status.name, status.state)
        pool = service.warm.store.get(name)
        return all(u.state is UnitState.IDLE for u in pool.units)

    wait_for(all_idle, timeout=20, what="the pool's units to be ready")


def submit(api: JobsApi, caller: str, job_id: str, pool: str = "demo"):
    """A job of `caller` on the pool, through the API (so its owner is verified)."""
    return call(api, caller, "submit", job_id=job_id, name="train", accelerator_type="v4-8", command="true", pool=pool)


# --- `tpujobs pool` and `tpujobs list` through the API -----------------------------------------


def tpujobs(monkeypatch, tmp_path, url: str, *args: str):
    """The CLI pointed at the API only (another project: Firestore cannot answer it), piped."""
    monkeypatch.setenv("TPUJOBS_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "no-such-project")
    monkeypatch.setenv("TPUJOBS_LOCAL_STACK", "1")
    monkeypatch.setenv("TPUJOBS_API_URL", url)
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def timeless(answer: dict) -> list[dict]:
    """A pool-list answer less the chip-hours, which grow between two reads."""
    return [{k: v for k, v in pool.items() if "chip_hours" not in k and k != "last_day"} for pool in answer["pools"]]


def test_the_cli_manages_pools_through_the_api_as_the_caller(api, service, allowed, monkeypatch, tmp_path):
    """create, list, describe, resize and delete as Ada; Eve's resize is refused with the API's
    sentence; `tpujobs list` shows the pool a job runs on; -o json is the API's answer."""
    with serving(api) as (url, callers):
        run = functools.partial(tpujobs, monkeypatch, tmp_path, url)
        created = run("pool", "create", "demo", "--accelerator", "v4-8", "--count", "1", "--owner", ADA)
        assert created.exit_code == 0, created.output
        assert "Created pool demo: 1 x 1 x v4-8" in created.output and callers == [ADA]
        ready(service)
        assert submit(api, ADA, "ada-1")[0] == 200
        described = run("pool", "describe", "demo", "--owner", ADA)
        assert described.exit_code == 0 and "ada-1 (attempt 1)" in described.output
        hidden = run("pool", "describe", "demo", "--owner", EVE)
        assert hidden.exit_code == 0 and "(hidden)" in hidden.output and "ada-1" not in hidden.output
        as_json = run("pool", "list", "-o", "json", "--owner", ADA)
        assert timeless(json.loads(as_json.output)) == timeless(call(api, ADA, "pool-list")[1])
        listed = run("list", "--as", ADA)
        rows = [[cell.strip() for cell in re.split(r"[│┃]", line)[1:-1]] for line in listed.output.splitlines()]
        header = next(row for row in rows if row and row[0] == "JOB")
        row = next(row for row in rows if row and row[0] == "ada-1")
        assert "POOL" in header and row[header.index("POOL")] == "demo"
        refused = run("pool", "resize", "demo", "--count", "2", "--owner", EVE)
        assert refused.exit_code == 1 and "Not allowed: eve@example.com may not resize pool demo" in refused.output
        resized = run("pool", "resize", "demo", "--count", "2", "--owner", ADA)
        assert resized.exit_code == 0 and "holds 2 unit(s)" in resized.output
        missing = run("pool", "describe", "nothing", "--owner", ADA)
        assert missing.exit_code == 1 and "No pool 'nothing'" in missing.output
        deleted = run("pool", "delete", "demo", "--owner", ADA)
        assert deleted.exit_code == 0 and "Deleted pool demo" in deleted.output
    assert service.store.get("ada-1").state is JobState.CANCELLED
    assert service.warm.store.get("demo") is None


def test_a_deployment_built_without_warm_pools_says_so(firestore_client, tpu_client, project_id):
    """No pool store: every pool action is a 503 naming why, and a pool message is rejected."""
    settings = local_settings(project=project_id, default_zone=ZONE, local_stack=True)
    bare = Engine(FirestoreJobStore(firestore_client), CloudTpu(tpu_client, project_id), settings, utc_now)
    api = JobsApi(bare, bare.store, settings)
    for action, body in (("pool-list", {}), ("pool-describe", {"name": "demo"}), ("pool-delete", {"name": "demo"})):
        status, answer = call(api, ADMIN, action, **body)
        assert status == 503 and "without warm pools" in answer["error"]
    message = inbound("tpujobs-control", {"action": "pool-delete", "owner": ADMIN, "name": "demo"})
    bare.controls.on_control(message)
    assert bare.store.rejection(message.message_id).reason == "this deployment has no warm pools"

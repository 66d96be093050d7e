"""The `jobs` API's warm-pool actions (pool-create, -list, -describe, -resize, -delete) on the
Firestore emulator and the TPU simulator: who may do what, and what each answer shows.

The API is built as the local stack runs it (the caller header says who calls), on a job
service with the Firestore pool store and the access policies read as production reads them.
"""

from __future__ import annotations

import functools
import json
import re
from datetime import datetime, timezone

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


def create(api: JobsApi, caller: str = ADA, **fields):
    pool = {"name": "demo", "accelerator_type": "v4-8", "count": 2, "users": [BOB], **fields}
    return call(api, caller, "pool-create", **pool)


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


def queued_resources(service: Engine) -> set[str]:
    return {status.name for status in service.capacity.list_capacity(ZONE) if status.state != "DELETING"}


# --- create ------------------------------------------------------------------------------------


def test_only_admins_and_owners_the_policy_allows_may_create_a_pool(api, service, allowed):
    """Eve (no policy) is refused with the policy's name and nothing is written; Ada (in the
    allowed group) and an admin (no policy needed) create pools they own, units asked for at once."""
    status, body = create(api, EVE, name="eves")
    assert status == 403 and "config/policies.pools" in body["error"]
    assert service.warm.store.get("eves") is None
    status, body = create(api, ADA)
    assert status == 200, body
    assert body["pool"]["owner"] == ADA and body["pool"]["count"] == 2
    assert {u["state"] for u in body["pool"]["units"]} <= {"REQUESTED", "IDLE"}
    assert queued_resources(service) == {"demo-u0-g1", "demo-u1-g1"}
    status, body = create(api, ADMIN, name="admins", count=1)
    assert status == 200 and body["pool"]["owner"] == ADMIN


def test_a_taken_name_is_409_and_the_pool_is_unchanged(api, service, allowed):
    """A second create of the same name (by anyone) does not touch the first pool."""
    assert create(api)[0] == 200
    status, body = create(api, ADMIN, count=5)
    assert status == 409 and "already exists" in body["error"]
    assert service.warm.store.get("demo").count == 2 and service.warm.store.get("demo").owner == ADA


@pytest.mark.parametrize(
    ("fields", "status", "words"),
    [
        ({"owner": EVE}, 400, "never taken from the body"),
        ({"colour": "red"}, 400, "Unknown field 'colour' for pool-create"),
        ({"accelerator_type": "v9-8"}, 400, "accelerator_type"),
        ({"count": 0}, 400, "count must be a whole number from 1 to 64"),
        ({"name": "Not_A_Name"}, 400, "pool name 'Not_A_Name'"),
        ({"idle_minutes": "soon"}, 400, "idle_minutes"),
    ],
)
def test_a_bad_pool_is_a_400_naming_the_field_and_nothing_is_written(api, service, allowed, fields, status, words):
    """Each refusal is one sentence; no pool document and no queued resource."""
    answer_status, body = create(api, **fields)
    assert answer_status == status and words in body["error"], body
    assert service.warm.store.list_pools() == []
    assert queued_resources(service) == set()


# --- list and describe ---------------------------------------------------------------------------


def test_anyone_may_list_and_describe_but_only_the_pools_people_see_its_jobs(api, service, allowed):
    """Ada's one-unit pool runs Bob's job and Ada's waits: Ada (owner), Bob (a user) and an admin
    see both job ids; Eve sees the same pool, its units busy, with the ids hidden and a count."""
    assert create(api, count=1)[0] == 200
    ready(service)
    assert submit(api, BOB, "bob-1")[0] == 200
    assert submit(api, ADA, "ada-1")[0] == 200
    assert service.store.get("bob-1").state is JobState.PROVISIONING
    assert service.store.get("ada-1").state is JobState.QUEUED
    for who in (ADA, BOB, ADMIN):
        status, body = call(api, who, "pool-describe", name="demo")
        assert status == 200
        assert [u["job_id"] for u in body["pool"]["units"]] == ["bob-1"]
        assert body["pool"]["waiting"] == ["ada-1"]
    status, body = call(api, EVE, "pool-describe", name="demo")
    assert status == 200
    assert [(u["state"], u["job_id"]) for u in body["pool"]["units"]] == [("BUSY", "(hidden)")]
    assert body["pool"]["waiting"] == 1
    status, listed = call(api, EVE, "pool-list")
    assert status == 200 and [p["name"] for p in listed["pools"]] == ["demo"]
    assert listed["pools"][0]["units"][0]["job_id"] == "(hidden)"
    status, listed = call(api, BOB, "pool-list")
    assert listed["pools"][0]["units"][0]["job_id"] == "bob-1"


def test_a_user_named_through_a_group_sees_the_jobs(api, service, allowed, firestore_client):
    """`users: [group:NAME]` counts for config/groups members, as it does for running jobs."""
    firestore_client.collection("config").document("groups").set({"pool-makers": [ADA], "team": [EVE]})
    assert create(api, count=1, users=["group:team"])[0] == 200
    ready(service)
    assert submit(api, ADA, "ada-1")[0] == 200
    status, body = call(api, EVE, "pool-describe", name="demo")
    assert status == 200 and body["pool"]["units"][0]["job_id"] == "ada-1"


def test_pools_are_listed_by_name_with_times_as_rfc3339(api, allowed):
    """Every pool, sorted by name; timestamps are strings the CLI reads back."""
    assert create(api, name="zeta", count=1)[0] == 200
    assert create(api, name="alpha", count=1)[0] == 200
    status, body = call(api, EVE, "pool-list")
    assert status == 200 and [p["name"] for p in body["pools"]] == ["alpha", "zeta"]
    created = body["pools"][0]["created_at"]
    assert isinstance(created, str) and created.endswith("Z")
    assert datetime.fromisoformat(created.replace("Z", "+00:00")) <= datetime.now(timezone.utc)


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"name": "nothing"}, 404, "No pool 'nothing'"),
        ({"name": "../jobs/x"}, 404, "No pool '../jobs/x'"),
        ({}, 400, "'name' is required"),
        ({"name": "demo", "job_id": "x"}, 400, "Unknown field 'job_id' for pool-describe"),
    ],
)
def test_describing_a_missing_or_unnamed_pool_is_refused(api, body, status, words):
    """A pool that cannot exist is a 404 as a missing one is; no name is a 400."""
    answer_status, answer = call(api, ADA, "pool-describe", **body)
    assert answer_status == status and words in answer["error"], answer


# --- resize and delete ---------------------------------------------------------------------------


def test_only_the_owner_or_an_admin_may_resize(api, service, allowed):
    """Bob (a user) and Eve are refused and nothing changes; Ada grows it to 3 (a new unit is
    asked for), an admin shrinks it to 1 (the surplus released)."""
    assert create(api)[0] == 200
    ready(service)
    for who in (BOB, EVE):
        status, body = call(api, who, "pool-resize", name="demo", count=3)
        assert status == 403 and "only its owner or an admin" in body["error"]
    assert service.warm.store.get("demo").count == 2
    status, body = call(api, ADA, "pool-resize", name="demo", count=3)
    assert status == 200 and body["pool"]["count"] == 3 and len(body["pool"]["units"]) == 3
    assert "demo-u2-g1" in queued_resources(service)
    status, body = call(api, ADMIN, "pool-resize", name="demo", count=1)
    assert status == 200 and body["pool"]["count"] == 1
    assert [u["index"] for u in body["pool"]["units"]] == [0]
    assert queued_resources(service) == {"demo-u0-g1"}


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"name": "demo", "count": "3"}, 400, "'count' is required"),
        ({"name": "demo", "count": True}, 400, "'count' is required"),
        ({"name": "demo", "count": 65}, 400, "count must be from 1 to 64"),
        ({"name": "demo"}, 400, "'count' is required"),
        ({"name": "other", "count": 2}, 404, "no pool named other"),
    ],
)
def test_a_bad_resize_is_refused_and_the_pool_keeps_its_units(api, service, allowed, body, status, words):
    assert create(api)[0] == 200
    answer_status, answer = call(api, ADA, "pool-resize", **body)
    assert answer_status == status and words in answer["error"], answer
    assert service.warm.store.get("demo").count == 2


def test_deleting_cancels_the_pools_jobs_and_releases_its_capacity(api, service, allowed):
    """Eve may not; Ada deletes: the job on it is CANCELLED, the one waiting too, every unit's
    queued resource is deleted and the pool's document goes."""
    assert create(api, count=1)[0] == 200
    ready(service)
    assert submit(api, BOB, "bob-1")[0] == 200
    assert submit(api, BOB, "bob-2")[0] == 200
    status, body = call(api, EVE, "pool-delete", name="demo")
    assert status == 403 and service.warm.store.get("demo") is not None
    status, body = call(api, ADA, "pool-delete", name="demo")
    assert status == 200, body
    assert service.store.get("bob-1").state is JobState.CANCELLED
    assert service.store.get("bob-2").state is JobState.CANCELLED
    assert "deleted by ada@example.com" in service.store.get("bob-1").state_reason
    assert service.warm.store.get("demo") is None and body["pool"] is None
    assert queued_resources(service) == set()
    status, body = call(api, ADA, "pool-describe", name="demo")
    assert status == 404


def test_a_job_may_not_ask_for_a_pool_that_does_not_exist(api):
    """Submitting onto an unknown pool is refused before anything is written (the service's rule)."""
    status, body = submit(api, ADA, "lost-1", pool="nowhere")
    assert status == 403 and "no pool named nowhere" in body["error"]


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

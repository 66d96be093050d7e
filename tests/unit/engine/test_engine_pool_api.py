"""The `jobs` API's warm-pool actions (pool-create, -list, -describe, -resize, -delete) on the
fakes and the TPU simulator: who may do what, and what each answer shows.

The API is built as the local stack runs it (the caller header says who calls); the access
policies are read from documents as an admin writes them in `config`. The CLI through the API,
and a deployment without warm pools, are tests/emulator/test_pool_api.py.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest
from engine_harness import ZONE, Engine

from tpujobs.cli.api_client import described as described_answer
from tpujobs.cli.api_client import listed as listed_jobs
from tpujobs.domain import pools
from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.states import JobState
from tpujobs.local.fakes import InMemoryAccessPolicies
from tpujobs.local.testing import wait_for

ADA = "ada@example.com"  # allowed to create pools by config/policies.pools (through a group)
BOB = "bob@example.com"  # named a user of Ada's pool
EVE = "eve@example.com"  # nobody to the pool
ADMIN = "root@example.com"
ALLOWED = {"groups": {"pool-makers": [ADA]}, "policies": {"pools": ["group:pool-makers"]}}


def allowing(groups: dict[str, list[str]]) -> Any:
    """The policies of `config` when Ada may create pools, with these `config/groups`."""
    return InMemoryAccessPolicies.from_documents({**ALLOWED, "groups": groups}).allowed


@pytest.fixture
def jobs(engine) -> Engine:
    return engine(admins=(ADMIN,), access=allowing(ALLOWED["groups"]))


def call(jobs: Engine, caller: str, action: str, **body: Any) -> tuple[int, Any]:
    answer = jobs.api({"action": action, **body}, caller)
    return answer.status, answer.body


def create(jobs: Engine, caller: str = ADA, **fields: Any) -> tuple[int, Any]:
    pool = {"name": "demo", "accelerator_type": "v4-8", "count": 2, "users": [BOB], **fields}
    return call(jobs, caller, "pool-create", **pool)


def ready(jobs: Engine, name: str = "demo") -> None:
    """Tick until every unit of the pool is IDLE: the simulator made its capacity ACTIVE and the
    reconciler saw it, as in production."""

    def all_idle() -> bool:
        jobs.tick()
        pool = jobs.warm_pools.get(name)
        return pool is not None and all(u.state is pools.UnitState.IDLE for u in pool.units)

    wait_for(all_idle, timeout=20, what="the pool's units to be ready")


def submit(jobs: Engine, caller: str, job_id: str, pool: str = "demo") -> tuple[int, Any]:
    """A job of `caller` on the pool, through the API (so its owner is verified)."""
    return call(jobs, caller, "submit", job_id=job_id, name="train", accelerator_type="v4-8", command="true", pool=pool)


def queued_resources(jobs: Engine) -> set[str]:
    return {status.name for status in jobs.capacity.list_capacity(ZONE) if status.state is not HoldingState.RELEASING}


def count_of(jobs: Engine, name: str = "demo") -> int:
    pool = jobs.warm_pools.get(name)
    assert pool is not None, f"pool {name} exists"
    return pool.count


# --- create ------------------------------------------------------------------------------------


def test_only_admins_and_owners_the_policy_allows_may_create_a_pool(jobs):
    """Eve (no policy) is refused with the policy's name and nothing is written; Ada (in the
    allowed group) and an admin (no policy needed) create pools they own, units asked for at once."""
    status, body = create(jobs, EVE, name="eves")
    assert status == 403 and "config/policies.pools" in body["error"]
    assert jobs.warm_pools.get("eves") is None
    status, body = create(jobs, ADA)
    assert status == 200, body
    assert body["pool"]["owner"] == ADA and body["pool"]["count"] == 2
    assert {u["state"] for u in body["pool"]["units"]} <= {"REQUESTED", "IDLE"}
    assert queued_resources(jobs) == {"demo-u0-g1", "demo-u1-g1"}
    status, body = create(jobs, ADMIN, name="admins", count=1)
    assert status == 200 and body["pool"]["owner"] == ADMIN


def test_a_taken_name_is_409_and_the_pool_is_unchanged(jobs):
    """A second create of the same name (by anyone) does not touch the first pool."""
    assert create(jobs)[0] == 200
    status, body = create(jobs, ADMIN, count=5)
    assert status == 409 and "already exists" in body["error"]
    pool = jobs.warm_pools.get("demo")
    assert pool is not None and (pool.count, pool.owner) == (2, ADA)


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
def test_a_bad_pool_is_a_400_naming_the_field_and_nothing_is_written(jobs, fields, status, words):
    """Each refusal is one sentence; no pool document and no queued resource."""
    answer_status, body = create(jobs, **fields)
    assert answer_status == status and words in body["error"], body
    assert jobs.warm_pools.list_pools() == []
    assert queued_resources(jobs) == set()


# --- list and describe ---------------------------------------------------------------------------


def test_anyone_may_list_and_describe_but_only_the_pools_people_see_its_jobs(jobs):
    """Ada's one-unit pool runs Bob's job and Ada's waits: Ada (owner), Bob (a user) and an admin
    see both job ids; Eve sees the same pool, its units busy, with the ids hidden and a count."""
    assert create(jobs, count=1)[0] == 200
    ready(jobs)
    assert submit(jobs, BOB, "bob-1")[0] == 200
    assert submit(jobs, ADA, "ada-1")[0] == 200
    assert jobs.job("bob-1").state is JobState.PROVISIONING
    assert jobs.job("ada-1").state is JobState.QUEUED
    for who in (ADA, BOB, ADMIN):
        status, body = call(jobs, who, "pool-describe", name="demo")
        assert status == 200
        assert [u["job_id"] for u in body["pool"]["units"]] == ["bob-1"]
        assert body["pool"]["waiting"] == ["ada-1"]
    status, body = call(jobs, EVE, "pool-describe", name="demo")
    assert status == 200
    assert [(u["state"], u["job_id"]) for u in body["pool"]["units"]] == [("BUSY", "(hidden)")]
    assert body["pool"]["waiting"] == 1
    status, listed = call(jobs, EVE, "pool-list")
    assert status == 200 and [p["name"] for p in listed["pools"]] == ["demo"]
    assert listed["pools"][0]["units"][0]["job_id"] == "(hidden)"
    status, listed = call(jobs, BOB, "pool-list")
    assert listed["pools"][0]["units"][0]["job_id"] == "bob-1"


def test_a_jobs_pool_placement_is_shown_only_to_the_pools_people(jobs):
    """Eve, nobody to the pool, lists and describes Bob's job without its pool, unit or the
    sentences that name them; Bob (a user), Ada (its owner) and an admin see them."""
    assert create(jobs, count=1)[0] == 200
    ready(jobs)
    assert submit(jobs, BOB, "bob-1")[0] == 200
    unit = jobs.job("bob-1").warm_pool_unit
    assert unit
    for who in (BOB, ADA, ADMIN):
        shown = call(jobs, who, "list")[1]["jobs"][0]
        assert (shown["warm_pool"], shown["warm_pool_unit"], shown["spec"]["pool"]) == ("demo", unit, "demo")
    _, listed = call(jobs, EVE, "list")
    _, described = call(jobs, EVE, "describe", job_id="bob-1")
    for shown in (listed["jobs"][0], described["job"]):
        assert (shown["warm_pool"], shown["warm_pool_unit"], shown["spec"]["pool"]) == ("<hidden>",) * 3
        assert shown["job_id"] == "bob-1"
    seen_by_eve = json.dumps([listed, described])
    assert unit not in seen_by_eve and '"demo' not in seen_by_eve
    assert any(unit in e["reason"] for e in call(jobs, BOB, "describe", job_id="bob-1")[1]["events"])
    # What Eve's `tpujobs list` and `describe` read back: the job, its placement still hidden.
    for job in (*listed_jobs(listed), described_answer(described)[0]):
        assert (job.job_id, job.warm_pool, job.warm_pool_unit, job.spec.pool) == ("bob-1", "<hidden>", "<hidden>", None)


def test_a_user_named_through_a_group_sees_the_jobs(jobs):
    """`users: [group:NAME]` counts for config/groups members, as it does for running jobs."""
    jobs.access.allowed = allowing({"pool-makers": [ADA], "team": [EVE]})
    assert create(jobs, count=1, users=["group:team"])[0] == 200
    ready(jobs)
    assert submit(jobs, ADA, "ada-1")[0] == 200
    status, body = call(jobs, EVE, "pool-describe", name="demo")
    assert status == 200 and body["pool"]["units"][0]["job_id"] == "ada-1"


def test_pools_are_listed_by_name_with_times_as_rfc3339(jobs):
    """Every pool, sorted by name; timestamps are strings the CLI reads back."""
    assert create(jobs, name="zeta", count=1)[0] == 200
    assert create(jobs, name="alpha", count=1)[0] == 200
    status, body = call(jobs, EVE, "pool-list")
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
def test_describing_a_missing_or_unnamed_pool_is_refused(jobs, body, status, words):
    """A pool that cannot exist is a 404 as a missing one is; no name is a 400."""
    answer_status, answer = call(jobs, ADA, "pool-describe", **body)
    assert answer_status == status and words in answer["error"], answer


# --- resize and delete ---------------------------------------------------------------------------


def test_an_owner_whose_pool_right_was_taken_away_may_shrink_but_not_grow(jobs):
    """Growing is more capacity: the owner's rights now decide, not those she had at create."""
    assert create(jobs)[0] == 200
    jobs.access.allowed = allowing({})  # an admin took Ada out of pool-makers
    status, body = call(jobs, ADA, "pool-resize", name="demo", count=3)
    assert status == 403 and "config/policies.pools" in body["error"]
    assert count_of(jobs) == 2
    status, body = call(jobs, ADA, "pool-resize", name="demo", count=1)
    assert status == 200 and body["pool"]["count"] == 1
    assert call(jobs, ADMIN, "pool-resize", name="demo", count=2)[0] == 200  # an admin may


def test_only_the_owner_or_an_admin_may_resize(jobs):
    """Bob (a user) and Eve are refused and nothing changes; Ada grows it to 3 (a new unit is
    asked for), an admin shrinks it to 1 (the surplus released)."""
    assert create(jobs)[0] == 200
    ready(jobs)
    for who in (BOB, EVE):
        status, body = call(jobs, who, "pool-resize", name="demo", count=3)
        assert status == 403 and "only its owner or an admin" in body["error"]
    assert count_of(jobs) == 2
    status, body = call(jobs, ADA, "pool-resize", name="demo", count=3)
    assert status == 200 and body["pool"]["count"] == 3 and len(body["pool"]["units"]) == 3
    assert "demo-u2-g1" in queued_resources(jobs)
    status, body = call(jobs, ADMIN, "pool-resize", name="demo", count=1)
    assert status == 200 and body["pool"]["count"] == 1
    assert [u["index"] for u in body["pool"]["units"]] == [0]
    assert queued_resources(jobs) == {"demo-u0-g1"}


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
def test_a_bad_resize_is_refused_and_the_pool_keeps_its_units(jobs, body, status, words):
    """Each refusal names what is wrong; the pool keeps its count."""
    assert create(jobs)[0] == 200
    answer_status, answer = call(jobs, ADA, "pool-resize", **body)
    assert answer_status == status and words in answer["error"], answer
    assert count_of(jobs) == 2


def test_deleting_cancels_the_pools_jobs_and_releases_its_capacity(jobs):
    """Eve may not; Ada deletes: the job on it is CANCELLED, the one waiting too, every unit's
    queued resource is deleted and the pool's document goes."""
    assert create(jobs, count=1)[0] == 200
    ready(jobs)
    assert submit(jobs, BOB, "bob-1")[0] == 200
    assert submit(jobs, BOB, "bob-2")[0] == 200
    status, body = call(jobs, EVE, "pool-delete", name="demo")
    assert status == 403 and jobs.warm_pools.get("demo") is not None
    status, body = call(jobs, ADA, "pool-delete", name="demo")
    assert status == 200, body
    assert jobs.job("bob-1").state is JobState.CANCELLED
    assert jobs.job("bob-2").state is JobState.CANCELLED
    assert "deleted by ada@example.com" in jobs.job("bob-1").state_reason
    assert jobs.warm_pools.get("demo") is None and body["pool"] is None
    assert queued_resources(jobs) == set()
    status, body = call(jobs, ADA, "pool-describe", name="demo")
    assert status == 404


def test_a_job_may_not_ask_for_a_pool_that_does_not_exist(jobs):
    """Submitting onto an unknown pool is refused before anything is written (the service's rule)."""
    status, body = submit(jobs, ADA, "lost-1", pool="nowhere")
    assert status == 403 and "no pool named nowhere" in body["error"]
    assert jobs.store.get("lost-1") is None

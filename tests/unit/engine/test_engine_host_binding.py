"""The attempt key's host binding on every path: a TPU API holding's own VM names only, a pool
job's VMs no older than its unit's request, and key holders remembered per job incarnation.

The attempt_key function's `attempt-key` (`KeyApi`) is driven with a stand-in verifier (its claims are what
Google signs into a VM's identity token, `format=full`); the engine and its store are the fakes.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from engine_harness import ZONE, Engine

from tpujobs.domain.naming import host_name_refusal
from tpujobs.domain.pools import HELD
from tpujobs.engine.api import CALLER_HEADER
from tpujobs.engine.key_api import KeyApi
from tpujobs.local.testing import ManualClock, OffsetClock, wait_for

KEY_URL = "https://us-central1-test-project.cloudfunctions.net/jobs"
ADMIN = "root@example.com"
OWNER = "ada@example.com"
TPU_VM = "t1v-n-0a1b2c3d-w-0"
UNIT_SECRET = bytes(range(32))  # a unit's pool agent's (agent/unit_secret.py)


class VmTokens:
    """Stand-in for google-auth's check of instance identity tokens: token -> its claims."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}

    def __call__(self, token: str, audiences: Any) -> dict[str, Any]:
        return self.claims[token]

    def vm(self, jobs: Engine, instance: str, *, made: datetime | None = None, name: str = TPU_VM) -> str:
        """The token of a VM of the deployment's account in the job's project and zone (made now)."""
        compute = {
            "project_id": jobs.settings.project,
            "zone": ZONE,
            "instance_id": instance,
            "instance_name": name,
            "instance_creation_timestamp": int((made or jobs.clock()).timestamp()),
        }
        email = jobs.settings.tpu_service_account
        self.claims[instance] = {"email": email, "email_verified": True, "google": {"compute_engine": compute}}
        return instance


def ask(jobs: Engine, tokens: VmTokens, token: str, job_id: str = "train-1", **changes: Any) -> Any:
    """The `attempt-key` answer for worker 0 of slice 0 of the job's attempt 1, unless `changes` say otherwise."""
    body = {"action": "attempt-key", "identity": token, "job_id": job_id, "attempt": 1, "slice_id": 0}
    body = {"worker_id": 0, **body, **changes}
    caller = {CALLER_HEADER: jobs.settings.tpu_service_account}
    api = KeyApi(jobs.store, jobs.api_settings, jobs.service.clock, verify_vm_token=tokens)
    return api.handle("POST", KEY_URL, caller, json.dumps(body).encode())


def register(jobs: Engine, tokens: VmTokens, token: str, secret: bytes) -> Any:
    """The `unit-register` answer for the token's VM, as a unit's pool agent sends it before any job."""
    body = {"action": "unit-register", "identity": token, "secret_sha256": hashlib.sha256(secret).hexdigest()}
    caller = {CALLER_HEADER: jobs.settings.tpu_service_account}
    api = KeyApi(jobs.store, jobs.api_settings, jobs.service.clock, verify_vm_token=tokens)
    return api.handle("POST", KEY_URL, caller, json.dumps(body).encode())


def submit(jobs: Engine, **changes: Any) -> None:
    spec = {"job_id": "train-1", "name": "train", "owner": OWNER, "accelerator_type": "v4-16", "command": "true"}
    assert jobs.submit({**spec, **changes}).kind == "provisioning"


@pytest.fixture
def tokens() -> VmTokens:
    return VmTokens()


# -- a TPU API holding's VMs are its nodes' workers ------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["train-2-c1-x7k2", "demo-c0-g1-ab12", "my-vm", "t1v-n-0a1b2c3d-w-0-x", "t1v-n-0A1B-w-0", "t1v-n--w-0"],
    ids=["compute_job_vm", "compute_pool_vm", "hand_made_vm", "suffixed", "upper_case", "no_number"],
)
def test_only_a_tpu_workers_name_can_be_a_tpu_api_holdings_host(name):
    """On the TPU API only `t1v-n-<hex>-w-<worker>` is a holding's VM: any other name is refused."""
    assert "not a TPU API worker" in (host_name_refusal("train-1-a1", 0, 1, 0, name) or "")
    assert "not a TPU API worker" in (host_name_refusal("demo-u0-g3", 0, 1, 0, name) or "")
    assert host_name_refusal("train-1-a1", 0, 1, 0, TPU_VM) is None


def test_a_compute_engine_vm_gets_no_key_of_a_tpu_api_holding(engine, tokens):
    """A Compute Engine job's VM (its MIG's name) of the same account and zone, made after the
    attempt asked, asks first for a TPU API job's key: 403, and the real worker still gets it."""
    jobs = engine(clock=ManualClock(), key_url=KEY_URL)
    submit(jobs)
    answer = ask(jobs, tokens, tokens.vm(jobs, "2002", name="train-2-c1-x7k2"))
    assert answer.status == 403 and "key" not in answer.body
    assert "not a TPU API worker" in answer.body["error"]
    assert ask(jobs, tokens, tokens.vm(jobs, "1001")).status == 200


# -- a pool job's hosts are its unit's VMs ---------------------------------------------------------


def pooled(engine: Any, clock: OffsetClock) -> Engine:
    """An engine with one ready unit of pool `demo`, made an hour ago, and train-1 just put on it."""
    jobs = engine(clock=clock, key_url=KEY_URL, admins=(ADMIN,))
    data = {"name": "demo", "accelerator_type": "v4-8", "count": 1, "users": [OWNER]}
    assert jobs.create_pool(data, ADMIN).kind == "done"

    def unit_held() -> bool:
        """the unit's queued resource to be ACTIVE"""
        jobs.tick()
        pool = jobs.warm_pools.get("demo")
        return pool is not None and all(u.state in HELD for u in pool.units)

    wait_for(unit_held, timeout=20)
    clock.advance(3600)
    spec = {"job_id": "train-1", "name": "train", "owner": OWNER, "accelerator_type": "v4-8", "command": "true"}
    assert jobs.submit_verified({**spec, "pool": "demo"}).kind == "provisioning"
    return jobs


def test_a_vm_older_than_the_pool_jobs_unit_gets_no_key(engine, tokens):
    """A VM of the same account and zone made before the unit was asked for (an old job's, another
    pool's) is not the unit's: 403. The unit's own VM, made after its request and an hour before
    the job was assigned to it, with its pool agent's registered secret, gets the key."""
    jobs = pooled(engine, OffsetClock())
    job = jobs.store.get("train-1")
    assert job is not None and job.warm_pool_unit == "demo-u0-g1" and job.unit_requested_at is not None
    old = ask(jobs, tokens, tokens.vm(jobs, "2002", made=job.unit_requested_at - timedelta(hours=1)))
    assert old.status == 403 and "key" not in old.body
    assert "made before unit demo-u0-g1 was asked for" in old.body["error"]
    own_vm = tokens.vm(jobs, "1001", made=job.unit_requested_at + timedelta(seconds=30))
    assert register(jobs, tokens, own_vm, UNIT_SECRET).status == 200
    own = ask(jobs, tokens, own_vm, unit_secret=UNIT_SECRET.hex())
    assert own.status == 200, own.body


def test_a_pool_job_that_does_not_say_when_its_unit_was_asked_for_gets_no_key(engine, tokens, monkeypatch):
    """A job document without its unit's request time (written before it was kept) hands out no key:
    the check fails closed."""
    jobs = pooled(engine, OffsetClock())
    job = jobs.store.get("train-1")
    assert job is not None
    monkeypatch.setattr(jobs.store, "get", lambda job_id: job.evolve(unit_requested_at=None))  # an older document
    answer = ask(jobs, tokens, tokens.vm(jobs, "1001", made=jobs.clock() - timedelta(minutes=30)))
    assert answer.status == 403 and "does not say when unit demo-u0-g1 was asked for" in answer.body["error"]


# -- a reused job id starts clean --------------------------------------------------------------------


def resubmitted(jobs: Engine, clock: ManualClock, **changes: Any) -> None:
    """train-1 ends, its record expires (one day's retention) and is deleted, and a new job of the
    same id is submitted: the old job's key holders (kept 8 days) are still remembered."""
    jobs.cancel("train-1", "done")
    clock.advance(86400 + 60)
    assert jobs.store.prune_expired_jobs(clock()) == ["train-1"]
    jobs.tick()
    submit(jobs, **changes)


def test_a_reused_job_ids_new_host_is_not_blocked_by_the_old_jobs_holder(engine, tokens):
    """The new job's worker, another VM than the old job's, gets the key; the old job's VM, made
    before the new attempt asked, does not."""
    clock = ManualClock()
    jobs = engine(clock=clock, key_url=KEY_URL, record_retention_days=1)
    submit(jobs)
    old_vm = tokens.vm(jobs, "1001")
    assert ask(jobs, tokens, old_vm).status == 200
    resubmitted(jobs, clock)
    answer = ask(jobs, tokens, tokens.vm(jobs, "2002"))
    assert answer.status == 200, answer.body
    assert ask(jobs, tokens, old_vm).status == 403


def test_a_reused_job_ids_coordinator_is_its_own(engine, tokens):
    """The old multislice job's coordinator address is not the new job's: its hosts wait for their
    own slice 0 worker 0 to name one."""
    clock = ManualClock()
    jobs = engine(clock=clock, key_url=KEY_URL, record_retention_days=1)
    submit(jobs, slices=2)
    assert ask(jobs, tokens, tokens.vm(jobs, "1001"), address="10.0.0.5").body["coordinator"] == "10.0.0.5"
    resubmitted(jobs, clock, slices=2)
    early = ask(jobs, tokens, tokens.vm(jobs, "3003"), slice_id=1)
    assert early.status == 200 and early.body["coordinator"] is None
    first = ask(jobs, tokens, tokens.vm(jobs, "2002"), address="10.0.0.7")
    assert first.status == 200 and first.body["coordinator"] == "10.0.0.7"

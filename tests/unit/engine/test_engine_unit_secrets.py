"""A warm-pool job's key goes to its unit's pool agent alone: the VM's identity token is not
enough, the request must prove the secret the agent registered before any job ran (`unit-register`).

The attempt_key function (`KeyApi`) is driven with a stand-in verifier, as in
test_engine_host_binding; the engine and its store are the fakes.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from engine_harness import Engine
from test_engine_host_binding import KEY_URL, UNIT_SECRET, VmTokens, ask, pooled, register, submit

from tpujobs.engine.api import CALLER_HEADER, JobsApi
from tpujobs.engine.jobs_api.unit_secrets import secret_sha256, unit_digest
from tpujobs.local.testing import ManualClock, OffsetClock

OTHER_SECRET = bytes(range(1, 33))  # what a job's leftover process would make up
OTHER_PROJECTS_VM = {"project_id": "other-project", "instance_id": "9", "instance_creation_timestamp": 1}


@pytest.fixture
def tokens() -> VmTokens:
    return VmTokens()


@pytest.fixture
def unit(engine: Any, tokens: VmTokens) -> tuple[Engine, str]:
    """train-1 put on pool demo's one unit, and the token of that unit's VM (made after its request)."""
    jobs = pooled(engine, OffsetClock())
    job = jobs.store.get("train-1")
    assert job is not None and job.unit_requested_at is not None
    return jobs, tokens.vm(jobs, "1001", made=job.unit_requested_at + timedelta(seconds=30))


def held_by(jobs: Engine, token: str, tokens: VmTokens) -> dict[str, Any] | None:
    """The unit-secret record of the token's VM, as stored."""
    vm = tokens.claims[token]["google"]["compute_engine"]
    return jobs.store.unit_secret_document(unit_digest(vm))


# -- a pool job's key needs the unit's secret -------------------------------------------------------


def test_a_pool_jobs_key_request_with_the_vms_token_but_no_or_a_wrong_secret_is_refused_and_records_nothing(
    unit, tokens
):
    """The unit's own VM, registered, asks with its valid token and no secret, then a made-up one:
    403 both times and no holder recorded; the pool agent's request with the secret then gets the key."""
    jobs, vm = unit
    assert register(jobs, tokens, vm, UNIT_SECRET).status == 200
    bare = ask(jobs, tokens, vm)
    assert bare.status == 403 and "key" not in bare.body
    assert "proves no unit secret" in bare.body["error"]
    wrong = ask(jobs, tokens, vm, unit_secret=OTHER_SECRET.hex())
    assert wrong.status == 403 and "key" not in wrong.body
    assert "does not match" in wrong.body["error"]
    agents = ask(jobs, tokens, vm, unit_secret=UNIT_SECRET.hex())
    assert agents.status == 200, agents.body
    assert agents.body["key"]


def test_a_unit_vm_that_never_registered_gets_no_pool_jobs_key(unit, tokens):
    """Without a registration, no secret proves anything: 403, whatever the request carries."""
    jobs, vm = unit
    answer = ask(jobs, tokens, vm, unit_secret=UNIT_SECRET.hex())
    assert answer.status == 403 and "key" not in answer.body
    assert "registered no unit secret" in answer.body["error"]


def test_a_job_vm_made_for_one_attempt_needs_no_unit_secret(engine, tokens):
    """A job that is not on a pool is unchanged: its VM's token alone gets the key."""
    jobs = engine(clock=ManualClock(), key_url=KEY_URL)
    submit(jobs)
    answer = ask(jobs, tokens, tokens.vm(jobs, "3003"))
    assert answer.status == 200, answer.body


# -- registration: the first wins -------------------------------------------------------------------


def test_a_second_registration_with_another_hash_is_refused_and_counted(unit, tokens):
    """After the pool agent registered, another hash for the same VM (a leftover process's) is 409 and
    counted; the first hash is kept and still proves the agent's requests, the other proves nothing."""
    jobs, vm = unit
    assert register(jobs, tokens, vm, UNIT_SECRET).status == 200
    second = register(jobs, tokens, vm, OTHER_SECRET)
    assert second.status == 409 and "the first one stands" in second.body["error"]
    record = held_by(jobs, vm, tokens)
    assert record is not None
    assert record["secret_sha256"] == secret_sha256(UNIT_SECRET) and record["refused"] == 1
    assert ask(jobs, tokens, vm, unit_secret=OTHER_SECRET.hex()).status == 403
    assert ask(jobs, tokens, vm, unit_secret=UNIT_SECRET.hex()).status == 200


def test_the_same_hash_registered_again_after_a_reboot_is_accepted(unit, tokens):
    """The agent keeps its secret across reboots and registers it at each start: the same hash is 200."""
    jobs, vm = unit
    assert register(jobs, tokens, vm, UNIT_SECRET).status == 200
    again = register(jobs, tokens, vm, UNIT_SECRET)
    assert again.status == 200, again.body
    record = held_by(jobs, vm, tokens)
    assert record is not None and record["refused"] == 0


def test_a_vm_made_again_starts_clean(unit, tokens):
    """A VM of the same instance id but another creation time (made again) registers its own secret,
    and the first VM's record is kept as it was."""
    jobs, vm = unit
    assert register(jobs, tokens, vm, UNIT_SECRET).status == 200
    first = dict(tokens.claims[vm]["google"]["compute_engine"])
    made = jobs.clock() + timedelta(minutes=10)
    remade = tokens.vm(jobs, "1001", made=made)  # the same instance id, another creation time
    assert register(jobs, tokens, remade, OTHER_SECRET).status == 200
    assert jobs.store.unit_secret_document(unit_digest(first))["secret_sha256"] == secret_sha256(UNIT_SECRET)


@pytest.mark.parametrize(
    ("claims", "status", "says"),
    [
        ({"email_verified": False}, 403, "not verified"),
        ({"google": {"compute_engine": OTHER_PROJECTS_VM}}, 403, "not in project"),
        ({"google": {}}, 403, "no instance"),
    ],
    ids=["unverified", "other_project", "no_instance"],
)
def test_a_registration_from_a_token_that_names_no_vm_of_the_project_is_refused(unit, tokens, claims, status, says):
    """A token that is unverified, of another project's VM or without `format=full` registers nothing."""
    jobs, vm = unit
    tokens.claims["odd"] = {**tokens.claims[vm], **claims}
    answer = register(jobs, tokens, "odd", UNIT_SECRET)
    assert answer.status == status and says in answer.body["error"]
    assert held_by(jobs, vm, tokens) is None


def test_a_registration_is_refused_with_a_token_that_does_not_verify(unit, tokens):
    """A token the verifier does not know: 401, nothing kept."""
    jobs, vm = unit

    def refuse(token: str, audiences: Any) -> dict[str, Any]:
        from tpujobs.engine.identity import InvalidToken

        raise InvalidToken("Could not verify token signature.")

    answer = register(jobs, refuse, vm, UNIT_SECRET)  # type: ignore[arg-type]
    assert answer.status == 401
    assert held_by(jobs, vm, tokens) is None


def test_the_jobs_api_does_not_answer_unit_register(unit):
    """`unit-register` is the key function's: the jobs API says where to ask (404), never 500."""
    jobs, _ = unit
    api = JobsApi(jobs.service, jobs.store, jobs.api_settings)
    body = {"action": "unit-register", "identity": "t", "secret_sha256": "0" * 64}
    answer = api.handle("POST", KEY_URL, {CALLER_HEADER: "root@example.com"}, json.dumps(body).encode())
    assert answer.status == 404 and "key URL" in answer.body["error"]

"""The command starts only on a ready slice (issue 38 items 2 and 3): `attempt-key` hands out an
attempt's key only once its holding is ACTIVE as the capacity port reads it.

Until then (a Compute Engine interconnect ACTIVATING, read as PROVISIONING; part of an
individual-mode MIG, read as WAITING with "3 of 4 hosts came") the answer is 409,
ask again, with the holding's state and detail, and nothing is recorded; a FAILED or missing
holding is refused for good. The attempt_key function (`KeyApi`) is driven with the stand-in
verifier of test_engine_attempt_keys, on the fake capacity; a pool job's on the TPU simulator.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from engine_harness import ZONE, Engine
from test_engine_attempt_keys import KEY_URL, VmTokens, provisioning
from test_engine_host_binding import UNIT_SECRET, pooled, register
from test_engine_host_binding import VmTokens as UnitVmTokens

from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.states import JobState
from tpujobs.engine.api import CALLER_HEADER
from tpujobs.engine.errors import TransientError
from tpujobs.engine.jobs_api.slice_readiness import SHARED_FOR
from tpujobs.engine.key_api import KeyApi
from tpujobs.engine.ports import Capacity, CapacityStatus
from tpujobs.local.fakes.capacity import InMemoryCapacity
from tpujobs.local.testing import ManualClock, OffsetClock

PARTIAL = "3 of 4 hosts came; the others wait"
ACTIVATING = "interconnect 4x4x4 being activated: its VMs run, their chips are not linked yet"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def capacity() -> InMemoryCapacity:
    return InMemoryCapacity()


@pytest.fixture
def jobs(engine: Any, clock: ManualClock, capacity: InMemoryCapacity) -> Engine:
    return engine(clock=clock, key_url=KEY_URL, capacity=capacity)


@pytest.fixture
def tokens() -> VmTokens:
    return VmTokens()


def key_api(jobs: Engine, tokens: Any, holdings: Any) -> KeyApi:
    """The attempt_key function on the engine's store and clock, reading `holdings`."""
    return KeyApi(jobs.store, jobs.api_settings, jobs.service.clock, verify_vm_token=tokens, holdings=holdings)


def ask(api: KeyApi, jobs: Engine, token: str, **changes: Any) -> Any:
    """The `attempt-key` answer for worker 0 of train-1's attempt 1, unless `changes` say otherwise."""
    body = {"action": "attempt-key", "identity": token, "job_id": "train-1", "attempt": 1, "slice_id": 0}
    caller = {CALLER_HEADER: jobs.settings.tpu_service_account}
    return api.handle("POST", KEY_URL, caller, json.dumps({"worker_id": 0, **body, **changes}).encode())


def holding(jobs: Engine) -> str:
    return jobs.job().queued_resource


def reads(capacity: InMemoryCapacity) -> list[tuple[str, ...]]:
    return [call for call in capacity.calls if call[0] == "status"]


def test_a_key_for_a_holding_still_provisioning_waits_and_is_handed_out_once_it_is_active(
    jobs, tokens, capacity, clock
):
    """PROVISIONING (an interconnect ACTIVATING): 409 with its state, detail and a Retry-After, and
    no holder recorded, so the same VM asks again; once ACTIVE the same VM gets the key."""
    provisioning(jobs)
    capacity.set_state(holding(jobs), HoldingState.PROVISIONING, detail=ACTIVATING)
    api = key_api(jobs, tokens, capacity)
    vm = tokens.vm("t1", jobs)
    waiting = ask(api, jobs, vm)
    assert waiting.status == 409, waiting.body
    assert "key" not in waiting.body and waiting.body["ready"] is False
    assert (waiting.body["holding"], waiting.body["state"]) == (holding(jobs), "PROVISIONING")
    assert waiting.body["detail"] == ACTIVATING and ACTIVATING in waiting.body["error"]
    assert "Not ready" in waiting.body["error"] and waiting.headers["Retry-After"].isdigit()
    capacity.set_state(holding(jobs), HoldingState.ACTIVE)
    clock.advance(SHARED_FOR.total_seconds())
    granted = ask(api, jobs, vm)
    assert granted.status == 200, granted.body
    assert granted.body["key"]


def test_a_partial_slice_gets_no_key_and_the_answer_says_how_many_hosts_came(jobs, tokens, capacity):
    """Only some of an individual-mode MIG's VMs came (WAITING): every host that
    came is told to wait, with how many came; none gets the key."""
    provisioning(jobs)
    capacity.set_state(holding(jobs), HoldingState.WAITING, detail=PARTIAL)
    api = key_api(jobs, tokens, capacity)
    for worker, instance in ((0, "1001"), (1, "1002"), (0, "1001")):
        vm = tokens.vm(f"t{instance}", jobs, instance=instance, instance_name=f"t1v-n-0a1b2c3d-w-{worker}")
        answer = ask(api, jobs, vm, worker_id=worker)
        assert answer.status == 409, answer.body
        assert answer.body["state"] == "WAITING" and PARTIAL in answer.body["error"]
        assert "key" not in answer.body


@pytest.mark.parametrize("state", [HoldingState.FAILED, HoldingState.LOST, HoldingState.RELEASING])
def test_a_holding_that_will_never_be_ready_is_refused_for_good(jobs, tokens, capacity, state):
    """FAILED (an interconnect that failed, with Google's reason), LOST or RELEASING: 403, not
    ask again, with the state and its reason."""
    provisioning(jobs)
    capacity.set_state(holding(jobs), state, detail="ICI link down")
    answer = ask(key_api(jobs, tokens, capacity), jobs, tokens.vm("t1", jobs))
    assert answer.status == 403, answer.body
    assert state in answer.body["error"] and "never be ready" in answer.body["error"]
    assert "key" not in answer.body


def test_a_holding_that_is_gone_is_refused_for_good(jobs, tokens, capacity):
    """The holding no longer exists (released, deleted by hand): 403, never be ready."""
    provisioning(jobs)
    capacity.vanish(holding(jobs))
    answer = ask(key_api(jobs, tokens, capacity), jobs, tokens.vm("t1", jobs))
    assert answer.status == 403 and "does not exist" in answer.body["error"]


def test_an_active_holding_costs_one_status_read_shared_by_the_hosts_that_ask_together(jobs, tokens, capacity, clock):
    """The common case: the holding is ACTIVE when the hosts ask. The first request reads its
    status once; a second host asking within SHARED_FOR reads nothing more; later, one more read."""
    provisioning(jobs)
    capacity.set_state(holding(jobs), HoldingState.ACTIVE)
    api = key_api(jobs, tokens, capacity)
    before = len(reads(capacity))
    assert ask(api, jobs, tokens.vm("t1", jobs)).status == 200
    assert reads(capacity)[before:] == [("status", ZONE, holding(jobs))]
    other = tokens.vm("t2", jobs, instance="1002", instance_name="t1v-n-0a1b2c3d-w-1")
    assert ask(api, jobs, other, worker_id=1).status == 200
    assert len(reads(capacity)) == before + 1
    clock.advance(SHARED_FOR.total_seconds())
    assert ask(api, jobs, other, worker_id=1).status == 200
    assert len(reads(capacity)) == before + 2


def test_a_forged_request_reads_no_capacity(jobs, tokens, capacity):
    """A VM that cannot be the host is refused before any capacity read: forgeries cost nothing."""
    provisioning(jobs)
    capacity.set_state(holding(jobs), HoldingState.ACTIVE)
    before = len(reads(capacity))
    stranger = tokens.vm("t9", jobs, email="someone-else@test-project.iam.gserviceaccount.com")
    assert ask(key_api(jobs, tokens, capacity), jobs, stranger).status == 403
    assert len(reads(capacity)) == before


class Unreadable:
    """Capacity whose reads fail for now (a rate limit, an outage)."""

    def status(self, zone: str, name: str) -> CapacityStatus | None:
        raise TransientError("429 rateLimitExceeded")


def test_a_holding_whose_state_cannot_be_read_is_not_ready_yet(jobs, tokens):
    """A read that fails for now is no refusal and no grant: 409, ask again, saying why."""
    provisioning(jobs)
    answer = ask(key_api(jobs, tokens, Unreadable()), jobs, tokens.vm("t1", jobs))
    assert answer.status == 409 and answer.body["state"] == "UNKNOWN"
    assert "could not be read" in answer.body["error"] and "rateLimitExceeded" in answer.body["error"]


class Recording:
    """The capacity port, with the names whose status was read."""

    def __init__(self, capacity: Capacity) -> None:
        self.capacity = capacity
        self.read: list[str] = []

    def status(self, zone: str, name: str) -> CapacityStatus | None:
        self.read.append(name)
        return self.capacity.status(zone, name)


def test_a_pool_jobs_key_waits_for_its_units_holding_which_is_active(engine):
    """A warm-pool job's hosts are its unit's, whose holding is ACTIVE before any job is put on it:
    the key reads the unit's holding (not a holding of the job's own) and is handed out at once."""
    jobs = pooled(engine, OffsetClock())
    job = jobs.job()
    assert job.unit_requested_at is not None
    tokens = UnitVmTokens()
    vm = tokens.vm(jobs, "1001", made=job.unit_requested_at + timedelta(seconds=30))
    assert register(jobs, tokens, vm, UNIT_SECRET).status == 200
    holdings = Recording(jobs.capacity)
    answer = ask(key_api(jobs, tokens, holdings), jobs, vm, unit_secret=UNIT_SECRET.hex())
    assert answer.status == 200, answer.body
    assert holdings.read == [job.warm_pool_unit]


def test_the_next_attempts_key_waits_while_the_preempted_hosts_still_save(jobs, tokens, capacity, clock):
    """Preempted, attempt 1's queued resource kept through its grace (`held_over`) and attempt 2's
    ACTIVE at once: attempt 2's hosts wait (409 SAVING) while attempt 1's hosts that started have
    not said their command ended (`stopped`, after the notice), so attempt 2 resumes from their
    save; once both have, the key is given, and attempt 2 is untouched by those reports."""
    provisioning(jobs, capacity="spot", on_preemption="resume", max_restarts=3)
    capacity.set_state(holding(jobs), HoldingState.ACTIVE)
    jobs.report("started", 1)
    jobs.report("started", 1, worker=1)
    capacity.set_state("train-1-a1", HoldingState.LOSING)
    jobs.qr_state({"queued_resource": "train-1-a1", "zone": ZONE, "state": "LOSING"})
    assert jobs.job().attempt == 2 and [h.holding for h in jobs.job().held_over] == ["train-1-a1"]
    capacity.set_state("train-1-a2", HoldingState.ACTIVE)
    clock.advance(1)
    api = key_api(jobs, tokens, capacity)
    vm = tokens.vm("t2", jobs)
    saving = ask(api, jobs, vm, attempt=2)
    assert saving.status == 409, saving.body
    assert (
        saving.body["state"] == "SAVING"
        and "attempt 1" in saving.body["error"]
        and "2 not exited" in saving.body["error"]
    )
    jobs.report("stopped", 1, exit_code=143)  # its save done, the command ended after the notice
    assert ask(api, jobs, vm, attempt=2).status == 409  # one host still saving
    jobs.report("stopped", 1, worker=1, exit_code=0)
    granted = ask(api, jobs, vm, attempt=2)
    assert granted.status == 200, granted.body
    assert (jobs.job().attempt, jobs.job().state) == (2, JobState.PROVISIONING)

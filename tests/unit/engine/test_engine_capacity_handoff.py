"""Issue 37 item 2: the jobs API holds no capacity. It commits what a user asks and hands the
capacity work to the converge function (tpujobs-converge, an id and nothing else), which does it.

The API here is built as runtime builds it (`instances.api_engine`): the same stores, no capacity
(`NoCapacity`, which refuses every call), and the recording publisher as its hand-off; the engine
it hands off to is the harness's own, on this test's TPU simulator.
"""

from __future__ import annotations

from typing import Any

import pytest
from engine_harness import ZONE, Engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpujobs.domain import pools
from tpujobs.domain.states import JobState
from tpujobs.engine.capacity_handoff import CapacityNotHeld, NoCapacity
from tpujobs.local.fakes import InMemoryAccessPolicies

ADA = "ada@example.com"
EVE = "eve@example.com"
ADMIN = "root@example.com"
SPEC = {"job_id": "train-1", "name": "train", "accelerator_type": "v4-8", "command": "python train.py"}
OWNED = {**SPEC, "owner": ADA}


@pytest.fixture
def jobs(engine) -> Engine:
    allowed = {"groups": {"makers": [ADA]}, "policies": {"pools": ["group:makers"]}}
    return engine(admins=(ADMIN,), access=InMemoryAccessPolicies.from_documents(allowed).allowed)


@pytest.fixture
def api(jobs: Engine) -> Any:
    """The jobs API's engine: no capacity, its capacity work handed off."""
    return jobs.handing_off()


def call(jobs: Engine, api: Any, caller: str, action: str, **body: Any) -> tuple[int, Any]:
    answer = jobs.api_on(api, {"action": action, **body}, caller)
    return answer.status, answer.body


def test_a_submission_through_the_api_is_committed_queued_and_provisioned_by_the_converge_function(jobs, api):
    """The API answers QUEUED having asked for no capacity; the hand-off names the job, and its
    delivery requests the job's queued resource."""
    status, body = call(jobs, api, ADA, "submit", **SPEC)
    assert (status, body["state"], body["outcome"]) == (200, "QUEUED", "queued")
    assert jobs.live_capacity() == set()
    assert jobs.deliver_handoffs() == [("job", "train-1")]
    assert jobs.job().state is JobState.PROVISIONING
    assert jobs.live_capacity() == {jobs.job().queued_resource}


def test_a_cancel_through_the_api_answers_cancelled_and_the_converge_function_releases(jobs, api):
    """`cancel` answers the state after (CANCELLED) at once; the capacity goes when the hand-off
    is delivered, not in the API."""
    assert jobs.submit(OWNED).kind == "provisioning"
    held = jobs.job().queued_resource
    status, body = call(jobs, api, ADA, "cancel", job_id="train-1")
    assert (status, body["state"], body["previous_state"]) == (200, "CANCELLED", "PROVISIONING")
    assert jobs.live_capacity() == {held}
    jobs.deliver_handoffs()
    assert jobs.live_capacity() == set()


def test_a_retried_cancel_hands_the_release_off_again(jobs, api):
    """A cancel whose first hand-off was lost is finished by the retry: CANCELLED already, so the
    API hands the job off once more, and the capacity goes."""
    assert jobs.submit(OWNED).kind == "provisioning"
    call(jobs, api, ADA, "cancel", job_id="train-1")
    jobs.published.take_handoffs()  # lost
    status, body = call(jobs, api, ADA, "cancel", job_id="train-1")
    assert (status, body["state"]) == (200, "CANCELLED")
    assert jobs.deliver_handoffs() == [("job", "train-1")]
    assert jobs.live_capacity() == set()


def test_a_rerun_through_the_api_is_provisioned_by_the_converge_function(jobs, api):
    """A rerun commits the new attempt QUEUED; its capacity is asked for where it is held."""
    assert jobs.submit(OWNED).kind == "provisioning"
    jobs.cancel("train-1", "by hand")
    status, body = call(jobs, api, ADA, "rerun", job_id="train-1", request_id="r-1")
    assert (status, body["outcome"], body["state"], body["attempt"]) == (200, "started", "QUEUED", 2)
    jobs.deliver_handoffs()
    job = jobs.job()
    assert (job.state, job.attempt) == (JobState.PROVISIONING, 2)
    assert jobs.live_capacity() == {job.queued_resource}


def test_a_pool_made_and_deleted_through_the_api_gets_and_loses_its_units_in_the_converge_function(jobs, api):
    """pool-create writes the pool and hands it off, and its delivery requests the units;
    pool-delete likewise cancels the pool's jobs and releases them."""
    pool = {"name": "demo", "accelerator_type": "v4-8", "count": 2}
    status, _ = call(jobs, api, ADA, "pool-create", **pool)
    assert status == 200
    assert jobs.live_capacity() == set()
    assert jobs.deliver_handoffs() == [("pool", "demo")]
    made = jobs.warm_pools.get("demo")
    assert made is not None and {u.state for u in made.units} == {pools.UnitState.REQUESTED}
    assert len(jobs.live_capacity()) == 2
    status, _ = call(jobs, api, ADA, "pool-resize", name="demo", count=1)
    assert status == 200
    jobs.deliver_handoffs()
    assert len(jobs.live_capacity()) == 1
    status, _ = call(jobs, api, ADA, "pool-delete", name="demo")
    assert status == 200
    jobs.deliver_handoffs()
    assert jobs.live_capacity() == set() and jobs.warm_pools.get("demo") is None


def test_a_forged_hand_off_does_only_what_firestore_says(jobs):
    """A converge message for a running job, a job that does not exist or a pool that does not
    changes nothing, and writes nothing: no rejection, no event."""
    assert jobs.submit(OWNED).kind == "provisioning"
    before = (jobs.job(), jobs.events(), jobs.live_capacity())
    jobs.converge({"action": "converge", "job_id": "train-1"})
    jobs.converge({"action": "converge", "job_id": "nobody-1"})
    jobs.converge({"action": "pool-converge", "name": "nopool"})
    assert (jobs.job(), jobs.events(), jobs.live_capacity()) == before
    assert jobs.rejections() == []


def test_a_hand_off_that_names_nothing_is_recorded(jobs):
    """Only the jobs function publishes on tpujobs-converge, so a malformed message is a rejection to read."""
    jobs.converge({"action": "converge", "job_id": "no spaces allowed"})
    jobs.converge({"action": "drop-everything"})
    assert len(jobs.rejections()) == 2


def test_the_api_engine_refuses_every_capacity_call(jobs):
    """NoCapacity acts on nothing: each method of the capacity port raises CapacityNotHeld (a bug,
    neither transient nor permanent, so never recorded as the platform's answer)."""
    capacity = NoCapacity()
    calls = [
        lambda: capacity.status(ZONE, "x"),
        lambda: capacity.release(ZONE, "x"),
        lambda: capacity.list_capacity(ZONE),
        lambda: capacity.create_error("op"),
        lambda: capacity.tell_hosts(ZONE, "x", 1, {}),
    ]
    for attempt in calls:
        with pytest.raises(CapacityNotHeld):
            attempt()
    assert not isinstance(CapacityNotHeld("x"), (ValueError, LookupError))


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=6,
)
converge_payloads = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"action": st.sampled_from(["converge", "pool-converge", "cancel", ""])},
        optional={
            "job_id": st.one_of(st.text(max_size=40), st.just("train-1")),
            "name": json_values,
            "owner": json_values,
        },
    ),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=converge_payloads)
def test_any_converge_message_returns_and_leaves_a_provisioning_job_as_it_is(jobs, payload):
    """Whatever arrives on tpujobs-converge, the handler returns, and a job whose state asks for
    nothing (PROVISIONING, its capacity held) keeps its state, attempt and capacity."""
    if jobs.store.get("train-1") is None:
        assert jobs.submit(OWNED).kind == "provisioning"
    before = jobs.job()
    jobs.converge(payload)
    after = jobs.job()
    assert (after.state, after.attempt, after.queued_resource) == (before.state, before.attempt, before.queued_resource)

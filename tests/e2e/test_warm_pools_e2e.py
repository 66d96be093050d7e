"""Warm pools end to end on the local stack: pools made through the jobs API, their units real
queued resources of the TPU simulator whose hosts run the pool-mode agent as local processes,
and jobs submitted on them through the API (a job on a pool needs a verified owner).

Each test makes its own pool, and deletes it at the end whatever happened, so one failure
leaves no unit behind for the next test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from stack_reads import worker_output

from tpujobs.cli.demo_pool import LocalPools
from tpujobs.domain.states import ATTEMPT_LIVE, JobState
from tpujobs.engine.settings import Settings
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

OWNER = "ada@example.com"
TIMEOUT = 180.0  # seconds any one wait may take: units boot, jobs run, preempted capacity comes back


@pytest.fixture(scope="module")
def pools(local_stack) -> LocalPools:
    """The stack's warm pools through the jobs API, as OWNER, whom config/policies lets create pools."""
    client = LocalPools(Settings.from_env(), local_stack, owner=OWNER)
    client.allow()
    return client


@pytest.fixture
def pool(pools: LocalPools) -> Iterator[str]:
    """A new pool of two v4-8 units, both idle; deleted (and its capacity released) afterwards."""
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    pools.create(name, count=2)
    try:
        pools.wait_idle(name, 2, TIMEOUT)
        yield name
    finally:
        if pools.describe(name) is not None:
            pools.delete(name)
        pools.wait_gone(name, TIMEOUT)


def on_pool(name: str, command: str, **spec: object) -> dict[str, object]:
    return {"name": "pool-e2e", "accelerator_type": "v4-8", "pool": name, "command": command, **spec}


def unit_queued_resources(pools: LocalPools, name: str) -> set[str]:
    """The queued resources the pool's document says its units hold now."""
    described = pools.describe(name)
    assert described is not None, f"pool {name} is gone"
    return {unit["queued_resource"] for unit in described["units"] if unit["state"] != "RELEASED"}


def running_on_unit(pools: LocalPools, job_id: str):
    def probe():
        job = pools.store.get(job_id)
        return job if job is not None and job.state is JobState.RUNNING and job.warm_pool_unit else None

    return wait_for(probe, timeout=TIMEOUT, interval=0.1, what=f"{job_id} RUNNING on a unit")


# Each job lists what it finds in its working directory and any process a job before it left
# behind (a double-forked daemon carrying the test's marker), then leaves both behind itself.
CLEAN_UNIT_COMMAND = (
    'echo "job=$TPUJOBS_JOB_ID"; '
    "ls -A | sed 's/^/found: /'; "
    'echo "leftover processes: $(pgrep -fc "leftover-$MARK")"; '
    'touch "left-by-$TPUJOBS_JOB_ID"; '
    '(setsid bash -c "sleep 600; echo leftover-$MARK" >/dev/null 2>&1 &)'
)


def test_a_pool_of_two_units_runs_three_jobs_one_after_another_on_the_capacity_it_holds(env, pools, pool):
    """Three jobs run on the pool's two units with no queued resource of their own, each
    SUCCEEDED, each in a fresh directory with nothing left running by the job before it."""
    units = pools.queued_resources(f"{pool}-u")
    assert units == {f"{pool}-u0-g1", f"{pool}-u1-g1"}
    before = pools.queued_resources()
    marker = uuid.uuid4().hex[:10]
    job_ids = []
    for _ in range(3):
        job_id, _ = pools.submit(on_pool(pool, CLEAN_UNIT_COMMAND, env={"MARK": marker}))
        job = pools.ended(job_id, TIMEOUT)
        assert job.state is JobState.SUCCEEDED, job.state_reason
        job_ids.append(job_id)

    assert pools.queued_resources(f"{pool}-u") == units
    made = pools.queued_resources() - before
    assert not made, f"queued resources made while the jobs ran: {sorted(made)}"
    ran_on = []
    for job_id in job_ids:
        job = pools.store.get(job_id)
        assert job is not None
        assert [u.pool for u in job.usage] == [pool]
        assert job.warm_pool == pool and job.warm_pool_unit in units
        ran_on.append(job.warm_pool_unit)
        output = worker_output(env, job_id)
        assert f"job={job_id}" in output
        assert "found: " not in output, f"{job_id} found files in its working directory:\n{output}"
        assert "leftover processes: 0" in output, output
    assert len(set(ran_on)) < len(ran_on)  # three jobs on two units: a unit ran two of them, one after another


def test_a_unit_preempted_mid_job_comes_back_and_the_job_resumes_on_the_pool(env, pools, pool):
    """Preempting a busy unit: the unit is asked for again (generation 2) and is ACTIVE, the
    job resumes on a unit with TPUJOBS_RESUME=1 and the same checkpoint prefix and succeeds,
    and the simulator holds exactly the pool's current units."""
    command = (
        'echo "attempt=$TPUJOBS_ATTEMPT resume=${TPUJOBS_RESUME:-0} checkpoint=$TPUJOBS_CHECKPOINT_URI"; '
        'if [ "$TPUJOBS_ATTEMPT" = 1 ]; then sleep 600; fi'
    )
    job_id, _ = pools.submit(on_pool(pool, command, on_preemption="resume"))
    job = running_on_unit(pools, job_id)
    unit_qr = job.warm_pool_unit
    index = int(unit_qr.rsplit("-u", 1)[1].split("-g")[0])
    wait_for(lambda: "attempt=1" in worker_output(env, job_id, 1), timeout=TIMEOUT, what="attempt 1's first line")

    env["control"].preempt(env["zone"], unit_qr, env["project"])

    job = pools.ended(job_id, TIMEOUT)
    assert job.state is JobState.SUCCEEDED, job.state_reason
    assert job.attempt == 2 and job.restarts == 1
    assert [u.pool for u in job.usage] == [pool, pool]
    assert job.usage[0].capacity_lost
    first, second = worker_output(env, job_id, 1), worker_output(env, job_id, 2)
    checkpoint = first.split("checkpoint=", 1)[1].split()[0]
    assert checkpoint.startswith("gs://") and job_id in checkpoint
    assert f"attempt=2 resume=1 checkpoint={checkpoint}" in second, second

    def unit_back():
        described = pools.describe(pool)
        unit = next(u for u in described["units"] if u["index"] == index)
        ready = unit["state"] in ("IDLE", "BUSY") and unit["capacity_state"] == "ACTIVE"
        return unit if ready and unit["queued_resource"] == f"{pool}-u{index}-g2" else None

    wait_for(unit_back, timeout=TIMEOUT, interval=0.2, what=f"unit {index} of {pool} back as generation 2")

    def nothing_leaked():
        return pools.queued_resources(f"{pool}-u") == unit_queued_resources(pools, pool)

    wait_for(nothing_leaked, timeout=TIMEOUT, interval=0.2, what=f"only {pool}'s current units in the simulator")
    assert not pools.queued_resources(f"{job_id}-a")


def test_deleting_a_pool_cancels_its_job_moves_the_one_that_may_provision_and_releases_every_unit(env, pools, pool):
    """Deleting a pool while two jobs run on it: the job that waits for its pool is CANCELLED,
    the one with `pool_fallback: provision` goes on on capacity of its own and SUCCEEDS, and
    every unit and the pool's document are gone."""
    stays, _ = pools.submit(on_pool(pool, "sleep 600"))
    moves, _ = pools.submit(
        on_pool(
            pool, 'if [ "$TPUJOBS_ATTEMPT" = 1 ]; then sleep 600; fi; echo "own capacity"', pool_fallback="provision"
        )
    )
    assert running_on_unit(pools, stays).warm_pool_unit != running_on_unit(pools, moves).warm_pool_unit

    pools.delete(pool)

    cancelled = pools.ended(stays, TIMEOUT)
    assert cancelled.state is JobState.CANCELLED, cancelled.state_reason
    assert pool in cancelled.state_reason
    moved = pools.ended(moves, TIMEOUT)
    assert moved.state is JobState.SUCCEEDED, moved.state_reason
    assert moved.usage[0].pool == pool and moved.usage[-1].pool == ""
    assert moved.queued_resource.startswith(f"{moves}-a")
    assert "own capacity" in worker_output(env, moves, moved.attempt)

    pools.wait_gone(pool, TIMEOUT)
    wait_for(lambda: not pools.queued_resources(f"{moves}-a"), timeout=TIMEOUT, what=f"{moves}'s own capacity released")
    assert all(pools.store.get(j).state not in ATTEMPT_LIVE for j in (stays, moves))

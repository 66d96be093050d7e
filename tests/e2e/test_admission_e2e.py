"""Quota admission on the local stack: jobs through Pub/Sub, workers that really run.

A pool of its own (v5litepod in us-east5-a), so the quota does not hold back the other
end-to-end tests sharing the stack.
"""

from __future__ import annotations

import pytest
from google.cloud import firestore

from tpujobs.adapters.firestore_pools import FirestorePools
from tpujobs.domain.states import JobState
from tpujobs.engine.topology import CONTROL
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e

ZONE = "us-east5-a"
POOL = "v5litepod@us-east5"  # its admission pool: the family's on-demand chips in the zone's region


@pytest.fixture
def one_at_a_time(env):
    pools = FirestorePools(firestore.Client(project=env["project"]))
    pools.set_quota(ZONE, "v5litepod", "on-demand", 8)  # one on-demand v5litepod-8 at a time
    yield pools
    pools.set_quota(ZONE, "v5litepod", "on-demand", None)


def state_of(env, job_id: str, wanted: JobState):
    def probe():
        job = env["store"].get(job_id)
        return job if job is not None and job.state is wanted else None

    probe.__doc__ = f"{job_id} {wanted.value}"
    return wait_for(probe, timeout=60)


def test_the_second_job_waits_for_quota_and_runs_when_the_first_is_cancelled(env, submit_job, one_at_a_time):
    spec = {"accelerator_type": "v5litepod-8", "zone": ZONE, "capacity": "on-demand"}
    first = submit_job(prefix="quota-a", command="sleep 120", **spec)
    state_of(env, first, JobState.RUNNING)
    second = submit_job(prefix="quota-b", command="echo second job ran", **spec)

    waiting = state_of(env, second, JobState.QUEUED)
    wait_for(lambda: "Waiting for quota" in env["store"].get(second).state_reason or None, timeout=30)
    assert waiting.attempt == 1
    assert [h.job_id for h in one_at_a_time.view(POOL).holders] == [first]

    env["publisher"].publish_json(CONTROL, {"action": "cancel", "job_id": first, "owner": "ada@example.com"})
    state_of(env, first, JobState.CANCELLED)
    done = state_of(env, second, JobState.SUCCEEDED)
    assert done.attempt == 1 and done.accounting().chip_hours > 0
    wait_for(lambda: one_at_a_time.view(POOL).holders == () or None, timeout=30)  # freed after the commit

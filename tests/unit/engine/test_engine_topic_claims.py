"""tpujobs-control grants nothing by claim (issue 26): its `owner` is whatever the publisher
wrote, so unless config/policies sets `trust_topic_owners`, a message acts only on a job or a pool
that a claim made for that same claimed owner; never on what the jobs API's verified callers own,
and a claimed admin is a claim too. With the setting on, the claim counts as it did before."""

from __future__ import annotations

from typing import Any

import pytest
from engine_harness import Engine

from tpujobs.domain.access import AccessPolicies
from tpujobs.domain.states import JobState

ADA = "ada@example.com"
ADMIN = "root@example.com"
SPEC = {"job_id": "train-1", "name": "train", "owner": ADA, "accelerator_type": "v4-8", "command": "true"}
POOL = {"name": "demo", "accelerator_type": "v4-8", "count": 2}
UNTRUSTED = AccessPolicies(pools=(ADA,))
TRUSTED = AccessPolicies(pools=(ADA,), trust_topic_owners=True)


@pytest.fixture
def jobs(engine) -> Engine:
    return engine(admins=(ADMIN,), access=UNTRUSTED)


def control(jobs: Engine, action: str, owner: str = ADA, **fields: Any) -> list[str]:
    """A tpujobs-control message; the reasons of the rejections it added."""
    before = len(jobs.rejections())
    jobs.control({"action": action, "owner": owner, **fields})
    return [r.reason for r in jobs.rejections()[before:]]


def submitted_through_the_api(jobs: Engine) -> None:
    assert jobs.submit_verified(SPEC).kind == "provisioning"
    assert jobs.job().owner_verified


def submitted_on_the_topic(jobs: Engine) -> None:
    assert jobs.submit(SPEC).kind == "provisioning"
    assert not jobs.job().owner_verified


def test_a_claim_of_the_same_name_may_not_cancel_a_job_the_api_verified(jobs):
    """Ada's API job stays as it was; the rejection says why and what to do instead."""
    submitted_through_the_api(jobs)
    reasons = control(jobs, "cancel", job_id="train-1")
    assert jobs.job().state is JobState.PROVISIONING
    assert len(reasons) == 1 and "verified principal (ada@example.com)" in reasons[0]
    assert "TPUJOBS_API_URL" in reasons[0] and "trust_topic_owners" in reasons[0]


@pytest.mark.parametrize("action", ["resume", "rerun"])
def test_a_claim_may_not_restart_a_job_the_api_verified(jobs, action):
    """An ended API job is neither resumed nor rerun by a claim: no new attempt, no request kept."""
    submitted_through_the_api(jobs)
    jobs.cancel("train-1", "Cancelled by ada@example.com.")
    ended = jobs.job()
    reasons = control(jobs, action, job_id="train-1", request_id="r-1")
    after = jobs.job()
    assert (after.state, after.attempt, after.restart_requests) == (JobState.CANCELLED, ended.attempt, ())
    assert len(reasons) == 1 and f"may not {action} it" in reasons[0]


def test_a_claimed_admin_may_not_cancel_anothers_claimed_job(jobs):
    """An admin's e-mail in `owner` is a claim as well: it gives no admin power on the topic."""
    submitted_on_the_topic(jobs)
    reasons = control(jobs, "cancel", owner=ADMIN, job_id="train-1")
    assert jobs.job().state is JobState.PROVISIONING
    assert len(reasons) == 1 and "only a claimed admin" in reasons[0]


def test_the_claimed_owner_still_cancels_a_job_a_claim_submitted(jobs):
    """What the topic made, the topic may end: the same claim owns it."""
    submitted_on_the_topic(jobs)
    assert control(jobs, "cancel", job_id="train-1") == []
    assert jobs.job().state is JobState.CANCELLED


def test_trusting_topic_owners_keeps_the_old_rights(jobs):
    """With trust_topic_owners: the owner's claim cancels and resumes an API job, a claimed admin cancels."""
    jobs.access.allowed = TRUSTED
    submitted_through_the_api(jobs)
    assert control(jobs, "cancel", job_id="train-1") == []
    assert jobs.job().state is JobState.CANCELLED
    assert control(jobs, "resume", job_id="train-1", request_id="r-1") == []
    assert jobs.job().attempt == 2 and not jobs.job().state.is_terminal
    assert control(jobs, "cancel", owner=ADMIN, job_id="train-1") == []
    assert jobs.job().state is JobState.CANCELLED


def test_a_claim_may_neither_resize_nor_delete_a_pool_the_api_made(jobs):
    """Deleting a pool would cancel every job on it: a claim of its owner's name changes nothing."""
    assert jobs.create_pool(POOL, ADA, verified=True).kind == "done"
    resized = control(jobs, "pool-resize", name="demo", count=1)
    deleted = control(jobs, "pool-delete", name="demo")
    pool = jobs.warm_pools.get("demo")
    assert pool is not None and pool.owner_verified and pool.count == 2 and pool.state.value == "ACTIVE"
    assert len(resized) == 1 and "pool demo is owned by a verified principal" in resized[0]
    assert len(deleted) == 1 and "may not delete it" in deleted[0]
    assert jobs.resize_pool("demo", 1, ADA).kind == "done"  # the jobs API's verified caller still may


def test_a_pool_a_trusted_claim_made_stays_its_claimed_owners_alone(jobs):
    """Made on the topic while claims were trusted, then trust is off: its claimed owner resizes
    it, a claimed admin may not delete it; with trust again, the claimed admin may."""
    jobs.access.allowed = TRUSTED
    assert control(jobs, "pool-create", pool=POOL) == []
    pool = jobs.warm_pools.get("demo")
    assert pool is not None and not pool.owner_verified
    jobs.access.allowed = UNTRUSTED
    assert control(jobs, "pool-resize", name="demo", count=1) == []
    assert jobs.warm_pools.get("demo").count == 1
    refused = control(jobs, "pool-delete", owner=ADMIN, name="demo")
    assert len(refused) == 1 and "only a claimed admin" in refused[0]
    assert jobs.warm_pools.get("demo").state.value == "ACTIVE"
    jobs.access.allowed = TRUSTED
    assert control(jobs, "pool-delete", owner=ADMIN, name="demo") == []
    gone = jobs.warm_pools.get("demo")
    assert gone is None or gone.state.value == "DELETING"

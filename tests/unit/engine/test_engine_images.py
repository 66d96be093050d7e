"""Images as the engine records them: each host's `started` report names the image digest it
runs, and the attempt's usage keeps it as a flat string (`usage[].image_digest`). An `exited`
report whose agent ended the attempt itself (an image it could not pull) puts its words in the
job's reason, and the job's `on_error` rule decides, as for any non-zero exit.
"""

from __future__ import annotations

import pytest
from engine_harness import Engine

from tpujobs.domain.states import JobState

IMAGE = "127.0.0.1:5000/team/trainer:v1"
DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


@pytest.fixture
def jobs(engine) -> Engine:
    return engine()


def submitted(jobs: Engine, **changes: object) -> str:
    """A v4-16 job (two hosts) with an image, PROVISIONING at attempt 1."""
    spec = {
        "job_id": "img-1",
        "name": "img",
        "owner": "ada@example.com",
        "accelerator_type": "v4-16",
        "command": "python train.py",
        "image": IMAGE,
        **changes,
    }
    assert jobs.submit(spec).kind == "provisioning"
    return "img-1"


def test_the_digest_a_host_ran_is_on_the_attempts_usage_as_a_flat_string(jobs) -> None:
    """The first host's digest is the attempt's, and the timeline says which image started."""
    job_id = submitted(jobs)

    jobs.report("started", 1, worker=0, job_id=job_id, image_digest=DIGEST)
    jobs.report("started", 1, worker=1, job_id=job_id, image_digest=DIGEST)

    document = jobs.store.job_document(jobs.job(job_id))
    assert document["state"] == "RUNNING"
    assert document["usage"][0]["image_digest"] == DIGEST
    assert document["usage"][0]["other_image_digest"] is None
    assert any(DIGEST in event.reason for event in jobs.events(job_id))
    assert jobs.rejections() == []


def test_hosts_that_ran_different_images_keep_both_digests(jobs) -> None:
    """A tag that moved between two hosts' pulls is recorded, not hidden behind the first digest."""
    job_id = submitted(jobs)

    jobs.report("started", 1, worker=0, job_id=job_id, image_digest=DIGEST)
    jobs.report("started", 1, worker=1, job_id=job_id, image_digest=OTHER)

    usage = jobs.job(job_id).usage[0]
    assert (usage.image_digest, usage.other_image_digest) == (DIGEST, OTHER)


def test_each_attempt_keeps_its_own_digest(jobs) -> None:
    """After a preemption the next attempt records the digest its hosts pulled, the first keeps its own."""
    job_id = submitted(jobs, max_restarts=2)
    jobs.report("started", 1, worker=0, job_id=job_id, image_digest=DIGEST)
    jobs.preempt(1, job_id=job_id)
    assert jobs.job(job_id).attempt == 2

    jobs.report("started", 2, worker=0, job_id=job_id, image_digest=OTHER)

    first, second = jobs.job(job_id).usage
    assert (first.image_digest, second.image_digest) == (DIGEST, OTHER)


def test_a_malformed_digest_refuses_the_report_and_changes_nothing(jobs) -> None:
    """Like any malformed report: a rejection naming the field, the job untouched."""
    job_id = submitted(jobs)

    jobs.report("started", 1, worker=0, job_id=job_id, image_digest="sha256:nothex")

    job = jobs.job(job_id)
    assert job.state is JobState.PROVISIONING and job.usage[0].image_digest is None
    assert any("image_digest" in r.reason for r in jobs.rejections())


def test_a_pull_that_failed_names_the_image_in_the_reason_and_fails_under_on_error_fail(jobs) -> None:
    """The agent's detail is the reason; on_error decides (fail), as for any non-zero exit."""
    job_id = submitted(jobs, on_error="fail")
    said = f"could not pull image {IMAGE}: not found"

    jobs.report("exited", 1, worker=1, job_id=job_id, exit_code=1, detail=said)

    job = jobs.job(job_id)
    assert job.state is JobState.FAILED and job.exit_code == 1
    assert job.state_reason.startswith(f"Worker 0-1 exited with 1: {said}")


def test_a_failed_pull_is_retried_when_on_error_says_so(jobs) -> None:
    """on_error: rerun counts the failed pull as a restart, like any error."""
    job_id = submitted(jobs, on_error="rerun", max_restarts=1)

    jobs.report("exited", 1, worker=0, job_id=job_id, exit_code=1, detail=f"could not pull image {IMAGE}: denied")

    job = jobs.job(job_id)
    assert job.attempt == 2 and job.restarts == 1
    assert any(f"could not pull image {IMAGE}: denied" in e.reason for e in jobs.events(job_id))

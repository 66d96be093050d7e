"""Images as the service records them, on the Firestore emulator and the TPU simulator.

Each host's `started` report names the image digest it runs; the attempt's usage on the job
document keeps it as a flat string (`usage[].image_digest`). An `exited` report whose agent
ended the attempt itself (an image it could not pull) puts its words in the job's reason,
and the job's `on_error` rule decides, as for any non-zero exit.
"""

from __future__ import annotations

import pytest

from tpujobs.domain.states import JobState
from tpujobs.engine.job_service import JobService
from tpujobs.local.testing import inbound, signed

pytestmark = pytest.mark.emulator

EVENTS = "tpujobs-worker-events"
IMAGE = "127.0.0.1:5000/team/trainer:v1"
DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


@pytest.fixture
def service(job_service) -> JobService:
    return job_service()


def submitted(service: JobService, **changes: object) -> str:
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
    assert service.submit(inbound("tpujobs-submit", spec)).kind == "provisioning"
    return "img-1"


def report(service: JobService, kind: str, worker: int, attempt: int = 1, **extra: object) -> None:
    payload = {"kind": kind, "job_id": "img-1", "attempt": attempt, "slice_id": 0, "worker_id": worker, **extra}
    service.on_worker_report(signed(service, EVENTS, payload))


def test_the_digest_a_host_ran_is_on_the_attempts_usage_as_a_flat_string(service, firestore_client) -> None:
    """The first host's digest is the attempt's, and the timeline says which image started."""
    job_id = submitted(service)

    report(service, "started", 0, image_digest=DIGEST)
    report(service, "started", 1, image_digest=DIGEST)

    doc = firestore_client.collection("jobs").document(job_id).get().to_dict()
    assert doc["state"] == "RUNNING"
    assert doc["usage"][0]["image_digest"] == DIGEST
    assert doc["usage"][0]["other_image_digest"] is None
    assert any(DIGEST in event.reason for event in service.store.events(job_id))
    assert service.store.rejections() == []


def test_hosts_that_ran_different_images_keep_both_digests(service) -> None:
    """A tag that moved between two hosts' pulls is recorded, not hidden behind the first digest."""
    job_id = submitted(service)

    report(service, "started", 0, image_digest=DIGEST)
    report(service, "started", 1, image_digest=OTHER)

    usage = service.store.get(job_id).usage[0]
    assert (usage.image_digest, usage.other_image_digest) == (DIGEST, OTHER)


def test_each_attempt_keeps_its_own_digest(service) -> None:
    """After a preemption the next attempt records the digest its hosts pulled, the first keeps its own."""
    job_id = submitted(service, max_restarts=2)
    report(service, "started", 0, image_digest=DIGEST)
    notice = {"job_id": job_id, "attempt": 1, "slice_id": 0, "worker_id": 0}
    service.on_preemption(signed(service, "tpujobs-preemption", notice))
    assert service.store.get(job_id).attempt == 2

    report(service, "started", 0, attempt=2, image_digest=OTHER)

    first, second = service.store.get(job_id).usage
    assert (first.image_digest, second.image_digest) == (DIGEST, OTHER)


def test_a_malformed_digest_refuses_the_report_and_changes_nothing(service) -> None:
    """Like any malformed report: a rejection naming the field, the job untouched."""
    job_id = submitted(service)

    report(service, "started", 0, image_digest="sha256:nothex")

    job = service.store.get(job_id)
    assert job.state is JobState.PROVISIONING and job.usage[0].image_digest is None
    assert any("image_digest" in r.reason for r in service.store.rejections())


def test_a_pull_that_failed_names_the_image_in_the_reason_and_fails_under_on_error_fail(service) -> None:
    """The agent's detail is the reason; on_error decides (fail), as for any non-zero exit."""
    job_id = submitted(service, on_error="fail")
    said = f"could not pull image {IMAGE}: not found"

    report(service, "exited", 1, exit_code=1, detail=said)

    job = service.store.get(job_id)
    assert job.state is JobState.FAILED and job.exit_code == 1
    assert job.state_reason.startswith(f"Worker 0-1 exited with 1: {said}")


def test_a_failed_pull_is_retried_when_on_error_says_so(service) -> None:
    """on_error: rerun counts the failed pull as a restart, like any error."""
    job_id = submitted(service, on_error="rerun", max_restarts=1)

    report(service, "exited", 0, exit_code=1, detail=f"could not pull image {IMAGE}: denied")

    job = service.store.get(job_id)
    assert job.attempt == 2 and job.restarts == 1
    assert any(f"could not pull image {IMAGE}: denied" in e.reason for e in service.store.events(job_id))

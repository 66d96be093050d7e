"""The TPU adapter's retries and error translation against the simulator's planned faults.

The simulator answers with Google's own error bodies (status, ErrorInfo, QuotaFailure), so the
real google-cloud-tpu REST client raises what it raises in production; `CloudTpu` must retry
blips inside the call, adopt a resource whose create answer was lost, and never retry a quota.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from tpujobs.adapters.google_errors import transient_retry
from tpujobs.adapters.tpu import CloudTpu
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.errors import PermanentError, QuotaExhausted, TransientError
from tpujobs.engine.ports import HostBoot
from tpujobs.local.simulator.client import SimulatorControl

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"
BOOT = HostBoot("tpu-vm@test.iam.gserviceaccount.com", {"startup-script": "true"})


def a_job(job_id: str = "train-1") -> Job:
    spec = parse_spec(
        {"job_id": job_id, "name": "train", "owner": "ada@example.com", "accelerator_type": "v4-8", "command": "x"}
    )
    job, _ = new_job(spec, ZONE, datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc))
    return job


def plan(simulator_url: str, method: str, code: int | str, count: int = 1, **fault: Any) -> None:
    """The next `count` calls of `method` answer with this fault (simulator control API)."""
    SimulatorControl(simulator_url).plan_errors(method, code, count, **fault)


def planned(simulator_url: str, method: str) -> int:
    """How many planned faults of `method` no call has met yet."""
    return len(SimulatorControl(simulator_url).faults()["errors"].get(method, []))


@pytest.fixture
def tpu(tpu_client, project_id) -> CloudTpu:
    return CloudTpu(tpu_client, project_id)


@pytest.mark.parametrize("code", ["UNKNOWN", "CANCELLED", "DATA_LOSS", 408, 502, 503, "ABORTED"])
def test_a_create_that_meets_a_blip_is_retried_inside_the_call(tpu, simulator_url, code):
    """One blip on create (issue 12: these once failed the job for good) costs a retry, nothing more."""
    plan(simulator_url, "create", code)
    status = tpu.request(a_job(), BOOT)
    assert status.name == "train-1-a1"
    assert planned(simulator_url, "create") == 0
    assert [s.name for s in tpu.list_capacity(ZONE)] == ["train-1-a1"]


def test_a_create_whose_answer_was_lost_is_adopted_on_the_retry(tpu, simulator_url):
    """DEADLINE_EXCEEDED after the service acted: the retried create finds it and adopts it."""
    plan(simulator_url, "create", "DEADLINE_EXCEEDED", applied=True)
    status = tpu.request(a_job(), BOOT)
    assert status.name == "train-1-a1"
    assert len(tpu.list_capacity(ZONE)) == 1


def test_a_rate_limited_create_is_retried_and_succeeds(tpu, simulator_url):
    """A 429 with ErrorInfo RATE_LIMIT_EXCEEDED is a plain blip: retried, not a quota."""
    plan(simulator_url, "create", 429, count=2)
    assert tpu.request(a_job(), BOOT).name == "train-1-a1"
    assert planned(simulator_url, "create") == 0


def test_a_create_refused_for_quota_raises_quota_exhausted_at_once(tpu, simulator_url):
    """A quota that ran out is never retried inside the call; the error is Google's own words
    (they become the waiting job's reason), naming the quota and the zone."""
    plan(simulator_url, "create", 429, count=2, quota=True)
    with pytest.raises(QuotaExhausted) as raised:
        tpu.request(a_job(), BOOT)
    assert planned(simulator_url, "create") == 1  # one attempt, not a retry loop
    message = str(raised.value)
    assert message.startswith("Quota limit 'TPUsPerProjectPerZoneForTPUAPI' has been exceeded")
    assert isinstance(raised.value.__cause__, QuotaExhausted)  # the table's classification, kept
    assert "TPUsPerProjectPerZoneForTPUAPI" in message and ZONE in message
    assert tpu.list_capacity(ZONE) == []


def test_a_refusal_is_permanent_and_not_retried(tpu, simulator_url):
    """PERMISSION_DENIED on read is no blip: one call, PermanentError naming service and action."""
    plan(simulator_url, "get", "PERMISSION_DENIED", count=2)
    with pytest.raises(PermanentError) as raised:
        tpu.status(ZONE, "train-1-a1")
    assert str(raised.value).startswith("TPU API refused to read queued resource train-1-a1: 403 ")
    assert planned(simulator_url, "get") == 1


def test_lists_and_deletes_are_retried_too(tpu, simulator_url):
    """Every method has the retry: a list and a delete each survive two blips."""
    tpu.request(a_job(), BOOT)
    plan(simulator_url, "list", "UNAVAILABLE", count=2)
    assert [s.name for s in tpu.list_capacity(ZONE)] == ["train-1-a1"]
    plan(simulator_url, "delete", "INTERNAL", count=2)
    tpu.release(ZONE, "train-1-a1")
    assert planned(simulator_url, "list") == planned(simulator_url, "delete") == 0


def test_an_outage_longer_than_the_retry_deadline_is_transient(tpu_client, project_id, simulator_url):
    """Blips past the in-call deadline raise TransientError: Pub/Sub redelivers the message."""
    tpu = CloudTpu(tpu_client, project_id, retry=transient_retry(deadline_s=0.5))
    plan(simulator_url, "create", 503, count=1000)
    with pytest.raises(TransientError) as raised:
        tpu.request(a_job(), BOOT)
    assert not isinstance(raised.value, QuotaExhausted)
    assert str(raised.value).startswith("TPU API failed to request queued resource train-1-a1: ")

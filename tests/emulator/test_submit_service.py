"""The submit use case on the real Firestore emulator, the TPU simulator and the real TPU client."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest

from tpujobs.adapters.firestore_store import REJECTIONS
from tpujobs.domain.states import JobState
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.job_service import JobService
from tpujobs.local.simulator.client import SimulatorControl

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def a_spec(**changes):
    spec = {
        "job_id": "train-1",
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-16",
        "command": "python train.py --steps 100",
        "labels": {"team": "research"},
    }
    spec.update(changes)
    return spec


def message(payload, message_id: str = "100") -> InboundMessage:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return InboundMessage(message_id, "tpujobs-submit", data)


@pytest.fixture
def service(job_service) -> JobService:
    return job_service(logs_bucket="", sleep=time.sleep)


def queued_resource(tpu_client, project_id: str, name: str, zone: str = ZONE):
    return tpu_client.get_queued_resource(name=f"projects/{project_id}/locations/{zone}/queuedResources/{name}")


def test_a_valid_spec_becomes_a_provisioning_job_and_one_queued_resource(service, tpu_client, project_id):
    """Submission records the job, requests {job_id}-a1 and mirrors its capacity state."""
    outcome = service.submit(message(a_spec(capacity="spot")))
    assert outcome.kind == "provisioning" and outcome.job_id == "train-1"
    job = service.store.get("train-1")
    assert job.state is JobState.PROVISIONING
    assert job.queued_resource == "train-1-a1"
    resource = queued_resource(tpu_client, project_id, "train-1-a1")
    assert job.capacity_state in {"ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE", "CREATING"}
    node_spec = resource.tpu.node_spec[0]
    assert node_spec.node_id == "train-1-a1"
    assert node_spec.node.accelerator_type == "v4-16"
    assert node_spec.node.labels["tpujobs-job"] == "train-1"
    assert node_spec.node.labels["team"] == "research"
    assert "startup-script" in node_spec.node.metadata
    assert resource.spot is not None and "spot" in type(resource).pb(resource).DESCRIPTOR.fields_by_name
    assert [e.to_state for e in service.store.events("train-1")] == [JobState.QUEUED, JobState.PROVISIONING]


def test_a_multislice_spec_asks_for_one_node_per_slice(service, tpu_client, project_id):
    """slices > 1 goes through multislice_params with the attempt's name as node prefix."""
    service.submit(message(a_spec(slices=2, accelerator_type="v5litepod-16")))
    resource = queued_resource(tpu_client, project_id, "train-1-a1")
    params = resource.tpu.node_spec[0].multislice_params
    assert params.node_count == 2 and params.node_id_prefix == "train-1-a1"


def test_the_same_spec_three_times_is_one_job_one_resource_and_no_extra_events(service, tpu_client, project_id):
    """Publishing one job_id three times (different message ids) changes nothing after the first."""
    outcomes = [service.submit(message(a_spec(), message_id=str(i))) for i in range(3)]
    assert [o.kind for o in outcomes] == ["provisioning", "duplicate", "duplicate"]
    assert len(service.store.events("train-1")) == 2
    listed = list(tpu_client.list_queued_resources(parent=f"projects/{project_id}/locations/{ZONE}"))
    assert [r.name.rsplit("/", 1)[-1] for r in listed] == ["train-1-a1"]


def test_a_redelivered_message_without_job_id_is_still_one_job(service):
    """The derived job id comes from the message id, so a redelivery names the same job."""
    spec = a_spec()
    del spec["job_id"]
    first = service.submit(message(spec, message_id="777"))
    again = service.submit(message(spec, message_id="777"))
    assert first.job_id == again.job_id and first.job_id.startswith("train-")
    assert again.kind == "duplicate"


def test_a_submission_that_stopped_half_way_is_finished_by_redelivery(service, tpu_client, project_id):
    """A job left QUEUED (crash before the TPU call) gets its capacity when the message returns."""
    from tpujobs.domain.job import new_job
    from tpujobs.domain.spec import parse_spec

    job, event = new_job(parse_spec(a_spec()), ZONE, utc_now())
    service.store.create(job, event)  # the first delivery died right after this
    outcome = service.submit(message(a_spec()))
    assert outcome.kind == "provisioning"
    assert service.store.get("train-1").state is JobState.PROVISIONING
    assert queued_resource(tpu_client, project_id, "train-1-a1").name.endswith("train-1-a1")


def test_an_existing_queued_resource_is_adopted_not_bought_twice(service, tpu_client, project_id):
    """If the request reached the TPU API before a crash, ALREADY_EXISTS is taken as ours."""
    from tpujobs.domain.job import new_job
    from tpujobs.domain.spec import parse_spec
    from tpujobs.engine.startup_script import host_boot

    job, event = new_job(parse_spec(a_spec()), ZONE, utc_now())
    service.store.create(job, event)
    service.tpu.request(job, host_boot(job, service.settings))  # died after the TPU call
    outcome = service.submit(message(a_spec()))
    assert outcome.kind == "provisioning"
    listed = list(tpu_client.list_queued_resources(parent=f"projects/{project_id}/locations/{ZONE}"))
    assert len(listed) == 1


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (b"not json at all", "JSON"),
        (b"[1, 2, 3]", "JSON object"),
        (b"\xff\xfe\x00bad", "UTF-8"),
        (json.dumps(a_spec(slices="2")).encode(), "slices"),
        (json.dumps(a_spec(surprise=True)).encode(), "surprise"),
        (json.dumps(a_spec(name="Bad_Name")).encode(), "name"),
        (json.dumps(a_spec(command="x" * 70_000)).encode(), "bytes"),
        (json.dumps(a_spec(accelerator_type="v99-8")).encode(), "accelerator_type"),
    ],
)
def test_malformed_input_is_recorded_as_a_rejection_and_acknowledged(service, firestore_client, payload, field):
    """Bad input returns normally (acknowledged) and leaves one rejection that names the problem."""
    outcome = service.submit(message(payload, message_id="555"))
    assert outcome.kind == "rejected"
    docs = [d.to_dict() for d in firestore_client.collection(REJECTIONS).stream()]
    assert len(docs) == 1
    assert field in docs[0]["reason"]
    assert docs[0]["topic"] == "tpujobs-submit"
    assert len(docs[0]["payload"]) <= 4096
    assert service.store.list_jobs() == []


def test_an_undecodable_message_is_rejected_with_its_reason(service, firestore_client):
    """A message whose data could not be decoded is recorded, not retried."""
    bad = InboundMessage("9", "tpujobs-submit", None, undecodable="message data is not valid base64")
    assert service.submit(bad).kind == "rejected"
    doc = firestore_client.collection(REJECTIONS).document("9").get().to_dict()
    assert doc["reason"] == "message data is not valid base64"


def test_a_different_spec_under_an_existing_job_id_is_recorded_and_ignored(service, firestore_client):
    """The job_id is the idempotency key: a changed spec under it is refused with a reason."""
    service.submit(message(a_spec(), message_id="1"))
    outcome = service.submit(message(a_spec(command="python other.py"), message_id="2"))
    assert outcome.kind == "duplicate"
    assert service.store.get("train-1").spec.command == "python train.py --steps 100"
    doc = firestore_client.collection(REJECTIONS).document("2").get().to_dict()
    assert "already exists" in doc["reason"]


class _RefusingTpu:
    """The TPU edge answering every request with a permanent error (a refused request)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def request(self, job, startup_script):
        raise self.error


def test_a_permanent_tpu_error_fails_the_job_with_the_reason(service):
    """A request the TPU API refuses for good ends the job FAILED, and the message is acknowledged."""
    service.tpu = _RefusingTpu(PermanentError("TPU API refused: 403 permission denied"))
    outcome = service.submit(message(a_spec()))
    assert outcome.kind == "failed"
    job = service.store.get("train-1")
    assert job.state is JobState.FAILED
    assert "permission denied" in job.state_reason
    assert job.ended_at is not None


def test_a_transient_tpu_error_raises_so_the_message_is_redelivered(service, simulator_url):
    """503s from the TPU API surface as TransientError and leave the job QUEUED for the retry."""

    def configure(rate: float) -> None:
        SimulatorControl(simulator_url).configure(api_error_rate=rate, seed=1)

    configure(1.0)
    with pytest.raises(TransientError):
        service.submit(message(a_spec()))
    assert service.store.get("train-1").state is JobState.QUEUED
    configure(0.0)
    assert service.submit(message(a_spec())).kind == "provisioning"

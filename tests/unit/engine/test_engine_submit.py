"""The submit use case on the fakes and the TPU simulator: what a submission becomes, what it
asks the TPU API for, and what it refuses."""

from __future__ import annotations

import json

import pytest
from engine_harness import PROJECT, ZONE, Engine, utc_now

from tpujobs.domain.job import new_job
from tpujobs.domain.spec import JobSpec, parse_spec, with_deployment_defaults
from tpujobs.domain.states import JobState
from tpujobs.domain.vm_defaults import VmDefaults
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.startup_script import host_boot


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


@pytest.fixture
def jobs(engine) -> Engine:
    return engine(logs_bucket="")


def queued_resource(tpu_client, name: str, zone: str = ZONE):
    return tpu_client.get_queued_resource(name=f"projects/{PROJECT}/locations/{zone}/queuedResources/{name}")


def listed(tpu_client) -> list[str]:
    return [
        r.name.rsplit("/", 1)[-1]
        for r in tpu_client.list_queued_resources(parent=f"projects/{PROJECT}/locations/{ZONE}")
    ]


def test_a_valid_spec_becomes_a_provisioning_job_and_one_queued_resource(jobs, tpu_client):
    """Submission records the job, requests {job_id}-a1 and mirrors its capacity state."""
    outcome = jobs.submit(a_spec(capacity="spot"))
    assert outcome.kind == "provisioning" and outcome.job_id == "train-1"
    job = jobs.job()
    assert job.state is JobState.PROVISIONING
    assert job.queued_resource == "train-1-a1"
    resource = queued_resource(tpu_client, "train-1-a1")
    assert job.capacity_state in {"WAITING", "PROVISIONING", "ACTIVE"}
    node_spec = resource.tpu.node_spec[0]
    assert node_spec.node_id == "train-1-a1"
    assert node_spec.node.accelerator_type == "v4-16"
    assert node_spec.node.labels["tpujobs-job"] == "train-1"
    assert node_spec.node.labels["team"] == "research"
    assert "startup-script" in node_spec.node.metadata
    assert resource.spot is not None and "spot" in type(resource).pb(resource).DESCRIPTOR.fields_by_name
    assert [e.to_state for e in jobs.events()] == [JobState.QUEUED, JobState.PROVISIONING]


def test_a_multislice_spec_asks_for_one_node_per_slice(jobs, tpu_client):
    """slices > 1 goes through multislice_params with the attempt's name as node prefix."""
    jobs.submit(a_spec(slices=2, accelerator_type="v5litepod-16"))
    params = queued_resource(tpu_client, "train-1-a1").tpu.node_spec[0].multislice_params
    assert params.node_count == 2 and params.node_id_prefix == "train-1-a1"


def test_the_same_spec_three_times_is_one_job_one_resource_and_no_extra_events(jobs, tpu_client):
    """Publishing one job_id three times (different message ids) changes nothing after the first."""
    outcomes = [jobs.submit(a_spec(), message_id=str(i)) for i in range(3)]
    assert [o.kind for o in outcomes] == ["provisioning", "duplicate", "duplicate"]
    assert len(jobs.events()) == 2
    assert listed(tpu_client) == ["train-1-a1"]


def test_a_redelivered_message_without_job_id_is_still_one_job(jobs):
    """The derived job id comes from the message id, so a redelivery names the same job."""
    spec = a_spec()
    del spec["job_id"]
    first = jobs.submit(spec, message_id="777")
    again = jobs.submit(spec, message_id="777")
    assert first.job_id == again.job_id and first.job_id.startswith("train-")
    assert again.kind == "duplicate"


def completed(spec: dict) -> JobSpec:
    """The spec as the first delivery stored it: with the deployment's defaults (its platform)."""
    return with_deployment_defaults(parse_spec(spec), VmDefaults())


def test_a_submission_that_stopped_half_way_is_finished_by_redelivery(jobs, tpu_client):
    """A job left QUEUED (crash before the TPU call) gets its capacity when the message returns."""
    job, event = new_job(completed(a_spec()), ZONE, utc_now())
    jobs.store.create(job, event)  # the first delivery died right after this
    assert jobs.submit(a_spec()).kind == "provisioning"
    assert jobs.job().state is JobState.PROVISIONING
    assert queued_resource(tpu_client, "train-1-a1").name.endswith("train-1-a1")


def test_an_existing_queued_resource_is_adopted_not_bought_twice(jobs, tpu_client):
    """If the request reached the TPU API before a crash, ALREADY_EXISTS is taken as ours."""
    job, event = new_job(completed(a_spec()), ZONE, utc_now())
    jobs.store.create(job, event)
    jobs.capacity.request(job, host_boot(job, jobs.settings))  # died after the TPU call
    assert jobs.submit(a_spec()).kind == "provisioning"
    assert len(listed(tpu_client)) == 1


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
def test_malformed_input_is_recorded_as_a_rejection_and_acknowledged(jobs, payload, field):
    """Bad input returns normally (acknowledged) and leaves one rejection that names the problem."""
    assert jobs.submit(payload, message_id="555").kind == "rejected"
    rejected = jobs.rejections()
    assert len(rejected) == 1
    assert field in rejected[0].reason
    assert rejected[0].topic == "tpujobs-submit"
    assert len(rejected[0].payload) <= 4096
    assert jobs.store.list_jobs() == []


def test_an_undecodable_message_is_rejected_with_its_reason(jobs):
    """A message whose data could not be decoded is recorded, not retried."""
    bad = InboundMessage("9", "tpujobs-submit", None, undecodable="message data is not valid base64")
    assert jobs.submit_message(bad).kind == "rejected"
    assert jobs.store.rejection("9").reason == "message data is not valid base64"


def test_a_different_spec_under_an_existing_job_id_is_rejected_not_a_duplicate(jobs):
    """The job_id is the idempotency key: a changed spec under it is refused with a reason."""
    jobs.submit(a_spec(), message_id="1")
    outcome = jobs.submit(a_spec(command="python other.py"), message_id="2")
    assert (outcome.kind, outcome.job_id) == ("rejected", "train-1")
    assert jobs.job().spec.command == "python train.py --steps 100"
    assert "is taken by another job" in jobs.store.rejection("2").reason


def test_another_owners_job_id_is_rejected_and_their_job_untouched(jobs):
    """Squatting: Bob's submit under Ada's job_id is no `duplicate`, and changes nothing of hers."""
    jobs.submit(a_spec(owner="ada@example.com"), message_id="1")
    held = jobs.job()
    outcome = jobs.submit(a_spec(owner="bob@example.com"), message_id="2")
    assert outcome.kind == "rejected" and "taken by another job" in outcome.reason
    assert "ada" not in outcome.reason  # whose job it is stays unsaid
    assert jobs.job() == held


def test_the_same_owners_identical_resubmit_is_the_only_duplicate(jobs):
    jobs.submit(a_spec(), message_id="1")
    assert jobs.submit(a_spec(), message_id="2").kind == "duplicate"
    assert jobs.rejections() == []


def test_the_api_answers_409_to_a_job_id_another_owner_holds(jobs):
    """Through the API the refusal is a 409 with the reason, which the CLI prints and exits on."""
    spec = {k: v for k, v in a_spec(owner="ada@example.com").items() if k != "owner"}
    assert jobs.api({"action": "submit", **spec}, "ada@example.com").status == 200
    answer = jobs.api({"action": "submit", **spec}, "bob@example.com")
    assert answer.status == 409 and "taken by another job" in answer.body["error"]
    again = jobs.api({"action": "submit", **spec}, "ada@example.com")
    assert (again.status, again.body["outcome"]) == (200, "duplicate")


class RefusingTpu:
    """The TPU edge answering every request with a permanent error (a refused request)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def request(self, job, boot):
        raise self.error


def test_a_permanent_tpu_error_fails_the_job_with_the_reason(engine):
    """A request the TPU API refuses for good ends the job FAILED, and the message is acknowledged."""
    jobs = engine(capacity=RefusingTpu(PermanentError("TPU API refused: 403 permission denied")))
    assert jobs.submit(a_spec()).kind == "failed"
    job = jobs.job()
    assert job.state is JobState.FAILED
    assert "permission denied" in job.state_reason
    assert job.ended_at is not None


def test_a_transient_tpu_error_raises_so_the_message_is_redelivered(jobs):
    """503s from the TPU API surface as TransientError and leave the job QUEUED for the retry."""
    jobs.simulator.configure(api_error_rate=1.0, seed=1)
    with pytest.raises(TransientError):
        jobs.submit(a_spec())
    assert jobs.job().state is JobState.QUEUED
    jobs.simulator.configure(api_error_rate=0.0, seed=1)
    assert jobs.submit(a_spec()).kind == "provisioning"


def test_a_retry_on_pattern_that_does_not_compile_is_a_rejection_naming_it(jobs):
    """retry_on.output ["(unclosed"]: rejected, the sentence stored under the message's id, no job."""
    spec = a_spec(accelerator_type="v4-8", retry_on={"output": ["ok", "(unclosed"]})
    assert jobs.submit(spec, message_id="701").kind == "rejected"
    rejected = jobs.rejections()
    assert len(rejected) == 1 and rejected[0].message_id == "701"
    assert "retry_on.output pattern '(unclosed' is not a regular expression" in rejected[0].reason
    assert jobs.store.get("train-1") is None


def test_valid_retry_on_patterns_make_a_job_that_keeps_them(jobs):
    """The same spec with patterns that compile becomes a job whose stored spec has them."""
    outcome = jobs.submit(a_spec(accelerator_type="v4-8", retry_on={"output": ["DEADLINE_EXCEEDED"]}))
    assert outcome.kind != "rejected", outcome.reason
    job = jobs.job()
    assert job.spec.retry_on is not None and job.spec.retry_on.output == ["DEADLINE_EXCEEDED"]

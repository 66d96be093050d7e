"""A job's life after submission, on the Firestore emulator, the TPU simulator and the real TPU client.

Reports and notices are fed to the service as the functions would pass them; the
agent and the worker processes have tests of their own.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tpujobs.adapters.firestore_store import REJECTIONS
from tpujobs.domain.states import JobState
from tpujobs.engine.job_service import JobService
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.testing import inbound as message
from tpujobs.local.testing import reconciler_for, signed, wait_for

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def service(job_service, sleeps) -> JobService:
    return job_service(sleep=sleeps.append, admins=("root@example.com",), stuck_after_seconds=0.0)


def submit(service: JobService, job_id: str = "train-1", **changes) -> str:
    spec = {
        "job_id": job_id,
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-16",  # two worker hosts
        "command": "python train.py",
        "on_preemption": "resume",
        "on_error": "fail",
        "max_restarts": 3,
    }
    spec.update(changes)
    assert service.submit(message("tpujobs-submit", spec)).kind == "provisioning"
    return job_id


def report(service: JobService, kind: str, attempt: int, worker: int = 0, job_id: str = "train-1", **extra):
    payload = {"kind": kind, "job_id": job_id, "attempt": attempt, "slice_id": 0, "worker_id": worker, **extra}
    return service.on_worker_report(signed(service, "tpujobs-worker-events", payload))


def preempt(service: JobService, attempt: int, worker: int = 0, job_id: str = "train-1"):
    payload = {"job_id": job_id, "attempt": attempt, "slice_id": 0, "worker_id": worker, "reason": "SIGTERM"}
    return service.on_preemption(signed(service, "tpujobs-preemption", payload))


def resources(tpu_client, project_id: str) -> dict[str, str]:
    parent = f"projects/{project_id}/locations/{ZONE}"
    return {r.name.rsplit("/", 1)[-1]: r.state.state.name for r in tpu_client.list_queued_resources(parent=parent)}


def live_resources(tpu_client, project_id: str) -> set[str]:
    return {name for name, state in resources(tpu_client, project_id).items() if state != "DELETING"}


def test_workers_starting_and_all_exiting_zero_is_success_and_releases_capacity(service, tpu_client, project_id):
    """started -> RUNNING; the job succeeds only when both workers exited 0; then its capacity goes."""
    submit(service)
    report(service, "started", 1, worker=0)
    report(service, "started", 1, worker=1)
    assert service.store.get("train-1").state is JobState.RUNNING
    report(service, "exited", 1, worker=0, exit_code=0)
    job = service.store.get("train-1")
    # counted on the worker's record, not on the job document (a job of 1,000 hosts)
    assert job.state is JobState.RUNNING and service.store.attempt_workers_succeeded("train-1", 1) == 1
    report(service, "exited", 1, worker=0, exit_code=0)  # a duplicate counts once
    assert service.store.get("train-1").state is JobState.RUNNING
    report(service, "exited", 1, worker=1, exit_code=0)
    job = service.store.get("train-1")
    assert job.state is JobState.SUCCEEDED and job.exit_code == 0 and job.ended_at is not None
    assert live_resources(tpu_client, project_id) == set()
    states = [(e.from_state, e.to_state) for e in service.store.events("train-1")]
    assert states.count((JobState.PROVISIONING, JobState.RUNNING)) == 1


def test_a_non_zero_exit_with_on_error_fail_ends_failed_with_the_exit_code(service, tpu_client, project_id):
    """Exit 3 and on_error=fail: FAILED, exit_code 3, the other worker's capacity released."""
    submit(service)
    report(service, "started", 1)
    report(service, "exited", 1, worker=1, exit_code=3)
    job = service.store.get("train-1")
    assert job.state is JobState.FAILED and job.exit_code == 3
    assert "exited with code 3 on worker 0-1" in job.state_reason
    assert live_resources(tpu_client, project_id) == set()


def test_a_preemption_notice_starts_the_next_attempt_at_once_and_resumes(service, tpu_client, project_id, sleeps):
    """Notice -> RECOVERING -> attempt 2 requested, old capacity deleted, no backoff the first time."""
    submit(service)
    report(service, "started", 1)
    preempt(service, 1)
    job = service.store.get("train-1")
    assert job.state is JobState.PROVISIONING
    assert (job.attempt, job.restarts, job.resume_next) == (2, 1, True)
    assert job.queued_resource == "train-1-a2"
    assert live_resources(tpu_client, project_id) == {"train-1-a2"}
    assert sleeps == []
    reasons = [e.reason for e in service.store.events("train-1") if e.to_state is JobState.RECOVERING]
    assert reasons and "Preempted" in reasons[0] and "resume" in reasons[0]


def test_duplicate_and_late_notices_never_start_two_attempts(service, tpu_client, project_id):
    """Notices from both workers, twice each, and a late report of attempt 1: one attempt 2, nothing else."""
    submit(service)
    report(service, "started", 1)
    for worker in (0, 1, 0, 1):
        preempt(service, 1, worker=worker)
    report(service, "exited", 1, worker=0, exit_code=0)  # attempt 1's worker, late
    job = service.store.get("train-1")
    assert (job.state, job.attempt, job.restarts) == (JobState.PROVISIONING, 2, 1)
    assert live_resources(tpu_client, project_id) == {"train-1-a2"}
    assert [e.to_state for e in service.store.events("train-1")].count(JobState.RECOVERING) == 1


def test_rerun_starts_from_scratch_and_fail_ends_the_job(service):
    """on_preemption=rerun gives a next attempt without resume; fail ends the job FAILED."""
    submit(service, "rerun-job", on_preemption="rerun")
    preempt(service, 1, job_id="rerun-job")
    assert service.store.get("rerun-job").resume_next is False
    assert service.store.get("rerun-job").attempt == 2
    submit(service, "fail-job", on_preemption="fail")
    preempt(service, 1, job_id="fail-job")
    job = service.store.get("fail-job")
    assert job.state is JobState.FAILED and "'fail'" in job.state_reason


def test_restarts_are_bounded_and_back_off(service, tpu_client, project_id, sleeps):
    """max_restarts=2: two recoveries (the second after a backoff), the third loss fails the job."""
    submit(service, max_restarts=2)
    preempt(service, 1)
    preempt(service, 2)
    assert service.store.get("train-1").attempt == 3
    assert sleeps and 0 < sleeps[0] <= 1.0
    preempt(service, 3)
    job = service.store.get("train-1")
    assert job.state is JobState.FAILED and "restarts are used up" in job.state_reason
    assert live_resources(tpu_client, project_id) == set()


def test_the_owner_cancels_and_capacity_goes_but_a_stranger_cannot(service, firestore_client, tpu_client, project_id):
    """A cancel from someone else is recorded as a rejection; the owner's ends the job CANCELLED."""
    submit(service)
    service.on_control(
        message("tpujobs-control", {"action": "cancel", "job_id": "train-1", "owner": "eve@example.com"})
    )
    assert service.store.get("train-1").state is JobState.PROVISIONING
    rejected = [d.to_dict()["reason"] for d in firestore_client.collection(REJECTIONS).stream()]
    assert any("may not cancel" in reason for reason in rejected)
    service.on_control(
        message("tpujobs-control", {"action": "cancel", "job_id": "train-1", "owner": "ada@example.com"})
    )
    job = service.store.get("train-1")
    assert job.state is JobState.CANCELLED and "ada@example.com" in job.state_reason
    assert live_resources(tpu_client, project_id) == set()


def test_an_admin_may_cancel_anyones_job(service):
    """Admins named in the settings can cancel every job."""
    submit(service)
    service.on_control(
        message("tpujobs-control", {"action": "cancel", "job_id": "train-1", "owner": "root@example.com"})
    )
    assert service.store.get("train-1").state is JobState.CANCELLED


def test_a_cancel_racing_a_recovery_leaves_no_capacity(service, tpu_client, project_id):
    """Cancelled while RECOVERING: a late converge adopts nothing and releases what it requested."""
    from tpujobs.domain.states import EventKind
    from tpujobs.domain.transitions import Observation

    submit(service)
    service.store.apply("train-1", Observation(EventKind.CAPACITY_LOST, 1, "agent", reason="lost"), utc_now)
    recovering = service.store.get("train-1")
    assert recovering.state is JobState.RECOVERING
    service.cancel("train-1", "Cancelled by a test.")
    service._start_next_attempt(recovering)  # the recovery handler that read RECOVERING earlier
    assert service.store.get("train-1").state is JobState.CANCELLED
    assert live_resources(tpu_client, project_id) == set()


def test_qr_state_observations_mirror_capacity_and_recover_from_loss(service, tpu_client, project_id):
    """WAITING/ACTIVE observations update capacity_state; SUSPENDED and FAILED start a recovery."""
    submit(service)
    qr = {"queued_resource": "train-1-a1", "zone": ZONE}
    service.on_qr_state(message("tpujobs-qr-state", {**qr, "state": "ACTIVE"}))
    assert service.store.get("train-1").capacity_state == "ACTIVE"
    service.on_qr_state(message("tpujobs-qr-state", {**qr, "state": "SUSPENDED"}))
    job = service.store.get("train-1")
    assert job.attempt == 2 and job.state is JobState.PROVISIONING
    service.on_qr_state(
        message(
            "tpujobs-qr-state", {"queued_resource": "train-1-a2", "zone": ZONE, "state": "FAILED", "detail": "hardware"}
        )
    )
    job = service.store.get("train-1")
    assert job.attempt == 3
    assert any("hardware" in e.reason for e in service.store.events("train-1"))


@pytest.mark.parametrize(
    ("topic", "handler", "payload"),
    [
        ("tpujobs-worker-events", "on_worker_report", b"nope"),
        (
            "tpujobs-worker-events",
            "on_worker_report",
            {"kind": "exploded", "job_id": "train-1", "attempt": 1, "slice_id": 0, "worker_id": 0},
        ),
        ("tpujobs-preemption", "on_preemption", {"job_id": "NOT VALID", "attempt": 1}),
        ("tpujobs-qr-state", "on_qr_state", {"queued_resource": "x", "zone": ZONE}),
        ("tpujobs-control", "on_control", {"action": "delete-everything", "job_id": "train-1", "owner": "ada"}),
    ],
)
def test_malformed_lifecycle_messages_are_rejected_and_acknowledged(service, firestore_client, topic, handler, payload):
    """Every inbound topic records bad input with a reason and returns normally."""
    submit(service)
    assert getattr(service, handler)(message(topic, payload)) is None
    docs = [d.to_dict() for d in firestore_client.collection(REJECTIONS).stream()]
    assert len(docs) == 1 and docs[0]["topic"] == topic and docs[0]["reason"]
    assert service.store.get("train-1").state is JobState.PROVISIONING


def test_reports_of_an_unknown_job_change_nothing(service):
    """A worker report about a job that does not exist is recorded as a rejection and creates nothing."""
    outcome = report(service, "started", 1, job_id="ghost-job")
    assert outcome is None and service.store.get("ghost-job") is None
    assert any("'ghost-job': no such job" in r.reason for r in service.store.rejections())


def test_the_reconciler_repairs_missing_capacity_and_releases_orphans(service, tpu_client, project_id):
    """Missing queued resource re-requested; one of a finished job deleted; others' resources untouched."""
    from tpujobs.adapters.tpu import queued_resource_for
    from tpujobs.engine.startup_script import host_boot

    submit(service, "lost-qr")
    service.tpu.release(ZONE, "lost-qr-a1")  # someone deleted it behind our back
    submit(service, "done-job")
    service.cancel("done-job", "Cancelled.")
    orphan = service.store.get("done-job")
    service.tpu.request(orphan, host_boot(orphan, service.settings))  # a leaked resource of a finished job
    foreign = orphan.evolve(job_id="someone-else", queued_resource="someone-else-a1")
    resource = queued_resource_for(foreign, project_id, host_boot(foreign, service.settings))
    resource.tpu.node_spec[0].node.labels.clear()  # not made by tpujobs
    tpu_client.create_queued_resource(
        parent=f"projects/{project_id}/locations/{ZONE}", queued_resource=resource, queued_resource_id="someone-else-a1"
    )
    report = reconciler_for(service).tick()
    assert "lost-qr-a1" in report.re_requested
    assert "done-job-a1" in report.released
    live = live_resources(tpu_client, project_id)
    assert "lost-qr-a1" in live and "someone-else-a1" in live and "done-job-a1" not in live


def test_the_reconciler_turns_a_suspended_resource_into_a_recovery(service, simulator_url):
    """No event arrives for a preemption the agent could not report: the tick finds it."""
    submit(service)
    report(service, "started", 1)
    wait_for(lambda: service.tpu.status(ZONE, "train-1-a1").state == "ACTIVE", timeout=10)
    SimulatorControl(simulator_url).preempt(ZONE, "train-1-a1")

    def replaced() -> bool:
        """the reconciler to start attempt 2"""
        reconciler_for(service).tick()
        return service.store.get("train-1").attempt > 1

    wait_for(replaced, timeout=10, interval=0.1)
    job = service.store.get("train-1")
    assert job.attempt == 2 and job.state is JobState.PROVISIONING
    assert any(e.source == "reconciler" for e in service.store.events("train-1"))


def test_the_reconciler_does_nothing_when_the_tpu_api_fails(service, simulator_url):
    """A zone whose listing fails is skipped: an API error never looks like a lost resource."""
    submit(service)
    report(service, "started", 1)
    SimulatorControl(simulator_url).configure(api_error_rate=1.0)
    result = reconciler_for(service).tick()
    assert result.zones_skipped == [ZONE]
    job = service.store.get("train-1")
    assert job.state is JobState.RUNNING and job.attempt == 1


def audit_entry(project_id: str, method: str, name: str, **payload) -> dict:
    """A Cloud Logging entry as the TPU audit-log sink publishes it (operation.last=true)."""
    return {
        "insertId": "abc123",
        "logName": f"projects/{project_id}/logs/cloudaudit.googleapis.com%2Factivity",
        "operation": {"id": "operations/op-1", "producer": "tpu.googleapis.com", "last": True},
        "protoPayload": {
            "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
            "serviceName": "tpu.googleapis.com",
            "methodName": f"google.cloud.tpu.v2.Tpu.{method}",
            "resourceName": name,
            **payload,
        },
        "severity": "NOTICE",
        "timestamp": "2026-11-22T05:00:00Z",
    }


def test_an_audit_log_entry_makes_the_service_read_the_queued_resource_state(
    service, tpu_client, project_id, firestore_client
):
    """The sink says a queued resource was created; its state now (ACTIVE) is what counts."""
    submit(service)
    parent = f"projects/{project_id}/locations/{ZONE}"
    wait_for(lambda: service.tpu.status(ZONE, "train-1-a1").state == "ACTIVE", timeout=10)
    entry = audit_entry(
        project_id, "CreateQueuedResource", parent, request={"parent": parent, "queuedResourceId": "train-1-a1"}
    )
    service.on_qr_state(message("tpujobs-qr-state", entry))
    job = service.store.get("train-1")
    assert job.state is JobState.PROVISIONING and job.capacity_state == "ACTIVE"
    assert list(firestore_client.collection(REJECTIONS).stream()) == []


def test_an_audit_log_entry_of_a_deletion_by_someone_else_starts_recovery(service, tpu_client, project_id):
    submit(service)
    report(service, "started", 1)
    name = f"projects/{project_id}/locations/{ZONE}/queuedResources/train-1-a1"
    service.tpu.release(ZONE, "train-1-a1")  # as a person in the console would
    service.on_qr_state(message("tpujobs-qr-state", audit_entry(project_id, "DeleteQueuedResource", name)))
    job = service.store.get("train-1")
    assert job.attempt == 2 and job.state is JobState.PROVISIONING


def test_an_audit_log_entry_of_another_service_is_rejected_like_any_bad_message(service, project_id, firestore_client):
    entry = audit_entry(project_id, "CreateQueuedResource", "projects/p/locations/us-central2-b/queuedResources/x-a1")
    entry["protoPayload"]["serviceName"] = "compute.googleapis.com"
    assert service.on_qr_state(message("tpujobs-qr-state", entry)) is None
    assert len(list(firestore_client.collection(REJECTIONS).stream())) == 1

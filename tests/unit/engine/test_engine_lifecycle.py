"""A job's life after submission, on the fakes and the TPU simulator: reports, notices,
restarts, cancels, capacity observations, and the reconciler's repairs.

Reports and notices are fed to the engine as the functions would pass them; the agent and the
worker processes have tests of their own.
"""

from __future__ import annotations

import pytest
from engine_harness import PROJECT, ZONE, Engine, utc_now

from tpujobs.domain.access import AccessPolicies
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Observation
from tpujobs.local.testing import wait_for

SPEC = {
    "job_id": "train-1",
    "name": "train",
    "owner": "ada@example.com",
    "accelerator_type": "v4-16",  # two worker hosts
    "command": "python train.py",
    "on_preemption": "resume",
    "on_error": "fail",
    "max_restarts": 3,
}


@pytest.fixture
def jobs(engine) -> Engine:
    return engine(admins=("root@example.com",), stuck_after_seconds=0.0)


def submit(jobs: Engine, job_id: str = "train-1", **changes) -> str:
    assert jobs.submit({**SPEC, "job_id": job_id, **changes}).kind == "provisioning"
    return job_id


def test_workers_starting_and_all_exiting_zero_is_success_and_releases_capacity(jobs):
    """started -> RUNNING; the job succeeds only when both workers exited 0; then its capacity goes."""
    submit(jobs)
    jobs.report("started", 1, worker=0)
    jobs.report("started", 1, worker=1)
    assert jobs.job().state is JobState.RUNNING
    jobs.report("exited", 1, worker=0, exit_code=0)
    # counted on the worker's record, not on the job document (a job of 1,000 hosts)
    assert jobs.job().state is JobState.RUNNING and jobs.store.attempt_workers_succeeded("train-1", 1) == 1
    jobs.report("exited", 1, worker=0, exit_code=0)  # a duplicate counts once
    assert jobs.job().state is JobState.RUNNING
    jobs.report("exited", 1, worker=1, exit_code=0)
    job = jobs.job()
    assert job.state is JobState.SUCCEEDED and job.exit_code == 0 and job.ended_at is not None
    assert jobs.live_capacity() == set()
    states = [(e.from_state, e.to_state) for e in jobs.events()]
    assert states.count((JobState.PROVISIONING, JobState.RUNNING)) == 1


def test_a_non_zero_exit_with_on_error_fail_ends_failed_with_the_exit_code(jobs):
    """Exit 3 and on_error=fail: FAILED, exit_code 3, the other worker's capacity released."""
    submit(jobs)
    jobs.report("started", 1)
    jobs.report("exited", 1, worker=1, exit_code=3)
    job = jobs.job()
    assert job.state is JobState.FAILED and job.exit_code == 3
    assert "exited with code 3 on worker 0-1" in job.state_reason
    assert jobs.live_capacity() == set()


def test_a_preemption_notice_starts_the_next_attempt_at_once_and_resumes(jobs, sleeps):
    """Notice -> RECOVERING -> attempt 2 requested, old capacity deleted, no backoff the first time."""
    submit(jobs)
    jobs.report("started", 1)
    jobs.preempt(1)
    job = jobs.job()
    assert job.state is JobState.PROVISIONING
    assert (job.attempt, job.restarts, job.resume_next) == (2, 1, True)
    assert job.queued_resource == "train-1-a2"
    assert jobs.live_capacity() == {"train-1-a2"}
    assert sleeps == []
    reasons = [e.reason for e in jobs.events() if e.to_state is JobState.RECOVERING]
    assert reasons and "Preempted" in reasons[0] and "resume" in reasons[0]


def test_duplicate_and_late_notices_never_start_two_attempts(jobs):
    """Notices from both workers, twice each, and a late report of attempt 1: one attempt 2, nothing else."""
    submit(jobs)
    jobs.report("started", 1)
    for worker in (0, 1, 0, 1):
        jobs.preempt(1, worker=worker)
    jobs.report("exited", 1, worker=0, exit_code=0)  # attempt 1's worker, late
    job = jobs.job()
    assert (job.state, job.attempt, job.restarts) == (JobState.PROVISIONING, 2, 1)
    assert jobs.live_capacity() == {"train-1-a2"}
    assert [e.to_state for e in jobs.events()].count(JobState.RECOVERING) == 1


def test_rerun_starts_from_scratch_and_fail_ends_the_job(jobs):
    """on_preemption=rerun gives a next attempt without resume; fail ends the job FAILED."""
    submit(jobs, "rerun-job", on_preemption="rerun")
    jobs.preempt(1, job_id="rerun-job")
    assert jobs.job("rerun-job").resume_next is False
    assert jobs.job("rerun-job").attempt == 2
    submit(jobs, "fail-job", on_preemption="fail")
    jobs.preempt(1, job_id="fail-job")
    job = jobs.job("fail-job")
    assert job.state is JobState.FAILED and "'fail'" in job.state_reason


def test_restarts_are_bounded_and_back_off(jobs, sleeps):
    """max_restarts=2: two recoveries (the second after a backoff), the third loss fails the job."""
    submit(jobs, max_restarts=2)
    jobs.preempt(1)
    jobs.preempt(2)
    assert jobs.job().attempt == 3
    assert sleeps and 0 < sleeps[0] <= 1.0
    jobs.preempt(3)
    job = jobs.job()
    assert job.state is JobState.FAILED and "restarts are used up" in job.state_reason
    assert jobs.live_capacity() == set()


def test_the_owner_cancels_and_capacity_goes_but_a_stranger_cannot(jobs):
    """A cancel from someone else is recorded as a rejection; the owner's ends the job CANCELLED."""
    submit(jobs)
    jobs.control({"action": "cancel", "job_id": "train-1", "owner": "eve@example.com"})
    assert jobs.job().state is JobState.PROVISIONING
    assert any("may not cancel" in r.reason for r in jobs.rejections())
    jobs.control({"action": "cancel", "job_id": "train-1", "owner": "ada@example.com"})
    job = jobs.job()
    assert job.state is JobState.CANCELLED and "ada@example.com" in job.state_reason
    assert jobs.live_capacity() == set()


def test_an_admin_may_cancel_anyones_job_on_the_topic_when_claims_are_trusted(engine):
    """Admins named in the settings can cancel every job; on the topic only with trust_topic_owners."""
    jobs = engine(admins=("root@example.com",), access=AccessPolicies())
    submit(jobs)
    jobs.control({"action": "cancel", "job_id": "train-1", "owner": "root@example.com"})
    assert jobs.job().state is JobState.PROVISIONING  # a claimed admin is a claim
    jobs.access.allowed = AccessPolicies(trust_topic_owners=True)
    jobs.control({"action": "cancel", "job_id": "train-1", "owner": "root@example.com"})
    assert jobs.job().state is JobState.CANCELLED


def test_a_cancel_racing_a_recovery_leaves_no_capacity(jobs):
    """Cancelled while RECOVERING: a late converge adopts nothing and releases what it requested."""
    submit(jobs)
    jobs.store.apply("train-1", Observation(EventKind.CAPACITY_LOST, 1, "agent", reason="lost"), utc_now)
    recovering = jobs.job()
    assert recovering.state is JobState.RECOVERING
    jobs.cancel("train-1", "Cancelled by a test.")
    jobs.start_next_attempt(recovering)  # the recovery handler that read RECOVERING earlier
    assert jobs.job().state is JobState.CANCELLED
    assert jobs.live_capacity() == set()


def test_qr_state_observations_mirror_capacity_and_recover_from_loss(jobs):
    """WAITING/ACTIVE observations update capacity_state; SUSPENDED and FAILED start a recovery."""
    submit(jobs)
    qr = {"queued_resource": "train-1-a1", "zone": ZONE}
    jobs.qr_state({**qr, "state": "ACTIVE"})
    assert jobs.job().capacity_state == "ACTIVE"
    jobs.qr_state({**qr, "state": "LOST"})
    job = jobs.job()
    assert job.attempt == 2 and job.state is JobState.PROVISIONING
    jobs.qr_state({"queued_resource": "train-1-a2", "zone": ZONE, "state": "FAILED", "detail": "hardware"})
    assert jobs.job().attempt == 3
    assert any("hardware" in e.reason for e in jobs.events())


@pytest.mark.parametrize(
    ("topic", "payload"),
    [
        ("tpujobs-worker-events", b"nope"),
        (
            "tpujobs-worker-events",
            {"kind": "exploded", "job_id": "train-1", "attempt": 1, "slice_id": 0, "worker_id": 0},
        ),
        ("tpujobs-preemption", {"job_id": "NOT VALID", "attempt": 1}),
        ("tpujobs-qr-state", {"queued_resource": "x", "zone": ZONE}),
        ("tpujobs-control", {"action": "delete-everything", "job_id": "train-1", "owner": "ada"}),
    ],
)
def test_malformed_lifecycle_messages_are_rejected_and_acknowledged(jobs, topic, payload):
    """Every inbound topic records bad input with a reason and returns normally."""
    submit(jobs)
    assert jobs.deliver(topic, payload) is None
    rejected = jobs.rejections()
    assert len(rejected) == 1 and rejected[0].topic == topic and rejected[0].reason
    assert jobs.job().state is JobState.PROVISIONING


def test_reports_of_an_unknown_job_change_nothing(jobs):
    """A worker report about a job that does not exist is recorded as a rejection and creates nothing."""
    outcome = jobs.report("started", 1, job_id="ghost-job")
    assert outcome is None and jobs.store.get("ghost-job") is None
    assert any("'ghost-job': no such job" in r.reason for r in jobs.rejections())


def test_the_reconciler_repairs_missing_capacity_and_releases_orphans(jobs, tpu_client):
    """Missing queued resource re-requested; one of a finished job deleted; others' resources untouched."""
    from tpujobs.adapters.tpu import queued_resource_for
    from tpujobs.engine.startup_script import host_boot

    submit(jobs, "lost-qr")
    jobs.capacity.release(ZONE, "lost-qr-a1")  # someone deleted it behind our back
    submit(jobs, "done-job")
    jobs.cancel("done-job", "Cancelled.")
    orphan = jobs.job("done-job")
    jobs.capacity.request(orphan, host_boot(orphan, jobs.settings))  # a leaked resource of a finished job
    foreign = orphan.evolve(job_id="someone-else", queued_resource="someone-else-a1")
    resource = queued_resource_for(foreign, PROJECT, host_boot(foreign, jobs.settings))
    resource.tpu.node_spec[0].node.labels.clear()  # not made by tpujobs
    tpu_client.create_queued_resource(
        parent=f"projects/{PROJECT}/locations/{ZONE}", queued_resource=resource, queued_resource_id="someone-else-a1"
    )
    report = jobs.tick()
    assert "lost-qr-a1" in report.re_requested
    assert "done-job-a1" in report.released
    live = jobs.live_capacity()
    assert "lost-qr-a1" in live and "someone-else-a1" in live and "done-job-a1" not in live


def test_the_reconciler_turns_a_suspended_resource_into_a_recovery(jobs):
    """No event arrives for a preemption the agent could not report: the tick finds it."""
    submit(jobs)
    jobs.report("started", 1)
    wait_for(lambda: jobs.capacity.status(ZONE, "train-1-a1").state == "ACTIVE", timeout=10)
    jobs.simulator.preempt(ZONE, "train-1-a1")

    def replaced() -> bool:
        """the reconciler to start attempt 2"""
        jobs.tick()
        return jobs.job().attempt > 1

    wait_for(replaced, timeout=10, interval=0.1)
    job = jobs.job()
    assert job.attempt == 2 and job.state is JobState.PROVISIONING
    assert any(e.source == "reconciler" for e in jobs.events())


def test_the_reconciler_does_nothing_when_the_tpu_api_fails(jobs):
    """A zone whose listing fails is skipped: an API error never looks like a lost resource."""
    submit(jobs)
    jobs.report("started", 1)
    jobs.simulator.configure(api_error_rate=1.0)
    result = jobs.tick()
    assert result.zones_skipped == [ZONE]
    job = jobs.job()
    assert job.state is JobState.RUNNING and job.attempt == 1


def audit_entry(method: str, name: str, **payload) -> dict:
    """A Cloud Logging entry as the TPU audit-log sink publishes it (operation.last=true)."""

    return {
        "insertId": "abc123",
        "logName": f"projects/{PROJECT}/logs/cloudaudit.googleapis.com%2Factivity",
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


def test_an_audit_log_entry_makes_the_engine_read_the_queued_resource_state(jobs):
    """The sink says a queued resource was created; its state now (ACTIVE) is what counts."""

    submit(jobs)
    parent = f"projects/{PROJECT}/locations/{ZONE}"
    wait_for(lambda: jobs.capacity.status(ZONE, "train-1-a1").state == "ACTIVE", timeout=10)
    jobs.qr_state(
        audit_entry("CreateQueuedResource", parent, request={"parent": parent, "queuedResourceId": "train-1-a1"})
    )
    job = jobs.job()
    assert job.state is JobState.PROVISIONING and job.capacity_state == "ACTIVE"
    assert jobs.rejections() == []


def test_an_audit_log_entry_of_a_deletion_by_someone_else_starts_recovery(jobs):
    """A deletion the engine did not make is a lost attempt: the next one starts."""

    submit(jobs)
    jobs.report("started", 1)
    jobs.capacity.release(ZONE, "train-1-a1")  # as a person in the console would
    jobs.qr_state(
        audit_entry("DeleteQueuedResource", f"projects/{PROJECT}/locations/{ZONE}/queuedResources/train-1-a1")
    )
    job = jobs.job()
    assert job.attempt == 2 and job.state is JobState.PROVISIONING


def test_an_audit_log_entry_of_another_service_is_rejected_like_any_bad_message(jobs):
    """An entry from another Google service is a rejection, acknowledged."""
    entry = audit_entry("CreateQueuedResource", "projects/p/locations/us-central2-b/queuedResources/x-a1")
    entry["protoPayload"]["serviceName"] = "compute.googleapis.com"
    assert jobs.qr_state(entry) is None
    assert len(jobs.rejections()) == 1

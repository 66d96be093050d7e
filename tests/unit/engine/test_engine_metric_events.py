"""The metric events' lines, written where the engine commits: a job's life, a stuck job, a rejection."""

from __future__ import annotations

import logging

import pytest
from engine_harness import Engine

from tpujobs.engine import metric_events, process_log
from tpujobs.local.testing import CrashPlan, InjectedCrash, ManualClock

SPEC = {
    "job_id": "train-1",
    "name": "train",
    "owner": "ada@example.com",
    "accelerator_type": "v4-16",
    "capacity": "spot",
    "command": "python train.py",
    "on_preemption": "resume",
    "on_error": "fail",
    "max_restarts": 3,
}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def jobs(engine, clock) -> Engine:
    return engine(clock=clock, stuck_after_seconds=30.0)


def lines(caplog: pytest.LogCaptureFixture) -> list[dict]:
    """The metric events' payloads logged so far, in order."""
    return [r.__dict__[process_log.EVENT_FIELDS] for r in caplog.records if process_log.EVENT_FIELDS in r.__dict__]


def named(caplog: pytest.LogCaptureFixture, event: str) -> list[dict]:
    return [line for line in lines(caplog) if line["event"] == event]


def test_a_job_preempted_recovered_and_succeeded_writes_each_line_once_with_its_numbers(jobs, clock, caplog):
    """submitted, admitted, preempted, recovered (after the time it took) and succeeded with its chip-hours."""
    caplog.set_level(logging.INFO)
    assert jobs.submit(SPEC).kind == "provisioning"
    clock.advance(60)
    jobs.report("started", 1, worker=0)
    jobs.report("started", 1, worker=1)
    clock.advance(3600)
    jobs.preempt(1)
    jobs.preempt(1, worker=1)  # a duplicate notice changes nothing, so writes nothing
    clock.advance(90)
    jobs.report("started", 2, worker=0)
    jobs.report("started", 2, worker=1)
    jobs.report("exited", 2, worker=0, exit_code=0)
    jobs.report("exited", 2, worker=1, exit_code=0)

    events = [line["event"] for line in lines(caplog)]
    assert events == ["job_submitted", "admitted", "preempted", "recovered", "job_succeeded"]
    submitted = named(caplog, "job_submitted")[0]
    assert submitted == {
        "event": "job_submitted",
        "job_id": "train-1",
        "owner": "ada@example.com",
        "family": "v4",
        "capacity": "spot",
        "attempt": 1,
    }
    assert named(caplog, "admitted")[0]["queue_wait_seconds"] == 0.0
    preempted = named(caplog, "preempted")[0]
    assert (preempted["attempt"], preempted["source"], preempted["to_state"]) == (1, "agent", "RECOVERING")
    recovered = named(caplog, "recovered")[0]
    assert recovered["attempt"] == 2 and recovered["recovery_seconds"] == pytest.approx(90.0)
    done = named(caplog, "job_succeeded")[0]
    assert done["reason_class"] == "worker_succeeded"
    assert done["chip_hours"] == pytest.approx(8 * 3600 / 3600, rel=0.05)  # v4-16: 8 chips, an hour of attempt 1


def test_a_failed_job_names_the_observation_that_ended_it(jobs, caplog):
    """reason_class is the EventKind that moved the job to FAILED: a label with few values."""
    caplog.set_level(logging.INFO)
    jobs.submit(SPEC)
    jobs.report("started", 1)
    jobs.report("exited", 1, worker=0, exit_code=3)
    (failed,) = named(caplog, "job_failed")
    assert failed["reason_class"] == "command_failed" and failed["job_id"] == "train-1"
    assert named(caplog, "job_succeeded") == []


def test_a_job_left_queued_past_the_stuck_limit_writes_one_stuck_line_per_tick(jobs, clock, caplog):
    """A submit that died after recording the job leaves it QUEUED; the tick past the limit says so."""
    plan = CrashPlan()  # counts a whole submit's steps, to crash right after its create
    jobs.crashing(plan).submit({**SPEC, "job_id": "probe-1"})
    create = plan.steps.index("store.create") + 1
    with pytest.raises(InjectedCrash):
        jobs.crashing(CrashPlan(at=create, when="after")).submit({**SPEC, "job_id": "stuck-1"})
    caplog.set_level(logging.INFO)
    jobs.tick()
    assert named(caplog, "job_stuck") == []  # not yet past the limit
    clock.advance(31)
    jobs.tick()
    (stuck,) = named(caplog, "job_stuck")
    assert stuck["job_id"] == "stuck-1" and stuck["state"] == "QUEUED"
    assert stuck["stuck_seconds"] == pytest.approx(31.0)


def test_a_refused_submission_writes_a_rejected_line_with_its_topic(jobs, caplog):
    """Bad input: the rejection's line, at WARNING, with the topic it came on."""
    caplog.set_level(logging.INFO)
    assert jobs.submit(b"{not json").kind == "rejected"
    (line,) = named(caplog, "rejected")
    assert line == {"event": "rejected", "topic": "tpujobs-submit", "count": 1}
    record = next(r for r in caplog.records if process_log.EVENT_FIELDS in r.__dict__)
    assert record.levelno == logging.WARNING


def test_every_event_and_field_the_table_names_is_documented():
    """The table is the contract with infra/monitoring.tf: each event says what it means, each field too."""
    for name, (meaning, fields) in metric_events.EVENTS.items():
        assert meaning, name
        assert set(fields) <= set(metric_events.FIELDS), name
    assert not {"event", "message", "severity", "time"} & set(metric_events.FIELDS)


def test_an_event_outside_the_table_is_refused():
    """A misspelt event or field fails where it is built, not silently in a metric."""
    with pytest.raises(ValueError, match="unknown metric event"):
        metric_events.MetricEvent("job_sucess")
    with pytest.raises(ValueError, match="no field"):
        metric_events.MetricEvent("rejected", {"topic": "t", "owner": "x"})


def test_a_recorded_dead_letter_writes_its_line_with_its_topic_and_deliveries(caplog):
    """The original topic is read back from the subscription's name; the delivery count as Pub/Sub said."""
    from datetime import datetime, timezone

    from tpujobs.engine.dead_letters import DeadLetters
    from tpujobs.engine.inbound import InboundMessage
    from tpujobs.local.fakes.dead_letters import InMemoryDeadLetters
    from tpujobs.local.testing import local_settings

    letters = DeadLetters(
        InMemoryDeadLetters(),
        local_settings(),
        lambda: datetime.now(timezone.utc),
        publisher=lambda: pytest.fail("recording publishes nothing"),
    )
    attributes = {
        "CloudPubSubDeadLetterSourceSubscription": "tpujobs-submit--submit_job",
        "CloudPubSubDeadLetterSourceDeliveryCount": "5",
    }
    caplog.set_level(logging.INFO)
    assert letters.record(InboundMessage("77", "tpujobs-dead-letter", b"{}", attributes)) is not None
    assert named(caplog, "dead_lettered") == [
        {"event": "dead_lettered", "topic": "tpujobs-submit", "delivery_attempts": 5}
    ]

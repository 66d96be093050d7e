"""Every state change is announced on tpujobs-status, in order; a change whose announcement
failed is announced by a later reconcile tick, once. (The real Pub/Sub path, its ordering key
and attributes, is tests/emulator/test_status.py.)"""

from __future__ import annotations

from engine_harness import Engine

from tpujobs.local.testing import OffsetClock

ORDER = ["QUEUED", "PROVISIONING", "RUNNING", "RECOVERING", "PROVISIONING", "RUNNING", "SUCCEEDED"]


def lifecycle(jobs: Engine) -> None:
    """QUEUED .. SUCCEEDED through a preemption, on a one-host job."""
    spec = {"job_id": "train-1", "name": "train", "owner": "ada@example.com", "accelerator_type": "v4-8"}
    assert jobs.submit({**spec, "command": "x"}).kind == "provisioning"
    jobs.report("started", 1)
    jobs.preempt(1)
    jobs.report("started", 2)
    jobs.report("exited", 2, exit_code=0)


def test_a_full_lifecycle_is_announced_in_order_once_each(engine):
    """One announcement per change, in timeline order, each with its seq, owner and reason."""
    jobs = engine()
    lifecycle(jobs)
    timeline = jobs.events()
    announced = jobs.published.announced
    assert [c.to_state for c in announced] == [e.to_state.value for e in timeline] == ORDER
    assert [c.seq for c in announced] == list(range(1, len(timeline) + 1))
    first, last = announced[0].payload(), announced[-1].payload()
    assert first["from_state"] is None and first["owner"] == "ada@example.com" and first["attempt"] == 1
    assert last["from_state"] == "RUNNING" and last["attempt"] == 2 and last["reason"]


def test_an_announcement_that_failed_is_made_by_the_reconciler(engine):
    """Changes committed while Pub/Sub was down are announced by a later tick, none lost, once only."""
    clock = OffsetClock()
    jobs = engine(clock=clock)
    jobs.published.failing = True
    lifecycle(jobs)
    assert jobs.published.announced == []
    jobs.published.failing = False
    clock.advance(60)
    report = jobs.tick()
    timeline = jobs.events()
    assert len(report.announced) == len(timeline) == 7
    assert sorted(c.seq for c in jobs.published.announced) == list(range(1, 8))
    assert jobs.store.unannounced_events(jobs.clock()) == []
    assert jobs.tick().announced == []  # once only

"""Chip-hours, queue wait, lost time and goodput, on jobs whose every time is known.

Each job is moved by decide() itself, observation by observation at chosen minutes, so
these tests cover both the arithmetic (domain/accounting.py) and where the transitions
record its timestamps.
"""

from __future__ import annotations

import pytest

from support.job_timelines import a_job, at, move, preempted_job, run_to_success
from tpujobs.domain.accounting import AttemptUsage, account, checkpoint_reported
from tpujobs.domain.states import EventKind, JobState


def test_a_job_that_never_lost_capacity_has_goodput_one() -> None:
    job = a_job()
    job = move(job, 5, EventKind.ADMITTED, capacity_state="ACCEPTED")
    job = move(job, 15, EventKind.WORKERS_STARTED, worker="0-0")
    job = run_to_success(job, 75)

    totals = job.accounting()
    assert job.spec.chips == 16
    assert totals.chip_hours == pytest.approx(16 * 1.0)  # 16 chips for 60 minutes
    assert totals.queue_wait_seconds == pytest.approx(15 * 60)
    assert totals.lost_chip_hours == 0
    assert totals.goodput == pytest.approx(1.0)


def test_preempted_job_counts_both_attempts_and_the_work_after_the_last_checkpoint() -> None:
    job = preempted_job()

    first, second = job.usage
    assert (first.held_from, first.ended_at, first.last_checkpoint_at) == (at(20), at(80), at(50))
    assert first.capacity_lost and first.work_kept
    assert first.chip_hours(at(150)) == pytest.approx(16.0)
    assert first.lost_seconds() == pytest.approx(30 * 60)
    assert second.waiting_since == at(80) and second.held_from == at(90)
    assert second.chip_hours(at(150)) == pytest.approx(16.0)
    assert second.lost_seconds() == 0

    totals = job.accounting()
    assert totals.chip_hours == pytest.approx(32.0)
    assert totals.lost_chip_hours == pytest.approx(8.0)  # 16 chips x 30 minutes
    assert totals.useful_chip_hours == pytest.approx(24.0)
    assert totals.goodput == pytest.approx(0.75)
    assert totals.queue_wait_seconds == pytest.approx((20 + 10) * 60)
    assert totals.lost_seconds == pytest.approx(30 * 60)


def test_rerun_from_scratch_loses_the_whole_attempt_checkpoint_or_not() -> None:
    job = preempted_job(on_preemption="rerun")

    assert not job.usage[0].work_kept
    assert job.usage[0].lost_seconds() == pytest.approx(60 * 60)
    assert job.accounting().goodput == pytest.approx(0.5)


def test_without_any_checkpoint_everything_held_in_the_attempt_is_lost() -> None:
    job = preempted_job(checkpoint_minute=None)

    assert job.usage[0].lost_seconds() == pytest.approx(60 * 60)


def test_a_checkpoint_saved_on_the_preemption_notice_keeps_all_the_work() -> None:
    """A job that saves on SIGTERM reports after the attempt ended; it still counts."""
    job = preempted_job(checkpoint_minute=50)
    usage = checkpoint_reported(job.usage, 1, at(80.1))
    assert usage is not None
    job = job.evolve(usage=usage)

    assert job.usage[0].lost_seconds() == 0
    assert job.accounting().goodput == pytest.approx(1.0)


def test_older_or_repeated_checkpoints_change_nothing() -> None:
    usage = (AttemptUsage(1, 8, at(0), held_from=at(1), last_checkpoint_at=at(30)),)

    assert checkpoint_reported(usage, 1, at(30)) is None  # every worker reports the same one
    assert checkpoint_reported(usage, 1, at(20)) is None  # delivered out of order
    assert checkpoint_reported(usage, 7, at(40)) is None  # no such attempt
    newer = checkpoint_reported(usage, 1, at(40))
    assert newer is not None and newer[0].last_checkpoint_at == at(40)


def test_a_running_attempt_counts_up_to_now() -> None:
    job = a_job()
    job = move(job, 0, EventKind.ADMITTED, capacity_state="ACTIVE")  # adopted, already up

    assert job.accounting(now=at(30)).chip_hours == pytest.approx(16 * 0.5)
    assert job.accounting(now=at(90)).chip_hours == pytest.approx(16 * 1.5)
    assert job.accounting().chip_hours == 0  # as of the last change: no time held yet


def test_capacity_that_never_came_costs_nothing_and_counts_as_waiting() -> None:
    job = a_job()
    job = move(job, 2, EventKind.ADMITTED, capacity_state="WAITING_FOR_RESOURCES")
    job = move(job, 40, EventKind.CANCEL_REQUESTED, attempt=None)

    totals = job.accounting()
    assert totals.chip_hours == 0
    assert totals.goodput is None
    assert totals.queue_wait_seconds == pytest.approx(40 * 60)


def test_a_second_end_keeps_the_first() -> None:
    """Cancelling a RECOVERING job ends nothing more: its attempt ended when it was lost."""
    job = a_job()
    job = move(job, 1, EventKind.ADMITTED, capacity_state="ACTIVE")
    job = move(job, 31, EventKind.CAPACITY_LOST)
    job = move(job, 45, EventKind.CANCEL_REQUESTED, attempt=None)

    assert job.usage[0].ended_at == at(31)
    assert job.accounting().chip_hours == pytest.approx(16 * 0.5)


def test_account_of_no_attempts_is_zero() -> None:
    totals = account((), at(0))
    assert (totals.chip_hours, totals.lost_chip_hours, totals.goodput) == (0, 0, None)


def test_an_exit_handled_before_its_start_counts_the_chip_time_from_the_hosts_start() -> None:
    """Push delivery keeps no order: an `exited` (with the host's start) before any `started` or
    ACTIVE still counts the capacity from when the host started the job, not from the exit."""
    job = move(a_job(slices=1, accelerator="v4-8"), 10, EventKind.ADMITTED, capacity_state="WAITING_FOR_RESOURCES")
    job = move(job, 30, EventKind.WORKER_SUCCEEDED, worker="0-0", exit_code=0, held_since=at(20))
    assert job.state is JobState.SUCCEEDED
    assert job.usage[0].held_from == at(20)
    assert job.accounting().chip_hours == pytest.approx(4 * 10 / 60)  # v4-8: 4 chips for 10 minutes


def test_a_hosts_start_time_cannot_move_chip_time_outside_the_attempt() -> None:
    """A start before the attempt began to wait counts from the wait; one in the future from now;
    a failed exit with its start counts its time too."""
    early = move(a_job(slices=1, accelerator="v4-8"), 10, EventKind.ADMITTED, capacity_state="ACCEPTED")
    early = move(early, 30, EventKind.WORKER_SUCCEEDED, worker="0-0", exit_code=0, held_since=at(-600))
    assert early.usage[0].held_from == at(0)  # submitted at minute 0: the attempt's wait began then
    late = move(a_job(slices=1, accelerator="v4-8"), 10, EventKind.ADMITTED, capacity_state="ACCEPTED")
    late = move(late, 30, EventKind.WORKER_SUCCEEDED, worker="0-0", exit_code=0, held_since=at(600))
    assert late.usage[0].held_from == at(30) and late.accounting().chip_hours == 0
    failed = move(a_job(slices=1, accelerator="v4-8"), 10, EventKind.ADMITTED, capacity_state="ACCEPTED")
    failed = move(failed, 30, EventKind.COMMAND_FAILED, worker="0-0", exit_code=1, held_since=at(25))
    assert failed.state is JobState.FAILED
    assert failed.usage[0].held_from == at(25) and failed.accounting().chip_hours == pytest.approx(4 * 5 / 60)

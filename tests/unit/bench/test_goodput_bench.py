"""bench/goodput.py's pure parts: the arithmetic, reading an attempt's output, the summary.

A full run takes minutes and is a measurement, not a test: nothing here starts the stack.
"""

from __future__ import annotations

import importlib.util
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tpujobs.domain.accounting import AttemptUsage

_PATH = Path(__file__).resolve().parents[3] / "bench" / "goodput.py"
_SPEC = importlib.util.spec_from_file_location("bench_goodput", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
goodput = importlib.util.module_from_spec(_SPEC)
sys.modules["bench_goodput"] = goodput  # dataclasses look their module up by name
_SPEC.loader.exec_module(goodput)

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


def minutes(n: float) -> datetime:
    return T0 + timedelta(minutes=n)


def test_random_phase_loses_half_an_interval_an_hour_and_misses_97_percent() -> None:
    e = goodput.expectation(3, 2.5)
    assert e.preemptions == 3  # 57.5 kept minutes an hour: 180 minutes of work need 4 attempts
    assert e.held_minutes == pytest.approx(187.5)
    assert e.goodput == pytest.approx(1 - 7.5 / 187.5)
    assert e.goodput < goodput.TARGET


def test_aligned_phases_lose_nothing_and_the_last_attempt_is_not_preempted() -> None:
    e = goodput.expectation(3, 0.0)
    assert (e.preemptions, e.held_minutes, e.goodput) == (2, 180.0, 1.0)


def test_the_target_allows_1_8_minutes_an_hour_so_3_6_minute_checkpoints() -> None:
    assert goodput.allowed_loss_minutes(0.97, 60) == pytest.approx(1.8)
    by_case = list(goodput.analytic(3).values())
    assert [e.lost_minutes for e in by_case] == [0.0, 2.5, 5.0]
    assert by_case[0].goodput >= goodput.TARGET > by_case[1].goodput > by_case[2].goodput


def test_a_preemption_must_lose_less_than_the_attempt_holds() -> None:
    with pytest.raises(ValueError):
        goodput.expectation(3, 60.0)


def test_parse_output_finds_resume_last_step_and_the_sigterm_checkpoint() -> None:
    text = "\n".join(
        [
            "worker 0-0: attempt 2 resumes from step 55",
            "worker 0-0: step 56",
            "worker 0-0: step 57",
            "[tpujobs-agent] preemption notice (SIGTERM): stopping the command, SIGKILL after 30 s",
            "TPUJOBS_CHECKPOINT step=57 on SIGTERM",
            "worker 0-0: got signal 15, stopping at step 57",
        ]
    )
    assert goodput.parse_output(2, text) == goodput.AttemptLog(2, 55, 57, 57)
    periodic = "worker 0-0: attempt 1 starts from step 0\nworker 0-0: step 5\nTPUJOBS_CHECKPOINT step=5\n"
    assert goodput.parse_output(1, periodic) == goodput.AttemptLog(1, 0, 5, None)


def result(variant: str, redone: int, late_checkpoint: bool, lost_minutes: float) -> object:
    """Two attempts of 4 chips: the first preempted after 60 minutes, the second 30 minutes."""
    first = AttemptUsage(
        1,
        4,
        T0,
        held_from=T0,
        ended_at=minutes(60),
        last_checkpoint_at=minutes(60.5 if late_checkpoint else 60 - lost_minutes),
        capacity_lost=True,
    )
    second = AttemptUsage(2, 4, minutes(60), held_from=minutes(61), ended_at=minutes(91))
    lost = 0.0 if late_checkpoint else lost_minutes
    chip_hours = 4 * 90 / 60
    return goodput.Result(
        variant=variant,
        job_id=f"goodput-{variant}",
        state="SUCCEEDED",
        wall_seconds=95.0,
        minute_seconds=1.0,
        chips=4,
        totals={
            "chip_hours": chip_hours / 60,  # real hours: a simulated minute is a real second
            "lost_chip_hours": 4 * lost / 60 / 60,
            "useful_chip_hours": (chip_hours - 4 * lost / 60) / 60,
            "goodput": 1 - lost / 90,
            "lost_seconds": lost,
            "queue_wait_seconds": 1.0,
        },
        usage=(first, second),
        logs=(goodput.AttemptLog(1, 0, 60, None), goodput.AttemptLog(2, 60 - redone, 90, None)),
        observed_held_seconds=91.0,
    )


def test_result_counts_redone_steps_and_whether_the_late_checkpoint_counted() -> None:
    periodic = result("periodic", redone=4, late_checkpoint=False, lost_minutes=4.5)
    assert periodic.preemptions == 1
    assert periodic.redone_steps() == [4]
    assert periodic.late_checkpoints_counted() == 0
    assert periodic.lost_minutes_per_preemption == pytest.approx(4.5)
    assert periodic.simulated_hours(periodic.totals["chip_hours"]) == pytest.approx(6.0)
    assert periodic.kept_work_goodput() == pytest.approx(1 - 4.5 / 90)

    # the sigterm variant as measured: work kept, but the document was not told
    kept = result("sigterm", redone=0, late_checkpoint=False, lost_minutes=4.5)
    assert kept.goodput == pytest.approx(1 - 4.5 / 90)
    assert kept.kept_work_goodput() == pytest.approx(1.0)
    counted = result("sigterm", redone=0, late_checkpoint=True, lost_minutes=4.5)
    assert counted.late_checkpoints_counted() == 1
    assert counted.goodput == pytest.approx(1.0)


def test_summary_takes_medians_and_judges_the_median_against_the_target() -> None:
    runs = [
        result("periodic", 4, False, 4.5),
        result("periodic", 3, False, 3.5),
        result("periodic", 1, False, 1.0),
    ]
    s = goodput.summarize("periodic", runs)
    assert s.goodputs == tuple(r.goodput for r in runs)
    assert s.median_goodput == pytest.approx(1 - 3.5 / 90)
    assert s.lost_minutes_per_preemption == pytest.approx(3.5)
    assert s.preemptions == 1
    assert s.chip_hours == pytest.approx(6.0)
    assert not s.meets_target  # 96.1%
    assert goodput.summarize("sigterm", [result("sigterm", 0, True, 4.5)]).meets_target

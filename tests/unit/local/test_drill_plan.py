"""The drill runner's plan (local/drill.py): faults and points as the command line gives them, and when each is due."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import pytest

from tpujobs.cli.drill import drill
from tpujobs.engine.output_export import OutputObjects, attempt_prefix
from tpujobs.local.drill import DEFAULT_AT, DEFAULT_FAULTS, FAULTS, OutputCursor, PlannedFault, Point, fault_plan
from tpujobs.local.fakes.output_bucket import InMemoryOutputBucket


def test_the_default_plan_preempts_with_notice_then_sigterms_without_one_after_a_checkpoint_each() -> None:
    assert fault_plan() == (
        PlannedFault("preempt", Point("checkpoint", 1)),
        PlannedFault("sigterm", Point("checkpoint", 1)),
    )
    assert set(DEFAULT_FAULTS.split(",")) <= set(FAULTS)
    options = inspect.signature(drill).parameters  # the CLI's defaults are the runner's
    assert (options["faults"].default, options["at"].default) == (DEFAULT_FAULTS, DEFAULT_AT)


def test_one_point_per_fault_in_order_and_the_last_point_repeats() -> None:
    plan = fault_plan("maintenance,silent,reboot", "step:7,12.5s")
    assert [(p.fault, p.at.kind, p.at.value) for p in plan] == [
        ("maintenance", "step", 7),
        ("silent", "seconds", 12.5),
        ("reboot", "seconds", 12.5),
    ]
    assert [str(p.at) for p in plan] == ["step:7", "12.5s", "12.5s"]


@pytest.mark.parametrize(
    ("faults", "at", "says"),
    [
        ("preempt,explode", None, "choose from"),
        ("", None, "choose from"),
        ("preempt", "checkpoint:0", "starts at 1"),
        ("preempt", "checkpoint:x", "none of"),
        ("preempt", "soon", "none of"),
        ("preempt", "-3s", "none of"),
        ("preempt", "step:1,step:2", "2 points for 1 faults"),
    ],
)
def test_a_bad_plan_is_refused_with_a_sentence(faults: str, at: str | None, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        fault_plan(faults, at)


def test_each_kind_of_point_is_reached_by_its_own_measure_only() -> None:
    """checkpoint:K counts the attempt's checkpoints, step:N its last printed step, Ns its seconds RUNNING."""
    assert not Point.parse("checkpoint:2").reached(checkpoints=1, step=50, seconds=99)
    assert Point.parse("checkpoint:2").reached(checkpoints=2, step=None, seconds=0)
    assert not Point.parse("step:10").reached(checkpoints=9, step=None, seconds=99)
    assert not Point.parse("step:10").reached(checkpoints=9, step=9, seconds=99)
    assert Point.parse("step:10").reached(checkpoints=0, step=11, seconds=0)
    assert not Point.parse("5s").reached(checkpoints=9, step=99, seconds=4.9)
    assert Point.parse("5s").reached(checkpoints=0, step=None, seconds=5.0)


def test_the_table_shows_each_finding_with_its_evidence_as_printed(capsys: pytest.CaptureFixture[str]) -> None:
    """For people: the attempts, then each finding's sentence, lines and timeline entries; markup shown literally."""
    from tpujobs.cli.drill import show_result

    line = {"run": "drilled", "attempt": 2, "worker": 0, "text": "TPUJOBS_START step=0 [bold]x[/bold]"}
    entry = {"attempt": 1, "at": "2026-01-01T00:00:00+00:00", "state": "RECOVERING", "reason": "Preempted"}
    answer = {
        "passed": False,
        "findings": [{"kind": "restore-skipped", "sentence": "Attempt 2 started from step 0.", "lines": [line],
                      "timeline": [entry]}],
        "attempts": [{"attempt": 1, "started_from": 0, "last_step": 9, "checkpoints": [3, 6, 9, 12],
                      "steps_redone": None, "ended": "RECOVERING: Preempted"}],
        "steps_redone": 9, "goodput": 0.5, "result_matches": False, "allowed_steps_redone_per_resume": 4,
        "jobs": {"drilled": "drill-1", "uninterrupted": "drill-1-base"},
        "faults": [{"fault": "preempt", "at": "checkpoint:1", "attempt": 1}],
    }  # fmt: skip

    show_result(answer)

    printed = capsys.readouterr().out
    assert "3 .. 12 (4)" in printed
    assert "restore-skipped" in printed and "Attempt 2 started from step 0." in printed
    assert "drilled attempt 2 worker 0: TPUJOBS_START step=0 [bold]x[/bold]" in printed
    assert "timeline: attempt 1 2026-01-01T00:00:00+00:00 RECOVERING: Preempted" in printed
    assert "result matches: NO" in printed and "goodput: 50.0%" in printed


class CountingBucket(InMemoryOutputBucket):
    """Counts the objects read, to show each chunk is read once however often the drill polls."""

    def __init__(self) -> None:
        super().__init__()
        self.names_read: list[str] = []

    def read_all(self, names: Sequence[str]) -> list[bytes | None]:
        self.names_read += names
        return super().read_all(names)


def test_the_drill_reads_each_output_chunk_once_and_joins_a_line_split_across_chunks() -> None:
    bucket = CountingBucket()
    objects = OutputObjects(bucket)
    prefix = attempt_prefix("job", 1) + "chunks/slice-0-worker-0/"
    cursor = OutputCursor()

    def poll() -> list[bytes]:
        return cursor.new_lines(objects, objects.worker_outputs("job", 1)[(0, 0)])

    bucket.put(prefix + "0.log", b"TPUJOBS_START step=0\nTPUJOBS_CHECK")
    assert poll() == [b"TPUJOBS_START step=0"]
    bucket.put(prefix + "2.log", b"TPUJOBS_STEP step=9\n")  # chunk 1 is late: chunk 2 waits for it
    assert poll() == []
    bucket.put(prefix + "1.log", b"POINT step=5\n")
    assert poll() == [b"TPUJOBS_CHECKPOINT step=5", b"TPUJOBS_STEP step=9"]
    assert poll() == []
    assert bucket.names_read == [prefix + "0.log", prefix + "1.log", prefix + "2.log"]

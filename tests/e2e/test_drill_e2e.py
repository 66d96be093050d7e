"""`tpujobs drill` on the local stack: the toy example passes; a copy whose restore is skipped fails, named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from support.drill import drill, job_file

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train"
# 12 s of steps an attempt: each fault, sent once the attempt's first checkpoint shows (its output comes
# in 2 s chunks, reports lag more under load), still lands with most of the attempt's steps to go.
COMMAND = "python3 train.py --steps 40 --step-seconds 0.3 --checkpoint-every 4"


def test_the_toy_example_passes_the_drill_and_a_skipped_restore_fails_it(local_stack, tmp_path: Path) -> None:
    """Preempted with notice, then SIGTERM without one: the toy example resumes from its newest checkpoint
    each time and ends with the uninterrupted run's digest; the copy that never restores is `restore-skipped`."""
    code, answer = drill(str(job_file(tmp_path, "toy", EXAMPLE, COMMAND, "v4-16")), timeout=150)
    assert code == 0, answer["findings"]
    assert answer["passed"] is True and answer["result_matches"] is True
    assert [f["fault"] for f in answer["faults"]] == ["preempt", "sigterm"]
    assert [f["attempt"] for f in answer["faults"]] == [1, 2]
    resumed = answer["attempts"][1:]
    assert resumed and all(a["started_from"] and a["started_from"] > 0 for a in resumed)
    assert 0 <= answer["steps_redone"] <= 2 * answer["allowed_steps_redone_per_resume"]
    assert 0 < answer["goodput"] <= 1

    planted = tmp_path / "planted"
    shutil.copytree(EXAMPLE, planted, ignore=shutil.ignore_patterns("__pycache__"))
    source = (planted / "train.py").read_text(encoding="utf-8")
    assert "saved = checkpoints.load(uri)" in source
    (planted / "train.py").write_text(source.replace("saved = checkpoints.load(uri)", "saved = None"), "utf-8")
    planted_job = job_file(tmp_path, "planted", planted, COMMAND, "v4-8")  # one host will do
    code, answer = drill(str(planted_job), "--faults", "preempt", timeout=150)
    assert code == 1
    kinds = [f["kind"] for f in answer["findings"]]
    assert "restore-skipped" in kinds, kinds
    skipped = next(f for f in answer["findings"] if f["kind"] == "restore-skipped")
    assert any(line["text"] == "TPUJOBS_START step=0" and line["attempt"] == 2 for line in skipped["lines"])

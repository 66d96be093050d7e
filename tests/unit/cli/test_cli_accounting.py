"""`tpujobs list` and `describe` show what jobs cost; `list --watch` redraws in place."""

from __future__ import annotations

from datetime import timedelta

from rich.console import Console

from support.job_timelines import a_job, at, move, preempted_job
from support.rich_text import rendered
from tpujobs.cli import commands as cli
from tpujobs.domain.accounting import checkpoint_reported
from tpujobs.domain.states import EventKind
from tpujobs.engine.ports import AttemptLogs


def test_list_shows_chip_hours_goodput_owner_and_age_with_running_time_counted_up_to_now() -> None:
    finished = preempted_job()  # 32 chip-hours, goodput 75%
    running = move(a_job().evolve(job_id="acct-2"), 0, EventKind.ADMITTED, capacity_state="ACTIVE")

    text = rendered(cli.jobs_table([finished, running], now=at(30)))

    rows = {line.split()[0]: line for line in text.splitlines() if line.strip().startswith("acct-")}
    assert "SUCCEEDED" in rows["acct-1"] and "32.00" in rows["acct-1"] and "75.0%" in rows["acct-1"]
    assert "ada" in rows["acct-1"] and "2" in rows["acct-1"].split()
    assert "PROVISIONING" in rows["acct-2"] and "8.00" in rows["acct-2"]  # 16 chips x 30 minutes so far
    assert "30m" in rows["acct-2"]
    assert "SUCCEEDED 1" in text and "PROVISIONING 1" in text  # the queue monitor's summary


def test_describe_shows_each_attempt_with_its_logs_chip_hours_and_lost_time() -> None:
    job = preempted_job()
    logs = {1: AttemptLogs(1, "gs://logs/jobs/acct-1/attempt-1/attempt.log", {}, at(81)), 2: None}

    text = rendered(cli.describe_tables(job, [], logs, now=at(200)))

    attempts = text[text.index("Attempts") : text.index("Timeline")]
    first = next(line for line in attempts.splitlines() if line.strip().startswith("1 "))
    second = next(line for line in attempts.splitlines() if line.strip().startswith("2 "))
    assert "16.00" in first and "30m00s" in first and "attempt-1/attempt.log" in first
    assert "us-central2-b" in first  # where the attempt asked for capacity
    assert "16.00" in second and "not exported yet" in second
    assert "32.00 (24.00 useful, 8.00 lost to preemption)" in text
    assert "75.0%" in text


def test_describe_marks_a_rerun_as_losing_the_whole_attempt() -> None:
    text = rendered(cli.describe_tables(preempted_job(on_preemption="rerun"), [], {}, now=at(200)))
    assert "1h00m (rerun)" in text


def test_watch_redraws_until_told_to_stop(monkeypatch) -> None:
    monkeypatch.setattr(cli, "out", Console(record=True, width=120, color_system=None))
    frames = iter(range(100))

    cli.watch_screen(lambda: f"frame {next(frames)}", interval=0.01, refreshes=3)

    assert "frame 3" in cli.out.export_text()  # the first draw and three refreshes


def test_a_running_job_counts_its_latest_checkpoint() -> None:
    job = move(a_job(), 0, EventKind.ADMITTED, capacity_state="ACTIVE")
    usage = checkpoint_reported(job.usage, 1, at(0) + timedelta(minutes=10))
    text = rendered(cli.describe_tables(job.evolve(usage=usage), [], {}, now=at(20)))
    assert "03-01 09:10:00" in text and "running" in text

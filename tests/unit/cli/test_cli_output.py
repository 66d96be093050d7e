"""What the CLI prints at 80 columns, piped, for scripts, and when it cannot work at all."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from support.job_timelines import a_job, at, move, preempted_job
from tpujobs.cli import app, tables
from tpujobs.cli.common import Stop, resolve_project
from tpujobs.domain.job import JobEvent
from tpujobs.domain.states import EventKind, JobState

LIST_HEADERS = (
    "JOB", "STATE", "ATTEMPT", "ACCELERATOR", "ZONE", "PRIORITY", "OWNER", "AGE", "CHIP-H", "GOODPUT", "REASON",
)  # fmt: skip
VALID = "name: train\nowner: ada@example.com\naccelerator_type: v4-8\ncommand: python train.py\n"


def some_jobs():
    long_owner = move(a_job(), 0, EventKind.ADMITTED, capacity_state="ACTIVE").evolve(
        job_id="train-llama-70b-run-2", owner="ada.lovelace@research.example.com"
    )
    return [preempted_job(), long_owner]


def terminal(width: int, renderable) -> str:
    console = Console(file=io.StringIO(), force_terminal=True, color_system=None, width=width)
    tables.show(console, renderable)
    return console.file.getvalue()


def piped(renderable) -> str:
    console = Console(file=io.StringIO(), width=80)  # a pipe: not a terminal
    tables.show(console, renderable)
    return console.file.getvalue()


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"[│┃]", line)[1:-1]]


def test_list_at_80_columns_keeps_the_numbers_and_prints_no_empty_column() -> None:
    """Every column shown has a header and a value in every row; ATTEMPT, AGE, CHIP-H and GOODPUT stay."""
    text = terminal(80, tables.jobs_sheet(some_jobs(), now=at(30)))
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    header = cells(next(line for line in lines if "JOB" in line))
    assert all(header) and {"JOB", "STATE", "ATTEMPT", "AGE", "CHIP-H", "GOODPUT"} <= set(header)
    rows = [cells(line) for line in lines if line.startswith("│")]
    assert len(rows) == 2 and all(all(row) for row in rows)
    assert "train-llama-70b-run-2" in text  # ids are never cut
    assert "32.00" in text and "75.0%" in text


def test_list_piped_has_every_column_whole() -> None:
    """Not a terminal: every header and every value, nothing cut, however wide."""
    text = piped(tables.jobs_sheet(some_jobs(), now=at(30)))
    header = cells(next(line for line in text.splitlines() if "JOB" in line))
    assert tuple(header) == LIST_HEADERS
    assert "ada.lovelace@research.example.com" in text and "…" not in text
    assert "\x1b" not in text


def test_describe_at_80_columns_keeps_attempt_numbers_and_reasons() -> None:
    """The attempts table keeps its numbers and chip-hours; the timeline keeps the whole reason."""
    job = preempted_job()
    reason = "The queued resource was preempted by the TPU service; a new attempt follows the rules."
    event = JobEvent(2, at(5), JobState.QUEUED, JobState.PROVISIONING, reason, "tpu", 1)
    text = terminal(80, tables.describe_tables(job, [event], {}, now=at(200), width=80))
    assert all(len(line) <= 80 for line in text.splitlines())
    attempts = text[text.index("Attempts") : text.index("Timeline")]
    numbers = [cells(line)[0] for line in attempts.splitlines() if line.startswith("│")]
    assert numbers == ["1", "2"] and "16.00" in attempts
    timeline = text[text.index("Timeline") :]
    wrapped = " ".join(cells(line)[-1] for line in timeline.splitlines() if line.startswith("│"))
    assert " ".join(wrapped.split()) == reason  # wrapped onto more lines, never cut


def test_dead_letters_and_rejections_fit_80_columns_with_ids_whole() -> None:
    """Ids are whole; the payload is cut with an ellipsis; the rejection's reason is kept."""
    payload = "{" + '"x": 1, ' * 40 + "}"
    letters = [
        {
            "message_id": "12345678901234567",
            "at": "2026-03-01T09:00:00Z",
            "topic": "tpujobs-submit",
            "delivery_attempts": 5,
            "payload": payload,
        }
    ]
    text = terminal(80, tables.dead_letters_sheet(letters))
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "12345678901234567" in text and "tpujobs-submit" in text and "…" in text
    refused = [
        {
            "message_id": "99",
            "at": "2026-03-01T09:00:00Z",
            "reason": "accelerator_type: unknown family",
            "payload": payload,
            "topic": "tpujobs-submit",
        }
    ]
    text = terminal(80, tables.rejections_sheet(refused))
    assert "accelerator_type: unknown family" in text and all(len(line) <= 80 for line in text.splitlines())


def test_version_comes_from_the_installed_package() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and re.fullmatch(r"tpujobs \d+\.\d+\.\d+\S*\n", result.output)


@pytest.mark.parametrize("verb", [["validate"], ["submit", "--dry-run"]])
def test_validate_and_dry_run_check_a_spec_without_submitting(tmp_path: Path, verb: list[str]) -> None:
    """A valid spec: exit 0; an invalid one: exit 2 with the field named, as submit says it. No project needed."""
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(VALID, encoding="utf-8")
    bad.write_text(VALID.replace("v4-8", "v4-9"), encoding="utf-8")
    env = {"GOOGLE_CLOUD_PROJECT": None, "TPUJOBS_STATE_DIR": str(tmp_path), "PATH": str(tmp_path)}
    ok = CliRunner().invoke(app, [*verb, str(good)], env=env)
    assert ok.exit_code == 0, ok.output
    assert "valid" in ok.output
    refused = CliRunner().invoke(app, [*verb, str(bad), "--set", "slices=2"], env=env)
    assert refused.exit_code == 2 and "Invalid spec" in refused.stderr and "accelerator_type" in refused.stderr


def test_describe_without_credentials_says_what_to_do_in_one_line(tmp_path: Path) -> None:
    """No emulator, no API, credentials pointing nowhere: one sentence on stderr, exit 1, no traceback."""
    env = {
        "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "no-such-key.json"),
        "GOOGLE_CLOUD_PROJECT": "some-project",
        "FIRESTORE_EMULATOR_HOST": None,
        "TPUJOBS_API_URL": None,
        "TPUJOBS_STATE_DIR": str(tmp_path),
    }
    result = CliRunner().invoke(app, ["describe", "job-1"], env=env)
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "credentials" in lines[0] and "gcloud auth application-default login" in lines[0]


def test_no_project_anywhere_is_one_sentence_saying_how_to_set_it(tmp_path: Path) -> None:
    """No --project, no GOOGLE_CLOUD_PROJECT, no gcloud, no local stack: never a silent default."""
    env = {
        "GOOGLE_CLOUD_PROJECT": None,
        "GCLOUD_PROJECT": None,
        "GOOGLE_APPLICATION_CREDENTIALS": None,
        "TPUJOBS_API_URL": None,
        "TPUJOBS_STATE_DIR": str(tmp_path),
        "PATH": str(tmp_path),  # no gcloud
    }
    result = CliRunner().invoke(app, ["list"], env=env)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--project" in lines[0] and "GOOGLE_CLOUD_PROJECT" in lines[0]


def test_the_project_comes_from_the_flag_then_the_environment_then_gcloud_then_the_stack(monkeypatch) -> None:
    from tpujobs.cli import common

    monkeypatch.setattr(common, "gcloud_project", lambda: "from-gcloud")
    stack = {"GOOGLE_CLOUD_PROJECT": "from-stack"}
    assert resolve_project("from-flag", {"GOOGLE_CLOUD_PROJECT": "from-env"}, stack) == "from-flag"
    assert resolve_project(None, {"GOOGLE_CLOUD_PROJECT": "from-env"}, stack) == "from-env"
    assert resolve_project(None, {}, stack) == "from-gcloud"
    monkeypatch.setattr(common, "gcloud_project", lambda: "")
    assert resolve_project(None, {}, stack) == "from-stack"
    with pytest.raises(Stop):
        resolve_project(None, {}, {})


def test_json_output_is_what_the_api_gives() -> None:
    """`-o json` and `-o yaml` print the document as it is (no markup, no wrapping)."""
    from tpujobs.cli.common import Format, print_document

    runner = CliRunner()
    document = {"jobs": [{"job_id": "a", "reason": "[bold]x[/] " + "y" * 200}]}
    import typer

    probe = typer.Typer()
    probe.command()(lambda: print_document(document, Format.json))
    assert json.loads(runner.invoke(probe, []).stdout) == document

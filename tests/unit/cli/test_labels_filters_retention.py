"""Labels changed after submission, `list`'s filters as options, its columns at 80, and when an
ended job's record expires: the pure parts, without Firestore."""

from __future__ import annotations

import io
import re
from datetime import timedelta

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from support.job_timelines import a_job, at, move, run_to_success
from tpujobs.cli import app, tables
from tpujobs.cli.commands import ACTIVE_GROUP, FINISHED_GROUP, job_filter
from tpujobs.domain.labels import LabelError, parse_label_pairs, relabeled
from tpujobs.domain.states import TERMINAL, TRANSITIONS, EventKind, JobState
from tpujobs.domain.transitions import Decision, Ignored, Observation, decide
from tpujobs.engine.settings import Settings


def labelled(**labels: str):
    job = a_job()
    return job.evolve(spec=job.spec.model_copy(update={"labels": labels}))


def test_relabeled_sets_and_removes_and_says_who_and_what() -> None:
    """The new labels replace the old ones named; the timeline entry names the caller and each change."""
    job = labelled(team="a", old="x")
    outcome = relabeled(job, {"team": "b", "run": "7"}, ["old"], "ada@example.com", at(3))
    assert isinstance(outcome, Decision)
    assert outcome.job.spec.labels == {"team": "b", "run": "7"}
    assert outcome.job.event_seq == job.event_seq + 1 and outcome.event.seq == outcome.job.event_seq
    assert "ada@example.com" in outcome.event.reason
    assert "team=b (was a)" in outcome.event.reason and "run=7" in outcome.event.reason
    assert "removed old" in outcome.event.reason


def test_relabeling_keeps_the_state_and_its_reason() -> None:
    """A label change is not a transition: a FAILED job still says why it failed."""
    failed = move(a_job(), 1, EventKind.CAPACITY_REQUEST_FAILED, reason="Quota refused.")
    outcome = relabeled(failed, {"team": "x"}, [], "ada", at(2))
    assert isinstance(outcome, Decision)
    assert outcome.job.state is JobState.FAILED and outcome.job.state_reason == "Quota refused."
    assert (outcome.event.from_state, outcome.event.to_state) == (JobState.FAILED, JobState.FAILED)
    assert outcome.job.ended_at == failed.ended_at and outcome.job.expire_at == failed.expire_at


def test_relabeling_a_job_holding_capacity_says_its_capacity_keeps_the_old_labels() -> None:
    """Nodes are labelled when created: the reason says so while capacity is held, and not otherwise."""
    running = move(move(a_job(), 1, EventKind.ADMITTED), 2, EventKind.WORKERS_STARTED, worker="0-0")
    held = relabeled(running, {"team": "x"}, [], "ada", at(3))
    queued = relabeled(a_job(), {"team": "x"}, [], "ada", at(3))
    assert isinstance(held, Decision) and isinstance(queued, Decision)
    assert "keeps its old labels" in held.event.reason
    assert "keeps its old labels" not in queued.event.reason


def test_a_label_change_that_changes_nothing_is_ignored() -> None:
    """A retried request (or removing a label that is not there) writes nothing."""
    assert isinstance(relabeled(labelled(team="a"), {"team": "a"}, ["nope"], "ada", at(1)), Ignored)


@pytest.mark.parametrize(
    ("put", "remove", "named"),
    [
        ({"Team": "a"}, [], "'Team'"),
        ({"tpujobs-x": "a"}, [], "tpujobs"),
        ({"team": "A B"}, [], "team"),
        ({"team": "a"}, ["team"], "'team'"),
    ],
)
def test_a_refused_label_names_it(put: dict[str, str], remove: list[str], named: str) -> None:
    """The spec's own label rules refuse it, in one sentence naming the label."""
    with pytest.raises(LabelError, match=re.escape(named)):
        relabeled(a_job(), put, remove, "ada", at(1))


def test_label_arguments_must_be_key_equals_value() -> None:
    assert parse_label_pairs(["team=x", "empty="]) == {"team": "x", "empty": ""}
    with pytest.raises(LabelError, match="'team'"):
        parse_label_pairs(["team"])


# --- retention ---------------------------------------------------------------------------


def test_an_ended_job_expires_its_retention_after_it_ended() -> None:
    """Every terminal transition sets expire_at = ended_at + the job's retention; none before."""
    job = a_job().evolve(record_retention_days=7)
    running = move(move(job, 1, EventKind.ADMITTED), 2, EventKind.WORKERS_STARTED, worker="0-0")
    assert running.expire_at is None
    done = run_to_success(running, 30)
    assert done.ended_at == at(30) and done.expire_at == at(30) + timedelta(days=7)
    cancelled = move(job, 5, EventKind.CANCEL_REQUESTED)
    assert cancelled.expire_at == at(5) + timedelta(days=7)


def test_leaving_an_end_state_clears_expire_at() -> None:
    """Every way out of an end state in the table (resume, rerun) keeps the record again."""
    ended = move(a_job(), 5, EventKind.CANCEL_REQUESTED)
    assert ended.expire_at is not None
    ways_out = [(s, e) for (s, e), targets in TRANSITIONS.items() if s is ended.state and targets - TERMINAL]
    if not ways_out:
        pytest.skip("no transition leaves an end state yet")
    for _, kind in ways_out:
        outcome = decide(ended, Observation(kind, None, "user", reason="again"), at(9))
        assert isinstance(outcome, Decision), outcome
        assert outcome.job.expire_at is None


def test_retention_settings_are_whole_days() -> None:
    """Defaults 180 and 30; a bad value names its variable."""
    defaults = Settings.from_env({})
    assert (defaults.record_retention_days, defaults.rejection_retention_days) == (180, 30)
    assert defaults.dead_letter_retention_days == 30
    assert Settings.from_env({"TPUJOBS_RECORD_RETENTION_DAYS": "7"}).record_retention_days == 7
    with pytest.raises(ValueError, match="TPUJOBS_REJECTION_RETENTION_DAYS"):
        Settings.from_env({"TPUJOBS_REJECTION_RETENTION_DAYS": "0"})


# --- list's options ----------------------------------------------------------------------


def test_active_and_finished_are_the_state_groups() -> None:
    assert job_filter([], None, None, [], active=True).states == ACTIVE_GROUP
    assert job_filter([], None, None, [], finished=True).states == FINISHED_GROUP
    assert set(ACTIVE_GROUP) | set(FINISHED_GROUP) == {s.value for s in JobState}


def test_states_labels_and_name_become_one_filter() -> None:
    """--state repeats (any of them), --label repeats (all of them), --name is a prefix."""
    where = job_filter(["failed", "CANCELLED"], "ada", "train-", ["team=x", "run=2"])
    assert where.states == ("FAILED", "CANCELLED")
    assert dict(where.labels) == {"team": "x", "run": "2"}
    assert (where.owner, where.name_prefix) == ("ada", "train-")
    assert job_filter(["FAILED", "RUNNING"], None, None, [], finished=True).states == ("FAILED",)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["list", "--state", "DONE"], "--state"),
        (["list", "--label", "team"], "--label"),
        (["list", "--active", "--finished"], "--active"),
        (["list", "--state", "RUNNING", "--finished"], "--state"),
        (["label", "job-1", "Team=x"], "'Team'"),
        (["label", "job-1"], "--remove"),
    ],
)
def test_bad_list_and_label_options_are_refused_naming_the_option(args: list[str], named: str) -> None:
    """Refused before anything is read or written: exit 2 and a sentence naming what is wrong."""
    result = CliRunner().invoke(app, args, env={"TPUJOBS_API_URL": "http://127.0.0.1:9/none"})
    assert result.exit_code == 2, result.output
    assert named in " ".join(result.output.split()).replace("│", "")


def test_job_filter_refuses_an_empty_name() -> None:
    with pytest.raises(typer.BadParameter, match="--name"):
        job_filter([], None, "", [])


# --- the table ---------------------------------------------------------------------------


def terminal(width: int, sheet: tables.Sheet) -> str:
    console = Console(file=io.StringIO(), force_terminal=True, color_system=None, width=width)
    tables.show(console, sheet)
    return console.file.getvalue()


def test_list_at_80_columns_shows_the_reason_shortened() -> None:
    """Short ids leave room: the reason is cut with an ellipsis, and no line passes 80."""
    job = move(a_job(), 1, EventKind.CAPACITY_REQUEST_FAILED, reason="The TPU API refused: " + "x" * 90)
    text = terminal(80, tables.jobs_sheet([job.evolve(job_id="j-1")], now=at(30)))
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "REASON" in text and "The TPU" in text and "…" in text and "x" * 90 not in text


def test_list_piped_shows_priority_and_the_whole_reason() -> None:
    job = move(a_job(), 1, EventKind.CAPACITY_REQUEST_FAILED, reason="The TPU API refused the request.")
    console = Console(file=io.StringIO(), width=80)
    tables.show(console, tables.jobs_sheet([job], now=at(30)))
    text = console.file.getvalue()
    assert "PRIORITY" in text and job.spec.priority in text
    assert "The TPU API refused the request." in text


def test_describe_says_when_an_ended_job_record_expires() -> None:
    ended = move(a_job(), 5, EventKind.CANCEL_REQUESTED)
    console = Console(file=io.StringIO(), width=200)
    tables.show(console, tables.describe_tables(ended, [], {}, now=at(10)))
    text = console.file.getvalue()
    assert "record expires" in text and "(kept 180 days)" in text
    assert str((at(5) + timedelta(days=180)).date()) in text

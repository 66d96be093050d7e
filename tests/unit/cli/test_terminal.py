"""What the CLI prints of a job is the job's text, literally: no Rich markup, no terminal control."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from support.job_timelines import a_job, at, move
from tpujobs import cli
from tpujobs.cli.terminal import shown, uncontrolled
from tpujobs.domain.job import JobEvent
from tpujobs.domain.states import EventKind, JobState

MARKUP = "[bold red]x[/]"
CLEAR = "\x1b[2J"
OWN_STYLES = re.compile(r"\x1b\[[0-9;]*m")  # the only escape sequences Rich itself writes here


def hostile_job():
    """A job whose every free-text field carries markup and a screen-clearing escape."""
    job = move(a_job(), 5, EventKind.ADMITTED, capacity_state="ACTIVE")
    spec = job.spec.model_copy(
        update={"labels": {"team": f"ml{MARKUP}", f"k{CLEAR}": "v"}, "env": {f"X{CLEAR}": MARKUP}}
    )
    return job.evolve(
        spec=spec,
        name=f"name{MARKUP}{CLEAR}",
        owner=f"ada{MARKUP}{CLEAR}mid",
        state_reason=f"reason {MARKUP} then {CLEAR} and\x9b2J\x07",
        zone=f"us-central2-b{CLEAR}",
    )


def terminal_output(renderable) -> tuple[str, str]:
    """What a colour terminal receives, and the same as plain text."""
    raw = io.StringIO()
    Console(file=raw, force_terminal=True, color_system="truecolor", width=250).print(renderable)
    plain = Console(record=True, width=250, color_system=None, file=io.StringIO())
    plain.print(renderable)
    return raw.getvalue(), plain.export_text()


def assert_literal(raw: str, text: str, *fields: str) -> None:
    assert OWN_STYLES.sub("", raw).count("\x1b") == 0, "an escape sequence came from the data"
    assert "\x9b" not in raw and "\x07" not in raw
    for field in fields:
        assert field in text, f"{field!r} is not shown literally"


def test_list_shows_owner_zone_and_id_literally() -> None:
    """`tpujobs list`: markup and control characters in a job's fields print as text."""
    job = hostile_job().evolve(job_id=f"id{MARKUP}")
    raw, text = terminal_output(cli.jobs_table([job], now=at(30)))
    assert_literal(raw, text, f"ada{MARKUP}\\x1b[2Jmid", f"id{MARKUP}", "us-central2-b\\x1b[2J")


def test_describe_shows_name_owner_reason_labels_and_env_names_literally() -> None:
    """`tpujobs describe`: the fields, the attempts and the timeline reasons print as text."""
    job = hostile_job()
    event = JobEvent(2, at(5), JobState.QUEUED, JobState.PROVISIONING, f"timeline {MARKUP}{CLEAR}", "tpu", 1)
    raw, text = terminal_output(cli.describe_tables(job, [event], {}, now=at(30)))
    assert_literal(
        raw,
        text,
        f"name{MARKUP}\\x1b[2J",
        f"ada{MARKUP}\\x1b[2Jmid",
        f"reason {MARKUP} then \\x1b[2J and\\x9b2J\\x07",
        f"team=ml{MARKUP}",
        "k\\x1b[2J=v",
        f"X\\x1b[2J={MARKUP}",
        f"timeline {MARKUP}\\x1b[2J",
    )


@pytest.mark.parametrize(
    ("text", "seen"),
    [
        ("plain text", "plain text"),
        ("a\x1b[2Jb", "a\\x1b[2Jb"),
        ("line\nbreak\ttab\rreturn", "line\\x0abreak\\x09tab\\x0dreturn"),
        ("c1 \x9b and del \x7f", "c1 \\x9b and del \\x7f"),
        ("right\u202eto left", "right\\u202eto left"),
        ("ünïcödé ✓", "ünïcödé ✓"),
    ],
)
def test_control_characters_become_visible_escapes(text: str, seen: str) -> None:
    """C0, DEL, C1 and the Unicode controls that reorder text are shown, not obeyed."""
    assert uncontrolled(text) == seen


def test_shown_escapes_markup_so_that_it_prints_as_written() -> None:
    """Rich prints shown(text) as the text itself, with our own markup around it kept."""
    console = Console(record=True, width=100, color_system=None, file=io.StringIO())
    console.print(f"[bold]{shown('[link=http://x]y[/link] [red]z[/]')}[/bold]")
    assert console.export_text().strip() == "[link=http://x]y[/link] [red]z[/]"
    assert uncontrolled(None) == ""

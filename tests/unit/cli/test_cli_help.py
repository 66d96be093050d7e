"""Every `tpujobs … --help` reads as whole sentences at any terminal width.

A docstring's own line breaks once showed through: at 100 columns the listing broke `submit`,
`logs`, `dead-letters` and `drill` mid-sentence ("…, else" / "by publishing …"). The check here
reads what a user sees: a line that ends mid-sentence although the next line's first word would
have fitted on it was broken by the text, not by the terminal.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tpujobs.cli import app

WIDTHS = (60, 100, 200)
BOX = "│"
SENTENCE_END = (".", "!", "?")
# Lines that start on their own by design: Typer's notes ([default: …], [required]) and list items.
OWN_LINE = re.compile(r"^(\[|[•*-] |\d+\. )")


def command_paths(command: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The root, every group and every command of a Click tree, depth first."""
    yield prefix
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from command_paths(sub, (*prefix, name))


def render_help(command: Any, path: tuple[str, ...], width: int) -> str:
    """What `tpujobs PATH --help` prints in a terminal `width` columns wide (the Click tree is
    built once: Typer's CliRunner would build it again for every screen)."""
    with CliRunner().isolation(env={"COLUMNS": str(width)}) as (stdout, _stderr, _output):
        with pytest.raises(SystemExit) as exit:
            command.main([*path, "--help"], prog_name="tpujobs")
        screen = stdout.getvalue().decode()
    assert exit.value.code == 0, screen
    return screen


def _unforced_break(line: str, end: int, limit: int, following: str) -> str | None:
    """The break between `line` (its text ending at column `end`) and `following` if the
    terminal did not force it: mid-sentence, and the next word would have fitted."""
    text, nxt = line[:end].rstrip(), following.strip()
    if not text.strip() or not nxt or OWN_LINE.match(nxt) or text.endswith(SENTENCE_END):
        return None
    if " " not in text.split("  ")[-1].strip() + nxt:  # one long token (a metavar) cut by characters
        return None
    if len(text) + 1 + len(nxt.split()[0]) > limit:
        return None
    return f"{text.strip()!r} / {nxt!r}"


def premature_breaks(output: str, width: int) -> list[str]:
    """Every line break in a rendered help screen that the text made, not the width: in prose
    (padded one column each side) and in the cells of Typer's panels (a continuation line is one
    cell, aligned under the cell it continues)."""
    lines = output.splitlines()
    breaks = []
    for line, following in itertools.pairwise(lines):
        if line.startswith(BOX) and following.startswith(BOX):
            close = following.rfind(BOX)
            body = following[1:close].rstrip()
            start = len(body) - len(body.lstrip()) + 1
            cell = line[start : line.rfind(BOX)].strip()
            continues = start > 2 and "  " not in body.strip() + cell and line[start - 1] == " " and line[start] != " "
            if continues:
                found = _unforced_break(line, line.rfind(BOX), close - 1, following[start:close])
                breaks += [found] if found else []
        elif line.startswith(" ") and following.startswith(" ") and BOX not in line + following:
            found = _unforced_break(line, len(line), width - 1, following)
            breaks += [found] if found else []
    return breaks


def hard_wrapped_app(markup_mode: Any) -> typer.Typer:
    """A two-command app whose docstring is wrapped as docstrings are in the source."""
    wrapped = typer.Typer(rich_markup_mode=markup_mode)

    @wrapped.command()
    def submit() -> None:
        """Submit a job: through the jobs API when its URL is set (the owner verified), else
        by publishing its spec to the submit topic.

        The second paragraph is wrapped in the source as well, and a reader must never see
        where: it is one sentence, however wide the terminal is."""

    @wrapped.command()
    def other() -> None:
        """Another command."""

    return wrapped


@pytest.mark.parametrize("width", WIDTHS)
def test_every_help_screen_reads_as_whole_sentences(width: int) -> None:
    """`tpujobs --help` and every group's and command's `--help`: no line broken mid-sentence."""
    command = typer.main.get_command(app)
    broken = {
        " ".join(path) or "tpujobs": found
        for path in command_paths(command)
        if (found := premature_breaks(render_help(command, path, width), width))
    }
    assert not broken, f"help broken mid-sentence at {width} columns: {broken}"


@pytest.mark.parametrize("width", WIDTHS)
def test_the_check_catches_a_docstrings_own_line_breaks(width: int) -> None:
    """Under Typer's "rich" markup the source's line breaks show (the fault this file guards
    against); under the markup mode `tpujobs` uses, the same docstrings read whole."""
    old = typer.main.get_command(hard_wrapped_app("rich"))
    assert premature_breaks(render_help(old, (), width), width), "the listing's hard break went unseen"
    assert premature_breaks(render_help(old, ("submit",), width), width), "the paragraph's hard break went unseen"
    ours = typer.main.get_command(hard_wrapped_app(app.rich_markup_mode))
    assert not premature_breaks(render_help(ours, (), width), width)
    assert not premature_breaks(render_help(ours, ("submit",), width), width)

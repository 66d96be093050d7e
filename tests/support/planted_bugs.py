"""Copies of examples/jax_lm with one resume bug planted, for the tests that must catch it.

The example ships without any bug switch; a test copies it into its tmp_path and changes one line,
as a team's real mistake would be one line. Used by the example's own tests and by the drill's.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "jax_lm"


@dataclass(frozen=True)
class PlantedBug:
    """Replace the one line whose code is `code` in `file` with `replacement` (same indentation)."""

    file: str
    code: str  # the line's code, without its indentation or trailing `  # comment`
    replacement: str
    what: str  # the bug in words, as a finding about it would name it


BUGS = {
    "restore-skipped": PlantedBug(
        file="train.py",
        code="newest = checkpointing.newest_step(manager, attempt) if resume else None",
        replacement="newest = None  # planted bug: the resume path ignores the checkpoint",
        what="the restore is skipped: a resumed attempt starts from step 0, not from the newest checkpoint",
    ),
    "data-order-reset": PlantedBug(
        file="train.py",
        code="data_index = step",
        replacement="data_index = step - start_step  # planted bug: the data order restarts after a resume",
        what="the data order is reset: after a resume the batches start again from the first",
    ),
}


class PlantedBugError(AssertionError):
    """The line to change is not in the example (any more): the planted copy would carry no bug."""


def planted_copy(src_dir: Path, dst_dir: Path, bug: str) -> Path:
    """Copy `src_dir` to `dst_dir` with `bug` (a key of BUGS) planted; `dst_dir`. Fails loudly when the
    line to change is missing or not unique, so that a change to the example cannot silently turn a
    bug test into a test of the correct code."""
    if bug not in BUGS:
        raise PlantedBugError(f"no planted bug {bug!r}; known: {', '.join(sorted(BUGS))}")
    planted = BUGS[bug]
    shutil.copytree(src_dir, dst_dir, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    target = dst_dir / planted.file
    lines = target.read_text(encoding="utf-8").splitlines(keepends=True)
    found = [i for i, line in enumerate(lines) if line.strip().partition("  #")[0] == planted.code]
    if len(found) != 1:
        raise PlantedBugError(
            f"{bug}: expected exactly one line `{planted.code}` in {src_dir / planted.file}, found {len(found)}"
        )
    line = lines[found[0]]
    indent = line[: len(line) - len(line.lstrip())]
    lines[found[0]] = f"{indent}{planted.replacement}\n"
    target.write_text("".join(lines), encoding="utf-8")
    return dst_dir

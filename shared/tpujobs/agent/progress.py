"""The progress protocol: lines a job prints so tpujobs can follow its progress (docs/resumable.md).

`TPUJOBS_START step=N` (every process, restore done), `TPUJOBS_STEP step=N data=HEX` (process 0),
`TPUJOBS_CHECKPOINT step=N ...` (its writer, once durable), `TPUJOBS_RESULT digest=HEX` (process 0,
at the end). The agent reports checkpoints; `tpujobs drill` reads every kind. Kept tiny: it ships.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .wire import MAX_DETAIL_CHARS

CHECKPOINT_LINE = re.compile(rb"^[ \t]*TPUJOBS_CHECKPOINT[ \t]+step=([0-9]+)(.*)$")
PROGRESS_LINE = re.compile(r"^[ \t]*TPUJOBS_(START|STEP|CHECKPOINT|RESULT)((?:[ \t]+\S+)*)[ \t\r]*$")
KINDS = {"START": "step", "STEP": "step", "CHECKPOINT": "step", "RESULT": "digest"}  # each one's required word


def parse_checkpoint(line: bytes) -> tuple[int, str] | None:
    """(step, detail) of a `TPUJOBS_CHECKPOINT step=N ...` line, else None."""
    match = CHECKPOINT_LINE.match(line.rstrip(b"\r\n"))
    if match is None:
        return None
    detail = match.group(2).decode("utf-8", "replace").strip()[:MAX_DETAIL_CHARS]
    return int(match.group(1)), detail


class Progress(NamedTuple):
    """One protocol line: its kind, its step (None for RESULT) and its `key=value` words."""

    kind: str
    step: int | None
    words: dict[str, str]


def parse_progress(line: str) -> Progress | None:
    """The protocol line `line` is, else None (also when its required word is missing or bad)."""
    match = PROGRESS_LINE.match(line.rstrip("\n"))
    if match is None:
        return None
    words = {key: value for key, _, value in (word.partition("=") for word in match.group(2).split())}
    kind, required = match.group(1), KINDS[match.group(1)]
    value = words.get(required, "")
    if required == "step":
        if not re.fullmatch(r"[0-9]+", value):
            return None
        return Progress(kind, int(value), words)
    return Progress(kind, None, words) if value else None

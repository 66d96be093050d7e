"""A failed command's last lines: kept, secret values cut out, and matched against the job's
retry_on.output patterns in a child process (a pattern that backtracks without end stalls only it).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading

from .masking import forms
from .wire import MAX_LAST_LINES, MAX_LAST_LINES_CHARS

LAST_LINES = MAX_LAST_LINES  # of the output sent with a failed `exited`, and at most LAST_BYTES of them
LAST_BYTES = MAX_LAST_LINES_CHARS  # of UTF-8, so never more characters than that
MAX_SECRET_BYTES = 64 * 1024  # Secret Manager's largest value: how far back a cut secret may start
MATCH_SECONDS = 10.0  # for the job's retry_on patterns over its last lines (a child process)

# A failed `exited` carries the command's last lines, with every secret value cut out, and
# which of the job's retry_on.output patterns matched one. The patterns run here, on the
# job's own host, never in the shared control plane: a pathological pattern can stall only
# this one job, and only for MATCH_SECONDS.


class LastOutput:
    """The command's newest output bytes: enough to cut out any secret value, even one that
    began before the LAST_BYTES that are sent, before they are sent (`last_lines`)."""

    def __init__(self, keep: int = LAST_BYTES + MAX_SECRET_BYTES) -> None:
        self.keep = keep
        self.dropped = False  # older output was let go: the window's start may cut a secret
        self._data = bytearray()
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            self._data.extend(data)
            excess = len(self._data) - self.keep
            if excess > 0:
                del self._data[:excess]
                self.dropped = True

    def snapshot(self) -> bytes:
        with self._lock:
            return bytes(self._data)


def redact(window: bytes, secrets: dict[str, str], dropped: bool = False) -> bytes:
    """`window` with every secret value, in each of its `masking.forms`, replaced by
    `[secret NAME]`. When older output was dropped (`dropped`), the window's first bytes, as
    long as the longest value, are left out too: a value cut by the window's start lies wholly
    within them and cannot be recognised."""
    names: dict[bytes, str] = {}
    for name in sorted(secrets):
        for form in forms(secrets[name]):
            names.setdefault(form, name)
    values = sorted(names, key=len, reverse=True)  # the longest first: one value may hold another
    cut = max((len(v) for v in values), default=0) if dropped else 0
    out = bytearray()
    pos = 0
    if values:
        for found in re.finditer(b"|".join(re.escape(v) for v in values), window):
            out += window[max(pos, cut) : max(found.start(), cut)]
            if found.end() > cut:  # wholly in the window, so recognised: its name only
                out += f"[secret {names[found.group()]}]".encode()
            pos = found.end()
    out += window[max(pos, cut) :]
    return bytes(out)


def _printable(text: str) -> str:
    """A line without control characters (a tab stays), so its JSON stays small and plain."""
    return "".join(c if c == "\t" or (ord(c) >= 32 and ord(c) != 127) else "?" for c in text)


def last_lines(window: bytes, secrets: dict[str, str], dropped: bool = False) -> list[str]:
    """The output's last lines, oldest first, secret values cut out (`redact`): at most
    LAST_LINES lines and LAST_BYTES bytes of UTF-8, whichever is less."""
    lines = redact(window, secrets, dropped).split(b"\n")
    if lines and lines[-1] == b"":  # the output ended with a newline
        lines.pop()
    if dropped and len(lines) > 1:  # the first line is what was left of a longer one
        lines = lines[1:]
    kept: list[str] = []
    room = LAST_BYTES
    for raw in reversed(lines[-LAST_LINES:]):
        line = _printable(raw.rstrip(b"\r").decode("utf-8", "replace"))
        size = len(line.encode("utf-8"))
        if size > room:
            if not kept:  # one long last line: its end
                kept.append(line.encode("utf-8")[-room:].decode("utf-8", "ignore"))
            break
        kept.append(line)
        room -= size
    return kept[::-1]


# Run by a child python3, so a pattern that backtracks without end can be stopped: the
# first (pattern index, line) with the newest line first, patterns in the spec's order;
# a pattern this Python cannot compile is skipped.
MATCHER = """
import json, re, sys
asked = json.load(sys.stdin)
compiled = []
for index, pattern in enumerate(asked["patterns"]):
    try:
        compiled.append((index, re.compile(pattern)))
    except re.error:
        pass
found = None
for line in reversed(asked["lines"]):
    found = next(([index, line] for index, pattern in compiled if pattern.search(line)), None)
    if found:
        break
json.dump(found, sys.stdout)
"""


def match_retry_output(
    patterns: list[str], lines: list[str], timeout: float = MATCH_SECONDS
) -> tuple[int, str] | str | None:
    """(index of the first pattern that matches, the line it matched) of the newest line a
    pattern matches; None when none does; a sentence when the patterns could not be run."""
    if not patterns or not lines:
        return None
    asked = json.dumps({"patterns": patterns, "lines": lines}).encode("utf-8")
    try:
        done = subprocess.run(
            # -I: neither the working directory (writable by the job) nor PYTHON* variables steer it.
            [sys.executable or "python3", "-I", "-c", MATCHER],
            input=asked,
            capture_output=True,
            timeout=timeout,
        )
        found = json.loads(done.stdout.decode("utf-8")) if done.returncode == 0 else None
    except subprocess.TimeoutExpired:
        return f"the retry_on.output patterns took over {timeout:g} s on the last lines; none is taken as matched"
    except (OSError, ValueError) as error:
        return f"the retry_on.output patterns could not be run: {error}"
    if isinstance(found, list) and len(found) == 2 and isinstance(found[0], int) and isinstance(found[1], str):
        return found[0], found[1]
    return None

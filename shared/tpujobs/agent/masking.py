"""Secret values cut out of a job's output on the host, before any of it leaves the VM.

Each value is recognised in the forms a program commonly prints it: raw, base64 (standard and
URL-safe, with or without padding), JSON-escaped and URL-encoded. `SecretMask` works on a
stream: it holds back a piece's last bytes while they may begin a form, so a value split across
two reads is still recognised.
"""

from __future__ import annotations

import base64
import json
import os
import re
import urllib.parse

MIN_SECRET_BYTES = 4  # shorter values would mask ordinary output, and are masked raw only


def forms(value: str) -> set[bytes]:
    """The byte strings `value` may appear as in output."""
    raw = os.fsencode(value)
    if not raw:
        return set()
    found = {raw}
    if len(raw) < MIN_SECRET_BYTES:
        return found
    for encoded in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
        found |= {encoded, encoded.rstrip(b"=")}
    found.add(json.dumps(value)[1:-1].encode("utf-8"))  # \" \\ \n and \uXXXX escapes
    found.add(json.dumps(value, ensure_ascii=False)[1:-1].encode("utf-8"))
    found.add(urllib.parse.quote(value, safe="").encode("ascii"))
    found.add(urllib.parse.quote_plus(value, safe="").encode("ascii"))
    return {form for form in found if form}


class SecretMask:
    """`feed` pieces of a stream, get them back with every form of every value replaced by
    `[secret NAME]`; `flush` at the end for what was held back."""

    def __init__(self, secrets: dict[str, str]) -> None:
        self.names: dict[bytes, str] = {}
        for name in sorted(secrets):
            for form in forms(secrets[name]):
                self.names.setdefault(form, name)
        longest_first = sorted(self.names, key=len, reverse=True)  # one form may hold another
        self.pattern = re.compile(b"|".join(re.escape(f) for f in longest_first)) if longest_first else None
        self.hold = max((len(f) for f in longest_first), default=1) - 1
        # What a tail may be the start of: its first 4 bytes pick the forms; a shorter tail is looked up.
        self.by_start: dict[bytes, list[bytes]] = {}
        self.short = {form[:size] for form in longest_first for size in (1, 2, 3) if size < len(form)}
        for form in longest_first:
            self.by_start.setdefault(form[:4], []).append(form)
        self.starts = re.compile(b"|".join(re.escape(first) for first in {form[:1] for form in longest_first}))
        self.pending = b""

    def mask(self, data: bytes) -> bytes:
        """`data`, complete, with every form replaced."""
        if self.pattern is None:
            return data
        return self.pattern.sub(lambda found: f"[secret {self.names[found.group()]}]".encode(), data)

    def feed(self, data: bytes) -> bytes:
        """What of the stream so far can be let out, masked; a tail that may start a value waits
        (only such a tail: a line's end goes out at once, ahead of the other stream's next lines)."""
        if self.pattern is None:
            return data
        data = self.pending + data
        # A form that starts before `unsure` is whole in `data` or not there at all, so it is
        # recognised now (its longest form first); from `unsure` on a form may be half come.
        unsure = self._unsure(data, 0)
        out, pos = bytearray(), 0
        for found in self.pattern.finditer(data):
            if found.start() >= unsure:
                break
            out += data[pos : found.start()] + f"[secret {self.names[found.group()]}]".encode()
            pos = found.end()
            if pos > unsure:  # the form masked held it: what may begin one lies after
                unsure = self._unsure(data, pos)
        out += data[pos:unsure]
        self.pending = data[unsure:]
        return bytes(out)

    def _unsure(self, data: bytes, start: int) -> int:
        """The first position from `start` where the rest of `data` begins a form, not yet whole."""
        for found in self.starts.finditer(data, max(start, len(data) - self.hold)):
            rest = data[found.start() :]
            if rest in self.short or any(
                len(rest) < len(form) and form.startswith(rest) for form in self.by_start.get(rest[:4], ())
            ):
                return found.start()
        return len(data)

    def flush(self) -> bytes:
        """The rest of the stream, masked."""
        rest, self.pending = self.pending, b""
        return self.mask(rest)

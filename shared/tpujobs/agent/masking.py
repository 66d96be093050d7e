"""Secret values cut out of a job's output on the host, before any of it leaves the VM.

Each value is recognised in the forms a program commonly prints it: raw, base64 (standard and
URL-safe, with or without padding), JSON-escaped and URL-encoded. `SecretMask` works on a
stream: it holds back the last bytes of each piece, as long as the longest form less one, so a
value split across two reads is still recognised.
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
        self.pending = b""

    def mask(self, data: bytes) -> bytes:
        """`data`, complete, with every form replaced."""
        if self.pattern is None:
            return data
        return self.pattern.sub(lambda found: f"[secret {self.names[found.group()]}]".encode(), data)

    def feed(self, data: bytes) -> bytes:
        """What of the stream so far can be let out, masked; a tail that may start a value waits."""
        if self.pattern is None:
            return data
        data = self.pending + data
        # A value that starts before `limit` lies wholly in `data`, so it is recognised now (its
        # longest form first); one that starts later may not have come whole yet: it waits.
        limit = len(data) - self.hold
        out, pos = bytearray(), 0
        for found in self.pattern.finditer(data):
            if found.start() >= limit:
                break
            out += data[pos : found.start()] + f"[secret {self.names[found.group()]}]".encode()
            pos = found.end()
        keep_from = max(pos, limit)
        out += data[pos:keep_from]
        self.pending = data[keep_from:]
        return bytes(out)

    def flush(self) -> bytes:
        """The rest of the stream, masked."""
        rest, self.pending = self.pending, b""
        return self.mask(rest)

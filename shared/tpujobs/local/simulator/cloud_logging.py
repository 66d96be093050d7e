"""A local Cloud Logging: v2 REST's `entries:write` and `entries:list`, for the agent's writes and
the real google-cloud-logging client's reads (its HTTP transport, `_use_grpc=False`).

Entries in memory, the oldest dropped past MAX_ENTRIES. `entries:list` takes the filters tpujobs
and the client write (a conjunction of comparisons on logName, severity, timestamp, labels and
resource), `orderBy` on timestamp and paging; anything else is Google's INVALID_ARGUMENT. A write
needs a bearer token, as Google's does. Who wrote each entry is kept beside it (`written`), as
Google knows the caller of entries:write (or that Cloud Run's platform wrote a function's stdout),
and, as there, no field of the entry says it: a writer sets every field it sends.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from tpujobs.local.simulator.errors import Code, SimulatorError
from tpujobs.local.simulator.http import (
    ApiServer,
    BackgroundApi,
    JsonRequestHandler,
    google_answer,
    serve_until_signalled,
)
from tpujobs.local.simulator.messages import json_object, timestamp

Json = dict[str, Any]
MAX_ENTRIES = 200_000
MAX_PAGE_SIZE = 1000
PLATFORM = "run.googleapis.com"  # the writer of a Cloud Run service's (a function's) stdout and stderr
TOKEN_PREFIX = "simulated:"  # a simulated access token is this and the account's email (simulator.metadata)
DEFAULT_PAGE_SIZE = 50
LOG_NAME = re.compile(r"(projects|organizations|folders|billingAccounts)/[^/]+/logs/[^/]+")
# What entries:list reads: a project, or a log view (a bucket's entries of one log, here).
READ_NAME = re.compile(r"projects/(?P<project>[^/]+)(?:/locations/[^/]+/buckets/[^/]+/views/[^/]+)?")
SEVERITIES = ["DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL", "ALERT", "EMERGENCY"]
# One comparison: a field path, an operator, a quoted or bare value.
_TERM = re.compile(
    r'\s*(?P<field>[A-Za-z_][A-Za-z0-9_]*(?:\.(?:"[^"]*"|[A-Za-z_][A-Za-z0-9_]*))*)\s*'
    r'(?P<op>>=|<=|!=|=|>|<|:)\s*(?P<value>"(?:[^"\\]|\\.)*"|[^\s()"]+)\s*'
)
_AND = re.compile(r"\s*(?:AND\s+)?", re.IGNORECASE)


class LoggingError(SimulatorError):
    """A request the local Cloud Logging refuses, answered as Google's error JSON."""


@functools.lru_cache(maxsize=65536)  # a list compares every entry's time with the filter's: the same few texts
def _when(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise LoggingError(Code.INVALID_ARGUMENT, f"Invalid timestamp: {text[:64]!r}") from None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def parse_filter(text: str) -> list[tuple[list[str], str, str]]:
    """(field path, operator, value) for each comparison of an AND-only filter."""
    terms = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        found = _TERM.match(text, pos)
        if found is None:
            where = text[pos : pos + 40]
            raise LoggingError(
                Code.INVALID_ARGUMENT,
                f"Unparseable filter: the local Cloud Logging takes comparisons joined by AND, at {where!r}",
            )
        path = [part.strip('"') for part in re.findall(r'"[^"]*"|[^.]+', found.group("field"))]
        value = found.group("value")
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        terms.append((path, found.group("op"), value))
        pos = found.end()
        joiner = _AND.match(text, pos)
        pos = joiner.end() if joiner else pos
    return terms


def _field(entry: Json, path: list[str]) -> Any:
    value: Any = entry
    for part in path:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _compare(have: Any, op: str, want: str, path: list[str]) -> bool:
    if have is None:
        return op == "!="
    if path == ["timestamp"] or path == ["receiveTimestamp"]:
        left: Any = _when(str(have))
        right: Any = _when(want)
    elif path == ["severity"]:
        if want.upper() not in SEVERITIES:
            raise LoggingError(Code.INVALID_ARGUMENT, f"Unknown severity: {want[:32]!r}")
        left, right = SEVERITIES.index(str(have)), SEVERITIES.index(want.upper())
    else:
        left, right = str(have), want
    if op == ":":
        return str(right) in str(left)
    return {
        "=": left == right,
        "!=": left != right,
        ">": left > right,
        ">=": left >= right,
        "<": left < right,
        "<=": left <= right,
    }[op]


class LoggingStore:
    """The entries written, oldest first."""

    def __init__(self, clock: Callable[[], float] = time.time, max_entries: int = MAX_ENTRIES) -> None:
        self.clock = clock
        self.entries: deque[Json] = deque(maxlen=max_entries)
        self.writers: deque[str] = deque(maxlen=max_entries)  # who wrote entries[i], kept in step with it
        self.views: dict[str, str] = {}  # a log view's full name -> the one log id it holds
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def written(self) -> list[tuple[str, Json]]:
        """(who wrote it, the entry) for each entry held, oldest first."""
        with self._lock:
            return list(zip(self.writers, self.entries, strict=True))

    def write(self, body: Json, writer: str = PLATFORM) -> Json:
        """entries:write by `writer` (the caller's principal; PLATFORM: Cloud Run's own logging)."""
        entries = body.get("entries")
        if not isinstance(entries, list) or not entries:
            raise LoggingError(Code.INVALID_ARGUMENT, "entries: at least one entry is required")
        received = timestamp(self.clock())
        made = []
        for index, raw in enumerate(entries):
            if not isinstance(raw, dict):
                raise LoggingError(Code.INVALID_ARGUMENT, f"entries[{index}]: an entry is an object")
            entry = dict(raw)
            entry.setdefault("logName", body.get("logName"))
            entry.setdefault("resource", body.get("resource") or {"type": "global", "labels": {}})
            labels = {**(body.get("labels") or {}), **(entry.get("labels") or {})}
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
                raise LoggingError(Code.INVALID_ARGUMENT, f"entries[{index}].labels: values are strings")
            entry["labels"] = labels
            if not isinstance(entry["logName"], str) or not LOG_NAME.fullmatch(entry["logName"]):
                raise LoggingError(Code.INVALID_ARGUMENT, f"entries[{index}].logName: projects/P/logs/LOG_ID")
            payloads = [key for key in ("textPayload", "jsonPayload", "protoPayload") if key in entry]
            if len(payloads) > 1:
                raise LoggingError(Code.INVALID_ARGUMENT, f"entries[{index}]: at most one payload")
            severity = str(entry.get("severity") or "DEFAULT").upper()
            if severity not in SEVERITIES:
                raise LoggingError(Code.INVALID_ARGUMENT, f"entries[{index}].severity: unknown {severity[:32]!r}")
            entry["severity"] = severity
            if entry.get("timestamp"):
                _when(str(entry["timestamp"]))  # checked, kept as written
            else:
                entry["timestamp"] = received
            entry["receiveTimestamp"] = received
            made.append(entry)
        with self._lock:
            for entry in made:
                entry.setdefault("insertId", f"local{next(self._ids):012d}")
                self.entries.append(entry)
                self.writers.append(writer)
        return {}

    def list(self, body: Json) -> Json:
        names = body.get("resourceNames") or body.get("projectIds")
        if not isinstance(names, list) or not names:
            raise LoggingError(Code.INVALID_ARGUMENT, "resourceNames: at least one is required")
        readers = [self._reader(str(name)) for name in names]
        terms = parse_filter(str(body.get("filter") or ""))
        order = str(body.get("orderBy") or "timestamp asc").strip().lower()
        if order not in ("timestamp asc", "timestamp desc", "timestamp"):
            raise LoggingError(Code.INVALID_ARGUMENT, f"orderBy: timestamp asc or timestamp desc, not {order!r}")
        size = int(body.get("pageSize") or DEFAULT_PAGE_SIZE)
        if not 0 < size <= MAX_PAGE_SIZE:
            raise LoggingError(Code.INVALID_ARGUMENT, f"pageSize: 1 to {MAX_PAGE_SIZE}")
        token = str(body.get("pageToken") or "0")
        if not token.isdigit():
            raise LoggingError(Code.INVALID_ARGUMENT, "pageToken: not one this server gave")
        with self._lock:
            everything = list(self.entries)
        found = [
            entry
            for entry in everything
            if any(reads(str(entry["logName"])) for reads in readers)
            and all(_compare(_field(entry, path), op, value, path) for path, op, value in terms)
        ]
        # Google: "Entries with equal timestamps are returned in order of their insertId values."
        found.sort(
            key=lambda entry: (_when(str(entry["timestamp"])), str(entry["insertId"])), reverse=order.endswith("desc")
        )
        start = int(token)
        page: Json = {"entries": found[start : start + size]}
        if start + size < len(found):
            page["nextPageToken"] = str(start + size)
        return page

    def add_view(self, name: str, log_id: str) -> None:
        """A log view (projects/P/locations/L/buckets/B/views/V) that shows only the log `log_id`."""
        self.views[name] = log_id

    def _reader(self, name: str) -> Callable[[str], bool]:
        """Whether an entry's logName is one `name` (a project, or a log view) shows."""
        match = READ_NAME.fullmatch(name)
        if match is None:
            raise LoggingError(Code.INVALID_ARGUMENT, f"resourceNames: {name[:200]!r} is not a project or a log view")
        prefix = f"projects/{match['project']}/logs/"
        if name.count("/") == 1:
            return lambda log_name: log_name.startswith(prefix)
        if name not in self.views:
            raise LoggingError(Code.NOT_FOUND, f"Log view {name} does not exist.")
        only = prefix + self.views[name]
        return lambda log_name: log_name == only

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, Json]:
        """The status and JSON answer to one request."""
        return google_answer(
            lambda: self._route(method, path, headers, body),
            "Local Cloud Logging",
            f"{method} {path}",
            tell_failures=False,  # an entry may hold anything a job printed
        )

    def _route(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, Json]:
        if method == "GET" and path == "/health":
            return 200, {"ok": True}
        if method == "POST" and path == "/v2/entries:write":
            authorization = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
            if not authorization.startswith("Bearer ") or not authorization[7:].strip():
                raise LoggingError(Code.UNAUTHENTICATED, "Request is missing required authentication credential.")
            token = authorization[7:].strip()
            writer = token.removeprefix(TOKEN_PREFIX) if token.startswith(TOKEN_PREFIX) else "unknown"
            return 200, self.write(json_object(body, "WriteLogEntriesRequest"), writer)
        if method == "POST" and path == "/v2/entries:list":
            return 200, self.list(json_object(body, "ListLogEntriesRequest"))
        if path.startswith("/v2/"):
            raise LoggingError(Code.UNIMPLEMENTED, f"The local Cloud Logging does not implement {method} {path}.")
        raise LoggingError(Code.NOT_FOUND, f"No such endpoint: {method} {path}.")


class _Handler(JsonRequestHandler):
    server: ApiServer[LoggingStore]

    def answer(self, method: str, path: str, query: Mapping[str, list[str]], body: bytes) -> None:
        self.send_json(*self.server.api.handle(method, path, dict(self.headers.items()), body))


class LoggingServer:
    """The local Cloud Logging on a local port, served by a daemon thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, store: LoggingStore | None = None) -> None:
        self.store = store or LoggingStore()
        self._served: BackgroundApi[LoggingStore] = BackgroundApi((host, port), _Handler, "the local Cloud Logging")

    @property
    def url(self) -> str:
        return self._served.url

    def start(self) -> str:
        """Bind and serve in the background; the base URL (api_endpoint, TPUJOBS_LOGGING_ENDPOINT)."""
        return self._served.serve(self.store)

    def stop(self) -> None:
        self._served.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve in the foreground until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m tpujobs.local.simulator.cloud_logging")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 lets the system choose")
    args = parser.parse_args(argv)
    server = LoggingServer(args.host, args.port)
    return serve_until_signalled(server.start, server.stop, "tpujobs-cloud-logging")


if __name__ == "__main__":
    sys.exit(main())

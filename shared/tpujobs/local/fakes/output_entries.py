"""Job output read from an in-process Cloud Logging store: `engine.jobs_api.job_output.OutputEntries`
without HTTP, answering as `adapters.job_output_logs.CloudLoggingEntries` answers from the local
stand-in that serves the same store (tests/contract/test_contract_output_entries.py holds the two)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any

from tpujobs.domain.job_output import RawEntry
from tpujobs.engine.errors import OutputUnreadable, PermanentError, TransientError
from tpujobs.engine.jobs_api.job_output import EntriesPage, StaleToken
from tpujobs.local.simulator.cloud_logging import LoggingError, LoggingStore
from tpujobs.local.simulator.errors import Code

MAX_PAGE_SIZE = 1000  # entries.list's most
_RFC3339 = re.compile(r"^(?P<base>[0-9T:-]{19})(?:\.(?P<fraction>[0-9]{1,9}))?(?P<zone>Z|[+-][0-9]{2}:[0-9]{2})$")
_UNREADABLE = (Code.NOT_FOUND, Code.PERMISSION_DENIED)
_FINAL = (Code.INVALID_ARGUMENT, Code.FAILED_PRECONDITION, Code.UNIMPLEMENTED, Code.UNAUTHENTICATED)


class InMemoryOutputEntries:
    """OutputEntries over a `LoggingStore`, read through the project or the log view `view`."""

    def __init__(self, store: LoggingStore, project: str, view: str = "") -> None:
        self.store = store
        self.project = project
        self.view = view

    def page(self, query: str, token: str | None, size: int) -> EntriesPage:
        body: dict[str, Any] = {
            "resourceNames": [self.view or f"projects/{self.project}"],
            "filter": query,
            "orderBy": "timestamp asc",
            "pageSize": min(max(1, size), MAX_PAGE_SIZE),
        }
        if token:
            body["pageToken"] = token
        try:
            answer = self.store.list(body)
        except LoggingError as error:
            if error.code in _UNREADABLE:
                raise OutputUnreadable(f"Cloud Logging: {error.message}") from error
            if token and error.code is Code.INVALID_ARGUMENT:
                raise StaleToken(error.message) from error
            kind = PermanentError if error.code in _FINAL else TransientError
            raise kind(f"Cloud Logging: {error.message}") from error
        found = answer.get("entries") or []
        return EntriesPage(tuple(_raw(e) for e in found), answer.get("nextPageToken") or None)


def _raw(entry: dict[str, Any]) -> RawEntry:
    """An entry as Cloud Logging's JSON gives it back: its text, labels and time to the microsecond."""
    labels = entry.get("labels") if isinstance(entry.get("labels"), dict) else {}
    if "textPayload" in entry:
        text = str(entry["textPayload"])
    else:
        payload = entry.get("jsonPayload", entry.get("protoPayload", ""))
        text = payload if isinstance(payload, str) else json.dumps(payload, sort_keys=True)
    return RawEntry({str(k): str(v) for k, v in (labels or {}).items()}, _timestamp(entry.get("timestamp")), text)


def _timestamp(value: Any) -> datetime:
    match = _RFC3339.match(str(value or ""))
    if match is None:
        return datetime.fromtimestamp(0, timezone.utc)
    fraction = (match["fraction"] or "")[:6].ljust(6, "0")
    zone = "+00:00" if match["zone"] == "Z" else match["zone"]
    return datetime.fromisoformat(f"{match['base']}.{fraction}{zone}").astimezone(timezone.utc)

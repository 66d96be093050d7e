"""Job output read from an in-process Cloud Logging store: `engine.jobs_api.job_output.OutputEntries`
without HTTP, answering as `adapters.job_output_logs.CloudLoggingEntries` answers from the local
stand-in that serves the same store (tests/contract/test_contract_output_entries.py holds the two)."""

from __future__ import annotations

from typing import Any

from tpujobs.adapters.job_output_logs import raw_entry
from tpujobs.engine.errors import OutputUnreadable, PermanentError, TransientError
from tpujobs.engine.jobs_api.job_output import EntriesPage, StaleToken
from tpujobs.local.simulator.cloud_logging import LoggingError, LoggingStore
from tpujobs.local.simulator.errors import Code

MAX_PAGE_SIZE = 1000  # entries.list's most
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
        return EntriesPage(tuple(raw_entry(e) for e in found), answer.get("nextPageToken") or None)

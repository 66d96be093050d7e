"""Reads a job's output entries from Cloud Logging (`entries.list`), a page at a time:
`CloudLoggingEntries`, the jobs API's `OutputEntries` port, and `read_entries` (every page).

It posts `entries.list` itself (google-auth's session, Google's JSON), because the answer's
`nextPageToken` is what `logs` resumes from and google-cloud-logging's iterator hides it. The
local stand-in (TPUJOBS_LOGGING_ENDPOINT, no credentials) serves it as Google would; Google's
errors become Transient or Permanent errors here, once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from google.api_core import exceptions as api_exceptions

from tpujobs.adapters.google_errors import translated
from tpujobs.domain.job_output import RawEntry
from tpujobs.engine.errors import OutputUnreadable, PermanentError
from tpujobs.engine.jobs_api.job_output import EntriesPage, StaleToken

PAGE_SIZE = 1000  # entries.list's most
LOGGING_API = "https://logging.googleapis.com"
READ_SCOPE = "https://www.googleapis.com/auth/logging.read"
TIMEOUT_S = 30.0
# RFC 3339 as Cloud Logging writes it: up to nanoseconds, "Z" or an offset.
_RFC3339 = re.compile(r"^(?P<base>[0-9T:-]{19})(?:\.(?P<fraction>[0-9]{1,9}))?(?P<zone>Z|[+-][0-9]{2}:[0-9]{2})$")


def read_entries(project: str, query: str, endpoint: str = "", view: str = "") -> Iterator[RawEntry]:
    """Every entry `query` finds in the project (or in the log view `view`, a full resource
    name), oldest first, page by page."""
    entries = CloudLoggingEntries(project, endpoint, view)
    token: str | None = None
    while True:
        page = entries.page(query, token, PAGE_SIZE)
        yield from page.entries
        if not page.next_token:
            return
        token = page.next_token


class CloudLoggingEntries:
    """`engine.jobs_api.job_output.OutputEntries` on the project's Cloud Logging (or the local stand-in).

    The session is made on the first read and kept: the jobs API reads on every `logs` call, and a
    session costs an auth lookup."""

    def __init__(self, project: str, endpoint: str = "", view: str = "") -> None:
        """`view`: the log view to read through (TPUJOBS_LOGGING_VIEW); empty: the project."""
        self.project = project
        self.endpoint = endpoint
        self.view = view
        self._session: Any = None

    def page(self, query: str, token: str | None, size: int) -> EntriesPage:
        """One page, oldest first. OutputUnreadable where Cloud Logging says the view is not there or
        not ours to read; StaleToken where it refuses `token`."""
        body: dict[str, Any] = {
            "resourceNames": [self.view or f"projects/{self.project}"],
            "filter": query,
            "orderBy": "timestamp asc",
            "pageSize": min(max(1, size), PAGE_SIZE),
        }
        if token:
            body["pageToken"] = token
        try:
            with translated("Cloud Logging", "reading the job's output"):
                answer = self._post(body)
        except PermanentError as error:
            cause = error.__cause__
            if isinstance(cause, (api_exceptions.NotFound, api_exceptions.PermissionDenied)):
                raise OutputUnreadable(str(error)) from cause
            if token and isinstance(cause, api_exceptions.BadRequest):
                raise StaleToken(str(error)) from cause
            raise
        found = answer.get("entries") or []
        return EntriesPage(
            tuple(raw_entry(e) for e in found if isinstance(e, dict)), answer.get("nextPageToken") or None
        )

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        base = (self.endpoint or LOGGING_API).rstrip("/")
        if "://" not in base:
            base = "http://" + base
        response = self._client().post(f"{base}/v2/entries:list", json=body, timeout=TIMEOUT_S)
        if response.status_code >= 400:
            raise api_exceptions.from_http_response(response)
        answer = response.json()
        return answer if isinstance(answer, dict) else {}

    def _client(self) -> Any:
        if self._session is None:
            from google.auth.transport.requests import AuthorizedSession

            if self.endpoint:
                from google.auth.credentials import AnonymousCredentials

                self._session = AuthorizedSession(AnonymousCredentials())
            else:
                import google.auth

                credentials, _ = google.auth.default(scopes=[READ_SCOPE])
                self._session = AuthorizedSession(credentials)
        return self._session


def raw_entry(entry: dict[str, Any]) -> RawEntry:
    """An entry as Cloud Logging's JSON gives it back: its text, labels and time to the microsecond."""
    labels = entry.get("labels") if isinstance(entry.get("labels"), dict) else {}
    if "textPayload" in entry:
        text = str(entry["textPayload"])
    else:
        payload = entry.get("jsonPayload", entry.get("protoPayload", ""))
        text = payload if isinstance(payload, str) else json.dumps(payload, sort_keys=True)
    return RawEntry({str(k): str(v) for k, v in (labels or {}).items()}, _timestamp(entry.get("timestamp")), text)


def _timestamp(value: Any) -> datetime:
    """Cloud Logging's time, to the microsecond (as the agent signed it); the epoch when absent."""
    match = _RFC3339.match(str(value or ""))
    if match is None:
        return datetime.fromtimestamp(0, timezone.utc)
    fraction = (match["fraction"] or "")[:6].ljust(6, "0")
    zone = "+00:00" if match["zone"] == "Z" else match["zone"]
    return datetime.fromisoformat(f"{match['base']}.{fraction}{zone}").astimezone(timezone.utc)

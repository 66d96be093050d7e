"""Reads a job's output entries from Cloud Logging with google-cloud-logging (`entries.list`, paged):
`read_entries`, and `CloudLoggingEntries`, the jobs API's `OutputEntries` port.

Its HTTP transport, so the local stand-in (TPUJOBS_LOGGING_ENDPOINT, no credentials) serves it
as Google would; library errors become Transient or Permanent errors here, once.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from google.api_core import exceptions as api_exceptions

from tpujobs.adapters.google_errors import translated
from tpujobs.domain.job_output import RawEntry
from tpujobs.engine.errors import OutputUnreadable, PermanentError

PAGE_SIZE = 1000  # entries.list's most


def read_entries(project: str, query: str, endpoint: str = "", view: str = "") -> Iterator[RawEntry]:
    """Every entry `query` finds in the project (or in the log view `view`, a full resource
    name), oldest first, page by page: one read, for a command line."""
    return CloudLoggingEntries(project, endpoint, view).read(query)


class CloudLoggingEntries:
    """`engine.jobs_api.job_output.OutputEntries` on the project's Cloud Logging (or the local stand-in).

    The client is made on the first read and kept: the jobs API reads on every `logs` call, and a
    client costs an auth lookup and a session."""

    def __init__(self, project: str, endpoint: str = "", view: str = "") -> None:
        """`view`: the log view to read through (TPUJOBS_LOGGING_VIEW); empty: the project."""
        self.project = project
        self.endpoint = endpoint
        self.view = view
        self._client: Any = None

    def read(self, query: str) -> Iterator[RawEntry]:
        """OutputUnreadable where Cloud Logging says the view is not there or not ours to read."""
        try:
            yield from self._read(query)
        except PermanentError as error:
            if isinstance(error.__cause__, (api_exceptions.NotFound, api_exceptions.PermissionDenied)):
                raise OutputUnreadable(str(error)) from error.__cause__
            raise

    def _read(self, query: str) -> Iterator[RawEntry]:
        from google.cloud import logging as cloud_logging

        with translated("Cloud Logging", "reading the job's output"):
            found = self._logging().list_entries(
                resource_names=[self.view or f"projects/{self.project}"],
                filter_=query,
                order_by=cloud_logging.ASCENDING,
                page_size=PAGE_SIZE,
            )
            for entry in found:
                at = entry.timestamp or datetime.fromtimestamp(0, timezone.utc)
                text = entry.payload if isinstance(entry.payload, str) else str(entry.payload)
                yield RawEntry(dict(entry.labels or {}), at, text)

    def _logging(self) -> Any:
        if self._client is None:
            from google.cloud import logging as cloud_logging

            if self.endpoint:
                from google.auth.credentials import AnonymousCredentials

                self._client = cloud_logging.Client(
                    project=self.project,
                    credentials=AnonymousCredentials(),
                    _use_grpc=False,
                    client_options={"api_endpoint": self.endpoint},
                )
            else:
                self._client = cloud_logging.Client(project=self.project, _use_grpc=False)
        return self._client

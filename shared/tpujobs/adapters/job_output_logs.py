"""Reads a job's output entries from Cloud Logging with google-cloud-logging (`entries.list`, paged):
`read_entries`, and `CloudLoggingEntries`, the jobs API's `OutputEntries` port.

Its HTTP transport, so the local stand-in (TPUJOBS_LOGGING_ENDPOINT, no credentials) serves it
as Google would; library errors become Transient or Permanent errors here, once.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone

from tpujobs.adapters.google_errors import translated
from tpujobs.domain.job_output import RawEntry

PAGE_SIZE = 1000  # entries.list's most


def read_entries(project: str, query: str, endpoint: str = "", view: str = "") -> Iterator[RawEntry]:
    """Every entry `query` finds in the project (or in the log view `view`, a full resource
    name), oldest first, page by page."""
    from google.cloud import logging as cloud_logging

    if endpoint:
        from google.auth.credentials import AnonymousCredentials

        client = cloud_logging.Client(
            project=project,
            credentials=AnonymousCredentials(),
            _use_grpc=False,
            client_options={"api_endpoint": endpoint},
        )
    else:
        client = cloud_logging.Client(project=project, _use_grpc=False)
    with translated("Cloud Logging", "reading the job's output"):
        found = client.list_entries(
            resource_names=[view or f"projects/{project}"],
            filter_=query,
            order_by=cloud_logging.ASCENDING,
            page_size=PAGE_SIZE,
        )
        for entry in found:
            at = entry.timestamp or datetime.fromtimestamp(0, timezone.utc)
            text = entry.payload if isinstance(entry.payload, str) else str(entry.payload)
            yield RawEntry(dict(entry.labels or {}), at, text)


class CloudLoggingEntries:
    """`engine.jobs_api.job_output.OutputEntries` on the project's Cloud Logging (or the local stand-in)."""

    def __init__(self, project: str, endpoint: str = "", view: str = "") -> None:
        """`view`: the log view to read through (TPUJOBS_LOGGING_VIEW); empty: the project."""
        self.project = project
        self.endpoint = endpoint
        self.view = view

    def read(self, query: str) -> Iterator[RawEntry]:
        return read_entries(self.project, query, self.endpoint, self.view)

"""The local Cloud Logging stand-in and a VM's token, for the tests that write and read job output there;
and the local stack's own Cloud Logging, read back and forged into, for the e2e tests."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from tpujobs.agent.rest import Metadata, TokenSource
from tpujobs.local.simulator.cloud_logging import LoggingServer


class FixedTokens(TokenSource):
    """The VM's token, as the simulated metadata server would hand it."""

    def __init__(self) -> None:
        super().__init__(Metadata("http://metadata.invalid"))

    def token(self) -> str:
        return "simulated:tpu-vm@demo.iam.gserviceaccount.com"


@contextmanager
def logging_stand_in() -> Iterator[LoggingServer]:
    """The local Cloud Logging on a free port, stopped on the way out."""
    server = LoggingServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def stack_output_entries(project: str, job_id: str, created_at: datetime, at_least: int) -> list[Any]:
    """The output entries of the job's attempt 1 in the local stack's Cloud Logging, oldest first, read
    with google-cloud-logging once there are `at_least` of them (the agents' own lines left out)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import logging as cloud_logging

    from tpujobs.domain import job_output
    from tpujobs.local.testing import wait_for

    client = cloud_logging.Client(
        project=project,
        credentials=AnonymousCredentials(),
        _use_grpc=False,
        client_options={"api_endpoint": os.environ["TPUJOBS_LOGGING_ENDPOINT"]},
    )
    query = job_output.job_filter(project, os.environ.get("TPUJOBS_PREFIX", ""), job_id, 1, created_at)

    def written() -> list[Any] | None:
        found = client.list_entries(filter_=query, order_by=cloud_logging.ASCENDING)
        mine = [entry for entry in found if entry.labels.get("tpujobs_stream") != "agent"]
        return mine if len(mine) >= at_least else None

    written.__doc__ = f"{at_least} output lines of {job_id} in the local Cloud Logging"
    return list(wait_for(written, timeout=30))


def forge_like(entry: Any, text: str, **labels: str) -> None:
    """Another job's code, with the same VM credentials, writes `text` under `entry`'s labels
    (changed by `labels`) with a signature it made up, to the local stack's Cloud Logging."""
    forged = {**entry.labels, "tpujobs_seq": "999", "tpujobs_signature": "v1=" + "0" * 64, **labels}
    body = {"logName": entry.log_name, "entries": [{"textPayload": text, "labels": forged}]}
    request = urllib.request.Request(
        os.environ["TPUJOBS_LOGGING_ENDPOINT"] + "/v2/entries:write",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": "Bearer simulated:someone-else"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200

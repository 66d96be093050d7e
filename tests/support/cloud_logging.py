"""The local Cloud Logging stand-in and a VM's token, for the tests that write and read job output there."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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

"""The job's output, shipped in numbered chunks through failing uploads (`agent/output.py`)."""

from __future__ import annotations

import json

from agent_stubs import (
    BUCKET,
    GoogleStub,
)

from tpujobs.agent.output import LogShipper
from tpujobs.agent.rest import GoogleApi, Storage
from tpujobs.local.testing import wait_for

# --- output shipping ------------------------------------------------------------------


def test_output_is_shipped_in_numbered_chunks_with_a_completion_marker(google: GoogleStub) -> None:
    """Each tick ships what arrived as the next chunk; close writes the rest and complete.json."""
    storage = Storage(GoogleApi(google.url, None))
    shipper = LogShipper(storage, BUCKET, "p/", chunk_seconds=0.1)
    shipper.write(b"one\n")
    wait_for(lambda: google.chunks("p/"), timeout=5, interval=0.02, what="the first chunk")
    shipper.write(b"two\n")
    shipper.close(exit_code=3)
    names = [n for n, _ in google.chunks("p/")]
    assert names == ["p/000000.log", "p/000001.log", "p/complete.json"]
    assert google.output("p/") == b"one\ntwo\n"
    assert json.loads(google.objects[(BUCKET, "p/complete.json")]) == {"exit_code": 3, "chunks": 2}


def test_a_large_burst_is_split_into_256_kib_chunks(google: GoogleStub) -> None:
    """600 KiB written at once becomes chunks of at most 256 KiB that concatenate back."""
    storage = Storage(GoogleApi(google.url, None))
    shipper = LogShipper(storage, BUCKET, "p/", chunk_seconds=30)
    data = bytes(range(256)) * (600 * 4)
    shipper.write(data)
    shipper.close(exit_code=None)
    chunks = google.chunks("p/")
    assert [len(d) for _, d in chunks] == [262144, 262144, len(data) - 2 * 262144]
    assert google.output("p/") == data
    assert (BUCKET, "p/complete.json") not in google.objects  # no exit code: not a clean end


def test_output_survives_failed_uploads_and_goes_out_later(google: GoogleStub) -> None:
    """When every retry of an upload fails, the data stays pending and ships on the next tick."""
    google.failures["/upload/"] = [503, 503]  # every retry of the first try
    storage = Storage(GoogleApi(google.url, None))
    shipper = LogShipper(storage, BUCKET, "p/", chunk_seconds=0.1, attempts=2)
    shipper.write(b"kept\n")
    shipper.close(exit_code=0)
    assert google.output("p/") == b"kept\n"
    assert [n for n, _ in google.chunks("p/")] == ["p/000000.log", "p/complete.json"]
    assert len([r for r in google.requests if "/upload/" in r[1]]) == 4  # 2 failed, chunk, marker


def test_while_uploads_fail_only_the_newest_output_is_kept_within_the_bound(
    google: GoogleStub,
) -> None:
    """Past max_pending bytes the oldest output is dropped and counted; the rest still ships in order."""
    google.failures["/upload/"] = [503] * 4
    storage = Storage(GoogleApi(google.url, None))
    shipper = LogShipper(storage, BUCKET, "p/", chunk_seconds=30, attempts=2, max_pending=10)
    shipper.write(b"0123456789")
    assert shipper._ship() is False  # the upload fails; the data stays
    shipper.write(b"abcdef")
    assert shipper._ship() is False
    shipper.close(exit_code=0)
    assert google.output("p/") == b"6789abcdef"
    assert shipper.dropped == 6

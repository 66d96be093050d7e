"""The log export streams: its memory is bounded by a few chunks, never by the log's size.

8 workers x 12 chunks of 256 KiB (24 MiB of output, a 28 MiB attempt.log) on the storage
emulator; tracemalloc measures the export's peak of Python memory, which must stay far below
the size of one log, and the bytes must be those of the in-memory functions. Fewer, larger
chunks than a job writes: the storage emulator is slow, and the bound is about bytes held.
"""

from __future__ import annotations

import tracemalloc
from datetime import datetime, timezone

import pytest

from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.adapters.output_bucket import GcsOutputBucket
from tpujobs.domain.job import new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import EventKind
from tpujobs.domain.transitions import Decision, Observation
from tpujobs.engine.output_export import OutputExporter, OutputObjects, combined_log

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(300)]  # 110 objects through tracemalloc

WORKERS, CHUNKS, CHUNK_BYTES = 8, 12, 256 * 1024
# A few chunks ahead, the upload's 256 KiB buffer, the clients' own, and the listing of the
# attempt's 104 objects (which grows with the number of chunks, not with their bytes).
PEAK_BOUND = 6 * 1024 * 1024
NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def chunk(worker: int, seq: int) -> bytes:
    """One chunk of whole lines, different for every worker and chunk, exactly CHUNK_BYTES long."""
    line = f"worker {worker:02d} chunk {seq:02d} loss {worker * seq:08d} ".encode()
    line = line + b"x" * (63 - len(line)) + b"\n"
    return line * (CHUNK_BYTES // len(line))


def test_exporting_8_workers_holds_a_few_chunks_in_memory_not_the_log(firestore_client, bucket):
    """The export writes the same bytes as before while its peak memory stays under 6 MiB for a 28 MiB attempt.log."""
    store = FirestoreJobStore(firestore_client)
    spec = {"job_id": "wide-1", "name": "wide", "owner": "ada@example.com", "accelerator_type": "v4-8",
            "slices": WORKERS, "command": "python train.py"}  # fmt: skip
    job, event = new_job(parse_spec(spec), "us-central2-b", NOW, "gs://logs/logs/jobs/wide-1/")
    assert store.create(job, event)
    assert isinstance(store.apply("wide-1", Observation(EventKind.CANCEL_REQUESTED, None, "user"), utc_now), Decision)
    prefix = "logs/jobs/wide-1/attempt-1/"
    for k in range(WORKERS):
        chunks = f"{prefix}chunks/slice-{k}-worker-0/"
        for seq in range(CHUNKS):
            bucket.blob(f"{chunks}{seq:06d}.log").upload_from_string(chunk(k, seq))
        bucket.blob(chunks + "complete.json").upload_from_string(b'{"exit_code": 0, "chunks": %d}' % CHUNKS)
    exporter = OutputExporter(OutputObjects(GcsOutputBucket(bucket.client, bucket.name)), store, utc_now,
                           sleep=lambda seconds: None, settle_seconds=0.0)  # fmt: skip

    tracemalloc.start()
    try:
        result = exporter.export("wide-1", 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    outputs = {k: b"".join(chunk(k, seq) for seq in range(CHUNKS)) for k in range(WORKERS)}
    combined = combined_log(outputs)
    assert len(result.written) == WORKERS + 1
    assert bucket.blob(f"{prefix}attempt.log").download_as_bytes() == combined
    assert bucket.blob(f"{prefix}worker-7.log").download_as_bytes() == outputs[7]  # not cut off: its output as it was
    assert len(combined) > 4 * PEAK_BOUND
    assert peak < PEAK_BOUND, f"the export's peak was {peak / 2**20:.1f} MiB for a {len(combined) / 2**20:.0f} MiB log"
    assert exporter.export("wide-1", 1).written == ()  # the same bytes again: nothing uploaded

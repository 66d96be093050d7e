"""The logs bucket on Cloud Storage: what `tpujobs.engine.output_export` reads and writes.

Errors go through the one table (adapters/google_errors.py): retryable ones and lost
connections -> TransientError; the rest, a missing bucket among them -> PermanentError.
"""

from __future__ import annotations

import base64
import hashlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING

from tpujobs.adapters.google_errors import translated
from tpujobs.engine.ports import StoredObject

if TYPE_CHECKING:
    from google.cloud import storage

SERVICE = "Cloud Storage"
DOWNLOAD_THREADS = 8  # an attempt's chunks are many small objects: fetch a few at a time
# A streamed upload sends (and holds) this much at a time: a multiple of 256 KiB, as resumable
# uploads require; the library's default of 100 MiB would be the memory an export is bounded by.
UPLOAD_CHUNK_BYTES = 256 * 1024


class GcsOutputBucket:
    """One bucket through google-cloud-storage (the emulator when STORAGE_EMULATOR_HOST is set)."""

    def __init__(self, client: storage.Client, bucket: str) -> None:
        self._client = client
        self.bucket_name = bucket
        self._bucket = client.bucket(bucket)

    def uri(self, name: str) -> str:
        return f"gs://{self.bucket_name}/{name}"

    def list_objects(self, prefix: str) -> list[StoredObject]:
        with translated(SERVICE, f"list gs://{self.bucket_name}/{prefix}"):
            return [StoredObject(b.name, b.updated) for b in self._client.list_blobs(self.bucket_name, prefix=prefix)]

    def read(self, name: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        with translated(SERVICE, f"read {name}"):
            try:
                return bytes(self._bucket.blob(name).download_as_bytes())
            except NotFound:
                return None

    def read_all(self, names: Sequence[str]) -> list[bytes | None]:
        if len(names) <= 1:
            return [self.read(name) for name in names]
        with ThreadPoolExecutor(max_workers=DOWNLOAD_THREADS) as pool:
            return list(pool.map(self.read, names))

    def read_each(self, names: Sequence[str]) -> Iterator[bytes | None]:
        """Each object's bytes in the order named, as the caller asks for them, with at most
        DOWNLOAD_THREADS downloads ahead: memory of a few objects, never of all of them."""
        if len(names) <= 1:
            yield from (self.read(name) for name in names)
            return
        with ThreadPoolExecutor(max_workers=DOWNLOAD_THREADS) as pool:
            ahead: deque[Future[bytes | None]] = deque()
            for name in names:
                ahead.append(pool.submit(self.read, name))
                if len(ahead) >= DOWNLOAD_THREADS:
                    yield ahead.popleft().result()
            while ahead:
                yield ahead.popleft().result()

    def write_stream_if_changed(self, name: str, stream: Callable[[], Iterable[bytes]], content_type: str) -> bool:
        """Upload the bytes `stream()` makes unless the object holds exactly them; whether it
        uploaded. The stream is made twice, to hash it and to upload it through a resumable
        upload, UPLOAD_CHUNK_BYTES at a time: never whole in memory."""
        digest, size = hashlib.md5(usedforsecurity=False), 0
        for piece in stream():
            digest.update(piece)
            size += len(piece)
        md5 = base64.b64encode(digest.digest()).decode("ascii")
        with translated(SERVICE, f"write {name}"):
            existing = self._bucket.get_blob(name)
            if existing is not None and existing.size == size and existing.md5_hash == md5:
                return False
            blob = self._bucket.blob(name, chunk_size=UPLOAD_CHUNK_BYTES)
            with blob.open("wb", content_type=content_type) as out:
                for piece in stream():
                    out.write(piece)
        return True

    def mark_used(self, name: str, at: datetime) -> bool:
        """Set the object's custom time to `at` unless it is there already or later (Storage
        refuses to move a custom time back). The patch holds only if nobody changed the object's
        metadata since it was read: a concurrent export that won has marked it as used anyway."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        with translated(SERVICE, f"mark {name} as used"):
            blob = self._bucket.get_blob(name)
            if blob is None or (blob.custom_time is not None and blob.custom_time >= at):
                return False
            blob.custom_time = at
            try:
                blob.patch(if_metageneration_match=blob.metageneration)
            except (NotFound, PreconditionFailed):
                return False
        return True

"""The logs bucket on Cloud Storage: what `tpujobs.logs_export` reads and writes.

Errors go through the one table (adapters/google_errors.py): retryable ones and lost
connections -> TransientError; the rest, a missing bucket among them -> PermanentError.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING

from tpujobs.adapters.google_errors import translated
from tpujobs.ports import StoredObject

if TYPE_CHECKING:
    from google.cloud import storage

SERVICE = "Cloud Storage"
DOWNLOAD_THREADS = 8  # an attempt's chunks are many small objects: fetch a few at a time


def md5_base64(data: bytes) -> str:
    """An object's MD5 as Cloud Storage reports it (`md5Hash`)."""
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode("ascii")


class GcsLogBucket:
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

    def write_if_changed(self, name: str, data: bytes, content_type: str) -> bool:
        with translated(SERVICE, f"write {name}"):
            existing = self._bucket.get_blob(name)
            if existing is not None and existing.size == len(data) and existing.md5_hash == md5_base64(data):
                return False
            self._bucket.blob(name).upload_from_string(data, content_type=content_type)
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

"""The local Cloud Storage's two mends (tpujobs.local.storage_emulator), through the real client."""

from __future__ import annotations

import urllib.request
from urllib.parse import quote

from tpujobs.local.storage_emulator import write_config_unless_in_memory


def test_a_download_carries_the_objects_generation_as_cloud_storage_sends_it(storage_url: str, bucket) -> None:
    """x-goog-generation on the media answer equals the object's generation (TensorStore needs it)."""
    blob = bucket.blob("ckpt/step-1/data")
    blob.upload_from_string(b"weights")
    blob.reload()
    url = f"{storage_url}/download/storage/v1/b/{bucket.name}/o/{quote(blob.name, safe='')}?alt=media"
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.read() == b"weights"
        assert answer.headers["x-goog-generation"] == str(blob.generation)
        assert answer.headers["x-goog-metageneration"] == str(blob.metageneration)


def test_objects_stay_readable_and_listed_without_the_metadata_file(bucket) -> None:
    """In memory the metadata file is never written; what the client wrote still lists and reads back."""
    for n in range(5):
        bucket.blob(f"out/{n:06d}.log").upload_from_string(f"line {n}\n".encode())
    names = [b.name for b in bucket.client.list_blobs(bucket, prefix="out/")]
    assert names == [f"out/{n:06d}.log" for n in range(5)]
    assert bucket.blob("out/000003.log").download_as_bytes() == b"line 3\n"


def test_the_metadata_file_is_still_written_where_the_store_is_on_disk() -> None:
    """Only the in-memory store skips it: a store on disk reads it back when it starts."""
    written: list[str] = []

    class Store:
        def __init__(self, in_memory: bool) -> None:
            self._use_memory_fs = in_memory

    write = write_config_unless_in_memory(lambda self: written.append("meta"))
    write(Store(in_memory=True))  # type: ignore[arg-type]
    assert written == []
    write(Store(in_memory=False))  # type: ignore[arg-type]
    assert written == ["meta"]

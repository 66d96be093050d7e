"""The contract of `ports.OutputBucket`: the in-memory bucket and `GcsOutputBucket` on the storage emulator.

The agents upload their chunks outside the port (`put` here stands for them); the export reads,
lists, writes its logs only when they changed, and marks the chunks it used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from contract_data import T0

from tpujobs.local.fakes import InMemoryOutputBucket


@dataclass
class Bucket:
    """A OutputBucket, and how a test uploads an object beside the port."""

    port: Any
    put: Callable[[str, bytes], None]


@pytest.fixture(params=["memory", pytest.param("storage", marks=pytest.mark.emulator)])
def logs(request: pytest.FixtureRequest) -> Bucket:
    if request.param == "memory":
        fake = InMemoryOutputBucket("logs")
        return Bucket(fake, fake.put)
    from tpujobs.adapters.output_bucket import GcsOutputBucket

    bucket = request.getfixturevalue("bucket")
    return Bucket(
        GcsOutputBucket(bucket.client, bucket.name), lambda name, data: bucket.blob(name).upload_from_string(data)
    )


def test_objects_are_listed_by_prefix_in_name_order_and_read_as_uploaded(logs):
    """list_objects narrows by prefix, in name order; a missing object reads as None, in every read."""
    logs.put("job/a1/0-0/000002.log", b"two")
    logs.put("job/a1/0-0/000001.log", b"one")
    logs.put("other/x.log", b"x")
    listed = logs.port.list_objects("job/")
    assert [o.name for o in listed] == ["job/a1/0-0/000001.log", "job/a1/0-0/000002.log"]
    assert all(o.updated is not None for o in listed)
    assert logs.port.read("job/a1/0-0/000001.log") == b"one" and logs.port.read("nothing") is None
    names = ["job/a1/0-0/000002.log", "nothing", "other/x.log"]
    assert logs.port.read_all(names) == [b"two", None, b"x"]
    assert list(logs.port.read_each(names)) == [b"two", None, b"x"]
    assert logs.port.uri("job/a1.log").endswith("/job/a1.log") and logs.port.uri("x").startswith("gs://")


def test_a_stream_is_written_only_when_its_bytes_changed(logs):
    """The same bytes again upload nothing; different bytes replace the object."""
    pieces = [b"step 1\n", b"step 2\n"]
    assert logs.port.write_stream_if_changed("job/attempt.log", lambda: iter(pieces), "text/plain") is True
    assert logs.port.write_stream_if_changed("job/attempt.log", lambda: iter(pieces), "text/plain") is False
    assert logs.port.read("job/attempt.log") == b"step 1\nstep 2\n"
    assert logs.port.write_stream_if_changed("job/attempt.log", lambda: iter([b"other\n"]), "text/plain") is True
    assert logs.port.read("job/attempt.log") == b"other\n"


def test_an_objects_custom_time_only_moves_forward(logs):
    """mark_used moves it to a later time, never back, and says so; a missing object is False."""
    logs.put("chunk.log", b"x")
    assert logs.port.mark_used("chunk.log", T0) is True
    assert logs.port.mark_used("chunk.log", T0) is False
    assert logs.port.mark_used("chunk.log", T0 - timedelta(days=1)) is False
    assert logs.port.mark_used("chunk.log", T0 + timedelta(days=1)) is True
    assert logs.port.mark_used("missing.log", T0) is False


def upload(bucket: Any, name: str, data: bytes) -> None:
    """An object uploaded as an agent uploads its chunks."""
    bucket.blob(name).upload_from_string(data)

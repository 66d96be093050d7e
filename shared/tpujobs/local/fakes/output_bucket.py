"""The logs bucket in memory: `GcsOutputBucket` without Cloud Storage."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timezone

from tpujobs.engine.ports import StoredObject


class InMemoryOutputBucket:
    """`ports.OutputBucket` in memory: objects with their update and custom times, listed by name;
    `clock` (default: the wall clock) stamps each upload's update time."""

    def __init__(self, name: str = "logs", clock: Callable[[], datetime] | None = None) -> None:
        self.name = name
        self._clock = clock
        self._objects: dict[str, tuple[bytes, datetime | None, datetime | None]] = {}  # data, updated, custom
        self._lock = threading.Lock()
        self.uploads = 0  # writes that reached the bucket

    def put(self, name: str, data: bytes) -> None:
        """Upload an object, as an agent uploads its chunks."""
        with self._lock:
            self._objects[name] = (data, self._clock() if self._clock else datetime.now(timezone.utc), None)

    def custom_time(self, name: str) -> datetime | None:
        with self._lock:
            return self._objects[name][2] if name in self._objects else None

    def uri(self, name: str) -> str:
        return f"gs://{self.name}/{name}"

    def list_objects(self, prefix: str) -> list[StoredObject]:
        with self._lock:
            return [StoredObject(n, self._objects[n][1]) for n in sorted(self._objects) if n.startswith(prefix)]

    def read(self, name: str) -> bytes | None:
        with self._lock:
            return self._objects[name][0] if name in self._objects else None

    def read_all(self, names: Sequence[str]) -> list[bytes | None]:
        return [self.read(name) for name in names]

    def read_each(self, names: Sequence[str]) -> Iterator[bytes | None]:
        return (self.read(name) for name in names)

    def write_stream_if_changed(self, name: str, stream: Callable[[], Iterable[bytes]], content_type: str) -> bool:
        data = b"".join(stream())
        if self.read(name) == data:
            return False
        self.put(name, data)
        with self._lock:
            self.uploads += 1
        return True

    def mark_used(self, name: str, at: datetime) -> bool:
        with self._lock:
            if name not in self._objects:
                return False
            data, updated, custom = self._objects[name]
            if custom is not None and custom >= at:
                return False
            self._objects[name] = (data, updated, at)
            return True

"""The last output lines of an attempt's workers, as a job page shows them: read from the newest
chunks only, and kept briefly in the function instance.

A job page refreshes every 10 s while its job moves, and an agent uploads a chunk every 2 s of
output: reading a worker's whole log (every chunk, or the exported log) on each load would grow
with the job's age. So each worker's newest chunks are read, newest first, until they hold the
lines shown, and an attempt's lines are reused for a few seconds by every viewer of the instance.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from tpujobs.engine.output_export import attempt_prefix

if TYPE_CHECKING:
    from tpujobs.domain.job import Job
    from tpujobs.engine.ports import Clock, OutputBucket

OUTPUT_LINES = 20  # last lines shown per worker
TAIL_CHUNKS = 30  # the most chunks read per worker, newest first (2, then 4, 8, 16 side by side)
LINE_CHARS = 2_000  # a longer line is cut: what one page (and the cache) holds stays bounded
MOVING_FRESH = timedelta(seconds=15)  # a running attempt's lines are read again after this
ENDED_FRESH = timedelta(minutes=10)  # an ended attempt's output no longer changes
CACHED_ATTEMPTS = 64  # (job, attempt) entries one instance keeps, least recently shown dropped
_CHUNK = re.compile(r"(?P<seq>[0-9]{1,12})\.log")


@dataclass(frozen=True)
class _Read:
    at: datetime
    ended: bool
    lines: dict[int, list[str]]


class RecentOutput:
    """Workers' last lines per (job, attempt), read from the logs bucket (`ports.OutputBucket`)."""

    def __init__(self, bucket: OutputBucket, clock: Clock) -> None:
        self.bucket = bucket
        self.clock = clock
        self._reads: OrderedDict[tuple[str, int], _Read] = OrderedDict()
        self._lock = threading.Lock()

    def last_lines(self, job: Job, attempt: int, workers: int, *, ended: bool) -> dict[int, list[str]]:
        """Worker K -> its last OUTPUT_LINES lines, for workers 0..workers-1; a read younger than
        MOVING_FRESH (ENDED_FRESH once the attempt has ended) is reused."""
        key, now = (job.job_id, attempt), self.clock()
        with self._lock:
            kept = self._reads.get(key)
            if kept is not None and now - kept.at < (ENDED_FRESH if kept.ended else MOVING_FRESH):
                self._reads.move_to_end(key)
                return kept.lines
        lines = {worker: self._tail(job, attempt, worker) for worker in range(workers)}
        with self._lock:
            self._reads[key] = _Read(now, ended, lines)
            self._reads.move_to_end(key)
            while len(self._reads) > CACHED_ATTEMPTS:
                self._reads.popitem(last=False)
        return lines

    def _tail(self, job: Job, attempt: int, worker: int) -> list[str]:
        """Worker K's last lines from its newest chunks; a line cut by the first chunk read is
        left out unless that chunk is the worker's first."""
        slice_id, worker_id = divmod(worker, job.spec.hosts_per_slice)
        folder = attempt_prefix(job.job_id, attempt, job.spec.service_account)
        prefix = f"{folder}chunks/slice-{slice_id}-worker-{worker_id}/"
        chunks = sorted(
            (int(match["seq"]), stored.name)
            for stored in self.bucket.list_objects(prefix)
            if (match := _CHUNK.fullmatch(stored.name[len(prefix) :]))
        )
        newest_first = [name for _, name in reversed(chunks)][:TAIL_CHUNKS]
        text, taken, batch = b"", 0, 2
        while taken < len(newest_first) and text.count(b"\n") <= OUTPUT_LINES:
            names = newest_first[taken : taken + batch]  # side by side, twice as many each round
            text = b"".join(data or b"" for data in reversed(self.bucket.read_all(names))) + text
            taken, batch = taken + len(names), batch * 2
        lines = text.decode("utf-8", errors="replace").splitlines()
        if taken < len(chunks) and lines:
            lines = lines[1:]
        return [line[:LINE_CHARS] for line in lines[-OUTPUT_LINES:]]

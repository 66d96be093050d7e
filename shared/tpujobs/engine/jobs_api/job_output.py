"""The `logs` action: an attempt's output from Cloud Logging, each entry's signature checked here.

A job's code can write entries with any job's labels, so only entries its agents signed are
lines (`domain.job_output.verify`); checking needs the master key, which the API holds and users
do not, so through the API everyone gets verified output. Who may read it: the job's owner or an
admin (`domain.access.may_cancel`, the rule of env values and of the dashboard's output lines).
An answer is a page of at most about MAX_ENTRIES entries, oldest first; `after` asks for the next.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Protocol

from tpujobs.agent.wire import SLICE_LABEL, WORKER_LABEL
from tpujobs.domain import job_output
from tpujobs.domain.access import may_cancel
from tpujobs.domain.job_output import KeyFor, OutputLine, RawEntry
from tpujobs.domain.signing import MasterKeys, MissingMasterKey, created_micros
from tpujobs.engine.errors import OutputUnreadable
from tpujobs.engine.jobs_api.answers import ApiError, Response

if TYPE_CHECKING:
    from tpujobs.domain.job import Job
    from tpujobs.engine.jobs_api.requests import LogsRequest
    from tpujobs.engine.ports import JobDocuments
    from tpujobs.engine.settings import Settings

# Entries read for one answer: a page of entries.list (its most is 1000) times a few, so one
# answer costs a few of the project's read quota; and their text, so it stays far below a
# function's answer size (an agent's line is at most 64 Ki characters, a forged entry 256 KB).
MAX_ENTRIES = 5000
MAX_CHARS = 1024 * 1024
# A page never ends inside one time, unless that time alone holds twice the above: only a flood
# of forged entries of one microsecond does, and the rest of that microsecond is skipped.
HARD_FACTOR = 2

log = logging.getLogger(__name__)


class OutputEntries(Protocol):
    """Cloud Logging's `entries.list` for one query, oldest first (`adapters.job_output_logs`);
    OutputUnreadable when the deployment may not read its output there."""

    def read(self, query: str) -> Iterable[RawEntry]: ...


@dataclass(frozen=True)
class OutputPage:
    """Verified lines of one answer, the entries dropped as forged, and where the next page starts."""

    lines: tuple[OutputLine, ...]
    forged: int
    after: datetime | None  # the next page holds entries later than this; None: nothing more


def verifying_keys(settings: Settings, job: Job) -> KeyFor | None:
    """What finds the key each entry of `job` must be signed with, or None when this process holds
    no master key (the control plane does; users' machines do not)."""
    keys = MasterKeys.of(
        settings.report_key,
        settings.report_key_version,
        settings.report_key_previous,
        settings.report_key_previous_version,
    )
    created = created_micros(job.created_at) if job.created_at else None

    def key_for(attempt: int, job_created: int, version: str) -> bytes | None:
        if job_created != created or version not in keys.secrets:  # another job of that id, or no such key
            return None
        return keys.attempt_key(job.job_id, job_created, attempt, version)

    try:
        keys.attempt_key(job.job_id, 0, 1)
    except MissingMasterKey:
        return None
    return key_for


def read_page(
    entries: OutputEntries,
    settings: Settings,
    job: Job,
    attempt: int,
    key_for: KeyFor,
    worker: int | None = None,
    after: datetime | None = None,
    max_entries: int = MAX_ENTRIES,
    max_chars: int = MAX_CHARS,
) -> OutputPage:
    """The verified lines of the attempt (one worker's: K = slice x hosts per slice + worker) from
    the entries later than `after`. A page ends at `max_entries` entries or `max_chars` of text,
    but not between two entries of the same time, so `after` (the last one's time) loses none and
    repeats none (up to HARD_FACTOR times the limits)."""
    query = job_output.job_filter(settings.project, settings.prefix, job.job_id, attempt, since=after or job.created_at)
    if worker is not None:
        hosts = job.spec.hosts_per_slice
        query += f' AND labels.{SLICE_LABEL}="{worker // hosts}" AND labels.{WORKER_LABEL}="{worker % hosts}"'
    cut: list[datetime] = []
    later = (e for e in entries.read(query) if after is None or e.timestamp > after)
    taken = _bounded(later, max_entries, max_chars, cut)
    verified = job_output.verify(job.job_id, taken, key_for)
    mine = tuple(
        line
        for line in verified.lines
        if worker is None or line.slice_id * job.spec.hosts_per_slice + line.worker_id == worker
    )
    return OutputPage(mine, verified.forged, cut[0] if cut else None)


def _bounded(entries: Iterable[RawEntry], most: int, chars: int, cut: list[datetime]) -> Iterator[RawEntry]:
    """Entries until `most` of them or `chars` of text, then those of the same time as the last
    (up to HARD_FACTOR times either); `cut` gets the last time when more follow (the next page
    starts after it)."""
    last: datetime | None = None
    text = 0
    for count, entry in enumerate(entries):
        full = count >= most or text >= chars
        flooded = count >= HARD_FACTOR * most or text >= HARD_FACTOR * chars
        if last is not None and full and (entry.timestamp != last or flooded):
            cut.append(last)
            return
        last = entry.timestamp
        text += len(entry.text)
        yield entry


class JobOutput:
    """`logs`: the verified lines of an attempt's output, for the job's owner or an admin."""

    def __init__(
        self,
        store: JobDocuments,
        settings: Settings,
        entries: OutputEntries | None,
        find_job: Callable[[str], Job],
    ) -> None:
        """`entries`: the deployment's Cloud Logging (None: this API reads none); `find_job`: the
        job by id or ApiError(404), as the job actions find it."""
        self.store = store
        self.settings = settings
        self.entries = entries
        self.find_job = find_job

    def read(self, caller: str, request: LogsRequest) -> Response:
        """One page of the attempt's verified lines. `cloud_logging: false`: the job's output is not
        there (read its Cloud Storage copy); `after`, when set, asks for the next page."""
        job = self.find_job(request.job_id)
        if not may_cancel(job.owner, caller, self.settings.admins):
            raise ApiError(403, f"{caller} may not read {job.job_id}'s output: only its owner or an admin may.")
        attempt = request.attempt or job.attempt
        if attempt > job.attempt:
            raise ApiError(400, f"{job.job_id} has no attempt {attempt} (it is at attempt {job.attempt}).")
        if request.worker is not None and request.worker >= job.total_workers:
            raise ApiError(400, f"{job.job_id} has workers 0 to {job.total_workers - 1}, not {request.worker}.")
        answer: dict[str, object] = {"job_id": job.job_id, "attempt": attempt, "cloud_logging": False}
        if not job_output.wanted(job.spec.cloud_logging, self.settings.cloud_logging) or self.entries is None:
            return Response(200, {**answer, "lines": [], "forged": 0, "after": None})
        key_for = verifying_keys(self.settings, job)
        if key_for is None:
            raise ApiError(503, "This deployment's API holds no master key: it cannot check output entries.")
        try:
            page = read_page(self.entries, self.settings, job, attempt, key_for, request.worker, request.after)
        except OutputUnreadable as error:  # no log view, or no right to it: the deployment's to mend
            log.error("the jobs API cannot read Cloud Logging: %s", error)
            raise ApiError(
                503,
                "This deployment's API cannot read job output from Cloud Logging (its log view is missing,"
                " or the API may not read it; see docs/operations.md): read the Cloud Storage copy.",
            ) from error
        return Response(
            200,
            {
                **answer,
                "cloud_logging": True,
                "lines": [_line_json(line) for line in page.lines],
                "forged": page.forged,
                "after": _time(page.after),
            },
        )


def _line_json(line: OutputLine) -> dict[str, object]:
    return {
        "slice_id": line.slice_id,
        "worker_id": line.worker_id,
        "seq": line.seq,
        "timestamp": _time(line.timestamp),
        "stream": line.stream,
        "text": line.text,
    }


def _time(at: datetime | None) -> str | None:
    return None if at is None else at.astimezone(timezone.utc).isoformat()

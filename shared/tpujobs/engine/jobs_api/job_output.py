"""The `logs` action: an attempt's output from Cloud Logging, each entry's signature checked here.

A job's code can write entries with any job's labels, so only entries its agents signed are
lines (`domain.job_output.verify`); checking needs the master key, which the API holds and users
do not, so through the API everyone gets verified output. Who may read it: the job's owner or an
admin (`domain.access.may_cancel`, the rule of env values and of the dashboard's output lines).

An answer pages through Cloud Logging (`entries.list`, oldest first) and checks each entry as it
reads it, until it holds `Limits.lines` verified lines (or `Limits.chars` of their text), or has
read `Limits.entries` entries: unsigned entries cost reading, never room for lines. It ends
exactly where it stopped: `after` is a cursor (Cloud Logging's page token and how many entries of
that page were read), so the next answer starts at the next entry, even inside one microsecond
of a flood. `cut` says why an answer stopped before the end (`CUT_REASONS`).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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

# Why an answer stopped before the attempt's last entry; the next answer (`after`) goes on from there.
CUT_REASONS = {
    "lines": "the answer holds its most verified lines",
    "chars": "the answer holds its most text",
    "entries": "the answer read its most entries; those without a valid signature were skipped",
}
MAX_CURSOR = 4096  # characters of an `after` cursor (a page token is some hundreds)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """What one answer holds and reads at most. Verified text stays far below a function's answer
    size (an agent's line is at most 64 Ki characters); entries read bound what one answer costs of
    the project's read quota (entries.list answers at most 1000 a page)."""

    lines: int = 5000
    chars: int = 1024 * 1024
    entries: int = 20_000
    page_size: int = 1000


@dataclass(frozen=True)
class EntriesPage:
    """One page of `entries.list`: its entries, oldest first, and the token of the next (None: the last)."""

    entries: Sequence[RawEntry]
    next_token: str | None


class StaleToken(ValueError):
    """Cloud Logging refused a page token: expired, or not one it gave for this query."""


class OutputEntries(Protocol):
    """Cloud Logging's `entries.list` for one query, a page at a time, oldest first
    (`adapters.job_output_logs`); OutputUnreadable when the deployment may not read its output
    there, StaleToken when it refuses `token`."""

    def page(self, query: str, token: str | None, size: int) -> EntriesPage: ...


@dataclass(frozen=True)
class Cursor:
    """Where the next answer starts: the page `token` (empty: the first page) and how many of its
    entries were read already."""

    token: str = ""
    skip: int = 0

    def text(self) -> str:
        raw = json.dumps({"t": self.token, "s": self.skip}, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @staticmethod
    def parse(text: str) -> Cursor:
        """The cursor an answer's `after` gave; ValueError for anything else."""
        try:
            body = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        except (binascii.Error, ValueError, UnicodeDecodeError):
            raise ValueError("not a cursor") from None
        if not isinstance(body, dict) or not isinstance(body.get("t"), str) or type(body.get("s")) is not int:
            raise ValueError("not a cursor")
        if body["s"] < 0 or len(text) > MAX_CURSOR:
            raise ValueError("not a cursor")
        return Cursor(body["t"], body["s"])


@dataclass
class OutputPage:
    """Verified lines of one answer, the entries dropped as forged, where the next answer starts
    (None: nothing more) and why this one stopped there (a CUT_REASONS key; None at the end)."""

    lines: list[OutputLine] = field(default_factory=list)
    forged: int = 0
    read: int = 0
    after: Cursor | None = None
    cut: str | None = None
    chars: int = 0

    def full(self, limits: Limits) -> str | None:
        """The reason this answer may take no more, or None."""
        if len(self.lines) >= limits.lines:
            return "lines"
        if self.chars >= limits.chars:
            return "chars"
        if self.read >= limits.entries:
            return "entries"
        return None


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


def output_query(project: str, prefix: str, job: Job, attempt: int, worker: int | None) -> str:
    """The query of the attempt's entries (one worker's: K = slice x hosts per slice + worker): the
    same for every page of it, as a page token asks."""
    query = job_output.job_filter(project, prefix, job.job_id, attempt, since=job.created_at)
    if worker is not None:
        hosts = job.spec.hosts_per_slice
        query += f' AND labels.{SLICE_LABEL}="{worker // hosts}" AND labels.{WORKER_LABEL}="{worker % hosts}"'
    return query


def read_page(
    entries: OutputEntries,
    query: str,
    job: Job,
    key_for: KeyFor,
    worker: int | None = None,
    after: Cursor | None = None,
    limits: Limits = Limits(),
) -> OutputPage:
    """The verified lines of `query`'s entries from `after` on, each entry checked as it is read,
    until the answer is full (`Limits`) or the entries end. A line repeated (a retried write) is
    shown once per answer."""
    page = OutputPage()
    seen: set[tuple[int, int, int, int]] = set()
    at = after or Cursor()
    while True:
        found = entries.page(query, at.token or None, limits.page_size)
        for index in range(at.skip, len(found.entries)):
            reason = page.full(limits)
            if reason is not None:
                page.after, page.cut = Cursor(at.token, index), reason
                return page
            page.read += 1
            verified = job_output.verify(job.job_id, [found.entries[index]], key_for)
            page.forged += verified.forged
            for line in verified.lines:
                key = (line.attempt, line.slice_id, line.worker_id, line.seq)
                mine = worker is None or line.slice_id * job.spec.hosts_per_slice + line.worker_id == worker
                if mine and key not in seen:
                    seen.add(key)
                    page.lines.append(line)
                    page.chars += len(line.text)
        if not found.next_token:
            return page
        at = Cursor(found.next_token, 0)
        reason = page.full(limits)
        if reason is not None:  # full at a page's end: the next answer starts with the next page
            page.after, page.cut = at, reason
            return page


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
            return Response(200, {**answer, "lines": [], "forged": 0, "after": None, "cut": None})
        key_for = verifying_keys(self.settings, job)
        if key_for is None:
            raise ApiError(503, "This deployment's API holds no master key: it cannot check output entries.")
        try:
            after = Cursor.parse(request.after) if request.after else None
        except ValueError:
            raise ApiError(400, "'after' must be the 'after' of a `logs` answer, as it gave it.") from None
        query = output_query(self.settings.project, self.settings.prefix, job, attempt, request.worker)
        try:
            page = read_page(self.entries, query, job, key_for, request.worker, after)
        except OutputUnreadable as error:  # no log view, or no right to it: the deployment's to mend
            log.error("the jobs API cannot read Cloud Logging: %s", error)
            raise ApiError(
                503,
                "This deployment's API cannot read job output from Cloud Logging (its log view is missing,"
                " or the API may not read it; see docs/operations.md): read the Cloud Storage copy.",
            ) from error
        except StaleToken as error:
            raise ApiError(400, "'after' is no longer valid (or was never given): read from the start.") from error
        return Response(200, {**answer, "cloud_logging": True, **page_json(page)})


def page_json(page: OutputPage) -> dict[str, object]:
    """An answer's lines, `forged`, `read`, `after` (the cursor, or None at the end) and `cut`:
    None, or {reason, why} when the answer stopped before the attempt's last entry."""
    cut = None if page.cut is None else {"reason": page.cut, "why": CUT_REASONS[page.cut]}
    return {
        "lines": [_line_json(line) for line in page.lines],
        "forged": page.forged,
        "read": page.read,
        "after": None if page.after is None else page.after.text(),
        "cut": cut,
    }


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

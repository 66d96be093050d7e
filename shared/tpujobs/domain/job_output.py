"""A job's output in Cloud Logging, as the reader sees it: whether a job's goes there, the filter
and Logs Explorer link that find it, and which entries its agents wrote.

A job's code runs with its VM's credentials, so it can write entries with any job's labels. Each
agent signs its entries with its attempt's key (`tpujobs.agent.log_wire`); an entry whose
signature does not hold is dropped here and counted. Pure: no I/O, no clock.
"""

from __future__ import annotations

import hmac
import re
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from tpujobs.agent.wire import (
    ATTEMPT_LABEL,
    ENTRY_SIGNATURE_PREFIX,
    JOB_CREATED_LABEL,
    JOB_LABEL,
    KEY_VERSION_LABEL,
    SEQ_LABEL,
    SIGNATURE_LABEL,
    SLICE_LABEL,
    STREAM_LABEL,
    VERSION_PATTERN,
    WORKER_LABEL,
    log_name,
    micros,
    sign_entry,
)

__all__ = [
    "OutputLine",
    "RawEntry",
    "Verified",
    "attempt_output_link",
    "explorer_url",
    "job_filter",
    "log_name",
    "output_link",
    "verify",
    "wanted",
]
EXPLORER = "https://console.cloud.google.com/logs/query"
_SIGNATURE = re.compile(re.escape(ENTRY_SIGNATURE_PREFIX) + r"[0-9a-f]{64}")
_NUMBER = re.compile(r"[0-9]{1,20}")


def wanted(spec_switch: bool | None, deployment_on: bool) -> bool:
    """Whether a job's output goes to Cloud Logging: only where the deployment turned it on, and
    then unless the job's spec says `cloud_logging: false`."""
    return deployment_on and spec_switch is not False


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def job_filter(
    project: str, prefix: str, job_id: str, attempt: int | None = None, since: datetime | None = None
) -> str:
    """The Logging query for a job's output (or one attempt's): the one `tpujobs logs` reads with
    and the Logs Explorer link shows. `since` (the job's creation) keeps a reader's default window
    (google-cloud-logging's: the last 24 hours) from hiding an older job's lines."""
    terms = [f"logName={_quoted(log_name(project, prefix))}", f"labels.{JOB_LABEL}={_quoted(job_id)}"]
    if since is not None:
        terms.append(f"timestamp>={_quoted(since.astimezone(timezone.utc).strftime('%Y-%m-%dT%H:%M:%S.%fZ'))}")
    if attempt is not None:
        terms.append(f"labels.{ATTEMPT_LABEL}={_quoted(str(attempt))}")
    return " AND ".join(terms)


def output_link(project: str, prefix: str, job_id: str, spec_switch: bool | None, deployment_on: bool) -> str | None:
    """The Logs Explorer link of a job's output, or None when its output is not in Cloud Logging:
    what `describe` answers (built where the deployment's project is known) and `submit` prints."""
    if not wanted(spec_switch, deployment_on):
        return None
    return explorer_url(project, job_filter(project, prefix, job_id))


def attempt_output_link(project: str, prefix: str, job_id: str, attempt: int, since: datetime) -> str:
    """The Logs Explorer link of one attempt's output, from `since` (the attempt's start): a
    timestamp in the query overrides the Explorer's default window (the last hour), which would
    hide an older attempt's lines. Only for a job whose output goes there (`wanted`)."""
    return explorer_url(project, job_filter(project, prefix, job_id, attempt, since))


def explorer_url(project: str, query: str) -> str:
    """The Logs Explorer with `query` filled in. It shows every entry, forged ones too: only
    `tpujobs logs` checks signatures."""
    return f"{EXPLORER};query={urllib.parse.quote(query, safe='')}?project={urllib.parse.quote(project, safe='')}"


@dataclass(frozen=True)
class RawEntry:
    """An entry as read back: its labels, time and text."""

    labels: Mapping[str, str]
    timestamp: datetime
    text: str


@dataclass(frozen=True)
class OutputLine:
    """One verified line of a job's output."""

    attempt: int
    slice_id: int
    worker_id: int
    seq: int
    timestamp: datetime
    stream: str
    text: str


@dataclass(frozen=True)
class Verified:
    """The lines whose signature holds, in the order read, and how many entries did not."""

    lines: tuple[OutputLine, ...]
    forged: int


KeyFor = Callable[[int, int, str], bytes | None]  # (attempt, job created micros, key version) -> key


def verify(job_id: str, entries: Iterable[RawEntry], key_for: KeyFor) -> Verified:
    """The entries of `job_id` that its attempts' agents signed, each line once (a retried write,
    or a replayed copy, is the same line); the rest are counted as forged."""
    lines: list[OutputLine] = []
    seen: set[tuple[int, int, int, int]] = set()
    forged = 0
    for entry in entries:
        line = _checked(job_id, entry, key_for)
        if line is None:
            forged += 1
        elif (line.attempt, line.slice_id, line.worker_id, line.seq) not in seen:
            seen.add((line.attempt, line.slice_id, line.worker_id, line.seq))
            lines.append(line)
    return Verified(tuple(lines), forged)


def _checked(job_id: str, entry: RawEntry, key_for: KeyFor) -> OutputLine | None:
    labels = entry.labels
    numbers = [labels.get(name, "") for name in (ATTEMPT_LABEL, SLICE_LABEL, WORKER_LABEL, SEQ_LABEL)]
    created = labels.get(JOB_CREATED_LABEL, "")
    version = labels.get(KEY_VERSION_LABEL, "")
    signature = labels.get(SIGNATURE_LABEL, "")
    if labels.get(JOB_LABEL) != job_id or not all(_NUMBER.fullmatch(n) for n in [*numbers, created]):
        return None
    if not re.fullmatch(VERSION_PATTERN, version) or not _SIGNATURE.fullmatch(signature):
        return None
    attempt, slice_id, worker_id, seq = (int(n) for n in numbers)
    key = key_for(attempt, int(created), version)
    if key is None:
        return None
    at = micros(entry.timestamp)
    expected = sign_entry(key, job_id, attempt, f"{slice_id}-{worker_id}", seq, at, entry.text)
    if not hmac.compare_digest(expected, signature):
        return None
    stream = labels.get(STREAM_LABEL, "stdout")
    return OutputLine(attempt, slice_id, worker_id, seq, entry.timestamp, stream, entry.text)

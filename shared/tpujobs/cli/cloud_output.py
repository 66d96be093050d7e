"""A job's output read back from Cloud Logging, and the Logs Explorer link `submit` and `describe`
print. Only entries that the job's own agents signed are shown (`tpujobs.domain.job_output`): the
jobs API checks them for everyone (its `logs` action holds the master key); without an API, a
machine that holds the master key (an operator's) checks them itself, page by page as the API
does. The Logs Explorer shows every entry, so the link says it does not check them.

Either way the reader stops after MAX_PAGES answers; where output remained, `OutputRead.cut`
says so and why, and the command prints it: output is never cut silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpujobs.domain import job_output
from tpujobs.domain.job import Job
from tpujobs.engine.jobs_api.job_output import CUT_REASONS, Cursor, read_page
from tpujobs.engine.jobs_api.job_output import output_query as output_query
from tpujobs.engine.jobs_api.job_output import verifying_keys as verifying_keys
from tpujobs.engine.settings import Settings

Write = Callable[[bytes], None]
# Answers one `tpujobs logs` reads at most (each up to the API's Limits: 5000 lines, 20,000 entries read).
MAX_PAGES = 200


@dataclass(frozen=True)
class OutputRead:
    """What a reader wrote: verified lines, entries dropped as forged, entries read, and, when it
    stopped before the attempt's last entry, why (a sentence; None: the output is whole)."""

    lines: int
    forged: int
    read: int = 0
    cut: str | None = None


def explorer_link(config: Settings, job_id: str, cloud_logging: bool | None = None) -> str | None:
    """The Logs Explorer link of a job's output, or None when its output is not in Cloud Logging."""
    return job_output.output_link(config.project, config.prefix, job_id, cloud_logging, config.cloud_logging)


def cut_sentence(pages: int, read: int, reason: str | None) -> str:
    """What the command says when it stopped with output left: after how much, and why."""
    why = CUT_REASONS.get(reason or "", "the answer stopped early")
    return (
        f"Output cut: stopped after {pages} answers ({read} Cloud Logging entries read); the last one"
        f" stopped because {why}. Narrow it with --worker, or read the exported log (--links)."
    )


def read_verified(config: Settings, job: Job, attempt: int, worker: int | None, write: Write) -> OutputRead | None:
    """Writes the attempt's verified lines (one worker's: K = slice x hosts per slice + worker);
    None when they cannot be verified here (no master key)."""
    from tpujobs.adapters.job_output_logs import CloudLoggingEntries

    key_for = verifying_keys(config, job)
    if key_for is None:
        return None
    entries = CloudLoggingEntries(config.project, config.logging_endpoint)
    query = output_query(config.project, config.prefix, job, attempt, worker)
    after: Cursor | None = None
    shown = forged = read = 0
    for pages in range(1, MAX_PAGES + 1):
        page = read_page(entries, query, job, key_for, worker, after)
        for line in page.lines:
            write(line.text.encode("utf-8", "replace") + b"\n")
        shown, forged, read = shown + len(page.lines), forged + page.forged, read + page.read
        if page.after is None:
            return OutputRead(shown, forged, read)
        after = page.after
        if pages == MAX_PAGES:
            return OutputRead(shown, forged, read, cut_sentence(pages, read, page.cut))
    return OutputRead(shown, forged, read)


def read_through_api(
    ask: Callable[[dict[str, Any]], dict[str, Any] | None],
    job_id: str,
    attempt: int | None,
    worker: int | None,
    write: Write,
) -> OutputRead | None:
    """Writes the verified lines the jobs API's `logs` answers, page by page; None when the job's
    output is not in Cloud Logging. `ask` posts one request (`cli.common.ask_api`, as the caller)
    and raises with the API's refusal."""
    request: dict[str, Any] = {"action": "logs", "job_id": job_id}
    request.update({k: v for k, v in (("attempt", attempt), ("worker", worker)) if v is not None})
    shown = forged = read = 0
    for pages in range(1, MAX_PAGES + 1):
        answer = ask(request) or {}
        if not answer.get("cloud_logging"):
            return None
        for line in answer.get("lines", []):
            write(str(line.get("text", "")).encode("utf-8", "replace") + b"\n")
            shown += 1
        forged += int(answer.get("forged") or 0)
        read += int(answer.get("read") or 0)
        if not answer.get("after"):
            return OutputRead(shown, forged, read)
        if pages == MAX_PAGES:
            cut = answer.get("cut")
            reason = str(cut.get("reason") or "") if isinstance(cut, dict) else ""
            return OutputRead(shown, forged, read, cut_sentence(pages, read, reason))
        request["after"] = answer["after"]
        request["attempt"] = answer.get("attempt", attempt)  # the pages of one attempt, even if another starts
    return OutputRead(shown, forged, read)

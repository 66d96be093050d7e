"""A job's output read back from Cloud Logging, and the Logs Explorer link `submit` and `describe`
print. Only entries that the job's own agents signed are shown (`tpujobs.domain.job_output`): the
jobs API checks them for everyone (its `logs` action holds the master key); without an API, a
machine that holds the master key (an operator's) checks them itself. The Logs Explorer shows
every entry, so the link says it does not check them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpujobs.domain import job_output
from tpujobs.domain.job import Job
from tpujobs.engine.jobs_api.job_output import verifying_keys as verifying_keys
from tpujobs.engine.settings import Settings

Write = Callable[[bytes], None]
# Pages one `tpujobs logs` reads through the API at most (each up to the API's MAX_ENTRIES entries).
MAX_PAGES = 200


def explorer_link(config: Settings, job_id: str, cloud_logging: bool | None = None) -> str | None:
    """The Logs Explorer link of a job's output, or None when its output is not in Cloud Logging."""
    return job_output.output_link(config.project, config.prefix, job_id, cloud_logging, config.cloud_logging)


def read_verified(config: Settings, job: Job, attempt: int, worker: int | None, write: Write) -> tuple[int, int] | None:
    """Writes the attempt's verified lines (one worker's: K = slice x hosts per slice + worker);
    (lines, forged entries dropped), or None when they cannot be verified here."""
    from tpujobs.adapters.job_output_logs import read_entries

    key_for = verifying_keys(config, job)
    if key_for is None:
        return None
    query = job_output.job_filter(config.project, config.prefix, job.job_id, attempt, since=job.created_at)
    verified = job_output.verify(job.job_id, read_entries(config.project, query, config.logging_endpoint), key_for)
    hosts = job.spec.hosts_per_slice
    shown = 0
    for line in verified.lines:
        if worker is not None and line.slice_id * hosts + line.worker_id != worker:
            continue
        write(line.text.encode("utf-8", "replace") + b"\n")
        shown += 1
    return shown, verified.forged


def read_through_api(
    ask: Callable[[dict[str, Any]], dict[str, Any] | None],
    job_id: str,
    attempt: int | None,
    worker: int | None,
    write: Write,
) -> tuple[int, int] | None:
    """Writes the verified lines the jobs API's `logs` answers, page by page; (lines, forged
    entries dropped), or None when the job's output is not in Cloud Logging. `ask` posts one
    request (`cli.common.ask_api`, as the caller) and raises with the API's refusal."""
    request: dict[str, Any] = {"action": "logs", "job_id": job_id}
    request.update({k: v for k, v in (("attempt", attempt), ("worker", worker)) if v is not None})
    shown = forged = 0
    for _ in range(MAX_PAGES):
        answer = ask(request) or {}
        if not answer.get("cloud_logging"):
            return None
        for line in answer.get("lines", []):
            write(str(line.get("text", "")).encode("utf-8", "replace") + b"\n")
            shown += 1
        forged += int(answer.get("forged") or 0)
        if not answer.get("after"):
            return shown, forged
        request["after"] = answer["after"]
        request["attempt"] = answer.get("attempt", attempt)  # the pages of one attempt, even if another starts
    return shown, forged

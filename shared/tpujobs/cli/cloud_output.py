"""A job's output read back from Cloud Logging, and the Logs Explorer link `submit` and `describe`
print. Only entries that the job's own agents signed are shown (`tpujobs.domain.job_output`); the
Logs Explorer shows every entry, so the link says it does not check them.
"""

from __future__ import annotations

from collections.abc import Callable

from tpujobs.domain import job_output
from tpujobs.domain.job import Job
from tpujobs.domain.signing import MasterKeys, MissingMasterKey, created_micros
from tpujobs.engine.settings import Settings


def explorer_link(config: Settings, job_id: str, cloud_logging: bool | None = None) -> str | None:
    """The Logs Explorer link of a job's output, or None when its output is not in Cloud Logging."""
    return job_output.output_link(config.project, config.prefix, job_id, cloud_logging, config.cloud_logging)


def verifying_keys(config: Settings, job: Job) -> Callable[[int, int, str], bytes | None] | None:
    """What finds the key each entry must be signed with, or None when this machine holds no
    master key (only the control plane and its operators do)."""
    keys = MasterKeys.of(
        config.report_key, config.report_key_version, config.report_key_previous, config.report_key_previous_version
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


def read_verified(
    config: Settings, job: Job, attempt: int, worker: int | None, write: Callable[[bytes], None]
) -> tuple[int, int] | None:
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

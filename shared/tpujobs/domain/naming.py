"""Deterministic names: the same job and attempt always give the same resource.

Deterministic names make retries safe: asking twice for `{job_id}-a{attempt}` finds the
first request (ALREADY_EXISTS) instead of buying capacity twice.
"""

from __future__ import annotations

import re

TPU_RESOURCE_ID = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_TPU_RESOURCE_ID = 63


def queued_resource_name(job_id: str, attempt: int) -> str:
    """The queued resource (and node id prefix) of one attempt of a job."""
    if attempt < 1:
        raise ValueError(f"attempt must be 1 or more, got {attempt}")
    name = f"{job_id}-a{attempt}"
    if len(name) > MAX_TPU_RESOURCE_ID or not TPU_RESOURCE_ID.fullmatch(name):
        raise ValueError(f"{name!r} is not a valid TPU resource id")
    return name


def parse_queued_resource_name(name: str) -> tuple[str, int] | None:
    """(job_id, attempt) of a name tpujobs made, or None for anyone else's resource."""
    match = re.fullmatch(r"(?P<job>[a-z][a-z0-9-]*[a-z0-9])-a(?P<attempt>[1-9][0-9]{0,3})", name)
    if not match:
        return None
    return match["job"], int(match["attempt"])


def node_id(queued_resource: str, slice_index: int, slices: int) -> str:
    """The TPU node of one slice: the queued resource's name, suffixed per slice in multislice."""
    return queued_resource if slices == 1 else f"{queued_resource}-{slice_index}"


def exported_attempt(log_uri: str | None) -> int | None:
    """The attempt whose combined log (`.../attempt-N/attempt.log`) a log_uri names, if any."""
    match = re.search(r"/attempt-([0-9]+)/attempt\.log$", log_uri or "")
    return int(match[1]) if match else None


def job_prefix(job_id: str, service_account: str | None = None) -> str:
    """Where a job keeps its objects in the logs bucket (output chunks, exported logs,
    checkpoints): `jobs/{id}/` on the deployment's shared account, and
    `accounts/{email}/jobs/{id}/` on an account of its own, the only prefix that account may
    touch (infra/ grants it per prefix), so no job of another account can read or change them.
    """
    if service_account:
        return f"accounts/{service_account}/jobs/{job_id}/"
    return f"jobs/{job_id}/"

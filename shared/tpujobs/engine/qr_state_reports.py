"""tpujobs-qr-state: an observed state of a holding (a report, the audit-log sink),
and the TPU audit-log entries that the log sink routes to it."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, NamedTuple

from pydantic import Field

from tpujobs.domain.spec import ZONE_PATTERN
from tpujobs.engine.messages import Strict

# An audit-log entry of a queued resource's creation carries its request, startup script and all.
MAX_AUDIT_ENTRY_BYTES = 1024 * 1024
TPU_SERVICE = "tpu.googleapis.com"
_QR_PATH = re.compile(
    r"projects/([^/]+)/locations/([a-z]+-[a-z]+[0-9]+-[a-z])/queuedResources/([a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)$"
)
# The admin-activity audit log of a project, as a sink's LogEntry names it (the log id URL-encoded):
# the one log infra/logging.tf routes here, and one only Google writes.
ACTIVITY_LOG_ID = "cloudaudit.googleapis.com%2Factivity"


def activity_log(project: str) -> str:
    """The `logName` of `project`'s admin-activity audit log."""
    return f"projects/{project}/logs/{ACTIVITY_LOG_ID}"


class AuditTarget(NamedTuple):
    """What a TPU audit-log entry names: the holding, its zone and its project, and the log the
    entry says it is from. A claim until checked (`engine.jobs.audit_entries`)."""

    zone: str
    holding: str
    project: str
    log_name: str


class QrStateReport(Strict):
    """tpujobs-qr-state: an observed state of a holding (a report; the audit-log sink sends entries)."""

    queued_resource: Annotated[str, Field(pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$", max_length=63)]
    zone: Annotated[str, Field(pattern=ZONE_PATTERN)]
    # A `HoldingState` value (WAITING, ACTIVE, LOST, ...); any other word reads as UNKNOWN: nothing is done.
    state: Annotated[str, Field(pattern=r"^[A-Z_]{1,40}$")]
    detail: str = Field(default="", max_length=1024)
    # Hosts whose node is TERMINATED, PREEMPTED or unhealthy.
    unhealthy_hosts: Annotated[int, Field(ge=0, le=100_000)] = 0


def audit_log_target(raw: bytes | None) -> AuditTarget | None:
    """What a TPU audit-log entry that the log sink routed here names, or None for anything else.

    The sink publishes Cloud Logging `LogEntry` JSON: `protoPayload` is the AuditLog, whose
    `resourceName` (or the operation's `response.name`, or the create request's `parent`
    and `queuedResourceId`) names the queued resource. The entry says what was done, not
    what state the resource is in now, so the service reads that from the TPU API.
    """
    if raw is None or len(raw) > MAX_AUDIT_ENTRY_BYTES:
        return None
    try:
        entry = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    payload = entry.get("protoPayload") if isinstance(entry, dict) else None
    if not isinstance(payload, dict) or payload.get("serviceName") != TPU_SERVICE:
        return None
    response = _json_object(payload.get("response"))
    request = _json_object(payload.get("request"))
    candidates = [payload.get("resourceName"), response.get("name")]
    if isinstance(request.get("parent"), str) and isinstance(request.get("queuedResourceId"), str):
        candidates.append(f"{request['parent']}/queuedResources/{request['queuedResourceId']}")
    log_name = entry.get("logName")
    for candidate in candidates:
        match = _QR_PATH.search(candidate) if isinstance(candidate, str) else None
        if match:
            return AuditTarget(match[2], match[3], match[1], log_name if isinstance(log_name, str) else "")
    return None


def _json_object(value: Any) -> dict[str, Any]:
    """A decoded JSON value if it is an object, else an empty one: a field to read further."""
    return value if isinstance(value, dict) else {}

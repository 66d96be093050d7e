"""The wire contract between the agent and the control plane, written once for both sides.

How an attempt's key is derived and written, how a report is encoded and signed, and how
large a report's fields may be; how an output line is labelled and signed as a Cloud Logging
entry. The agent signs with it; `tpujobs.domain.signing` and the
engine's message schemas check with it. Standard library only: it ships in the agent.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from datetime import datetime, timezone
from typing import Any

SIGNATURE_ATTRIBUTE = "tpujobs-signature"  # the Pub/Sub message attribute that carries a signature
# Beside the signature, what names its key, so it is checked before anything is read: the master
# key's version, and the job's creation time (microseconds), which with job id and attempt (in the
# data) derive the key. Neither is signed: another value derives another key, which fails.
KEY_VERSION_ATTRIBUTE = "tpujobs-key-version"
JOB_CREATED_ATTRIBUTE = "tpujobs-job-created"
VERSION_PATTERN = r"[0-9]{1,12}"  # a master key's version: Secret Manager numbers them
KEY_PREFIX = "tpujobs-key-v1:"
KEY_BYTES = 32
SIGNATURE_PREFIX = "v1="

# A report's limits, as the engine's schemas accept them.
MAX_REPORT_BYTES = 16 * 1024  # of one message's data
MAX_DETAIL_CHARS = 1024  # of a report's detail
MAX_LAST_LINES = 20  # of a failed command's output sent with its `exited`...
MAX_LAST_LINES_CHARS = 4096  # ...and at most this much text in all
MAX_RETRY_LINE_CHARS = 256  # of the line a retry_on.output pattern matched


def derive_key(master: str, job_id: str, created_micros: int, attempt: int) -> bytes:
    """The 32-byte key of one attempt of one job: HMAC-SHA256 under the deployment's master key
    of the job id, its creation time (microseconds since the epoch) and the attempt number."""
    info = f"tpujobs attempt key v1\x00{job_id}\x00{int(created_micros)}\x00{int(attempt)}".encode()
    return hmac.new(master.encode("utf-8"), info, hashlib.sha256).digest()


def key_text(key: bytes) -> str:
    """The key as the metadata value the agent reads: `tpujobs-key-v1:` and base64url."""
    return KEY_PREFIX + base64.urlsafe_b64encode(key).decode("ascii").rstrip("=")


def parse_key_text(text: str) -> bytes:
    """The inverse of `key_text`; ValueError for anything else. The message never quotes the
    value: it is a secret."""
    value = text.strip()
    if not value.startswith(KEY_PREFIX):
        raise ValueError(f"the report key does not start with {KEY_PREFIX!r}")
    body = value[len(KEY_PREFIX) :]
    if not re.fullmatch(r"[A-Za-z0-9_-]+", body):
        raise ValueError("the report key is not base64url without padding")
    try:
        key = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("the report key is not base64url without padding") from None
    if len(key) != KEY_BYTES or base64.urlsafe_b64encode(key).decode("ascii").rstrip("=") != body:
        raise ValueError(f"the report key is not {KEY_BYTES} bytes in canonical base64url")
    return key


def encode_payload(payload: dict[str, Any]) -> bytes:
    """The bytes a report is published (and signed) as: compact JSON with sorted keys."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode("utf-8")


def sign(key: bytes, data: bytes) -> str:
    """The `tpujobs-signature` attribute of a message whose data is exactly `data`."""
    return SIGNATURE_PREFIX + hmac.new(key, data, hashlib.sha256).hexdigest()


# --- job output as Cloud Logging entries ------------------------------------------------
# A job's code holds the same VM token as its agent, so it can write entries with any labels,
# but not another attempt's key: the reader (`tpujobs.domain.job_output`) checks the HMAC.

LOG_ID = "tpujobs-job-output"  # the log of a deployment is projects/P/logs/{prefix}tpujobs-job-output
JOB_LABEL = "tpujobs_job"
ATTEMPT_LABEL = "tpujobs_attempt"
SLICE_LABEL = "tpujobs_slice"
WORKER_LABEL = "tpujobs_worker"
SEQ_LABEL = "tpujobs_seq"  # the line's number on its host, from 0
STREAM_LABEL = "tpujobs_stream"  # stdout, stderr or agent
SIGNATURE_LABEL = "tpujobs_signature"
KEY_VERSION_LABEL = "tpujobs_key_version"
JOB_CREATED_LABEL = "tpujobs_job_created"
ENTRY_SIGNATURE_PREFIX = "v1="


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def micros(at: datetime) -> int:
    """An entry's timestamp as signed: microseconds since the epoch. Cloud Logging may write the
    time back in another form (more digits, another zone), never at another instant."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    return (at - _EPOCH) // _MICROSECOND


_MICROSECOND = datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=timezone.utc) - _EPOCH


def entry_digest(job_id: str, attempt: int, worker: str, seq: int, at_micros: int, text: str) -> bytes:
    """The bytes an entry's signature covers; `worker` is `slice-worker` (e.g. "0-3")."""
    fields = ["tpujobs log entry v1", job_id, int(attempt), worker, int(seq), int(at_micros), text]
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sign_entry(key: bytes, job_id: str, attempt: int, worker: str, seq: int, at_micros: int, text: str) -> str:
    """The `tpujobs_signature` label of one entry."""
    digest = entry_digest(job_id, attempt, worker, seq, at_micros, text)
    return ENTRY_SIGNATURE_PREFIX + hmac.new(key, digest, hashlib.sha256).hexdigest()


def log_name(project: str, prefix: str) -> str:
    """The deployment's log of job output."""
    return f"projects/{project}/logs/{prefix}{LOG_ID}"

"""The wire contract between the agent and the control plane, written once for both sides.

How an attempt's key is derived and written, how a report is encoded and signed, and how
large a report's fields may be. The agent signs with it; `tpujobs.domain.signing` and the
engine's message schemas check with it. Standard library only: it ships in the agent.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
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

"""Signed worker reports: each attempt's hosts hold a key that signs what they say.

The key is derived per attempt from the deployment's master key (HMAC of the job id, its creation time and
the attempt number), handed to that attempt's hosts in their metadata, and stored nowhere: it is derived
again whenever a report is checked. A job's code can read its own key, so it can forge reports only for
itself; `scrub` removes a key from any text that is kept. The wire contract is `tpujobs.agent.wire`,
which both sides import. Pure: no clock, no I/O. See docs/security.md.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from datetime import datetime, timedelta

from tpujobs.agent.wire import (
    KEY_ATTRIBUTE,
    KEY_PREFIX,
    SIGNATURE_ATTRIBUTE,
    SIGNATURE_PREFIX,
    derive_key,
    key_text,
    sign,
)
from tpujobs.domain.job import Job

__all__ = [  # the wire's names among them, for the engine
    "CLOCK_SKEW",
    "KEY_ATTRIBUTE",
    "KEY_PREFIX",
    "MIN_MASTER_KEY_CHARS",
    "SIGNATURE_ATTRIBUTE",
    "SIGNATURE_PREFIX",
    "MissingMasterKey",
    "attempt_key",
    "key_text",
    "report_digest",
    "report_problem",
    "scrub",
    "scrub_bytes",
    "sign",
    "signature_problem",
]
MIN_MASTER_KEY_CHARS = 32
# A host's clock may run a little ahead or behind ours (NTP keeps TPU VMs close).
CLOCK_SKEW = timedelta(seconds=60)
# The key and whatever key-like text follows it: a key written after a doubled prefix
# (`tpujobs-key-v1:tpujobs-key-v1:...`) is cut out whole too.
_KEY_TEXT = re.compile(re.escape(KEY_PREFIX) + r"[A-Za-z0-9_:-]+")
_KEY_BYTES = re.compile(re.escape(KEY_PREFIX.encode()) + rb"[A-Za-z0-9_:-]+")
_SIGNATURE = re.compile(re.escape(SIGNATURE_PREFIX) + r"[0-9a-f]{64}")


class MissingMasterKey(RuntimeError):
    """The deployment has no usable report-signing key (TPUJOBS_REPORT_KEY)."""


def attempt_key(master: str, job_id: str, created_at: datetime, attempt: int) -> bytes:
    """The 32-byte key of one attempt of one job, derived from the master key."""
    if len(master) < MIN_MASTER_KEY_CHARS:
        raise MissingMasterKey(
            f"TPUJOBS_REPORT_KEY must hold at least {MIN_MASTER_KEY_CHARS} characters of a random secret"
        )
    created = int(created_at.timestamp() * 1_000_000)  # microseconds: what Firestore keeps
    return derive_key(master, job_id, created, attempt)


def signature_problem(key: bytes, data: bytes, signature: str | None) -> str | None:
    """Why `signature` does not vouch for `data` under `key`, or None when it does."""
    if not signature:
        return f"the report is unsigned (no {SIGNATURE_ATTRIBUTE} attribute)"
    if not _SIGNATURE.fullmatch(signature):
        return f"the {SIGNATURE_ATTRIBUTE} attribute is not a v1 HMAC-SHA256 signature"
    if not hmac.compare_digest(sign(key, data), signature):
        return "the signature does not match the key of the attempt the report names"
    return None


def report_digest(signature: str) -> str:
    """A short stable id of one signed report, to remember it and refuse a replay."""
    return hashlib.sha256(signature.encode("ascii", "replace")).hexdigest()[:40]


def scrub(text: str) -> str:
    """`text` with any attempt key cut out: for payloads kept in rejections and dead letters."""
    return _KEY_TEXT.sub(KEY_PREFIX + "<redacted>", text)


def scrub_bytes(data: bytes) -> bytes:
    """`scrub` for message data kept whole (a dead letter kept for replay)."""
    return _KEY_BYTES.sub(KEY_PREFIX.encode() + b"<redacted>", data)


def report_problem(
    job: Job,
    *,
    attempt: int,
    slice_id: int,
    worker_id: int,
    at: datetime | None,
    data: bytes,
    signature: str | None,
    master: str,
    now: datetime,
) -> str | None:
    """Why a worker report or preemption notice must not be believed, or None.

    It must be signed with the key of the attempt it names, come from a worker host that
    the job's topology has, and carry a time between the attempt's request and now
    (give or take CLOCK_SKEW). A report of an older attempt is believed (it arrived
    late); `decide` then ignores it as stale.
    """
    if attempt > job.attempt:
        return f"it names attempt {attempt}, but the job is at attempt {job.attempt}"
    if job.created_at is None:
        return "the job has no creation time to derive its attempt keys from"
    problem = signature_problem(attempt_key(master, job.job_id, job.created_at, attempt), data, signature)
    if problem:
        return problem
    spec = job.spec
    if slice_id >= spec.slices:
        return f"slice {slice_id} is out of range: the job has {spec.slices} slice(s)"
    if worker_id >= spec.hosts_per_slice:
        return f"worker {worker_id} is out of range: each slice has {spec.hosts_per_slice} host(s)"
    if at is None:
        return "the report carries no time ('at')"
    began = next((u.waiting_since for u in job.usage if u.attempt == attempt), None)
    if began is not None and at < began - CLOCK_SKEW:
        return f"its time {at.isoformat()} is before attempt {attempt} began ({began.isoformat()})"
    if at > now + CLOCK_SKEW:
        return f"its time {at.isoformat()} is in the future (now {now.isoformat()})"
    return None

"""Signed worker reports: each attempt's hosts hold a key that signs what they say.

The key is derived per attempt from a version of the deployment's master key (HMAC of the job id,
its creation time and the attempt number), handed to that attempt's hosts once they prove which VM
they are (`tpujobs.engine.attempt_keys`), and stored nowhere. A report names its key (version and
creation time beside the signature), so its signature is checked before anything is read. The wire
contract is `tpujobs.agent.wire`. Pure: no clock, no I/O. See docs/security.md.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from tpujobs.agent.wire import (
    JOB_CREATED_ATTRIBUTE,
    KEY_PREFIX,
    KEY_VERSION_ATTRIBUTE,
    SIGNATURE_ATTRIBUTE,
    SIGNATURE_PREFIX,
    VERSION_PATTERN,
    derive_key,
    key_text,
    sign,
)
from tpujobs.domain.job import Job

__all__ = [  # the wire's names among them, for the engine
    "CLOCK_SKEW",
    "JOB_CREATED_ATTRIBUTE",
    "KEY_PREFIX",
    "KEY_VERSION_ATTRIBUTE",
    "MIN_MASTER_KEY_CHARS",
    "SIGNATURE_ATTRIBUTE",
    "SIGNATURE_PREFIX",
    "MasterKeys",
    "MissingMasterKey",
    "attempt_key",
    "created_micros",
    "forgery",
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
_CREATED = re.compile(r"[0-9]{1,20}")


class MissingMasterKey(RuntimeError):
    """The deployment has no usable report-signing key (TPUJOBS_REPORT_KEY)."""


def created_micros(created_at: datetime) -> int:
    """A job's creation time as keys use it: microseconds since the epoch, what Firestore keeps."""
    return int(created_at.timestamp() * 1_000_000)


@dataclass(frozen=True)
class MasterKeys:
    """The deployment's master keys by version: the current one derives every key handed out; the
    previous one still verifies, so rotating the master key breaks no attempt that is running."""

    current_version: str
    secrets: Mapping[str, str] = field(repr=False)

    @classmethod
    def of(cls, current: str, version: str = "1", previous: str = "", previous_version: str = "") -> MasterKeys:
        """From the settings: the current secret and its version, and the previous pair if any."""
        secrets = {version: current}
        if previous and previous_version and previous_version != version:
            secrets[previous_version] = previous
        return cls(version, secrets)

    def attempt_key(self, job_id: str, created: int, attempt: int, version: str | None = None) -> bytes:
        """The 32-byte key of one attempt of one job under `version` (default: the current)."""
        return _derived(self.secrets.get(version or self.current_version, ""), job_id, created, attempt)


def attempt_key(master: str, job_id: str, created_at: datetime, attempt: int) -> bytes:
    """The 32-byte key of one attempt of one job, derived from one master key."""
    return _derived(master, job_id, created_micros(created_at), attempt)


def _derived(master: str, job_id: str, created: int, attempt: int) -> bytes:
    if len(master) < MIN_MASTER_KEY_CHARS:
        raise MissingMasterKey(
            f"TPUJOBS_REPORT_KEY must hold at least {MIN_MASTER_KEY_CHARS} characters of a random secret"
        )
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


# Why a message does not prove itself signed: one fixed sentence per kind, never quoting the
# message, so a flood of forgeries is counted under a handful of reasons.
UNSIGNED = f"unsigned (no {SIGNATURE_ATTRIBUTE} attribute)"
MALFORMED = "signed in a malformed way (signature, key version or job creation time)"
UNKNOWN_VERSION = "signed under a master key version that is neither the current nor the previous"
MISMATCH = "not signed by the key it names"


def forgery(keys: MasterKeys, job_id: str, attempt: int, data: bytes, attributes: Mapping[str, str]) -> str | None:
    """Why the message is not signed by the key of the attempt it names, or None when it is.

    Checked from the message alone (its data and attributes) before anything is read, so a forged
    message costs no read and no write (`engine.jobs.signed_reports` counts them)."""
    signature = attributes.get(SIGNATURE_ATTRIBUTE)
    if not signature:
        return UNSIGNED
    version = attributes.get(KEY_VERSION_ATTRIBUTE, "")
    created = attributes.get(JOB_CREATED_ATTRIBUTE, "")
    if not (_SIGNATURE.fullmatch(signature) and re.fullmatch(VERSION_PATTERN, version) and _CREATED.fullmatch(created)):
        return MALFORMED
    if version not in keys.secrets:
        return UNKNOWN_VERSION
    if not hmac.compare_digest(sign(keys.attempt_key(job_id, int(created), attempt, version), data), signature):
        return MISMATCH
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
    created: str,
    now: datetime,
) -> str | None:
    """Why a report or notice, signed for the attempt it names (`forgery` found nothing), must not
    be believed, or None.

    It must name this job (its creation time: a job id used again is another job), come from a
    worker host that the job's topology has, and carry a time between the attempt's request and
    now (give or take CLOCK_SKEW). A report of an older attempt is believed (it arrived late);
    `decide` then ignores it as stale.
    """
    if job.created_at is None or str(created_micros(job.created_at)) != created:
        return "it was signed for an earlier job of the same job_id"
    if attempt > job.attempt:
        return f"it names attempt {attempt}, but the job is at attempt {job.attempt}"
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

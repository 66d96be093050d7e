"""What a notification posts, how it is signed, and which addresses it may go to.

Pure so the receiver's side can be written from it: the body is JSON that Slack and Google Chat
accept (`text`), with the structured fields beside it; the signature is HMAC-SHA256 over
`{timestamp}.{body}` (as Stripe and Slack sign theirs), so a replayed body with a new timestamp
fails. A job's owner picks the URL and the function runs inside the deployment, so only public
addresses are allowed: never loopback (save on the local stack), private, link-local (the
metadata server), multicast or reserved ones.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from dataclasses import dataclass

SIGNATURE_HEADER = "X-Tpujobs-Signature"
TIMESTAMP_HEADER = "X-Tpujobs-Timestamp"
DELIVERY_HEADER = "X-Tpujobs-Delivery"  # the event's id: the same for every retry of one notification
IDEMPOTENCY_HEADER = "Idempotency-Key"
SIGNING_KEY_LABEL = b"tpujobs notify signing key"  # the local stack derives its key with it

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Notice:
    """One state change of a job, as a notification tells it."""

    job_id: str
    state: str
    reason: str
    attempt: int
    seq: int
    link: str = ""  # the job's dashboard page, when the deployment has one

    @property
    def event_id(self) -> str:
        """The event's id, the same for every delivery of it: `{job_id}/{seq}`."""
        return f"{self.job_id}/{self.seq}"

    def text(self) -> str:
        """A sentence a person reads in Slack or Chat."""
        sentence = f"tpujobs job {self.job_id} is {self.state} (attempt {self.attempt})"
        if self.reason:
            sentence += f": {self.reason}"
        return f"{sentence} {self.link}" if self.link else sentence

    def body(self) -> bytes:
        """The JSON posted: `text` for chat, the structured fields for programs."""
        fields = {
            "text": self.text(),
            "job_id": self.job_id,
            "state": self.state,
            "reason": self.reason,
            "attempt": self.attempt,
            "link": self.link,
        }
        return json.dumps(fields, separators=(",", ":")).encode("utf-8")


def signature(key: bytes, timestamp: str, body: bytes) -> str:
    """`sha256=<hex>`: HMAC-SHA256 with `key` over `{timestamp}.{body}`."""
    return "sha256=" + hmac.new(key, timestamp.encode("ascii") + b"." + body, hashlib.sha256).hexdigest()


def verify(key: bytes, timestamp: str, body: bytes, header: str) -> bool:
    """Whether `header` signs `body` at `timestamp` with `key` (what a receiver checks)."""
    return hmac.compare_digest(signature(key, timestamp, body), header)


def headers(notice: Notice, key: bytes, timestamp: str) -> dict[str, str]:
    """The headers of one post of `notice` at `timestamp` (seconds since the epoch, as text)."""
    return {
        "Content-Type": "application/json",
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: signature(key, timestamp, notice.body()),
        DELIVERY_HEADER: notice.event_id,
        IDEMPOTENCY_HEADER: notice.event_id,
    }


def derived_signing_key(master: str) -> bytes:
    """The local stack's signing key, derived from its report master key (production mounts its own)."""
    return hmac.new(master.encode("utf-8"), SIGNING_KEY_LABEL, hashlib.sha256).digest()


def address_refusal(address: IpAddress, *, allow_loopback: bool = False) -> str | None:
    """Why a webhook may not be posted to `address`, or None when it is a public address.

    `allow_loopback` is the local stack's: its receivers listen on 127.0.0.1.
    """
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return None if allow_loopback else "a loopback address"
    if address.is_link_local:
        return "a link-local address (the metadata server's range)"
    if address.is_multicast:
        return "a multicast address"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_reserved:
        return "a reserved address"
    if address.is_private or not address.is_global:
        return "a private or non-public address"
    return None

"""What a notification posts, how it is signed, and which addresses it may go to.

Pure so the receiver's side can be written from it: the body is JSON that Slack and Google Chat
accept (`text`), with the structured fields beside it; the signature is HMAC-SHA256 over
`{timestamp}.{body}` (as Stripe and Slack sign theirs), so a replayed body with a new timestamp
fails. Each team signs with a key of its own (`NotifyKeys.team_key`: HMAC of the team's name under
a version of the deployment's notify master key), so a receiver of one team holds nothing that
signs another's. A job's owner picks the URL and the function runs inside the deployment, so only
public addresses are allowed: never loopback (save on the local stack), private, link-local (the
metadata server), multicast or reserved ones.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

SIGNATURE_HEADER = "X-Tpujobs-Signature"
TIMESTAMP_HEADER = "X-Tpujobs-Timestamp"
DELIVERY_HEADER = "X-Tpujobs-Delivery"  # the event's id: the same for every retry of one notification
IDEMPOTENCY_HEADER = "Idempotency-Key"
KEY_ID_HEADER = "X-Tpujobs-Key-Id"  # the team whose key signed: `account:EMAIL` or `owner:EMAIL`
KEY_VERSION_HEADER = "X-Tpujobs-Key-Version"  # the master key's version the team key was derived under
# While the master key rotates, the same bytes signed with the team's key under the previous version.
PREVIOUS_SIGNATURE_HEADER = "X-Tpujobs-Signature-Previous"
PREVIOUS_KEY_VERSION_HEADER = "X-Tpujobs-Key-Version-Previous"
SIGNING_KEY_LABEL = b"tpujobs notify signing key"  # the local stack derives its master key with it
TEAM_KEY_LABEL = b"tpujobs notify team key v1\x00"  # a team's key: HMAC(master, label + team)
MIN_MASTER_KEY_BYTES = 32

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
    # Whether the event moved the job to another state: a label change (the same state before
    # and after) is in the timeline, but no state target hears of it.
    changes_state: bool = True

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


def headers(notice: Notice, team: str, keys: Sequence[tuple[str, bytes]], timestamp: str) -> dict[str, str]:
    """The headers of one post of `notice` at `timestamp` (seconds since the epoch, as text), signed
    with `team`'s key under each version of `keys` (`NotifyKeys.signing`: the current one first,
    the previous one beside it while a rotation lasts)."""
    body = notice.body()
    (version, key), *previous = keys
    signed = {
        "Content-Type": "application/json",
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: signature(key, timestamp, body),
        KEY_ID_HEADER: team,
        KEY_VERSION_HEADER: version,
        DELIVERY_HEADER: notice.event_id,
        IDEMPOTENCY_HEADER: notice.event_id,
    }
    for old_version, old_key in previous[:1]:
        signed[PREVIOUS_SIGNATURE_HEADER] = signature(old_key, timestamp, body)
        signed[PREVIOUS_KEY_VERSION_HEADER] = old_version
    return signed


def signing_team(service_account: str | None, owner: str, *, owner_trusted: bool) -> str:
    """Whose key signs a job's notifications: the team of the account it runs as, else its owner's.

    An owner nobody verified (a topic's claim, unless config/policies trusts them) is `claimed:`,
    a name no owner's key is derived from: a claim never earns a signature under the real owner's key.
    """
    if service_account:
        return f"account:{service_account}"
    return f"owner:{owner}" if owner_trusted else f"claimed:{owner}"


@dataclass(frozen=True)
class NotifyKeys:
    """The notify master key by version: the current one signs; the previous one signs beside it
    while a rotation lasts, so receivers can move to the new team key at their pace."""

    current_version: str
    secrets: Mapping[str, bytes] = field(repr=False)

    @classmethod
    def of(cls, current: bytes, version: str = "1", previous: bytes = b"", previous_version: str = "") -> NotifyKeys:
        """From the settings: the current master and its version, and the previous pair if any.
        ValueError when the current master is shorter than MIN_MASTER_KEY_BYTES."""
        if len(current) < MIN_MASTER_KEY_BYTES:
            raise ValueError(
                f"the notify signing key must hold at least {MIN_MASTER_KEY_BYTES} bytes of a random secret"
            )
        secrets = {version: current}
        if previous and previous_version and previous_version != version:
            secrets[previous_version] = previous
        return cls(version, secrets)

    def team_key(self, team: str, version: str | None = None) -> bytes:
        """`team`'s key under `version` (default: the current): 64 hex characters, used as text."""
        master = self.secrets[version or self.current_version]
        return hmac.new(master, TEAM_KEY_LABEL + team.encode("utf-8"), hashlib.sha256).hexdigest().encode("ascii")

    def signing(self, team: str) -> list[tuple[str, bytes]]:
        """(version, `team`'s key) for each version that signs: the current first."""
        versions = [self.current_version, *(v for v in self.secrets if v != self.current_version)]
        return [(version, self.team_key(team, version)) for version in versions]


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

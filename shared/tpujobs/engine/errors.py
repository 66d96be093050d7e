"""The two kinds of failure that decide what a handler does with its message.

Adapters translate library errors into these at the edge, chaining the cause, so the
service never sees a google.api_core exception.
"""

from __future__ import annotations


class TransientError(RuntimeError):
    """Worth retrying: the handler raises, the function answers 500, Pub/Sub redelivers."""


class PermanentError(RuntimeError):
    """Retrying cannot help: the handler records why and acknowledges the message."""


class QuotaExhausted(TransientError):
    """A 429 (RESOURCE_EXHAUSTED) that means a quota ran out, not a rate limit: retrying soon
    will not help, so the job waits with this reason shown until capacity frees up.

    `region` names the region when Google says the quota that ran out is a region's: its other
    zones have no room either, so zone failover skips them ("" when zonal or unknown).
    """

    def __init__(self, message: str = "", region: str = "") -> None:
        super().__init__(message)
        self.region = region


class OutputUnreadable(PermanentError):
    """Cloud Logging refused to list the deployment's job output (NOT_FOUND, PERMISSION_DENIED):
    its log view is missing, or this service may not read it. The deployment's to mend."""


class NotOurs(PermanentError):
    """A resource named like a tpujobs holding that does not carry tpujobs' ownership marker
    (`domain.ownership`): someone else's. It is never adopted, written or deleted; retrying
    cannot make it ours, so the refusal is recorded, never retried."""

"""The one table that turns a Google client error into TransientError or PermanentError.

Every adapter wraps its calls in `translated(service, doing)`, and the TPU client retries with
`transient_retry`, whose predicate is the same table. It reads the gRPC status where the error has one,
else the `status` of Google's JSON error body, else the HTTP status, so both transports translate alike.
A bare REST 409 is permanent (REST renders ALREADY_EXISTS and ABORTED alike): adapters that expect
ALREADY_EXISTS catch it themselves. Anything not Google's passes through unchanged.
See docs/architecture.md#errors-and-retries.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from google.api_core import exceptions as api_exceptions
from google.api_core.retry import Retry
from google.auth import exceptions as auth_exceptions
from google.rpc import code_pb2

from tpujobs.domain.quotas import REGION, ZONE, region_of
from tpujobs.engine.errors import PermanentError, QuotaExhausted, TransientError

# google.rpc.Code names whose failure may not happen again (google/rpc/code.proto, AIP-194).
TRANSIENT_CODES = frozenset(
    {
        "CANCELLED",
        "UNKNOWN",
        "DEADLINE_EXCEEDED",
        "RESOURCE_EXHAUSTED",
        "ABORTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
    }
)
NOT_IMPLEMENTED = 501  # the one 5xx that retrying cannot fix
TRANSIENT_HTTP = frozenset({408, 429, 499})  # timeout, rate or quota, client closed (CANCELLED)

# ErrorInfo reasons (google/api/error_reason.proto), and the older JSON APIs' `errors[].reason`.
RATE_LIMIT_REASONS = frozenset({"RATE_LIMIT_EXCEEDED", "rateLimitExceeded", "userRateLimitExceeded"})
QUOTA_REASONS = frozenset({"RESOURCE_QUOTA_EXCEEDED", "quotaExceeded", "dailyLimitExceeded"})
_NAMES_A_QUOTA = re.compile(r"quota", re.IGNORECASE)
# Google names a regional TPU quota "...PerRegion..." and says where: "Quota limit
# 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded. Limit: 0 in region us-east5."
# (marin-community/marin#1612), or both scopes at once: "Limit: 0,0 in region us-central1,zone us-central1-a".
_REGIONAL_QUOTA = re.compile(r"PerRegion", re.IGNORECASE)
_IN_REGION = re.compile(r"\bin region '?([a-z]+-[a-z]+[0-9]+)\b")
_NAMES_A_RATE = re.compile(r"per[\s_-]*(second|minute|100[\s_-]*seconds)|rate[\s_-]*limit", re.IGNORECASE)

# The TPU client's retry (the client has none of its own): short, for blips; a longer outage
# is Pub/Sub's to retry, by redelivering the message.
RETRY_INITIAL_S = 0.25
RETRY_MAXIMUM_S = 4.0
RETRY_MULTIPLIER = 2.0
RETRY_DEADLINE_S = 10.0


@contextmanager
def translated(service: str, doing: str) -> Iterator[None]:
    """Google's errors raised in the block become TransientError, QuotaExhausted or
    PermanentError, saying which service failed at what, with the cause chained."""
    try:
        yield
    except Exception as error:
        translation = translate(error, service, doing)
        if translation is None:
            raise
        raise translation from error


def translate(error: BaseException, service: str, doing: str) -> TransientError | PermanentError | None:
    """The tpujobs error for `error`, or None when it is not a Google or connection error."""
    if isinstance(error, api_exceptions.RetryError):
        cause = error.cause
        if isinstance(cause, api_exceptions.GoogleAPICallError) and _quota_ran_out(cause):
            return QuotaExhausted(f"{service} failed to {doing}: {quota_reason(cause)}", quota_region(cause))
        return TransientError(f"{service} failed to {doing}: {error}")
    call = _as_call_error(error)
    if call is not None:
        if not is_transient_status(call):
            return PermanentError(f"{service} refused to {doing}: {call}")
        if _quota_ran_out(call):
            return QuotaExhausted(f"{service} failed to {doing}: {quota_reason(call)}", quota_region(call))
        return TransientError(f"{service} failed to {doing}: {call}")
    if _unreachable(error):
        return TransientError(f"{service} unreachable while trying to {doing}: {error}")
    if isinstance(error, api_exceptions.GoogleAPIError | auth_exceptions.GoogleAuthError):
        return PermanentError(f"{service} refused to {doing}: {error}")
    return None


def is_retryable(error: BaseException) -> bool:
    """Worth calling again now: transient, and not a quota that ran out (the Retry predicate)."""
    translation = translate(error, "", "")
    return isinstance(translation, TransientError) and not isinstance(translation, QuotaExhausted)


def transient_retry(deadline_s: float = RETRY_DEADLINE_S) -> Retry:
    """Exponential backoff with jitter on `is_retryable` errors, for at most `deadline_s`."""
    return Retry(
        predicate=is_retryable,
        initial=RETRY_INITIAL_S,
        maximum=RETRY_MAXIMUM_S,
        multiplier=RETRY_MULTIPLIER,
        timeout=deadline_s,
    )


# -- the status ---------------------------------------------------------------------------


def status_name(error: api_exceptions.GoogleAPICallError) -> str | None:
    """The google.rpc.Code name the call failed with, if the exception or its body says."""
    name = getattr(error.grpc_status_code, "name", None)
    if name:
        return str(name)
    response = error.response
    try:
        status = response.json()["error"]["status"]
    except Exception:  # not a requests.Response, not JSON, or no status: the HTTP code decides
        return None
    return status if isinstance(status, str) and status in code_pb2.Code.DESCRIPTOR.values_by_name else None


def is_transient_status(error: api_exceptions.GoogleAPICallError) -> bool:
    """The table: by gRPC status where known, else by HTTP status; neither means permanent."""
    name = status_name(error)
    if name is not None:
        return name in TRANSIENT_CODES
    code = error.code
    if not isinstance(code, int):
        return False
    return code in TRANSIENT_HTTP or (500 <= code < 600 and code != NOT_IMPLEMENTED)


def _as_call_error(error: BaseException) -> api_exceptions.GoogleAPICallError | None:
    if isinstance(error, api_exceptions.GoogleAPICallError):
        return error
    grpc = sys.modules.get("grpc")  # loaded by any gRPC client; if not, this is no gRPC error
    if grpc is not None and isinstance(error, grpc.RpcError):
        translated: api_exceptions.GoogleAPICallError = api_exceptions.from_grpc_error(error)
        return translated
    return None


def _unreachable(error: BaseException) -> bool:
    """The API could not be reached or did not answer. A requests error that is also a
    ValueError (an invalid URL or header) is our mistake, not the network's."""
    if isinstance(error, auth_exceptions.TransportError):
        return True
    if isinstance(error, auth_exceptions.GoogleAuthError):
        return bool(error.retryable)
    if isinstance(error, ValueError):
        return False
    if isinstance(error, OSError | futures.TimeoutError):  # a publish future's wait, too
        return True
    urllib3_errors = sys.modules.get("urllib3.exceptions")
    return urllib3_errors is not None and isinstance(error, urllib3_errors.HTTPError)


# -- quota ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Details:
    """What an error's details say, read alike from gRPC (protobuf) and REST (JSON)."""

    reasons: frozenset[str]
    metadata: Mapping[str, str]  # ErrorInfo.metadata
    violations: tuple[Mapping[str, Any], ...]  # QuotaFailure.violations, camelCase as in JSON


def _details(error: api_exceptions.GoogleAPICallError) -> _Details:
    reasons: set[str] = set()
    metadata: dict[str, str] = {}
    violations: list[Mapping[str, Any]] = []
    for detail in error.details:
        kind, body = _as_json(detail)
        if kind == "google.rpc.ErrorInfo":
            reasons.add(str(body.get("reason") or ""))
            metadata.update(body.get("metadata") or {})
        elif kind == "google.rpc.QuotaFailure":
            violations.extend(body.get("violations") or ())
    if error.reason:
        reasons.add(str(error.reason))
        metadata.update(error.metadata or {})
    reasons.update(str(e["reason"]) for e in error.errors if isinstance(e, Mapping) and e.get("reason"))
    reasons.discard("")
    return _Details(frozenset(reasons), metadata, tuple(violations))


def _as_json(detail: Any) -> tuple[str, Mapping[str, Any]]:
    """(type name, fields) of one detail: a JSON dict over REST, a protobuf message over gRPC."""
    if isinstance(detail, Mapping):
        return str(detail.get("@type", "")).rsplit("/", 1)[-1], detail
    descriptor = getattr(detail, "DESCRIPTOR", None)
    if descriptor is None:
        return "", {}
    from google.protobuf.json_format import MessageToDict

    return descriptor.full_name, MessageToDict(detail)


def _quota_ran_out(error: api_exceptions.GoogleAPICallError) -> bool:
    """A RESOURCE_EXHAUSTED (429) that says a quota ran out, not that calls came too fast."""
    if status_name(error) != "RESOURCE_EXHAUSTED" and error.code != 429:
        return False
    details = _details(error)
    if details.reasons & RATE_LIMIT_REASONS:
        return False
    if details.reasons & QUOTA_REASONS:
        return True
    if details.violations:
        return not any(_NAMES_A_RATE.search(_violation_text(v)) for v in details.violations)
    if details.reasons:
        return False  # the details name another cause
    return bool(_NAMES_A_QUOTA.search(error.message or "")) and not _NAMES_A_RATE.search(error.message or "")


def _violation_text(violation: Mapping[str, Any]) -> str:
    return " ".join(str(violation.get(key, "")) for key in ("quotaId", "quotaMetric", "description"))


def quota_reason(error: api_exceptions.GoogleAPICallError) -> str:
    """A sentence naming the quota that ran out, its limit and where, when the details say."""
    details = _details(error)
    named = [
        _quota_named(v.get("quotaId") or v.get("quotaMetric") or v.get("subject"), v.get("quotaValue"),
                     v.get("quotaDimensions") or {})
        for v in details.violations
    ]  # fmt: skip
    if not named and details.metadata:
        meta = details.metadata
        location = {"location": meta["quota_location"]} if meta.get("quota_location") else {}
        named.append(
            _quota_named(
                meta.get("quota_limit") or meta.get("quota_metric"),
                meta.get("quota_limit_value"),
                location,
            )
        )
    which = "; ".join(text for text in named if text)
    return f"quota exhausted ({which}): {error.message}" if which else f"quota exhausted: {error.message}"


def _quota_named(name: Any, limit: Any, where: Mapping[str, Any]) -> str:
    """'TPUV4sPodPerProjectPerZoneForTPUAPI (limit 32, zone us-central2-b)', or what is known of it."""
    facts = ([f"limit {limit}"] if limit else []) + [f"{key} {value}" for key, value in sorted(where.items())]
    if not name:
        return ", ".join(facts)
    return f"{name} ({', '.join(facts)})" if facts else str(name)


def quota_region(error: api_exceptions.GoogleAPICallError) -> str:
    """The region whose quota ran out, when Google says the limit is a region's; "" when it is
    a zone's or nobody says. A regional quota anywhere in the error wins: with it full, no
    other zone of the region has room, whatever the zone's own quota says.

    Signs, from the details first: a QuotaFailure violation whose `quotaDimensions` name a
    region and no zone, or whose quota id says "PerRegion"; ErrorInfo's `quota_location` that is
    a region, or its `quota_limit` saying "PerRegion"; else the message ("... PerRegion ...
    in region us-east5").
    """
    details = _details(error)
    message = error.message or ""
    named = _IN_REGION.search(message)
    in_message = named.group(1) if named else ""
    for violation in details.violations:
        where = violation.get("quotaDimensions") or {}
        if where.get("region") and not where.get("zone"):
            return str(where["region"])
        if _REGIONAL_QUOTA.search(str(violation.get("quotaId") or violation.get("quotaMetric") or "")):
            return _region_named(where.get("region"), where.get("zone"), in_message)
    meta = details.metadata
    location = str(meta.get("quota_location") or "")
    if REGION.fullmatch(location):
        return location
    if _REGIONAL_QUOTA.search(str(meta.get("quota_limit") or "")):
        return _region_named(None, location, in_message)
    if _REGIONAL_QUOTA.search(message) or (in_message and not details.violations and not location):
        return in_message
    return ""


def _region_named(region: Any, zone: Any, in_message: str) -> str:
    """The region a regional quota's error names: its own dimension, its zone's, or the message's."""
    if region and REGION.fullmatch(str(region)):
        return str(region)
    if zone and ZONE.fullmatch(str(zone)):
        return region_of(str(zone))
    return in_message

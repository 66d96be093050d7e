"""The one table of Google errors (tpujobs.adapters.google_errors), on real api_core exceptions.

Errors are built the way the clients build them: over gRPC by `from_grpc_error` on an RPC
error carrying a google.rpc.Status in its trailing metadata (as grpcio delivers it), and by
`from_grpc_status`; over REST by `from_http_response` on a requests.Response holding Google's
JSON error body (AIP-193), and by `from_http_status`.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
import requests
import urllib3.exceptions
from google.api_core import exceptions
from google.auth import exceptions as auth_exceptions
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from tpujobs.adapters.google_errors import (
    is_retryable,
    quota_region,
    transient_retry,
    translate,
    translated,
)
from tpujobs.engine.errors import PermanentError, QuotaExhausted, TransientError

TPU = "tpu.googleapis.com"
ZONE = "us-central2-b"
QUOTA_MESSAGE = f"Quota 'TPUV4sPodPerProjectPerZoneForTPUAPI' exhausted. Limit 32 in zone {ZONE}."
RATE_MESSAGE = (
    "Quota exceeded for quota metric 'Default requests' and limit 'Default requests per minute "
    f"per project' of service '{TPU}' for consumer 'project_number:123'."
)

# google.rpc.Code -> what the table makes of it (transient ones may not happen again).
GRPC_TABLE = {
    grpc.StatusCode.CANCELLED: TransientError,
    grpc.StatusCode.UNKNOWN: TransientError,
    grpc.StatusCode.INVALID_ARGUMENT: PermanentError,
    grpc.StatusCode.DEADLINE_EXCEEDED: TransientError,
    grpc.StatusCode.NOT_FOUND: PermanentError,
    grpc.StatusCode.ALREADY_EXISTS: PermanentError,
    grpc.StatusCode.PERMISSION_DENIED: PermanentError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: TransientError,
    grpc.StatusCode.FAILED_PRECONDITION: PermanentError,
    grpc.StatusCode.ABORTED: TransientError,
    grpc.StatusCode.OUT_OF_RANGE: PermanentError,
    grpc.StatusCode.UNIMPLEMENTED: PermanentError,
    grpc.StatusCode.INTERNAL: TransientError,
    grpc.StatusCode.UNAVAILABLE: TransientError,
    grpc.StatusCode.DATA_LOSS: TransientError,
    grpc.StatusCode.UNAUTHENTICATED: PermanentError,
}

# HTTP status with no `status` in the body -> what the table makes of it.
HTTP_TABLE = {
    400: PermanentError,
    401: PermanentError,
    403: PermanentError,
    404: PermanentError,
    405: PermanentError,
    408: TransientError,
    409: PermanentError,  # ALREADY_EXISTS or ABORTED: the adapter that cares looks itself
    412: PermanentError,
    429: TransientError,
    499: TransientError,
    500: TransientError,
    501: PermanentError,
    502: TransientError,
    503: TransientError,
    504: TransientError,
    507: TransientError,
}


class RpcFailure(grpc.RpcError):
    """An RPC error as grpcio raises it: code, details, and the rich status in the trailers."""

    def __init__(self, code: grpc.StatusCode, message: str, details: tuple[Any, ...] = ()) -> None:
        super().__init__(message)
        self._code = code
        self._message = message
        status = status_pb2.Status(code=code.value[0], message=message)
        for detail in details:
            packed = any_pb2.Any()
            packed.Pack(detail)
            status.details.append(packed)
        self._trailers = (("grpc-status-details-bin", status.SerializeToString()),)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        return self._trailers


def grpc_error(code: grpc.StatusCode, message: str = "boom", *details: Any) -> exceptions.GoogleAPICallError:
    return exceptions.from_grpc_error(RpcFailure(code, message, details))


def rest_error(
    http_status: int,
    message: str = "boom",
    status: str | None = None,
    details: list[dict] | None = None,
    errors: list[dict] | None = None,
) -> exceptions.GoogleAPICallError:
    """What the REST transport raises for Google's JSON error body."""
    body: dict[str, Any] = {"code": http_status, "message": message}
    if status:
        body["status"] = status
    if details:
        body["details"] = details
    if errors:
        body["errors"] = errors
    response = requests.Response()
    response.status_code = http_status
    response._content = json.dumps({"error": body}).encode()
    response.headers["Content-Type"] = "application/json"
    response.request = requests.Request(
        "POST", f"https://{TPU}/v2/projects/p/locations/{ZONE}/queuedResources"
    ).prepare()
    return exceptions.from_http_response(response)


def quota_info(reason: str = "RESOURCE_QUOTA_EXCEEDED") -> error_details_pb2.ErrorInfo:
    return error_details_pb2.ErrorInfo(
        reason=reason,
        domain="googleapis.com",
        metadata={
            "service": TPU,
            "quota_metric": f"{TPU}/v4_pod_chips",
            "quota_limit": "TPUV4sPodPerProjectPerZoneForTPUAPI",
            "quota_limit_value": "32",
            "quota_location": ZONE,
        },
    )


def quota_failure() -> error_details_pb2.QuotaFailure:
    return error_details_pb2.QuotaFailure(
        violations=[
            error_details_pb2.QuotaFailure.Violation(
                subject="projects/123",
                description=QUOTA_MESSAGE,
                quota_id="TPUV4sPodPerProjectPerZoneForTPUAPI",
                quota_metric=f"{TPU}/v4_pod_chips",
                quota_dimensions={"zone": ZONE},
                quota_value=32,
            )
        ]
    )


def quota_failure_json() -> dict[str, Any]:
    return {
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [
            {
                "subject": "projects/123",
                "description": QUOTA_MESSAGE,
                "quotaId": "TPUV4sPodPerProjectPerZoneForTPUAPI",
                "quotaMetric": f"{TPU}/v4_pod_chips",
                "quotaDimensions": {"zone": ZONE},
                "quotaValue": "32",
            }
        ],
    }


def info_json(reason: str) -> dict[str, Any]:
    return {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": reason,
        "domain": "googleapis.com",
        "metadata": {"service": TPU, "quota_limit": "DefaultRequestsPerMinutePerProject"},
    }


def kind(error: BaseException) -> type[Exception] | None:
    translation = translate(error, "TPU API", "request queued resource train-1-a1")
    return None if translation is None else type(translation)


# -- the table ------------------------------------------------------------------------------


@pytest.mark.parametrize("code", list(GRPC_TABLE), ids=lambda c: c.name)
def test_every_grpc_code_raised_by_grpcio_is_classified_by_the_table(code):
    """Each google.rpc.Code, as a gRPC call raises it, is transient or permanent per the table."""
    assert kind(grpc_error(code)) is GRPC_TABLE[code]


@pytest.mark.parametrize("code", list(GRPC_TABLE), ids=lambda c: c.name)
def test_every_grpc_code_from_from_grpc_status_is_classified_alike(code):
    """`from_grpc_status` (the exception class picked by code alone) gives the same answer."""
    assert kind(exceptions.from_grpc_status(code, "boom")) is GRPC_TABLE[code]


@pytest.mark.parametrize("code", list(GRPC_TABLE), ids=lambda c: c.name)
def test_every_grpc_code_rendered_over_rest_with_its_status_is_classified_alike(code):
    """Google's REST body names the code in `status`; the HTTP status is code.proto's mapping."""
    http_status = exceptions.exception_class_for_grpc_status(code).code or 500
    if code is grpc.StatusCode.CANCELLED:
        http_status = 499
    assert kind(rest_error(http_status, status=code.name)) is GRPC_TABLE[code]


@pytest.mark.parametrize("http_status", list(HTTP_TABLE))
def test_every_http_status_without_a_named_code_is_classified_by_the_table(http_status):
    """A REST error whose body names no code is classified by its HTTP status alone."""
    assert kind(rest_error(http_status)) is HTTP_TABLE[http_status]
    assert kind(exceptions.from_http_status(http_status, "boom")) is HTTP_TABLE[http_status]


def test_a_rest_409_is_transient_only_when_its_body_says_aborted():
    """REST renders ALREADY_EXISTS and ABORTED alike as 409; the body's `status` tells them apart."""
    assert kind(rest_error(409, status="ABORTED")) is TransientError
    assert kind(rest_error(409, status="ALREADY_EXISTS")) is PermanentError
    assert kind(rest_error(409)) is PermanentError


def test_the_problems_of_issue_12_are_transient_on_both_transports():
    """UNKNOWN, CANCELLED and DATA_LOSS over gRPC, and 408, 499, 502 over REST, are blips."""
    for code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED, grpc.StatusCode.DATA_LOSS):
        assert kind(grpc_error(code)) is TransientError
    for status in (408, 499, 502):
        assert kind(rest_error(status)) is TransientError


# -- connection failures -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        requests.exceptions.ConnectionError("connection refused"),
        requests.exceptions.ReadTimeout("read timed out"),
        urllib3.exceptions.ProtocolError("connection aborted"),
        auth_exceptions.TransportError("metadata server unreachable"),
        auth_exceptions.RefreshError("token endpoint 503", retryable=True),
        ConnectionResetError("reset by peer"),
        TimeoutError("timed out"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_failure_to_reach_the_api_is_transient(error):
    """Nothing reached the service, or no answer came back: retrying may well work."""
    translation = translate(error, "Cloud Storage", "read gs://logs/x")
    assert type(translation) is TransientError
    assert str(translation).startswith("Cloud Storage unreachable while trying to read gs://logs/x: ")


def test_a_retry_that_ran_out_of_time_is_transient():
    """api_core's RetryError (the deadline passed while retrying blips) is worth another delivery."""
    error = exceptions.RetryError("Timeout of 10.0s exceeded", cause=grpc_error(grpc.StatusCode.UNAVAILABLE))
    assert kind(error) is TransientError


@pytest.mark.parametrize(
    "error",
    [
        ValueError("a bug of ours"),
        KeyError("spec"),
        requests.exceptions.InvalidURL("no host"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_error_that_is_not_googles_passes_through(error):
    """A bug or a malformed request of our own is not translated: it surfaces as itself."""
    assert translate(error, "TPU API", "list nodes") is None
    with pytest.raises(type(error)), translated("TPU API", "list nodes"):
        raise error


def test_an_auth_error_that_retrying_cannot_fix_is_permanent():
    """Missing or revoked credentials: no redelivery will bring them back."""
    assert kind(auth_exceptions.RefreshError("invalid_grant")) is PermanentError
    assert kind(auth_exceptions.DefaultCredentialsError("no credentials")) is PermanentError


# -- quota ------------------------------------------------------------------------------------


def test_a_grpc_quota_that_ran_out_is_quota_exhausted_with_a_readable_reason():
    """RESOURCE_EXHAUSTED with ErrorInfo RESOURCE_QUOTA_EXCEEDED and a QuotaFailure names the quota."""
    error = grpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, QUOTA_MESSAGE, quota_info(), quota_failure())
    translation = translate(error, "TPU API", "request queued resource train-1-a1")
    assert type(translation) is QuotaExhausted
    text = str(translation)
    assert text.startswith("TPU API failed to request queued resource train-1-a1: quota exhausted (")
    assert "TPUV4sPodPerProjectPerZoneForTPUAPI (limit 32, zone us-central2-b)" in text
    assert QUOTA_MESSAGE in text
    assert "\n" not in text and "violations" not in text  # a sentence, not a protobuf dump


def test_a_rest_quota_that_ran_out_is_quota_exhausted_alike():
    """The same error in Google's JSON body (camelCase details) reads the same."""
    error = rest_error(
        429, QUOTA_MESSAGE, "RESOURCE_EXHAUSTED",
        [info_json("RESOURCE_QUOTA_EXCEEDED"), quota_failure_json()],
    )  # fmt: skip
    translation = translate(error, "TPU API", "request queued resource train-1-a1")
    assert type(translation) is QuotaExhausted
    assert "TPUV4sPodPerProjectPerZoneForTPUAPI (limit 32, zone us-central2-b)" in str(translation)


def test_an_error_info_alone_saying_quota_names_the_quota_from_its_metadata():
    """Without a QuotaFailure, ErrorInfo's metadata (quota_limit, value, location) names it."""
    error = grpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, QUOTA_MESSAGE, quota_info())
    translation = translate(error, "TPU API", "request queued resource train-1-a1")
    assert type(translation) is QuotaExhausted
    assert "TPUV4sPodPerProjectPerZoneForTPUAPI (limit 32, location us-central2-b)" in str(translation)


def test_a_quota_failure_alone_is_quota_exhausted():
    """A QuotaFailure detail says a quota check failed, even with no ErrorInfo."""
    assert kind(grpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, QUOTA_MESSAGE, quota_failure())) is QuotaExhausted
    assert kind(rest_error(429, QUOTA_MESSAGE, details=[quota_failure_json()])) is QuotaExhausted


@pytest.mark.parametrize(
    "error",
    [
        grpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, RATE_MESSAGE, quota_info("RATE_LIMIT_EXCEEDED")),
        rest_error(429, RATE_MESSAGE, "RESOURCE_EXHAUSTED", [info_json("RATE_LIMIT_EXCEEDED")]),
        rest_error(429, RATE_MESSAGE, "RESOURCE_EXHAUSTED", [info_json("RATE_LIMIT_EXCEEDED"), quota_failure_json()]),
        rest_error(429, "Quota exceeded for quota metric 'Requests' per minute."),
        rest_error(429, "The rate of change requests to the object exceeds the rate limit.",
                   errors=[{"reason": "rateLimitExceeded", "domain": "usageLimits", "message": "slow down"}]),
        exceptions.from_http_status(429, "Too Many Requests"),
    ],
    ids=["grpc-rate-limit", "rest-rate-limit", "rate-limit-with-quota-failure", "per-minute-message",
         "storage-rate-limit", "bare-429"],
)  # fmt: skip
def test_a_rate_limit_429_stays_a_plain_transient_error(error):
    """Calls too fast is not a quota that ran out: it is retried soon, and never QuotaExhausted."""
    assert kind(error) is TransientError
    assert is_retryable(error)


@pytest.mark.parametrize(
    "message",
    [
        QUOTA_MESSAGE,
        "RESOURCE_EXHAUSTED: Quota limit 'TPUV2sPodPerProjectPerZoneForTPUAPI' has been exceeded. "
        f"Limit: 0 in zone {ZONE}.",
    ],
)
def test_a_429_without_details_that_names_a_quota_is_quota_exhausted(message):
    """With no details at all, a message naming a quota (and no rate) is the only sign, and enough."""
    assert kind(grpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, message)) is QuotaExhausted
    assert kind(rest_error(429, message)) is QuotaExhausted


def test_a_quota_is_never_retried_in_the_call_and_a_blip_is():
    """The Retry predicate is the table minus quota: retrying soon never helps a quota."""
    assert not is_retryable(grpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, QUOTA_MESSAGE, quota_info()))
    assert not is_retryable(grpc_error(grpc.StatusCode.NOT_FOUND))
    assert is_retryable(grpc_error(grpc.StatusCode.UNKNOWN))
    assert is_retryable(rest_error(502))


def test_a_retry_that_ran_out_on_a_quota_stays_quota_exhausted():
    """Another client's retry (Pub/Sub's) ending on a quota error still says the quota ran out."""
    cause = rest_error(429, QUOTA_MESSAGE, details=[quota_failure_json()])
    assert kind(exceptions.RetryError("Timeout of 60.0s exceeded", cause=cause)) is QuotaExhausted


# -- which quota: a zone's or a region's ------------------------------------------------------------

# Google's words for a regional TPU quota (marin-community/marin#1612), and for both scopes at once.
REGIONAL_MESSAGE = (
    "Quota limit 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded. Limit: 0 in region us-east5."
)
BOTH_SCOPES_MESSAGE = (
    "RESOURCE_EXHAUSTED: Quota limit 'TPUV2sPodPerProjectPerRegionForTPUAPI, TPUV2sPodPerProjectPerZoneForTPUAPI' "
    "has been exceeded. Limit: 0,0 in region us-central1,zone us-central1-a."
)


def regional_violation(dimensions: dict[str, str], quota_id: str) -> error_details_pb2.QuotaFailure:
    return error_details_pb2.QuotaFailure(
        violations=[
            error_details_pb2.QuotaFailure.Violation(
                subject="projects/123",
                description=REGIONAL_MESSAGE,
                quota_id=quota_id,
                quota_metric=f"{TPU}/v6e_chips_preemptible",
                quota_dimensions=dimensions,
            )
        ]
    )


def regional_info(location: str, limit: str) -> dict[str, Any]:
    return {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "RESOURCE_QUOTA_EXCEEDED",
        "domain": "googleapis.com",
        "metadata": {"service": TPU, "quota_limit": limit, "quota_location": location},
    }


def region_said(error: BaseException) -> str:
    translation = translate(error, "TPU API", "request queued resource train-1-a1")
    assert type(translation) is QuotaExhausted
    return translation.region


@pytest.mark.parametrize(
    "error",
    [
        grpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, REGIONAL_MESSAGE, quota_info(),
                   regional_violation({"region": "us-east5"}, "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI")),
        grpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, REGIONAL_MESSAGE,
                   regional_violation({"zone": "us-east5-b"}, "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI")),
        rest_error(429, REGIONAL_MESSAGE, "RESOURCE_EXHAUSTED",
                   [regional_info("us-east5", "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI")]),
        rest_error(429, REGIONAL_MESSAGE, "RESOURCE_EXHAUSTED",
                   [regional_info("us-east5-a", "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI")]),
        rest_error(429, REGIONAL_MESSAGE),
        exceptions.RetryError("Timeout of 60.0s exceeded", cause=rest_error(429, REGIONAL_MESSAGE)),
    ],
    ids=["grpc-region-dimension", "grpc-per-region-id-with-zone", "rest-location-is-a-region",
         "rest-per-region-limit-in-a-zone", "message-only", "retry-ended-on-it"],
)  # fmt: skip
def test_a_quota_google_says_is_a_regions_names_the_region(error):
    """A region's quota: by the violation's dimension or "PerRegion" id, ErrorInfo's location or
    limit, or the message alone; the region is the one Google names, or the zone's."""
    assert region_said(error) == "us-east5"


def test_an_error_naming_the_region_and_the_zone_at_once_is_the_regions():
    """Both quotas exceeded: the region's leaves no other zone of it any room, so it wins."""
    assert region_said(grpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, BOTH_SCOPES_MESSAGE)) == "us-central1"
    assert region_said(rest_error(429, BOTH_SCOPES_MESSAGE, "RESOURCE_EXHAUSTED")) == "us-central1"


@pytest.mark.parametrize(
    "error",
    [
        grpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, QUOTA_MESSAGE, quota_info(), quota_failure()),
        grpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, QUOTA_MESSAGE, quota_info()),
        rest_error(429, QUOTA_MESSAGE, "RESOURCE_EXHAUSTED", [quota_failure_json()]),
        rest_error(429, "RESOURCE_EXHAUSTED: Quota limit 'TPUV2sPodPerProjectPerZoneForTPUAPI' has been exceeded. "
                        f"Limit: 0 in zone {ZONE}."),
        rest_error(429, "Quota 'TPUS' exhausted."),
    ],
    ids=["grpc-zonal", "error-info-zone-location", "rest-zonal", "zonal-message", "nothing-said"],
)  # fmt: skip
def test_a_zones_quota_or_an_unknown_one_names_no_region(error):
    """A zonal quota (or one whose scope nobody says) leaves the region's other zones worth a try."""
    assert region_said(error) == ""
    assert quota_region(error if isinstance(error, exceptions.GoogleAPICallError) else error.cause) == ""


# -- translated() and transient_retry() -------------------------------------------------------------


def test_translated_names_the_service_and_the_action_and_chains_the_cause():
    """The message says which service failed at what; the library error stays as __cause__."""
    cause = grpc_error(grpc.StatusCode.UNAVAILABLE, "connection reset")
    with pytest.raises(TransientError) as raised, translated("TPU API", "request queued resource train-1-a1"):
        raise cause
    assert str(raised.value) == "TPU API failed to request queued resource train-1-a1: 503 connection reset"
    assert raised.value.__cause__ is cause
    with pytest.raises(PermanentError) as refused, translated("Firestore", "read job train-1"):
        raise grpc_error(grpc.StatusCode.PERMISSION_DENIED, "no access")
    assert str(refused.value) == "Firestore refused to read job train-1: 403 no access"


def test_transient_retry_calls_again_after_blips_and_returns_the_answer():
    """Two UNKNOWNs then an answer: the call returns the answer, after three attempts."""
    calls = []

    def call():
        calls.append(1)
        if len(calls) < 3:
            raise grpc_error(grpc.StatusCode.UNKNOWN, "stream reset")
        return "answer"

    assert transient_retry(deadline_s=5.0)(call)() == "answer"
    assert len(calls) == 3


@pytest.mark.parametrize(
    "error",
    [
        grpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, QUOTA_MESSAGE, quota_info()),
        grpc_error(grpc.StatusCode.INVALID_ARGUMENT, "bad accelerator type"),
    ],
    ids=["quota", "permanent"],
)
def test_transient_retry_gives_up_at_once_on_a_quota_or_a_refusal(error):
    """One attempt, and the error itself (not a RetryError) comes out."""
    calls = []

    def call():
        calls.append(1)
        raise error

    with pytest.raises(type(error)):
        transient_retry(deadline_s=5.0)(call)()
    assert len(calls) == 1

"""Google's error model as the simulator answers with it: canonical codes, the HTTP status each
maps to, and the JSON error body with its typed details.

Every refusal of the simulated API, and every fault a test injects (``Fault``), must look exactly like
what Google's REST frontends send (AIP-193, google/rpc/code.proto, error_details.proto), because the
code under test picks its exception, and so its retry, from that; the REST client picks it by the HTTP
status alone. See docs/local-stack.md#googles-errors-and-field-masks.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import Enum
from typing import Any

from tpujobs.domain.quotas import ZONE, PoolKey, Scope

TYPE_PREFIX = "type.googleapis.com/"
ERROR_INFO_TYPE = TYPE_PREFIX + "google.rpc.ErrorInfo"
QUOTA_FAILURE_TYPE = TYPE_PREFIX + "google.rpc.QuotaFailure"
BAD_REQUEST_TYPE = TYPE_PREFIX + "google.rpc.BadRequest"
TPU_SERVICE = "tpu.googleapis.com"
INJECTED = " (injected by the tpujobs simulator)"

# The TPU API calls a fault can be aimed at; operations are never faulted by method, so a
# long-running operation can always be polled to its end.
FAULT_METHODS = ("create", "get", "list", "delete", "update")


def project_number(project: str) -> int:
    """A stable 12-digit stand-in for a project's number (the simulator has no projects)."""
    digest = int(hashlib.sha256(project.encode("utf-8")).hexdigest(), 16)
    return 100_000_000_000 + digest % 900_000_000_000


class Code(Enum):
    """google.rpc.Code, each with the HTTP status code.proto maps it to."""

    CANCELLED = (1, 499)
    UNKNOWN = (2, 500)
    INVALID_ARGUMENT = (3, 400)
    DEADLINE_EXCEEDED = (4, 504)
    NOT_FOUND = (5, 404)
    ALREADY_EXISTS = (6, 409)
    PERMISSION_DENIED = (7, 403)
    RESOURCE_EXHAUSTED = (8, 429)
    FAILED_PRECONDITION = (9, 400)
    ABORTED = (10, 409)
    OUT_OF_RANGE = (11, 400)
    UNIMPLEMENTED = (12, 501)
    INTERNAL = (13, 500)
    UNAVAILABLE = (14, 503)
    DATA_LOSS = (15, 500)
    UNAUTHENTICATED = (16, 401)

    def __init__(self, grpc_code: int, http_status: int) -> None:
        self.grpc_code = grpc_code
        self.http_status = http_status


# An HTTP status named alone means the code Google's frontends send with it; statuses no code
# maps to are UNKNOWN (502, like 503, is a frontend that could not reach the service).
_CODE_OF_STATUS = {
    400: Code.INVALID_ARGUMENT,
    401: Code.UNAUTHENTICATED,
    403: Code.PERMISSION_DENIED,
    404: Code.NOT_FOUND,
    409: Code.ABORTED,
    429: Code.RESOURCE_EXHAUSTED,
    499: Code.CANCELLED,
    500: Code.INTERNAL,
    501: Code.UNIMPLEMENTED,
    502: Code.UNAVAILABLE,
    503: Code.UNAVAILABLE,
    504: Code.DEADLINE_EXCEEDED,
}

# The messages Google's frontends send with each code when the service says nothing more.
_MESSAGES = {
    Code.CANCELLED: "The operation was cancelled.",
    Code.UNKNOWN: "Unknown Error.",
    Code.INVALID_ARGUMENT: "Request contains an invalid argument.",
    Code.DEADLINE_EXCEEDED: "Deadline expired before operation could complete.",
    Code.NOT_FOUND: "Requested entity was not found.",
    Code.ALREADY_EXISTS: "Requested entity already exists",
    Code.PERMISSION_DENIED: "The caller does not have permission",
    Code.FAILED_PRECONDITION: "Precondition check failed.",
    Code.ABORTED: "The operation was aborted.",
    Code.OUT_OF_RANGE: "Operation was attempted past the valid range.",
    Code.UNIMPLEMENTED: "Operation is not implemented, or supported, or enabled.",
    Code.INTERNAL: "Internal error encountered.",
    Code.UNAVAILABLE: "The service is currently unavailable.",
    Code.DATA_LOSS: "Unrecoverable data loss or corruption.",
    Code.UNAUTHENTICATED: (
        "Request had invalid authentication credentials. Expected OAuth 2 access token, "
        "login cookie or other valid authentication credential."
    ),
}


class SimulatorError(Exception):
    """A request the simulated API refuses, rendered by ``to_json`` as Google's error body.

    *http_status* defaults to the code's; a fault may send another (a 502 says UNAVAILABLE).
    *details* are google.rpc detail messages as JSON, each with its ``@type``.
    """

    def __init__(
        self,
        code: Code,
        message: str,
        *,
        http_status: int | None = None,
        details: tuple[dict[str, Any], ...] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.http_status = http_status or code.http_status
        self.details = details

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "code": self.http_status,
            "message": self.message,
            "status": self.code.name,
        }
        if self.details:
            body["details"] = [dict(detail) for detail in self.details]
        return {"error": body}


def bad_request(field: str, description: str) -> SimulatorError:
    """INVALID_ARGUMENT naming the field at fault, with a google.rpc.BadRequest detail."""
    return SimulatorError(
        Code.INVALID_ARGUMENT,
        description,
        details=(
            {
                "@type": BAD_REQUEST_TYPE,
                "fieldViolations": [{"field": field, "description": description}],
            },
        ),
    )


@dataclass(frozen=True)
class Fault:
    """An error a TPU API call answers with instead of its result (``tpujobs dev fault error``).

    *quota* makes a 429 a quota running out (ErrorInfo RESOURCE_QUOTA_EXCEEDED and a
    QuotaFailure naming the TPU API's chips quota where it was called) instead of a rate limit
    (ErrorInfo RATE_LIMIT_EXCEEDED). *applied* lets the call take effect first and loses its answer, as a
    deadline that expires after the service acted: a created resource exists, a delete runs.
    """

    code: Code
    http_status: int
    quota: bool = False
    applied: bool = False
    message: str = ""

    @classmethod
    def parse(cls, value: int | str, *, quota: bool = False, applied: bool = False, message: str = "") -> Fault:
        """A fault from an HTTP status (400..599) or a google.rpc.Code name; ValueError if neither."""
        text = str(value).strip()
        if text.isdigit():
            status = int(text)
            if not 400 <= status <= 599:
                raise ValueError(f"an injected HTTP status must be within 400..599, got {status}")
            code = _CODE_OF_STATUS.get(status, Code.UNKNOWN)
        else:
            try:
                code = Code[text.upper()]
            except KeyError:
                names = ", ".join(c.name for c in Code)
                raise ValueError(f"{value!r} is neither an HTTP status nor a google.rpc.Code name ({names})") from None
            status = code.http_status
        if quota and code is not Code.RESOURCE_EXHAUSTED:
            raise ValueError(f"only a 429 RESOURCE_EXHAUSTED can be a quota error, not {code.name}")
        return cls(code, status, quota, applied, message)

    def error(self, project: str, zone: str, pool: PoolKey | None = None, limit: int | None = None) -> SimulatorError:
        """The error as the TPU API would send it to *project* calling in *zone* (or a region); a
        quota error names *pool*'s quota (family and tier; unknown: the generic chips quota) and
        its *limit* when the caller knows them."""
        consumer = f"projects/{project_number(project)}"
        if self.code is Code.RESOURCE_EXHAUSTED and self.quota:
            return self._quota_error(consumer, zone, pool, limit)
        if self.code is Code.RESOURCE_EXHAUSTED:
            message = self.message or (
                "Quota exceeded for quota metric 'Default requests' and limit 'Default requests "
                f"per minute per project' of service '{TPU_SERVICE}' for consumer "
                f"'project_number:{project_number(project)}'."
            )
            info = {
                "@type": ERROR_INFO_TYPE,
                "reason": "RATE_LIMIT_EXCEEDED",
                "domain": "googleapis.com",
                "metadata": {
                    "consumer": consumer,
                    "service": TPU_SERVICE,
                    "quota_metric": f"{TPU_SERVICE}/default_requests",
                    "quota_limit": "DefaultRequestsPerMinutePerProject",
                    "quota_location": "global",
                },
            }
            return SimulatorError(self.code, message + INJECTED, http_status=self.http_status, details=(info,))
        message = self.message or _MESSAGES[self.code]
        return SimulatorError(self.code, message + INJECTED, http_status=self.http_status)

    def _quota_error(self, consumer: str, location: str, pool: PoolKey | None, limit: int | None) -> SimulatorError:
        """nodes.create's 429 when the quota is short ("Quota limit 'TPUV6EPreemptiblePerProject-
        PerRegionForTPUAPI' has been exceeded. Limit: 0 in region us-east5."): the zonal or the
        regional id, preemptible or not, and the dimension to match."""
        scope: Scope = "zone" if ZONE.fullmatch(location) else "region"
        family, tier = (pool.family, pool.tier) if pool is not None else ("", "on-demand")
        quota_id = tpu_quota_id(family, tier, scope)
        metric = tpu_quota_metric(family, tier)
        where = f"Limit: {limit} in {scope} {location}." if limit is not None else f"({scope} {location})"
        message = self.message or f"Quota limit '{quota_id}' has been exceeded. {where}"
        details = (
            {
                "@type": ERROR_INFO_TYPE,
                "reason": "RESOURCE_QUOTA_EXCEEDED",
                "domain": "googleapis.com",
                "metadata": {
                    "consumer": consumer,
                    "service": TPU_SERVICE,
                    "quota_metric": metric,
                    "quota_limit": quota_id,
                    "quota_location": location,
                    **({"quota_limit_value": str(limit)} if limit is not None else {}),
                },
            },
            {
                "@type": QUOTA_FAILURE_TYPE,
                "violations": [
                    {
                        "subject": consumer,
                        "description": message,
                        "apiService": TPU_SERVICE,
                        "quotaMetric": metric,
                        "quotaId": quota_id,
                        "quotaDimensions": {scope: location},
                        **({"quotaValue": str(limit)} if limit is not None else {}),
                    }
                ],
            },
        )
        return SimulatorError(self.code, message + INJECTED, http_status=self.http_status, details=details)

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.http_status,
            "status": self.code.name,
            "quota": self.quota,
            "applied": self.applied,
            "message": self.message,
        }


# The TPU API's quota ids. Seen in Google's answers: TPUV4sPreemptiblePodPerProjectPerZone-
# ForTPUAPI, TPUV4sPreemptiblePodPerProjectPerRegionForTPUAPI, TPUV5sPreemptibleLitepodPer-
# ProjectPerRegionForTPUAPI, TPUV6EPerProjectPerZoneForTPUAPI, TPUV6EPreemptiblePerProjectPer-
# RegionForTPUAPI, TPUV2sPodPerProjectPerRegionForTPUAPI. Unconfirmed, by the same pattern:
# v5p's and v7x's stems, and the Reserved word of the reserved tier.
_TPU_QUOTA_STEMS: dict[str, tuple[str, str]] = {  # (before the tier's word, after it)
    "v2": ("TPUV2s", "Pod"),
    "v3": ("TPUV3s", "Pod"),
    "v4": ("TPUV4s", "Pod"),
    "v5litepod": ("TPUV5s", "Litepod"),
    "v5p": ("TPUV5P", ""),
    "v6e": ("TPUV6E", ""),
    "v7x": ("TPUV7X", ""),
}
_TIER_WORDS = {"on-demand": "", "spot": "Preemptible", "reserved": "Reserved"}


def tpu_quota_id(family: str, tier: str, scope: Scope) -> str:
    """The TPU API's quota id of a family's chips of *tier*, per zone or per region ("": any family)."""
    head, tail = _TPU_QUOTA_STEMS.get(family, ("TPUs", ""))
    return f"{head}{_TIER_WORDS[tier]}{tail}PerProjectPer{scope.capitalize()}ForTPUAPI"


def tpu_quota_metric(family: str, tier: str) -> str:
    """The quota metric behind it (its form unconfirmed: Google's errors seen name only the id)."""
    name = f"tpu_{family}" if family else "tpus"
    return f"{TPU_SERVICE}/{name}" + ("" if tier == "on-demand" else f"_{tier.replace('-', '_')}")

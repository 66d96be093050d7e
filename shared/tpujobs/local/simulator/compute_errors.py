"""Compute Engine's errors as its v1 REST API sends them, which differ from the TPU API's:
``{"error": {"code": 404, "message": ..., "errors": [{"domain": "global", "reason": "notFound",
"message": ...}]}}``; the client reads the reason from ``errors`` (google.api_core's ``.errors``)."""

from __future__ import annotations

from typing import Any

from tpujobs.local.simulator.errors import Code, SimulatorError

# What a TPU-model refusal becomes when it surfaces through the Compute API.
_REASONS = {
    Code.INVALID_ARGUMENT: "invalid",
    Code.NOT_FOUND: "notFound",
    Code.ALREADY_EXISTS: "alreadyExists",
    Code.FAILED_PRECONDITION: "conditionNotMet",
    Code.RESOURCE_EXHAUSTED: "rateLimitExceeded",
    Code.UNIMPLEMENTED: "notImplemented",
    Code.UNAVAILABLE: "backendError",
    Code.INTERNAL: "backendError",
}


class ComputeError(SimulatorError):
    """A request the simulated Compute API refuses, rendered in Compute Engine's error shape."""

    def __init__(self, http_status: int, reason: str, message: str, code: Code = Code.INVALID_ARGUMENT) -> None:
        super().__init__(code, message, http_status=http_status)
        self.reason = reason

    def to_json(self) -> dict[str, Any]:
        return {
            "error": {
                "code": self.http_status,
                "message": self.message,
                "errors": [{"message": self.message, "domain": "global", "reason": self.reason}],
            }
        }


def invalid(message: str) -> ComputeError:
    return ComputeError(400, "invalid", message)


def invalid_field(path: str, value: Any, why: str) -> ComputeError:
    """400 invalid naming the field, as Compute Engine words it."""
    return invalid(f"Invalid value for field '{path}': '{value}'. {why}")


def required(path: str) -> ComputeError:
    return invalid(f"Invalid value for field '{path}': ''. This field is required.")


def not_found(path: str) -> ComputeError:
    return ComputeError(404, "notFound", f"The resource '{path}' was not found", Code.NOT_FOUND)


def already_exists(path: str) -> ComputeError:
    return ComputeError(409, "alreadyExists", f"The resource '{path}' already exists", Code.ALREADY_EXISTS)


def in_use(kind: str, path: str, user: str) -> ComputeError:
    return ComputeError(
        400,
        "resourceInUseByAnotherResource",
        f"The {kind} resource '{path}' is already being used by '{user}'",
        Code.FAILED_PRECONDITION,
    )


def condition_not_met(message: str) -> ComputeError:
    return ComputeError(412, "conditionNotMet", message, Code.FAILED_PRECONDITION)


def as_compute(error: SimulatorError) -> ComputeError:
    """A TPU-model refusal (or an injected fault) in Compute Engine's shape."""
    if isinstance(error, ComputeError):
        return error
    return ComputeError(error.http_status, _REASONS.get(error.code, "backendError"), error.message, error.code)

"""Following Compute Engine's long-running operations with our own operations clients.

google-cloud-compute's `ExtendedOperation` polls through operations clients it builds itself,
on the default endpoint whatever `api_endpoint` the client was given (compute_v1 1.57.0,
`transports/base.py`): against the simulator it would poll Google. So every mutation is made
with its `*_unary` method, and its operation is read here, on the clients `build_clients` made.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from google.api_core import exceptions as api_exceptions

if TYPE_CHECKING:
    from google.cloud import compute_v1

POLL_FIRST_S = 0.2
POLL_MAX_S = 2.0


class OperationFollower:
    """Reads an operation again, zonal or regional, until it is DONE or the wait is over."""

    def __init__(
        self,
        zone_operations: compute_v1.ZoneOperationsClient,
        region_operations: compute_v1.RegionOperationsClient,
        project: str,
        call: Callable[[], dict[str, Any]],
        *,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`call` gives each read's retry and timeout."""
        self._zone_operations = zone_operations
        self._region_operations = region_operations
        self._project = project
        self._call = call
        self._sleep = sleep
        self._monotonic = monotonic

    def follow(self, operation: compute_v1.Operation, wait_s: float) -> compute_v1.Operation:
        """The operation as it is once DONE, or as last read when `wait_s` is over."""
        return self.follow_all([operation], wait_s)[0]

    def follow_all(self, operations: Sequence[compute_v1.Operation], wait_s: float) -> list[compute_v1.Operation]:
        """Operations that run at once, followed together: each pause is followed by one read of
        every operation not yet DONE, so N operations cost the wait of the slowest (not the sum)
        and no read of one already DONE. Each as it is once DONE, or as last read when `wait_s`
        is over; in the order given."""
        found = list(operations)
        deadline = self._monotonic() + wait_s
        pause = POLL_FIRST_S
        while not all(is_done(op) for op in found) and self._monotonic() < deadline:
            self._sleep(min(pause, max(0.0, deadline - self._monotonic())))
            pause = min(pause * 2, POLL_MAX_S)
            found = [op if is_done(op) else self.read(op) for op in found]
        return found

    def read(self, operation: compute_v1.Operation) -> compute_v1.Operation:
        """The operation now, from its own scope (its `zone` or `region` URL)."""
        name = operation.name
        if operation.zone:
            zone = operation.zone.rsplit("/", 1)[-1]
            return self._zone_operations.get(project=self._project, zone=zone, operation=name, **self._call())
        region = operation.region.rsplit("/", 1)[-1]
        return self._region_operations.get(project=self._project, region=region, operation=name, **self._call())


def is_done(operation: compute_v1.Operation) -> bool:
    return bool(operation.status.name == "DONE")


def operation_error(operation: compute_v1.Operation) -> api_exceptions.GoogleAPICallError | None:
    """A DONE operation's failure as the exception the API would have raised (as
    `ExtendedOperation` makes it: its HTTP status, message and `errors`); None if it succeeded."""
    errors = list(operation.error.errors)
    if not is_done(operation) or (not errors and not operation.http_error_status_code):
        return None
    status = operation.http_error_status_code or 400
    message = operation.http_error_message or "; ".join(f"{e.code}: {e.message}" for e in errors)
    failure: api_exceptions.GoogleAPICallError = api_exceptions.from_http_status(status, message, errors=errors)
    return failure


def describe(operation: compute_v1.Operation) -> str:
    """A failed operation's errors as a sentence ("CODE: message; ...")."""
    said = "; ".join(f"{e.code}: {e.message}" for e in operation.error.errors)
    return said or f"HTTP {operation.http_error_status_code}: {operation.http_error_message}"


# The error reasons of Compute Engine's JSON errors (`errors[].reason`) and of its operations'
# (`error.errors[].code`), compared without case or underscores.
ALREADY_EXISTS = frozenset({"alreadyexists", "resourcealreadyexists"})
IN_USE = frozenset({"resourceinusebyanotherresource"})
NOT_READY = frozenset({"resourcenotready"})


def has_reason(error: BaseException | None, reasons: frozenset[str]) -> bool:
    """Whether a Google error's reasons (REST `errors[].reason`, an operation's `errors[].code`)
    include one of `reasons` (compared without case or underscores)."""
    if not isinstance(error, api_exceptions.GoogleAPICallError):
        return False
    said: list[str] = [error.reason or ""]
    for each in error.errors or ():
        if isinstance(each, Mapping):
            said += [str(each.get("reason") or ""), str(each.get("code") or "")]
        else:
            said += [str(getattr(each, "reason", "") or ""), str(getattr(each, "code", "") or "")]
    return any(s.replace("_", "").lower() in reasons for s in said if s)

"""The door of every inbound topic but `tpujobs-submit`: a message is a JSON object of Unicode
text, at most `MAX_REPORT_BYTES`, that fits a small strict pydantic model; one that does not
becomes a `ReportError` with a sentence naming the field, which the service records as a
rejection and acknowledges. The models live by topic: worker_reports, qr_state_reports,
control_requests, pool_requests, export_requests.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from tpujobs.agent.wire import MAX_REPORT_BYTES
from tpujobs.domain.spec import ID_PATTERN, DuplicateKey, require_unicode_text, unique_keys

JobId = Annotated[str, Field(pattern=ID_PATTERN)]
Attempt = Annotated[int, Field(ge=1, le=10_000)]
EARLIEST = datetime(2000, 1, 1, tzinfo=timezone.utc)
LATEST = datetime(2200, 1, 1, tzinfo=timezone.utc)


def plausible(moment: datetime | None) -> datetime | None:
    """A report's time, in UTC, within years Firestore (and reason) can hold."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    try:
        moment = moment.astimezone(timezone.utc)
    except OverflowError:
        raise ValueError("is out of range") from None
    if not EARLIEST <= moment < LATEST:
        raise ValueError("must be between the years 2000 and 2200")
    return moment


# JSON has no datetime: timestamps arrive as RFC 3339 strings, so this one field is lax.
Timestamp = Annotated[datetime | None, Field(strict=False), AfterValidator(plausible)]


class ReportError(ValueError):
    """A message on an inbound topic that cannot be used; the message names the field."""


class Strict(BaseModel):
    """A message model: frozen, strict types, and fields it does not know ignored (a newer agent's)."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


Report = TypeVar("Report", bound=Strict)
Model = TypeVar("Model", bound=BaseModel)


def decode_report(model: type[Report], raw: bytes | None) -> Report:
    """One inbound message as `model`, or ReportError with the reason."""
    return validated(model, message_object(raw))


def message_object(raw: bytes | None) -> dict[str, Any]:
    """The message as a JSON object of Unicode text, or ReportError saying why not."""
    if raw is None:
        raise ReportError("the message has no data")
    if len(raw) > MAX_REPORT_BYTES:
        raise ReportError(f"the message is {len(raw)} bytes; at most {MAX_REPORT_BYTES} are expected")
    try:
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=unique_keys)
    except UnicodeDecodeError:
        raise ReportError("the message is not valid UTF-8") from None
    except DuplicateKey as error:
        raise ReportError(str(error)) from None
    except (ValueError, RecursionError):  # JSONDecodeError, or a number too long to convert
        raise ReportError("the message is not JSON") from None
    if not isinstance(data, dict):
        raise ReportError(f"the message must be a JSON object, got {type(data).__name__}")
    try:
        require_unicode_text(data)
    except ValueError as error:
        raise ReportError(str(error)) from None
    return data


def validated(model: type[Model], data: dict[str, Any]) -> Model:
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        field = ".".join(str(part) for part in first.get("loc", ())) or "the message"
        raise ReportError(f"field {field!r}: {first.get('msg', 'is invalid')}") from None

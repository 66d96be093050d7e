"""tpujobs-control: a user's request about a job (cancel, resume, rerun), or a warm pool's
(`pool_requests`), told apart by its `action`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from tpujobs.domain.spec import OWNER_PATTERN
from tpujobs.engine.messages import JobId, Strict, message_object, validated
from tpujobs.engine.pool_requests import POOL_CONTROL, PoolControlRequest


class ControlRequest(Strict):
    """tpujobs-control: a user's request about a job."""

    action: Literal["cancel", "resume", "rerun"]
    job_id: JobId
    owner: Annotated[str, Field(pattern=OWNER_PATTERN)]
    # resume, rerun: the request's id (default: the message id), so a retry starts nothing, and the
    # spec fields to change (`domain.restart.OVERRIDABLE`; checked there, each refusal a sentence).
    request_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,128}$")] | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)


def decode_control(raw: bytes | None) -> ControlRequest | PoolControlRequest:
    """A tpujobs-control message: a job's request, or a warm pool's (by its `action`)."""
    data = message_object(raw)
    pool_model = POOL_CONTROL.get(str(data.get("action")))
    return validated(pool_model, data) if pool_model is not None else validated(ControlRequest, data)

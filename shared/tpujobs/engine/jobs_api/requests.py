"""The `jobs` API's request bodies: one strict pydantic model per action.

A body is a JSON object with a known `action`; the rest must fit that action's model, which
refuses fields it does not know. A body that does not fit is an ApiError(400) whose sentence
names the field. `submit`'s body is a job spec, which `domain.spec` checks.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic_core import ErrorDetails

from tpujobs.domain.pools import MAX_UNITS, POOL_REQUEST_FIELDS
from tpujobs.domain.spec import DuplicateKey, unique_keys
from tpujobs.domain.states import JobState
from tpujobs.engine.jobs_api.answers import MAX_LIMIT, ApiError

CALLER_HEADER = "X-Tpujobs-Caller"  # who asks, in the local stack only (no Google signs its tokens)
MAX_BODY_BYTES = 64 * 1024
DEFAULT_LIMIT = 100
REQUEST_ID_PATTERN = r"^[A-Za-z0-9._-]{1,128}$"
SECRET_HEX_PATTERN = r"^[0-9a-f]{64}$"  # 32 bytes, or their SHA-256, as lower-case hex
STATES = tuple(state.value for state in JobState)
# What is wrong with each field when it is missing or does not fit, whatever the action.
SENTENCES = {
    "job_id": "'job_id' is required: the job's id as a string.",
    "state": f"'state' must be one of {', '.join(STATES)}, or a list of them.",
    "owner": "'owner' must be a non-empty string.",
    "name_prefix": "'name_prefix' must be a non-empty string: the start of the jobs' names.",
    "labels": "'labels' must be an object of label names to string values.",
    "remove": "'remove' must be a list of label names.",
    "limit": f"'limit' must be a whole number from 1 to {MAX_LIMIT}.",
    "request_id": "'request_id' must be 1 to 128 letters, digits, '.', '_' or '-'.",
    "overrides": "'overrides' must be an object of fields to change, such as zone or max_restarts.",
    "topic": "'topic' must be a topic name such as tpujobs-submit.",
    "name": "'name' is required: the pool's name as a string.",
    "count": f"'count' is required: the number of units, a whole number from 1 to {MAX_UNITS}.",
    "attempt": "'attempt' is required: the attempt's number, 1 or more.",
    "slice_id": "'slice_id' is required: the host's slice, 0 or more.",
    "worker_id": "'worker_id' is required: the host's worker number in its slice, 0 or more.",
    "identity": "'identity' is required: the VM's instance identity token (format=full).",
    "unit_secret": "'unit_secret' must be 64 lower-case hex digits: the unit's 32-byte secret.",
    "secret_sha256": "'secret_sha256' is required: 64 lower-case hex digits, the SHA-256 of the unit's secret.",
    "worker": "'worker' must be a worker's number K, 0 or more (K = slice x hosts per slice + worker).",
    "after": "'after' must be the 'after' of a `logs` answer, as it gave it (a cursor of up to 4096 characters).",
    "team": "'team' must be a team's name, a non-empty string.",
    "members": "'members' must be a list of e-mails.",
    "accounts": "'accounts' must be a list of service accounts' e-mails.",
    "chips": "'chips' must be an object of limits (LOCATION/FAMILY[/TIER]) to whole numbers of chips, 0 or more.",
    "borrowing_limit": "'borrowing_limit' must be a whole number of chips, 0 or more.",
    "lending_limit": "'lending_limit' must be a whole number of chips, 0 or more.",
    "weight": "'weight' must be a number above 0.",
    "budget_chip_hours": "'budget_chip_hours' must be a number of chip-hours, 0 or more.",
}
NOT_FROM_BODY = "The caller is never taken from the body: remove 'owner'"
SAYS_WHO = f"; the ID token (locally the {CALLER_HEADER} header) says who asks."


def _or_empty(value: Any, empty: Any) -> Any:
    """A missing, null or empty value as the field's empty default (as the API has always taken it)."""
    return value or empty


def _states(value: Any) -> tuple[str, ...]:
    """A state's name or a list of them, any case, as upper-case names without repeats."""
    given = value if isinstance(value, (list, tuple)) else [] if value is None else [value]
    if not all(isinstance(v, str) and v.upper() in STATES for v in given):
        raise ValueError(SENTENCES["state"])
    return tuple(dict.fromkeys(v.upper() for v in given))


NonEmpty = Annotated[str, Field(min_length=1)]
JobId = NonEmpty
Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT)]
States = Annotated[tuple[str, ...], BeforeValidator(_states)]
Labels = Annotated[dict[str, str], BeforeValidator(lambda v: _or_empty(v, {}))]
RequestId = Annotated[
    Annotated[str, Field(pattern=REQUEST_ID_PATTERN)] | None, BeforeValidator(lambda v: _or_empty(v, None))
]


class ApiRequest(BaseModel):
    """An action's fields: strict types, frozen, and a field the action does not take refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    caller_refusal: ClassVar[str | None] = None  # set: naming the caller (`owner`) is refused so
    caller_fields: ClassVar[tuple[str, ...]] = ("owner", "caller")

    @model_validator(mode="before")
    @classmethod
    def _caller_never_from_the_body(cls, data: Any) -> Any:
        if cls.caller_refusal is not None and isinstance(data, dict) and any(f in data for f in cls.caller_fields):
            raise ValueError(cls.caller_refusal)
        return data


class ListRequest(ApiRequest):
    """`list`: jobs newest first, narrowed by state (any of them), owner, name prefix and labels."""

    state: States = ()
    owner: NonEmpty | None = None
    limit: Limit = DEFAULT_LIMIT
    name_prefix: NonEmpty | None = None
    labels: Labels = {}


class JobRequest(ApiRequest):
    """`describe`: one job by id."""

    job_id: JobId


class CancelRequest(JobRequest):
    """`cancel`: one job by id; the caller is the token's."""

    caller_refusal = NOT_FROM_BODY + SAYS_WHO


class RestartRequest(JobRequest):
    """`resume` and `rerun`: one job, idempotent per `request_id`, with optional `overrides`."""

    caller_refusal = NOT_FROM_BODY + SAYS_WHO
    request_id: RequestId = None
    overrides: Annotated[dict[str, Any], BeforeValidator(lambda v: _or_empty(v, {}))] = {}


class LabelRequest(JobRequest):
    """`label`: labels to set and label names to remove, at least one of them."""

    caller_refusal = NOT_FROM_BODY + "."
    labels: Labels = {}
    remove: Annotated[list[str], BeforeValidator(lambda v: _or_empty(v, []))] = []

    @model_validator(mode="after")
    def _something_to_change(self) -> LabelRequest:
        if not self.labels and not self.remove:
            raise ValueError("'labels' or 'remove' is required: what to change.")
        return self


class ReadRequest(ApiRequest):
    """`rejections`: the newest, at most `limit`."""

    limit: Limit = 50


class DeadLettersRequest(ReadRequest):
    """`dead_letters`: the newest, at most `limit`, of one topic or all."""

    topic: NonEmpty | None = None


class NothingRequest(ApiRequest):
    """`quotas`, `pool-list`: no field."""


class PoolRequest(ApiRequest):
    """`pool-describe`, `pool-delete`: one pool by name."""

    name: NonEmpty


class PoolResizeRequest(PoolRequest):
    """`pool-resize`: the units wanted (the pool's rules check the range)."""

    count: int


class _PoolFields(ApiRequest):
    caller_refusal = NOT_FROM_BODY + "; the caller owns the pool."
    caller_fields = ("owner",)


# `pool-create`: the pool's fields, as `domain.pools.parse_pool_request` checks them; the owner is the caller.
_POOL_FIELDS: dict[str, Any] = {name: (Any, None) for name in sorted(POOL_REQUEST_FIELDS - {"owner"})}
PoolCreateRequest = create_model("PoolCreateRequest", __base__=_PoolFields, **_POOL_FIELDS)


def _ip_address(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"address must be an IP address, got {value[:64]!r}") from None


class LogsRequest(JobRequest):
    """`logs`: a page of an attempt's verified output (default: the current attempt), or one worker's."""

    attempt: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    worker: Annotated[int, Field(ge=0, le=1_000_000)] | None = None
    after: Annotated[str, Field(min_length=1, max_length=4096, pattern=r"^[A-Za-z0-9_-]+$")] | None = None


class AttemptKeyRequest(ApiRequest):
    """`attempt-key`: a host of a job's attempt asks for its key, with its VM's identity token."""

    job_id: JobId
    attempt: Annotated[int, Field(ge=1, le=1_000_000)]
    slice_id: Annotated[int, Field(ge=0, le=100_000)]
    worker_id: Annotated[int, Field(ge=0, le=100_000)]
    identity: Annotated[str, Field(min_length=1, max_length=8192)]
    # A multislice host's own address on the slices' network: worker 0 of slice 0 gives it, and
    # becomes the coordinator every host's MEGASCALE_COORDINATOR_ADDRESS names (docs/platforms.md).
    address: Annotated[str, AfterValidator(_ip_address)] | None = None
    # A warm-pool unit's host proves it is the unit's pool agent (root), not any process of the
    # VM: the 32 random bytes (hex) whose SHA-256 it registered before any job ran (`unit-register`).
    unit_secret: Annotated[str, Field(pattern=SECRET_HEX_PATTERN)] | None = None


class UnitRegisterRequest(ApiRequest):
    """`unit-register`: a warm-pool unit VM's pool agent, before any job runs there, registers the
    SHA-256 of its secret for that VM (its identity token says which); the first one is kept."""

    identity: Annotated[str, Field(min_length=1, max_length=8192)]
    secret_sha256: Annotated[str, Field(pattern=SECRET_HEX_PATTERN)]


class NotifyKeyRequest(ApiRequest):
    """`notify-key`: the caller's own team's notification signing key, a service account's, or
    (admins) any `team`'s (`account:EMAIL`, `owner:EMAIL`)."""

    service_account: NonEmpty | None = None
    team: NonEmpty | None = None


class TeamRequest(ApiRequest):
    """`team-unset`: one team by name (admins only)."""

    team: NonEmpty


Chips = Annotated[int, Field(ge=0)]


class TeamSetRequest(TeamRequest):
    """`team-set`: a team created or changed (`domain.team_edits.with_team`); the fields given replace."""

    members: list[str] | None = None
    accounts: list[str] | None = None
    chips: dict[str, Chips] | None = None
    borrowing_limit: Chips | None = None
    lending_limit: Chips | None = None
    weight: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    budget_chip_hours: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None


class UsageRequest(ApiRequest):
    """`usage`: a month's chip-hours, goodput and estimated cost per group (`domain.usage`)."""

    by: Annotated[str, Field(min_length=1, max_length=80)] = "team"  # team, owner or label:KEY
    month: Annotated[str, Field(pattern=r"^[0-9]{4}-[0-9]{2}$")] | None = None  # YYYY-MM; default: this one


# action -> its model (None: a job spec); the order is the one an unknown action's answer lists.
REQUESTS: dict[str, type[ApiRequest] | None] = {
    "list": ListRequest,
    "describe": JobRequest,
    "cancel": CancelRequest,
    "submit": None,
    "dead_letters": DeadLettersRequest,
    "rejections": ReadRequest,
    "quotas": NothingRequest,
    "resume": RestartRequest,
    "rerun": RestartRequest,
    "label": LabelRequest,
    "pool-create": PoolCreateRequest,
    "pool-list": NothingRequest,
    "pool-describe": PoolRequest,
    "pool-resize": PoolResizeRequest,
    "pool-delete": PoolRequest,
    "attempt-key": AttemptKeyRequest,
    "unit-register": UnitRegisterRequest,
    "logs": LogsRequest,
    "notify-key": NotifyKeyRequest,
    "usage": UsageRequest,
    "team-set": TeamSetRequest,
    "team-unset": TeamRequest,
    "team-show": NothingRequest,
}
ACTIONS = tuple(REQUESTS)


def validated(action: str, data: dict[str, Any]) -> ApiRequest | dict[str, Any]:
    """The action's request (a job spec's fields, for submit); ApiError(400) naming what is wrong."""
    model = REQUESTS[action]
    if model is None:
        return data
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ApiError(400, _sentence(action, model, error.errors(include_url=False))) from None


def parse_body(body: bytes) -> dict[str, Any]:
    """The request as a JSON object with a known `action`; ApiError(400) saying what is wrong."""
    if len(body) > MAX_BODY_BYTES:
        raise ApiError(400, f"The body is over {MAX_BODY_BYTES // 1024} KiB.")
    try:
        request = json.loads(body.decode("utf-8"), object_pairs_hook=unique_keys)
    except DuplicateKey as error:
        raise ApiError(400, f"The body is refused: {error}.") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ApiError(400, 'The body is not JSON: send an object such as {"action": "list"}.') from None
    if not isinstance(request, dict):
        raise ApiError(400, 'The body must be a JSON object such as {"action": "list"}.')
    action = request.get("action")
    if action not in ACTIONS:
        raise ApiError(400, f"'action' must be one of {', '.join(ACTIONS)}, not {action!r}.")
    return request


def _sentence(action: str, model: type[ApiRequest], errors: list[ErrorDetails]) -> str:
    """The first thing wrong, as one sentence: an unknown field before a bad one."""
    unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
    if unknown:
        fields = ", ".join(sorted(model.model_fields)) or "nothing"
        return f"Unknown field {unknown[0]!r} for {action}: it takes {fields}."
    first = errors[0]
    if first["type"] == "value_error" and "error" in first.get("ctx", {}):
        return str(first["ctx"]["error"])  # our own sentence, from a validator
    field = str(first["loc"][0]) if first["loc"] else ""
    return SENTENCES.get(field, f"'{field}': {first['msg']}.")

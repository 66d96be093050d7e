"""A warm pool's requests on tpujobs-control (create, resize and delete), and what each came to.

Here, not in warm_pools/, because the job controls answer them too: engine/jobs must not import
warm_pools, which builds on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tpujobs.domain.pools import MAX_UNITS, Pool
from tpujobs.domain.spec import OWNER_PATTERN, POOL_NAME_PATTERN

PoolName = Annotated[str, Field(pattern=POOL_NAME_PATTERN)]
Owner = Annotated[str, Field(pattern=OWNER_PATTERN)]


class _PoolControl(BaseModel):
    """A warm pool's request on tpujobs-control: unlike the agents' reports, a field it does not
    know is an error, so a misspelt `count` is refused, not ignored. `owner` is a claim (the
    topic checks no one): `tpujobs.engine.warm_pools` decides what it may do."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    owner: Owner


class PoolCreateRequest(_PoolControl):
    """`{"action": "pool-create", "owner", "pool": {name, accelerator_type, ...}}`: the pool's
    fields as the jobs API's pool-create takes them (checked by `domain.warm_pools`)."""

    action: Literal["pool-create"]
    pool: dict[str, Any]

    @field_validator("pool")
    @classmethod
    def _owner_is_the_message_s(cls, pool: dict[str, Any]) -> dict[str, Any]:
        if "owner" in pool:
            raise ValueError("must not name an owner: the message's owner owns the pool")
        return pool


class PoolResizeRequest(_PoolControl):
    """`{"action": "pool-resize", "owner", "name", "count"}`."""

    action: Literal["pool-resize"]
    name: PoolName
    count: Annotated[int, Field(ge=1, le=MAX_UNITS)]


class PoolDeleteRequest(_PoolControl):
    """`{"action": "pool-delete", "owner", "name"}`."""

    action: Literal["pool-delete"]
    name: PoolName


PoolControlRequest = PoolCreateRequest | PoolResizeRequest | PoolDeleteRequest
POOL_CONTROL: dict[str, type[PoolControlRequest]] = {
    "pool-create": PoolCreateRequest,
    "pool-resize": PoolResizeRequest,
    "pool-delete": PoolDeleteRequest,
}


@dataclass(frozen=True)
class PoolOutcome:
    """What became of one pool request (create, resize, delete)."""

    kind: Literal["done", "missing", "forbidden", "invalid", "exists"]
    pool: Pool | None
    reason: str

"""What a pool request (create, resize, delete) came to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tpujobs.domain.pools import Pool


@dataclass(frozen=True)
class PoolOutcome:
    """What became of one pool request (create, resize, delete)."""

    kind: Literal["done", "missing", "forbidden", "invalid", "exists"]
    pool: Pool | None
    reason: str

"""The `jobs` API's warm-pool actions (`tpujobs pool`): create, list, describe, resize, delete.

A pool is created by an admin or an owner `config/policies.pools` allows, resized and deleted by
its owner or an admin (the pool service checks); anyone may list and describe pools, but which
jobs run on a pool and wait for it is shown only to its owner, the users it names and admins.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from tpujobs.domain.pools import may_use
from tpujobs.domain.spec import POOL_NAME_PATTERN
from tpujobs.engine.jobs_api.answers import ApiError, Response, to_json
from tpujobs.engine.jobs_api.requests import ApiRequest, NothingRequest, PoolRequest, PoolResizeRequest
from tpujobs.engine.warm_pools.summary import pool_summary

if TYPE_CHECKING:
    from tpujobs.domain.pools import Pool
    from tpujobs.engine.pool_requests import PoolOutcome
    from tpujobs.engine.ports import AccessPolicyReader, Clock
    from tpujobs.engine.services import WarmPools
    from tpujobs.engine.settings import Settings

# What each outcome of a pool's create, resize or delete answers (the warm pools' service).
POOL_STATUS = {"done": 200, "missing": 404, "forbidden": 403, "invalid": 400, "exists": 409}
WAITING_SHOWN = 100  # waiting jobs a pool's answer names (or counts)


class PoolActions:
    """The pool actions, on the warm pool service and its store."""

    def __init__(self, warm: WarmPools, access: AccessPolicyReader | None, clock: Clock, settings: Settings) -> None:
        """`access`: the deployment's policies (the groups a pool's users may name); None: none."""
        self.warm = warm
        self.access = access
        self.clock = clock
        self.settings = settings

    def create(self, caller: str, request: ApiRequest) -> Response:
        """Create a pool the caller owns (admins, or owners `config/policies.pools` allows; the
        service checks): 200 with the pool, 400 invalid, 403 not allowed, 409 the name is taken."""
        fields = request.model_dump(exclude_unset=True)  # the pool's own rules check each value
        return self._answer(caller, self.warm.create(fields, caller, verified=True))

    def list(self, caller: str, request: NothingRequest) -> Response:
        """Every pool by name, each as `describe` shows it to the caller."""
        found = sorted(self.warm.store.list_pools(), key=lambda pool: pool.name)
        return Response(200, {"pools": [self._summary(caller, pool) for pool in found]})

    def describe(self, caller: str, request: PoolRequest) -> Response:
        """One pool: settings, units, its queue and its chip-hours (any caller; `_summary` says
        who sees which jobs)."""
        name = _pool_name(request)
        pool = self.warm.store.get(name)
        if pool is None:
            raise ApiError(404, f"No pool {name!r}.")
        return Response(200, {"pool": self._summary(caller, pool)})

    def resize(self, caller: str, request: PoolResizeRequest) -> Response:
        """Ask for `count` units (the pool's owner or an admin): new ones are requested at once,
        surplus ones go once no job is on them."""
        return self._answer(caller, self.warm.resize(_pool_name(request), request.count, caller))

    def delete(self, caller: str, request: PoolRequest) -> Response:
        """Delete a pool (its owner or an admin): its jobs are cancelled or moved, its units
        released; `pool` is null once the document is gone."""
        return self._answer(caller, self.warm.delete(_pool_name(request), caller))

    def _summary(self, caller: str, pool: Pool) -> dict[str, Any]:
        """The pool as `caller` may see it: which jobs run on it and wait for it only for its
        owner, the users it names (an e-mail or a group the caller is in) and admins."""
        policies = self.access.policies() if self.access is not None else None
        members = policies.members(caller) if policies is not None else frozenset({caller})
        show_jobs = may_use(pool, caller, tuple(self.settings.admins), members)
        waiting = self.warm.store.queue(pool.name, WAITING_SHOWN)
        return dict(to_json(pool_summary(pool, self.clock(), waiting, show_jobs=show_jobs)))

    def _answer(self, caller: str, outcome: PoolOutcome) -> Response:
        status = POOL_STATUS[outcome.kind]
        if status != 200:
            raise ApiError(status, outcome.reason)
        shown = self._summary(caller, outcome.pool) if outcome.pool is not None else None
        return Response(200, {"outcome": outcome.kind, "reason": outcome.reason, "pool": shown})


def _pool_name(request: PoolRequest) -> str:
    """The pool's name; one no pool can have is a 404, as a job id is."""
    if not re.match(POOL_NAME_PATTERN, request.name):
        raise ApiError(404, f"No pool {request.name!r}.")
    return request.name

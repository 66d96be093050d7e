"""Where the CLI reads from: the `jobs` API when one is configured, else Firestore directly.

Both give the same JSON documents (the API's answers: `tpujobs.engine.api.to_json` of the stored
documents), so `-o json` prints the same thing either way and the tables read one shape.
Through the API a user needs no Firestore access of their own and sees what the API lets
them see (env values only for their own jobs; dead letters, rejections and quotas only as
an admin). Firestore directly is the fallback the local stack and admins use, and what an
admin read the API refused falls back to, with the caller's own credentials.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from tpujobs.cli.common import Refused, api_url, ask_api, caller
from tpujobs.engine.ports import JobFilter
from tpujobs.engine.settings import Settings

if TYPE_CHECKING:
    from tpujobs.adapters.firestore_warm_pools import FirestoreWarmPools
    from tpujobs.domain.pools import Pool


class Reads(Protocol):
    """What the CLI reads, as the API's JSON answers."""

    def jobs(self, where: JobFilter, limit: int) -> dict[str, Any]: ...

    def describe(self, job_id: str) -> dict[str, Any] | None: ...

    def dead_letters(self, topic: str | None, limit: int) -> dict[str, Any]: ...

    def rejections(self, limit: int) -> dict[str, Any]: ...

    def rejection(self, message_id: str) -> dict[str, Any] | None: ...

    def quotas(self) -> dict[str, Any]: ...

    def pools(self) -> dict[str, Any]: ...

    def pool(self, name: str) -> dict[str, Any] | None: ...


def reads(config: Settings, owner: str | None = None) -> Reads:
    """The API's reads when TPUJOBS_API_URL is set, else Firestore's."""
    url = api_url()
    return ApiReads(config, url, caller(owner)) if url else StoreReads(config)


class ApiReads:
    """Reads through the `jobs` HTTP function, as `who` (deployed: the ID token's account)."""

    def __init__(self, config: Settings, url: str, who: str) -> None:
        self.config, self.url, self.who = config, url, who

    def _ask(self, request: dict[str, Any], missing_ok: bool = False) -> dict[str, Any] | None:
        return ask_api(self.config, self.url, request, self.who, missing_ok=missing_ok)

    def jobs(self, where: JobFilter, limit: int) -> dict[str, Any]:
        request: dict[str, Any] = {"action": "list", "limit": limit}
        given = (
            ("state", list(where.states)),
            ("owner", where.owner),
            ("name_prefix", where.name_prefix),
            ("labels", dict(where.labels)),
        )
        request.update({k: v for k, v in given if v})
        return self._ask(request) or {}

    def describe(self, job_id: str) -> dict[str, Any] | None:
        return self._ask({"action": "describe", "job_id": job_id}, missing_ok=True)

    def dead_letters(self, topic: str | None, limit: int) -> dict[str, Any]:
        request = {"action": "dead_letters", "limit": limit, **({"topic": topic} if topic else {})}
        return self._as_admin(request, lambda store: store.dead_letters(topic, limit))

    def rejections(self, limit: int) -> dict[str, Any]:
        return self._as_admin({"action": "rejections", "limit": limit}, lambda store: store.rejections(limit))

    def rejection(self, message_id: str) -> dict[str, Any] | None:
        return None  # a submission through the API is refused in its answer, never later

    def quotas(self) -> dict[str, Any]:
        return self._as_admin({"action": "quotas"}, lambda store: store.quotas())

    def pools(self) -> dict[str, Any]:
        return self._ask({"action": "pool-list"}) or {}

    def pool(self, name: str) -> dict[str, Any] | None:
        return self._ask({"action": "pool-describe", "name": name}, missing_ok=True)

    def _as_admin(self, request: dict[str, Any], directly: Callable[[StoreReads], dict[str, Any]]) -> dict[str, Any]:
        """An admin read through the API; refused (not in TPUJOBS_ADMINS), Firestore read with the
        caller's own credentials, so an admin by IAM, and anyone in the local stack, still reads
        it, and anyone else gets Firestore's refusal."""
        try:
            return self._ask(request) or {}
        except Refused as refused:
            if refused.status != 403:
                raise
        return directly(StoreReads(self.config))


class StoreReads:
    """Reads of Firestore with the user's own credentials, in the API's shapes."""

    def __init__(self, config: Settings) -> None:
        from google.cloud import firestore

        from tpujobs.adapters.firestore_store import FirestoreJobStore

        self.config = config
        self.client = firestore.Client(project=config.project)
        self.store = FirestoreJobStore(self.client)

    def jobs(self, where: JobFilter, limit: int) -> dict[str, Any]:
        from tpujobs.adapters.firestore_store import job_to_document
        from tpujobs.engine.api import to_json

        found = self.store.list_jobs(limit=limit, where=where)
        return {"jobs": [to_json(job_to_document(job)) for job in found]}

    def describe(self, job_id: str) -> dict[str, Any] | None:
        from tpujobs.adapters.firestore_store import job_to_document
        from tpujobs.cli.cloud_output import explorer_link
        from tpujobs.engine.api import to_json

        job = self.store.get(job_id)
        if job is None:
            return None
        return {
            "job": to_json(job_to_document(job)),
            "events": [to_json(e) for e in self.store.event_documents(job_id)],
            "attempts": [to_json(a) for a in self.store.attempt_documents(job_id)],
            "notifications": [to_json(n) for n in self.store.notification_documents(job_id)],
            "output_link": explorer_link(self.config, job_id, job.spec.cloud_logging),
        }

    def dead_letters(self, topic: str | None, limit: int) -> dict[str, Any]:
        from tpujobs.engine.api import dead_letter_document
        from tpujobs.runtime.instances import build_dead_letters, utc_now

        found = build_dead_letters(self.config, utc_now).list_dead_letters(topic=topic, limit=limit)
        return {"dead_letters": [dead_letter_document(letter) for letter in found]}

    def rejections(self, limit: int) -> dict[str, Any]:
        from tpujobs.engine.api import rejection_document

        return {"rejections": [rejection_document(r) for r in self.store.recent_rejections(limit=limit)]}

    def rejection(self, message_id: str) -> dict[str, Any] | None:
        from tpujobs.engine.api import rejection_document

        found = self.store.rejection(message_id)
        return None if found is None else rejection_document(found)

    def quotas(self) -> dict[str, Any]:
        from tpujobs.adapters.firestore_pools import FirestorePools
        from tpujobs.engine.api import quota_document

        return quota_document(FirestorePools(self.client))

    def pools(self) -> dict[str, Any]:
        from tpujobs.adapters.firestore_warm_pools import FirestoreWarmPools

        store = FirestoreWarmPools(self.client)
        return {"pools": [self._pool(store, pool) for pool in sorted(store.list_pools(), key=lambda p: p.name)]}

    def pool(self, name: str) -> dict[str, Any] | None:
        from tpujobs.adapters.firestore_warm_pools import FirestoreWarmPools
        from tpujobs.domain.spec import POOL_NAME_PATTERN

        store = FirestoreWarmPools(self.client)
        found = store.get(name) if re.match(POOL_NAME_PATTERN, name) else None  # no such name exists
        return None if found is None else {"pool": self._pool(store, found)}

    @staticmethod
    def _pool(store: FirestoreWarmPools, pool: Pool) -> dict[str, Any]:
        """The pool as the API shows it to those who may see its jobs: reading Firestore, you can."""
        from tpujobs.engine.api import WAITING_SHOWN, to_json
        from tpujobs.engine.warm_pools.summary import pool_summary
        from tpujobs.runtime.instances import utc_now

        return dict(to_json(pool_summary(pool, utc_now(), store.queue(pool.name, WAITING_SHOWN))))

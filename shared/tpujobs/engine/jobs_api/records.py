"""The `jobs` API's admin reads, for the CLI's dead-letters, rejections and quota show.

Admins only (`TPUJOBS_ADMINS`): dead letters and rejections hold other users' payloads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpujobs.engine.jobs_api.answers import (
    ApiError,
    Response,
    dead_letter_document,
    quota_document,
    rejection_document,
)
from tpujobs.engine.jobs_api.requests import DeadLettersRequest, NothingRequest, ReadRequest

if TYPE_CHECKING:
    from tpujobs.engine.ports import DeadLetterStore, JobDocuments, Pools
    from tpujobs.engine.settings import Settings


class Records:
    """The admin reads: dead letters, rejections and quotas."""

    def __init__(
        self, store: JobDocuments, pools: Pools | None, dead_letters: DeadLetterStore | None, settings: Settings
    ) -> None:
        """`pools`: the quota pools (None: no quotas); `dead_letters`: the deployment's (None: none kept)."""
        self.store = store
        self.pools = pools
        self.dead_letters_kept = dead_letters
        self.settings = settings

    def dead_letters(self, caller: str, request: DeadLettersRequest) -> Response:
        """Messages that failed too many deliveries, newest first (admins only)."""
        self._admin_only(caller, "dead letters")
        if self.dead_letters_kept is None:
            raise ApiError(503, "This deployment's API was built without its dead letters.")
        letters = self.dead_letters_kept.list_dead_letters(topic=request.topic, limit=request.limit)
        return Response(200, {"dead_letters": [dead_letter_document(letter) for letter in letters]})

    def rejections(self, caller: str, request: ReadRequest) -> Response:
        """Messages that could not become jobs, newest first, with the reason (admins only)."""
        self._admin_only(caller, "rejections")
        found = self.store.recent_rejections(limit=request.limit)
        return Response(200, {"rejections": [rejection_document(rejection) for rejection in found]})

    def quotas(self, caller: str, request: NothingRequest) -> Response:
        """Every limit (a zone's, a region's, a reservation's), the chips held under it and how
        many jobs wait for it, and what in `config/quotas` was skipped (admins only)."""
        self._admin_only(caller, "quotas")
        return Response(200, quota_document(self.pools))

    def _admin_only(self, caller: str, what: str) -> None:
        if caller not in self.settings.admins:
            raise ApiError(403, f"{caller} may not read {what}: only an admin (TPUJOBS_ADMINS) may.")

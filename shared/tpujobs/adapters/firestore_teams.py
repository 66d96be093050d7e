"""`config/teams` on Firestore: teams, their members and accounts, and their shares of the quota
limits (`tpujobs.domain.teams`), edited in the console or with `tpujobs team`.

A read takes `config/teams` and `config/quotas` in one round trip (the quotas say which shares
make no sense). An edit rewrites one team's field of the document by compare-and-set on the
update time it was read at (`firestore_cas`), as `FirestorePools` edits `config/quotas`: an
admin's edit in between makes it decide again on a fresh read, so neither is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from google.cloud import firestore
from google.cloud.firestore_v1.field_path import FieldPath

from tpujobs.adapters.firestore_cas import compare_and_set
from tpujobs.adapters.firestore_reads import transient_on_failure
from tpujobs.domain.quotas import QuotaBook
from tpujobs.domain.teams import TeamBook

if TYPE_CHECKING:
    from tpujobs.adapters.firestore_cas import Snapshot

CONFIG = "config"
TEAMS = "teams"
QUOTAS = "quotas"


class FirestoreTeams:
    """The `Teams` port on a Firestore client."""

    def __init__(self, client: firestore.Client) -> None:
        self._db = client

    def teams(self) -> TeamBook:
        refs = [self._db.collection(CONFIG).document(name) for name in (TEAMS, QUOTAS)]
        with transient_on_failure("read config/teams and config/quotas"):
            found = {s.id: s.to_dict() or {} for s in self._db.get_all(refs) if s.exists}
        return TeamBook(found.get(TEAMS), QuotaBook(found.get(QUOTAS)))

    def edit_team(self, name: str, edit: Callable[[dict[str, object]], dict[str, object]]) -> None:
        """Write team `name`'s field as `edit` leaves it (absent: deleted), if the document is
        still as read; else read again and decide again."""
        ref = self._db.collection(CONFIG).document(TEAMS)

        def change(snapshot: Snapshot) -> tuple[None, Callable[[], object] | None]:
            document = (snapshot.to_dict() or {}) if snapshot.exists else {}
            edited = edit(dict(document))
            if edited == document:
                return None, None
            if not snapshot.exists:
                return None, lambda: ref.create(edited)
            value = edited.get(name, firestore.DELETE_FIELD)
            option = self._db.write_option(last_update_time=snapshot.update_time)
            return None, lambda: ref.update({FieldPath(name).to_api_repr(): value}, option=option)

        compare_and_set(ref, change, what="config/teams", doing=f"edit team {name}")

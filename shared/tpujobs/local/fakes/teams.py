"""`config/teams` in memory: `FirestoreTeams` without Firestore.

The document is a dict and its version a counter every write moves, standing for Firestore's
update time: an edit decided on a version that moved is decided again on a fresh read, as the
adapter's compare-and-set does. The quotas, for the book's problems, are those of an
`InMemoryPools` when one is given.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

from tpujobs.domain.teams import TeamBook
from tpujobs.local.fakes.pools import InMemoryPools


class FakeTeams:
    """The `Teams` port in memory."""

    def __init__(self, pools: InMemoryPools | None = None, document: dict[str, Any] | None = None) -> None:
        self._pools = pools
        self._lock = threading.Lock()
        self._document: dict[str, Any] = copy.deepcopy(document or {})
        self._version = 0

    def teams(self) -> TeamBook:
        with self._lock:
            document = copy.deepcopy(self._document)
        return TeamBook(document, self._pools.quotas() if self._pools is not None else None)

    def edit_team(self, name: str, edit: Callable[[dict[str, object]], dict[str, object]]) -> None:
        while True:
            with self._lock:
                seen, version = copy.deepcopy(self._document), self._version
            edited = edit(copy.deepcopy(seen))  # outside the lock, as the adapter decides outside its write
            if edited == seen:
                return
            with self._lock:
                if self._version != version:
                    continue  # someone wrote first: decide again on a fresh read
                if name in edited:
                    self._document[name] = copy.deepcopy(edited[name])
                else:
                    self._document.pop(name, None)
                self._version += 1
                return

    def document(self) -> dict[str, Any]:
        """`config/teams` as stored, as an admin sees it in the console."""
        with self._lock:
            return copy.deepcopy(self._document)

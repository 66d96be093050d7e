"""Reading Firestore, written once for the job store's parts: errors translated through the one
table (adapters/google_errors.py), queries paged and counted, the client held."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from tpujobs.adapters.firestore_cas import FIRESTORE
from tpujobs.adapters.firestore_documents import JOBS
from tpujobs.adapters.google_errors import translated

if TYPE_CHECKING:
    from google.cloud import firestore


class OnFirestore:
    """A part of the job store: the client, and where a job's document is."""

    def __init__(self, client: firestore.Client) -> None:
        self._db = client

    def _job_ref(self, job_id: str) -> firestore.DocumentReference:
        return self._db.collection(JOBS).document(job_id)


def transient_on_failure(doing: str) -> AbstractContextManager[None]:
    """Firestore's errors through the one table (adapters/google_errors.py): TransientError
    when worth retrying, PermanentError when not, naming what was being done. An outcome a
    caller expects (AlreadyExists on create) is caught inside the block."""
    return translated(FIRESTORE, doing)


def count_of(query: Any, doing: str) -> int:
    """The number of documents the query matches, by Firestore's count aggregation."""
    with transient_on_failure(doing):
        result = query.count(alias="n").get()
    return int(result[0][0].value)


def paged(query: Any, page_size: int, doing: str) -> list[Any]:
    """Every document the query matches, `page_size` at a time: never a cap that would hide
    the rest."""
    return [doc for page in pages(query, page_size, doing) for doc in page]


def pages(query: Any, page_size: int, doing: str) -> Iterator[list[Any]]:
    """The query's documents a page at a time, each page read only when asked for. The query
    must be ordered (the last document of a page is the next cursor)."""
    after: Any = None
    while True:
        with transient_on_failure(doing):
            page = list((query if after is None else query.start_after(after)).limit(page_size).stream())
        yield page
        if len(page) < page_size:
            return
        after = page[-1]

"""The usage page's reads in memory (`engine.usage_report.UsageJobs`), on the in-memory job
store's documents: the adapter's two reads, in its order, projected and paged alike."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from tpujobs.adapters.firestore_documents import job_outline_from_document
from tpujobs.adapters.firestore_usage import PAGE_SIZE, USAGE_FIELDS
from tpujobs.domain.job import Job
from tpujobs.domain.states import ACTIVE
from tpujobs.local.fakes.documents import Collections, projected

_ACTIVE_STATES = frozenset(state.value for state in ACTIVE)


class InMemoryUsageJobs:
    """`UsageJobs` on an in-memory job store; `pages_read` counts the pages handed out."""

    def __init__(self, store: Collections) -> None:
        self.store = store
        self.pages_read = 0

    def overlapping(self, since: datetime, page_size: int = PAGE_SIZE) -> Iterator[list[Job]]:
        active = [d for _, d in self.store.job_documents() if d["state"] in _ACTIVE_STATES]
        ended = sorted(
            ((d["ended_at"], job_id, d) for job_id, d in self.store.job_documents() if d.get("ended_at") is not None),
            key=lambda found: found[:2],
        )
        for documents in (active, [d for at, _, d in ended if at >= since]):
            for start in range(0, len(documents), page_size):
                self.pages_read += 1
                yield [
                    job_outline_from_document(projected(d, USAGE_FIELDS)) for d in documents[start : start + page_size]
                ]

"""The usage page's reads on Firestore (`engine.usage_report.UsageJobs`): every job of a window.

Two queries, each paged with a cursor and no cap, projected to what the sums need (USAGE_FIELDS,
a few hundred bytes a job whatever its spec). Neither needs a composite index: `state IN` ordered
by document id (as `active_placements`), and a range on `ended_at` ordered by it (as
`ended_between`), both served by Firestore's single-field indexes.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING

from google.cloud import firestore

from tpujobs.adapters.firestore_documents import JOBS, job_outline_from_document
from tpujobs.adapters.firestore_reads import OnFirestore, pages
from tpujobs.domain.states import ACTIVE

if TYPE_CHECKING:
    from tpujobs.domain.job import Job

# What `job_outline_from_document` needs, and the usage page sums: owner, labels and usage.
USAGE_FIELDS = (
    "job_id",
    "name",
    "owner",
    "state",
    "zone",
    "created_at",
    "updated_at",
    "ended_at",
    "usage",
    "spec.labels",
    # what `tpujobs usage` groups and prices by: the team, the family, the tier
    "team",
    "on_demand",
    "spec.accelerator_type",
    "spec.capacity",
)
PAGE_SIZE = 500


class FirestoreUsageJobs(OnFirestore):
    """`UsageJobs` on Firestore."""

    def overlapping(self, since: datetime, page_size: int = PAGE_SIZE) -> Iterator[list[Job]]:
        jobs = self._db.collection(JOBS)
        active = (
            jobs.where(filter=firestore.FieldFilter("state", "in", sorted(state.value for state in ACTIVE)))
            .select(USAGE_FIELDS)
            .order_by("__name__")
        )
        ended = (
            jobs.where(filter=firestore.FieldFilter("ended_at", ">=", since))
            .select(USAGE_FIELDS)
            .order_by("ended_at")
            .order_by("__name__")
        )
        for query, doing in ((active, "list the jobs not yet ended"), (ended, "list the jobs ended since a day")):
            for page in pages(query, page_size, doing):
                if page:
                    yield [job_outline_from_document(doc.to_dict() or {}) for doc in page]

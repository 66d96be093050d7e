"""The job store in memory: `FirestoreJobStore`'s semantics without Firestore, one part per port.

Each part copies its adapter's semantics (ordering, paging, filters, what a missing document
returns); `tests/contract` runs the same tests against both. `job_documents` serves the other
fakes' queries over the jobs collection (`InMemoryPools`, `InMemoryWarmPools`).
"""

from __future__ import annotations

from tpujobs.local.fakes.job_reads import InMemoryJobQueries, InMemoryWorkerRecords
from tpujobs.local.fakes.job_records import InMemoryJobRecords
from tpujobs.local.fakes.message_records import InMemoryMessageRecords
from tpujobs.local.fakes.unit_secrets import InMemoryUnitSecrets


class InMemoryJobStore(
    InMemoryJobRecords, InMemoryWorkerRecords, InMemoryJobQueries, InMemoryMessageRecords, InMemoryUnitSecrets
):
    """`ports.JobStore` and `ports.JobDocuments` in memory, with the adapter's extras the local
    tools call (`rejections`, `workers`, `prune_expired`). `rejection_retention`: how long a
    rejection is kept (its `expire_at`)."""

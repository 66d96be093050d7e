"""The contract of the usage page's reads (`engine.usage_report.UsageJobs`): every job not yet
ended, then every job ended since a time, paged with a cursor and never capped, projected to what
the sums need (labels and usage kept, the command left out)."""

from __future__ import annotations

import pytest
from contract_data import a_job, clock

from tpujobs.domain.states import EventKind
from tpujobs.domain.transitions import Observation

CANCEL = Observation(EventKind.CANCEL_REQUESTED, None, "user", reason="Cancelled.")


@pytest.fixture
def usage_jobs(backend, request):
    if backend.name == "memory":
        from tpujobs.local.fakes.usage_jobs import InMemoryUsageJobs

        return InMemoryUsageJobs(backend.jobs)
    from tpujobs.adapters.firestore_usage import FirestoreUsageJobs

    return FirestoreUsageJobs(request.getfixturevalue("firestore_client"))


def test_the_window_reads_active_jobs_then_those_ended_since_page_by_page(backend, usage_jobs):
    """Active jobs in id order, then ended ones oldest end first; one ended before `since` is left
    out; pages of 2 hold them all; each job keeps its owner, labels and usage, not its command."""
    store = backend.jobs
    for job_id in ("live-b", "live-a", "live-c"):
        store.create(*a_job(job_id))
    for job_id, seconds in (("gone-old", 5), ("gone-2", 30), ("gone-1", 20)):
        store.create(*a_job(job_id))
        store.apply(job_id, CANCEL, lambda s=seconds: clock(s))
    pages = list(usage_jobs.overlapping(clock(10), page_size=2))
    assert [[job.job_id for job in page] for page in pages] == [["live-a", "live-b"], ["live-c"], ["gone-1", "gone-2"]]
    first = pages[0][0]
    assert first.owner == "ada@example.com" and first.spec.labels == {"team": "research"}
    assert "command" not in first.spec.model_fields_set
    ended = pages[2][0]
    assert ended.state.is_terminal and ended.ended_at == clock(20) and [u.chips for u in ended.usage] == [8]

"""The contract of what the attempt key's host binding reads from the job store: when a pool job's
unit was asked for, kept with the job (`ports.JobRecords`)."""

from __future__ import annotations

from datetime import timedelta

from contract_data import T0, ZONE, a_job, clock

from tpujobs.domain.states import EventKind
from tpujobs.domain.transitions import Decision, Observation


def test_a_job_put_on_a_unit_keeps_when_the_units_queued_resource_was_asked_for(backend):
    """Admitted onto a unit, the job reads back with the unit and its request time, as a timestamp."""
    store = backend.jobs
    store.create(*a_job(pool="demo"))
    asked = T0 - timedelta(hours=1)
    seen = Observation(
        EventKind.ADMITTED, 1, "submit", capacity_state="ACTIVE", unit="demo-u0-g1", zone=ZONE, unit_requested_at=asked
    )
    outcome = store.apply("train-1", seen, clock)
    assert isinstance(outcome, Decision)
    stored = store.get("train-1")
    assert stored == outcome.job
    assert (stored.warm_pool_unit, stored.unit_requested_at) == ("demo-u0-g1", asked)
    assert store.job_document(stored)["unit_requested_at"] == asked

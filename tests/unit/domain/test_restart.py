"""Resume and rerun of an ended job: the overrides allowed, and what decide() makes of a request."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tpujobs.domain import limits
from tpujobs.domain.accounting import AttemptUsage
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.naming import queued_resource_name
from tpujobs.domain.restart_overrides import REQUEST_MEMORY, describe_overrides, overridden_spec
from tpujobs.domain.spec import JobSpec, SpecError, parse_spec
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Decision, Ignored, Observation, decide

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
ENDED = NOW + timedelta(hours=1)
LATER = NOW + timedelta(days=2)


def spec(**changes: Any) -> JobSpec:
    data = {
        "job_id": "train-1",
        "name": "train",
        "owner": "alice",
        "accelerator_type": "v4-8",
        "command": "python train.py",
        "zones": ["us-central2-b", "us-east5-a"],
        "max_restarts": 2,
        **changes,
    }
    return parse_spec(data)


def ended_job(state: JobState = JobState.FAILED, **spec_changes: Any) -> Job:
    """A job at attempt 3 that used its restarts and ended in its second zone an hour in."""
    job, _ = new_job(spec(**spec_changes), "us-central2-b", NOW)
    usage = tuple(
        AttemptUsage(attempt=n, chips=4, waiting_since=NOW, held_from=NOW, ended_at=ENDED, zone="us-east5-a")
        for n in (1, 2, 3)
    )
    return job.evolve(
        state=state,
        attempt=3,
        restarts=2,
        zone="us-east5-a",
        queued_resource=queued_resource_name("train-1", 3),
        ended_at=ENDED,
        exit_code=1,
        usage=usage,
        event_seq=9,
    )


def request(kind: EventKind, **changes: Any) -> Observation:
    fields: dict[str, Any] = {"kind": kind, "attempt": None, "source": "user", "request_id": "req-1", **changes}
    return Observation(**fields)


def moved(result: Decision | Ignored) -> Decision:
    assert isinstance(result, Decision), f"expected a move, got {result!r}"
    return result


# --- overrides ---------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["command", "accelerator_type", "env", "name", "owner", "job_id", "slices"])
def test_an_override_of_a_field_that_makes_the_job_what_it_is_is_refused_naming_it(field: str) -> None:
    """Only zone, zones, capacity, max_restarts and time_limit may change; others are a sentence."""
    with pytest.raises(SpecError, match=f"'{field}' cannot be changed"):
        overridden_spec(spec(), {field: "x"})


def test_overrides_are_validated_as_the_spec_is_at_submit() -> None:
    """A bad value is refused by the spec's own rules, naming the field."""
    with pytest.raises(SpecError, match="max_restarts"):
        overridden_spec(spec(), {"max_restarts": 500})
    with pytest.raises(SpecError, match="time_limit"):
        overridden_spec(spec(), {"time_limit": "forever"})
    with pytest.raises(SpecError, match="capacity"):
        overridden_spec(spec(), {"capacity": "cheap"})


def test_a_zone_override_replaces_zones_and_zones_replace_zone() -> None:
    """`zone` and `zones` are one choice: the override's form wins, the other is cleared."""
    one = overridden_spec(spec(), {"zone": "us-east5-a"})
    assert (one.zone, one.zones, one.preferred_zones) == ("us-east5-a", None, ("us-east5-a",))
    many = overridden_spec(one, {"zones": ["us-east5-a", "us-central2-b"]})
    assert (many.zone, many.preferred_zones) == (None, ("us-east5-a", "us-central2-b"))
    with pytest.raises(SpecError, match="either zone or zones"):
        overridden_spec(spec(), {"zone": "us-east5-a", "zones": ["us-east5-a"]})


def test_leaving_reserved_capacity_drops_its_reservation_and_leaving_spot_its_fallback() -> None:
    """Fields that only mean something on the old capacity go with it, and the change says so."""
    reserved = spec(capacity="reserved", reservation="team-a")
    spot = overridden_spec(reserved, {"capacity": "spot"})
    assert (spot.capacity, spot.reservation) == ("spot", None)
    assert describe_overrides(reserved, spot) == "capacity=spot, reservation=none"
    fallback = spec(capacity="spot", on_demand_after_preemptions=2)
    assert overridden_spec(fallback, {"capacity": "on-demand"}).on_demand_after_preemptions is None
    assert overridden_spec(fallback, {"max_restarts": 4}).on_demand_after_preemptions == 2


def test_the_overridden_spec_keeps_everything_else() -> None:
    """The command, owner and job_id of the new attempt are the job's own."""
    before = spec(env={"STEPS": "10"})
    after = overridden_spec(before, {"max_restarts": 7, "time_limit": "2h"})
    assert after.model_copy(update={"max_restarts": 2, "time_limit": None}) == before
    assert describe_overrides(before, after) == "max_restarts=7, time_limit=2h"
    assert overridden_spec(before, {}) is before


# --- decide() ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "kind", "resumes"),
    [
        (JobState.FAILED, EventKind.RESUME_REQUESTED, True),
        (JobState.CANCELLED, EventKind.RESUME_REQUESTED, True),
        (JobState.FAILED, EventKind.RERUN_REQUESTED, False),
        (JobState.CANCELLED, EventKind.RERUN_REQUESTED, False),
        (JobState.SUCCEEDED, EventKind.RERUN_REQUESTED, False),
    ],
)
def test_a_restart_queues_the_next_attempt_with_a_fresh_budget(state: JobState, kind: EventKind, resumes: bool) -> None:
    """The next attempt (a queued-resource name never used) waits QUEUED in the first zone,
    restarts counted from zero, resuming or not; the job is no longer ended."""
    job = ended_job(state)
    decision = moved(decide(job, request(kind, reason="Resumed by alice."), LATER))
    after = decision.job
    assert after.state is JobState.QUEUED
    assert (after.attempt, after.queued_resource) == (4, queued_resource_name("train-1", 4))
    assert (after.restarts, after.resume_next, after.zone) == (0, resumes, "us-central2-b")
    assert (after.ended_at, after.exit_code, after.state_reason) == (None, None, "Resumed by alice.")
    assert after.restart_requests == ("req-1",)
    assert (decision.event.from_state, decision.event.source) == (state, "user")


def test_a_resume_is_refused_for_a_job_that_succeeded_or_has_not_ended() -> None:
    """Resume continues a failed or cancelled job only; an active job is no longer ended."""
    for state in (JobState.SUCCEEDED, JobState.QUEUED, JobState.RUNNING, JobState.RECOVERING):
        assert isinstance(decide(ended_job(state), request(EventKind.RESUME_REQUESTED), LATER), Ignored)
    assert isinstance(decide(ended_job(JobState.RUNNING), request(EventKind.RERUN_REQUESTED), LATER), Ignored)


def test_the_same_request_id_starts_nothing_after_the_attempt_it_started_ended_too() -> None:
    """A retried request is remembered on the job: even once the job has failed again."""
    first = moved(decide(ended_job(), request(EventKind.RESUME_REQUESTED), LATER)).job
    failed_again = first.evolve(state=JobState.FAILED, ended_at=LATER)
    again = decide(failed_again, request(EventKind.RESUME_REQUESTED), LATER)
    assert isinstance(again, Ignored) and "req-1" in again.reason
    other = moved(decide(failed_again, request(EventKind.RESUME_REQUESTED, request_id="req-2"), LATER))
    assert other.job.attempt == 5 and other.job.restart_requests == ("req-1", "req-2")


def test_a_job_remembers_only_its_latest_request_ids() -> None:
    """The memory is bounded: the oldest id goes first."""
    job = ended_job().evolve(restart_requests=tuple(f"r{n}" for n in range(REQUEST_MEMORY)))
    after = moved(decide(job, request(EventKind.RERUN_REQUESTED, request_id="new"), LATER)).job
    assert len(after.restart_requests) == REQUEST_MEMORY
    assert after.restart_requests[-1] == "new" and "r0" not in after.restart_requests


def test_the_overridden_spec_is_the_new_attempts_and_its_zone_comes_from_it() -> None:
    """Overrides travel in the observation's spec; the job runs with it from the next attempt."""
    job = ended_job()
    changed = overridden_spec(job.spec, {"zone": "us-east5-a", "max_restarts": 9})
    after = moved(decide(job, request(EventKind.RESUME_REQUESTED, spec=changed), LATER)).job
    assert after.spec == changed and after.zone == "us-east5-a" and after.spec.max_restarts == 9


def test_the_new_attempt_waits_from_the_request_not_from_the_old_end() -> None:
    """Accounting gets one more attempt, whose queue wait starts at the resume; the old ones stay."""
    job = ended_job()
    after = moved(decide(job, request(EventKind.RESUME_REQUESTED), LATER)).job
    assert after.usage[:-1] == job.usage
    new = after.usage[-1]
    assert (new.attempt, new.waiting_since, new.zone, new.ended_at) == (4, LATER, "us-central2-b", None)


def test_a_capacity_override_ends_the_on_demand_fallback_of_the_old_capacity() -> None:
    """A spot job that had fallen back to on-demand asks for what its new capacity says."""
    job = ended_job(capacity="spot").evolve(on_demand=True)
    kept = moved(decide(job, request(EventKind.RESUME_REQUESTED), LATER)).job
    assert kept.on_demand is True
    changed = overridden_spec(job.spec, {"capacity": "on-demand"})
    assert moved(decide(job, request(EventKind.RESUME_REQUESTED, spec=changed), LATER)).job.on_demand is False


def test_the_time_limit_counts_again_from_the_resumed_attempts_capacity() -> None:
    """A job resumed two days after its first start is not past a 2h time_limit: the clock starts
    again at the new attempt's capacity, and runs out 2h after it."""
    job = ended_job(time_limit="2h")
    after = moved(decide(job, request(EventKind.RESUME_REQUESTED), LATER)).job
    assert after.run_first_attempt == 4
    held = LATER + timedelta(minutes=5)
    running = after.evolve(state=JobState.RUNNING, usage=(*after.usage[:-1], replace(after.usage[-1], held_from=held)))
    assert limits.limit_reached(running, held + timedelta(minutes=119)) is None
    reached = limits.limit_reached(running, held + timedelta(minutes=121))
    assert reached is not None and reached.limit == limits.TIME_LIMIT

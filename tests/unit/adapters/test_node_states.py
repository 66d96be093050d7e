"""What each node state and health Google reports means for the attempt on that node.

The tables in `tpujobs.adapters.tpu` are held to the installed tpu_v2 enums, so a state the
API gains shows up here before it is met in production; the grace of suspect hosts is
decided by the pure domain (`decide` on HOSTS_SUSPECT, `Job.hosts_lost_after`).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from google.cloud import tpu_v2

from tpujobs.adapters.tpu import NODE_HEALTH, NODE_STATES, host_verdict
from tpujobs.domain.job import new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import EventKind, JobState
from tpujobs.domain.transitions import Decision, Ignored, Observation, decide

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


def test_every_node_state_of_the_api_has_a_documented_verdict() -> None:
    """Each tpu_v2 Node.State member is in NODE_STATES with a verdict and a sentence, and nothing else is."""
    assert set(NODE_STATES) == {member.name for member in tpu_v2.Node.State}
    for name, (verdict, why) in NODE_STATES.items():
        assert verdict in ("ok", "suspect", "lost") and why, name


def test_every_node_health_of_the_api_has_a_documented_verdict() -> None:
    """Each tpu_v2 Node.Health member is in NODE_HEALTH with a verdict and a sentence."""
    assert set(NODE_HEALTH) == {member.name for member in tpu_v2.Node.Health}
    for name, (verdict, why) in NODE_HEALTH.items():
        assert verdict in ("ok", "suspect", "lost") and why, name


@pytest.mark.parametrize(
    ("state", "health", "verdict", "condition"),
    [
        ("READY", "HEALTHY", "ok", "state READY"),
        ("READY", "HEALTH_UNSPECIFIED", "ok", "state READY"),
        ("CREATING", "HEALTH_UNSPECIFIED", "ok", "state CREATING"),
        ("READY", "TIMEOUT", "suspect", "health TIMEOUT"),
        ("READY", "UNHEALTHY_TENSORFLOW", "suspect", "health UNHEALTHY_TENSORFLOW"),
        ("RESTARTING", "HEALTHY", "suspect", "state RESTARTING"),
        ("UNKNOWN", "HEALTH_UNSPECIFIED", "suspect", "state UNKNOWN"),
        ("READY", "UNHEALTHY_MAINTENANCE", "lost", "health UNHEALTHY_MAINTENANCE"),
        ("REPAIRING", "UNHEALTHY_MAINTENANCE", "lost", "state REPAIRING"),
        ("PREEMPTED", "TIMEOUT", "lost", "state PREEMPTED"),
        ("TERMINATED", "HEALTHY", "lost", "state TERMINATED"),
        ("RESTARTING", "UNHEALTHY_MAINTENANCE", "lost", "health UNHEALTHY_MAINTENANCE"),
        ("A_STATE_FROM_THE_FUTURE", "HEALTHY", "suspect", "state A_STATE_FROM_THE_FUTURE"),
    ],
)
def test_a_node_is_judged_by_the_worse_of_its_state_and_health(state, health, verdict, condition) -> None:
    """Lost beats suspect beats ok; a name the table lacks is suspect, never acted on at once."""
    assert host_verdict(state, health) == (verdict, condition)


def _running_job():
    spec = parse_spec(
        {"job_id": "train-1", "name": "train", "owner": "ada", "accelerator_type": "v4-8", "command": "x"}
    )
    job, _ = new_job(spec, "us-central2-b", NOW)
    return job.evolve(state=JobState.RUNNING, attempt=1)


def _suspect(job, at, *hosts):
    return decide(job, Observation(EventKind.HOSTS_SUSPECT, job.attempt, "reconciler", hosts=hosts), at)


def test_a_suspect_host_keeps_the_time_it_was_first_seen_until_it_recovers() -> None:
    """Seen at 12:00, seen again at 12:02 with another condition: still since 12:00; healthy: forgotten."""
    job = _running_job()
    first = _suspect(job, NOW, ("train-1-a1", "health TIMEOUT"))
    assert isinstance(first, Decision) and first.job.state is JobState.RUNNING
    assert [(h.node, h.first_seen_at) for h in first.job.suspect_hosts] == [("train-1-a1", NOW)]

    again = _suspect(first.job, NOW + timedelta(minutes=2), ("train-1-a1", "health TIMEOUT"))
    assert isinstance(again, Ignored)  # a tick that sees the same thing writes nothing

    changed = _suspect(first.job, NOW + timedelta(minutes=2), ("train-1-a1", "state RESTARTING"))
    assert isinstance(changed, Decision)
    assert [(h.condition, h.first_seen_at) for h in changed.job.suspect_hosts] == [("state RESTARTING", NOW)]

    healthy = _suspect(changed.job, NOW + timedelta(minutes=3))
    assert isinstance(healthy, Decision) and healthy.job.suspect_hosts == ()
    assert "healthy again" in healthy.event.reason

    later = _suspect(healthy.job, NOW + timedelta(minutes=4), ("train-1-a1", "health TIMEOUT"))
    assert isinstance(later, Decision)
    assert [h.first_seen_at for h in later.job.suspect_hosts] == [NOW + timedelta(minutes=4)]  # a new episode


def test_a_suspect_host_is_lost_only_past_the_grace() -> None:
    """`hosts_lost_after` names the hosts whose condition outlasted the grace, and only those."""
    job = _running_job()
    decision = _suspect(job, NOW, ("train-1-a1", "health TIMEOUT"))
    assert isinstance(decision, Decision)
    watched = decision.job
    assert watched.hosts_lost_after(300, NOW + timedelta(seconds=300)) == ()
    (lost,) = watched.hosts_lost_after(300, NOW + timedelta(seconds=301))
    assert (lost.node, lost.condition) == ("train-1-a1", "health TIMEOUT")


def test_a_new_attempt_forgets_the_last_attempts_suspect_hosts() -> None:
    """Suspect hosts belong to one attempt's nodes: the next attempt starts with none."""
    job = _running_job()
    decision = _suspect(job, NOW, ("train-1-a1", "health TIMEOUT"))
    assert isinstance(decision, Decision)
    lost = decide(decision.job, Observation(EventKind.CAPACITY_LOST, 1, "reconciler", reason="gone"), NOW)
    assert isinstance(lost, Decision) and lost.job.state is JobState.RECOVERING
    following = decide(
        lost.job, Observation(EventKind.NEXT_ATTEMPT_REQUESTED, 1, "tpu", capacity_state="CREATING"), NOW
    )
    assert isinstance(following, Decision) and following.job.suspect_hosts == ()

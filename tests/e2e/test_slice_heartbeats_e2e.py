"""A hung host of a multi-host slice, found by its worker 0 over the slice's network.

A v4-16 (one slice of 2 hosts) runs `sleep`; worker 1's agent is frozen (SIGSTOP) while its
simulated node stays healthy, so neither the TPU API nor a notice says anything. Worker 0
stops hearing its beats and reports it (`peer_silent`): the attempt is recovered by the
agent's word, not by the reconciler's silent-worker query (whose timeout is a minute).
"""

from __future__ import annotations

import os
import shlex
import signal

import pytest

from tpujobs.domain.states import JobState
from tpujobs.engine.jobs.worker_records import SPOKEN_FOR
from tpujobs.engine.topology import CONTROL
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.e2e


def test_a_frozen_peer_agent_is_reported_by_worker_0_and_its_attempt_recovered(env, submit_job):
    """Worker 1 is spoken for (its record has no deadline of its own); frozen, it is reported by worker 0 and the
    job goes on at attempt 2."""
    job_id = submit_job(prefix="hung-peer", accelerator_type="v4-16", command="sleep 600", max_restarts=2)

    def spoken_for():
        records = {w.worker: w for w in env["store"].attempt_workers(job_id, 1)}
        peer = records.get("0-1")
        return records if peer is not None and peer.silent_after == SPOKEN_FOR else None

    spoken_for.__doc__ = f"{job_id}: worker 0-1 spoken for by worker 0"
    wait_for(spoken_for, timeout=120)
    job = env["store"].get(job_id)
    assert (job.state, job.attempt) == (JobState.RUNNING, 1)
    peer = next(w for w in env["control"].workers(env["zone"], job.queued_resource) if w["worker"] == 1)
    os.kill(int(peer["pid"]), signal.SIGSTOP)
    try:

        def next_attempt():
            found = env["store"].get(job_id)
            return found if found is not None and found.attempt == 2 else None

        next_attempt.__doc__ = f"{job_id} at attempt 2"
        wait_for(next_attempt, timeout=120)
    finally:
        os.kill(int(peer["pid"]), signal.SIGCONT)
    lost = [e for e in env["store"].events(job_id) if e.to_state is JobState.RECOVERING]
    assert len(lost) == 1, [e.reason for e in lost]
    assert lost[0].source == "agent" and "Worker 0-1 of attempt 1 went silent" in lost[0].reason, lost[0].reason
    env["publisher"].publish_json(CONTROL, {"action": "cancel", "job_id": job_id, "owner": "ada@example.com"})


def test_worker_0_that_succeeds_first_stays_watched_while_its_peer_runs(env, submit_job, tmp_path):
    """Worker 0's command ends first: its `exited` 0 says it still hears worker 1, so its record stays live with a
    deadline (worker 1, spoken for, has none of its own); the job succeeds when worker 1 ends."""
    flag = shlex.quote(str(tmp_path / "worker-1-runs"))
    # Worker 0 ends 5 s after worker 1's command began (its agent beats to worker 0 every 2 s from before it).
    command = (
        f'if [ "$TPUJOBS_WORKER_ID" = 0 ]; then while [ ! -e {flag} ]; do sleep 0.2; done; sleep 5; '
        f"else touch {flag}; sleep 20; fi"
    )
    job_id = submit_job(prefix="speaker-ends", accelerator_type="v4-16", command=command)

    def speaking():
        records = {w.worker: w for w in env["store"].attempt_workers(job_id, 1)}
        zero = records.get("0-0")
        return records if zero is not None and zero.exit_code == 0 else None

    speaking.__doc__ = f"{job_id}: worker 0-0 exited"
    records = wait_for(speaking, timeout=120)
    zero = records["0-0"]
    assert (zero.live, zero.speaks_for_peers) == (True, True), zero
    assert zero.silent_after is not None and zero.silent_after < SPOKEN_FOR
    assert records["0-1"].silent_after == SPOKEN_FOR and records["0-1"].exit_code is None
    assert env["store"].get(job_id).state is JobState.RUNNING

    def ended():
        found = env["store"].get(job_id)
        return found if found is not None and found.state.is_terminal else None

    ended.__doc__ = f"{job_id} ended"
    assert wait_for(ended, timeout=120).state is JobState.SUCCEEDED

"""The control plane against each unkind thing Google does, end to end on the local stack.

Every behaviour is driven as a user would drive it, through `tpujobs dev fault ...` (or
`tpujobs dev preempt`), against a local stack of their own (faults/conftest.py): jobs go
through Pub/Sub to the functions, the simulator runs their startup scripts, the agents
report. Each test then shows the control plane's response in the job's record and timeline,
and in what the simulator saw. Planned faults are cleared after every test, so none leaks
into the next.
"""

from __future__ import annotations

import json
import re
import shlex
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tpujobs.cli import app
from tpujobs.domain.states import JobState
from tpujobs.engine.topology import CONTROL
from tpujobs.local.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e-faults")]  # a stack of its own (faults/conftest.py)

OWNER = "ada@example.com"
LONG_GRACE_S = 60.0  # the e2e stack's is 10 s (E2E_WAITS); production's 300 s is too long to wait out here


# --- driving: the CLI, as a user types it ---------------------------------------------------


def tpujobs(*args: str) -> Any:
    """`tpujobs ARGS` against the local stack (TPUJOBS_STATE_DIR); its result, checked."""
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, f"tpujobs {shlex.join(args)}: {result.output}"
    return result


def fault(*args: str) -> str:
    """`tpujobs dev fault ARGS`; what it said."""
    return str(tpujobs("dev", "fault", *args).output)


def planned() -> dict[str, Any]:
    """`tpujobs dev fault show`: the planned errors per method and the no-boot budget."""
    return dict(json.loads(tpujobs("dev", "fault", "show").stdout))


@pytest.fixture(autouse=True)
def no_fault_outlives_its_test(env) -> Iterator[None]:
    yield
    CliRunner().invoke(app, ["dev", "fault", "clear"])


# --- observing: the job's record and timeline, the simulator's state -------------------------


def job_of(env, job_id: str):
    return env["store"].get(job_id)


def until(env, job_id: str, wanted: Callable[[Any], bool], what: str, timeout: float = 90.0):
    """The job once `wanted(job)` holds; a test failure naming `what` (and where the job is) if not."""

    def probe():
        job = job_of(env, job_id)
        return job if job is not None and wanted(job) else None

    probe.__doc__ = f"{job_id}: {what}"
    try:
        return wait_for(probe, timeout=timeout)
    except AssertionError:
        job = job_of(env, job_id)
        where = "absent" if job is None else f"{job.state.value} at attempt {job.attempt}: {job.state_reason}"
        raise AssertionError(f"{job_id} never {what} ({where})") from None


def running_at(env, job_id: str, attempt: int):
    return until(
        env, job_id, lambda j: j.state is JobState.RUNNING and j.attempt == attempt, f"RUNNING at attempt {attempt}"
    )


def ended(env, job_id: str, timeout: float = 90.0):
    return until(env, job_id, lambda j: j.state.is_terminal, "ended", timeout)


def timeline(env, job_id: str) -> list[Any]:
    return list(env["store"].events(job_id))


def event_saying(env, job_id: str, text: str, timeout: float = 90.0):
    """The first event of the job's timeline whose reason holds `text`, once there is one."""

    def probe():
        return next((e for e in timeline(env, job_id) if text in e.reason), None)

    probe.__doc__ = f"an event of {job_id} saying {text!r}"
    return wait_for(probe, timeout=timeout)


def recoveries(env, job_id: str) -> list[Any]:
    return [e for e in timeline(env, job_id) if e.to_state is JobState.RECOVERING]


def simulator(env, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """The simulator's control API (what a test sets up or reads, never the fault itself)."""
    return env["control"].call("GET" if body is None else "POST", path, body)


def workers_of(env, zone: str, queued_resource: str) -> list[dict[str, Any]]:
    return list(simulator(env, f"queuedResources/{zone}/{queued_resource}:workers")["workers"])


def cancel(env, job_id: str) -> None:
    env["publisher"].publish_json(CONTROL, {"action": "cancel", "job_id": job_id, "owner": OWNER})


@pytest.fixture
def jobs(env, submit_job) -> Iterator[Callable[..., str]]:
    """`jobs(prefix=..., **spec)`: a one-host v4-8 job, submitted; every one is cancelled after the test."""
    made: list[str] = []

    def submit(prefix: str = "gb", **spec: Any) -> str:
        job_id = submit_job(prefix=prefix, **{"accelerator_type": "v4-8", "owner": OWNER, **spec})
        made.append(job_id)
        return job_id

    yield submit
    for job_id in made:
        cancel(env, job_id)


# --- transient errors of the TPU API ----------------------------------------------------------

BLIPS = [
    ("create", "503", ()),
    ("create", "UNKNOWN", ()),
    ("create", "CANCELLED", ()),
    ("create", "DEADLINE_EXCEEDED", ("--applied",)),  # it was created; only the answer was lost
    ("get", "UNKNOWN", ()),
    ("list", "CANCELLED", ()),
    ("list", "503", ()),
]


@pytest.mark.parametrize(
    ("method", "code", "extra"), BLIPS, ids=[f"{m}-{c}{'-applied' if x else ''}" for m, c, x in BLIPS]
)
def test_a_transient_api_error_never_fails_a_job(env, jobs, method, code, extra):
    """Two calls of one method fail with a transient code; a job allowed no restart still runs once and SUCCEEDS."""
    fault("error", "--method", method, "--code", code, "--count", "2", *extra)
    job_id = jobs(prefix="blip", command="sleep 5; echo blip-ok", max_restarts=0)
    wait_for(lambda: planned()["errors"][method] == [], timeout=60)  # both were met
    job = ended(env, job_id)
    assert job.state is JobState.SUCCEEDED, job.state_reason
    assert (job.attempt, job.restarts) == (1, 0)
    assert all(e.to_state is not JobState.FAILED for e in timeline(env, job_id))


# --- quota ------------------------------------------------------------------------------------


def test_a_quota_429_leaves_the_job_waiting_saying_so_and_it_runs_once_the_quota_frees(env, jobs):
    """create answers 429 RESOURCE_QUOTA_EXCEEDED: the job waits, PROVISIONING with a reason naming the quota; cleared,
    it runs at attempt 1."""
    fault("error", "--method", "create", "--code", "429", "--quota", "--count", "100")
    job_id = jobs(prefix="quota", command="echo quota-ok", max_restarts=0)
    waiting = until(env, job_id, lambda j: "quota exhausted" in j.state_reason.lower(), "said it waits for quota")
    assert waiting.state is JobState.PROVISIONING and waiting.attempt == 1
    left = len(planned()["errors"]["create"])
    # Two reconciler ticks ask again and are refused again: still waiting, not failed.
    wait_for(lambda: len(planned()["errors"]["create"]) <= left - 2, timeout=30, interval=0.5, what="two asks more")
    still = job_of(env, job_id)
    assert (still.state, still.attempt, still.restarts) == (JobState.PROVISIONING, 1, 0), still.state_reason
    fault("clear")
    job = ended(env, job_id)
    assert job.state is JobState.SUCCEEDED, job.state_reason
    assert (job.attempt, job.restarts) == (1, 0)


# --- hosts that never boot --------------------------------------------------------------------


def test_a_host_that_never_boots_is_recovered_by_the_boot_timeout(env, jobs):
    """The first queued resource's hosts never run their startup script: lost after the boot timeout; attempt 2 runs and
    SUCCEEDS."""
    fault("no-boot", "--count", "1")
    job_id = jobs(prefix="noboot", command="echo booted-ok", max_restarts=2)
    lost = event_saying(env, job_id, "never booted", timeout=120)
    assert lost.attempt == 1 and lost.source == "reconciler"
    job = ended(env, job_id)
    assert job.state is JobState.SUCCEEDED, job.state_reason
    assert (job.attempt, job.restarts) == (2, 1)
    assert workers_of(env, env["zone"], f"{job_id}-a1") == []  # nothing ever ran there


# --- reboots ----------------------------------------------------------------------------------


def test_a_rebooted_host_never_runs_the_command_twice_and_the_job_resumes_at_a_new_attempt(env, jobs, tmp_path: Path):
    """Worker 1 of a v4-16 is reset: its startup script runs again, its agent reports `rebooted` and runs nothing;
    attempt 2 runs."""
    runs = tmp_path / "runs"
    runs.mkdir()
    marker = shlex.quote(str(runs))
    command = (
        f'echo "$TPUJOBS_ATTEMPT" >> {marker}/attempt-$TPUJOBS_ATTEMPT-worker-$TPUJOBS_WORKER_ID; '
        'if [ "$TPUJOBS_ATTEMPT" = 1 ]; then sleep 600; fi; echo done'
    )
    job_id = jobs(prefix="reboot", accelerator_type="v4-16", command=command, max_restarts=2)
    running_at(env, job_id, 1)
    wait_for(lambda: len(list(runs.glob("attempt-1-worker-*"))) == 2)
    fault("reboot", job_id, "--worker", "1")
    lost = event_saying(env, job_id, "Rebooted: worker 0-1 of attempt 1 started over")
    assert lost.to_state is JobState.RECOVERING and lost.source == "agent"
    job = ended(env, job_id)
    assert job.state is JobState.SUCCEEDED, job.state_reason
    assert (job.attempt, job.restarts) == (2, 1)
    assert (runs / "attempt-1-worker-1").read_text() == "1\n"  # started once, never again
    assert (runs / "attempt-1-worker-0").read_text() == "1\n"
    assert sorted(p.name for p in runs.glob("attempt-2-*")) == ["attempt-2-worker-0", "attempt-2-worker-1"]
    rebooted = [w for w in workers_of(env, env["zone"], f"{job_id}-a1") if w["worker"] == 1]
    assert [w["boot"] for w in rebooted] == [2]  # the script did run a second time


# --- maintenance ------------------------------------------------------------------------------


def test_a_maintenance_event_is_a_preemption_notice_and_the_job_resumes(env, jobs):
    """TERMINATE_ON_HOST_MAINTENANCE: the agent's one notice loses the attempt at once, the timeline names the
    maintenance, attempt 2 SUCCEEDS."""
    job_id = jobs(
        prefix="maint",
        command='if [ "$TPUJOBS_ATTEMPT" = 1 ]; then sleep 600; fi; echo "resumed=$TPUJOBS_RESUME"',
        max_restarts=2,
    )
    running_at(env, job_id, 1)
    fault("maintenance", job_id, "--notice", "30")
    lost = event_saying(env, job_id, "maintenance-event is TERMINATE_ON_HOST_MAINTENANCE")
    assert lost.to_state is JobState.RECOVERING and lost.source == "agent" and lost.attempt == 1
    job = ended(env, job_id)
    assert job.state is JobState.SUCCEEDED, job.state_reason
    assert (job.attempt, job.restarts, job.resume_next) == (2, 1, True)
    assert len(recoveries(env, job_id)) == 1


# --- node health and state: conditions that often pass ---------------------------------------

# (verb, condition, how it is shown in the timeline, the verb and value that end it)
CONDITIONS = [
    ("node-health", "TIMEOUT", "health TIMEOUT", ("node-health", "HEALTHY")),
    ("node-health", "UNHEALTHY_TENSORFLOW", "health UNHEALTHY_TENSORFLOW", ("node-health", "HEALTHY")),
    ("node-state", "UNKNOWN", "state UNKNOWN", ("node-state", "READY")),
    ("node-state", "RESTARTING", "state RESTARTING", ("node-state", "READY")),
]
IDS = [c[1] for c in CONDITIONS]
GRACE = re.compile(r"a host is lost if its condition lasts ([0-9]+) s")


def wait_for_flag(flag: Path) -> str:
    """A command that runs until the test creates `flag` at attempt 1, then succeeds."""
    quoted = shlex.quote(str(flag))
    return f'while [ "$TPUJOBS_ATTEMPT" = 1 ] && [ ! -e {quoted} ]; do sleep 0.2; done; echo flag-seen'


def watching(env, job_id: str, shown: str):
    """The reconciler's `Watching:` event for a node shown in a condition, and the grace it names."""
    event = event_saying(env, job_id, f"is {shown}; a host is lost if", timeout=60)
    match = GRACE.search(event.reason)
    assert match, event.reason
    return event, float(match.group(1))


@pytest.mark.parametrize(("verb", "condition", "shown", "ending"), CONDITIONS, ids=IDS)
def test_a_short_blip_of_a_passing_condition_changes_nothing(env, jobs, tmp_path, verb, condition, shown, ending):
    """The node is shown in the condition, watched, then healthy again within the grace: no restart, the job SUCCEEDS at
    attempt 1."""
    flag = tmp_path / "done"
    job_id = jobs(prefix="blipnode", command=wait_for_flag(flag), max_restarts=2)
    running_at(env, job_id, 1)
    fault(verb, job_id, condition)
    _, grace = watching(env, job_id, shown)
    fault(ending[0], job_id, ending[1])
    event_saying(env, job_id, "back to a definite, healthy state", timeout=60)
    flag.touch()
    job = ended(env, job_id)
    assert job.state is JobState.SUCCEEDED, job.state_reason
    assert (job.attempt, job.restarts) == (1, 0)
    assert recoveries(env, job_id) == [] and grace > 0


@pytest.mark.parametrize(("verb", "condition", "shown", "ending"), CONDITIONS, ids=IDS)
def test_a_passing_condition_that_lasts_past_the_grace_loses_the_host(
    env, jobs, tmp_path, verb, condition, shown, ending
):
    """The node stays in the condition: after the grace the host is lost, attempt 2 runs and SUCCEEDS."""
    job_id = jobs(prefix="lastnode", command=wait_for_flag(tmp_path / "never"), max_restarts=2)
    running_at(env, job_id, 1)
    fault(verb, job_id, condition)
    seen, grace = watching(env, job_id, shown)
    assert grace <= LONG_GRACE_S, f"the local stack's unhealthy grace ({grace:g} s) is too long to wait out"
    lost = event_saying(env, job_id, "grace: the host is lost", timeout=grace + 60)
    assert lost.to_state is JobState.RECOVERING and lost.attempt == 1
    assert (lost.at - seen.at).total_seconds() >= grace  # never before the grace was over
    job = ended(env, job_id)
    assert job.state is JobState.SUCCEEDED, job.state_reason
    assert (job.attempt, job.restarts) == (2, 1)


# --- dead capacity ----------------------------------------------------------------------------

DEAD_ZONE = "us-west4-a"  # a pool of its own, so its capacity limit holds back no other test


@pytest.fixture
def one_slice_of_capacity(env) -> Iterator[str]:
    """The simulator has chips for one v5litepod-8 in DEAD_ZONE; the limit is lifted afterwards."""
    pool = f"v5litepod@{DEAD_ZONE}"
    before = dict(simulator(env, "config").get("capacity") or {})
    simulator(env, "config", {"capacity": {**before, pool: 8}})
    yield pool
    simulator(env, "config", {"capacity": before})


class Watcher:
    """The states the simulator shows for a job's first two queued resources, polled in a thread."""

    def __init__(self, env, job_id: str) -> None:
        self.env = env
        self.names = (f"{job_id}-a1", f"{job_id}-a2")
        self.seen: list[tuple[str | None, str | None]] = []  # (a1 state, a2 state); None: absent
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            states = {
                qr["name"].rsplit("/", 1)[-1]: qr["state"]["state"]
                for qr in simulator(self.env, "state")["queuedResources"]
            }
            self.seen.append((states.get(self.names[0]), states.get(self.names[1])))

    def stop(self) -> list[tuple[str | None, str | None]]:
        self._stop.set()
        self._thread.join(10)
        return self.seen


def test_a_preempted_resource_holds_its_chips_until_deleted_and_the_job_still_gets_them(
    env, jobs, one_slice_of_capacity
):
    """Chips for one slice: the SUSPENDED attempt 1 holds them while it is deleted (slowly); attempt 2 waits for them,
    then RUNS."""
    job_id = jobs(
        prefix="dead",
        accelerator_type="v5litepod-8",
        zone=DEAD_ZONE,
        command='if [ "$TPUJOBS_ATTEMPT" = 1 ]; then sleep 600; fi; echo got-the-chips',
        max_restarts=2,
    )
    running_at(env, job_id, 1)
    watcher = Watcher(env, job_id)
    try:
        tpujobs("dev", "preempt", job_id)
        job = ended(env, job_id)
    finally:
        seen = watcher.stop()
    assert job.state is JobState.SUCCEEDED, job.state_reason
    assert (job.attempt, job.restarts) == (2, 1)
    assert any(a1 in ("SUSPENDING", "SUSPENDED", "DELETING") for a1, _ in seen)
    # While attempt 1's resource existed, attempt 2's never got the chips ...
    assert all(a2 not in ("PROVISIONING", "ACTIVE") for a1, a2 in seen if a1 is not None)
    # ... it waited for them, and got them once attempt 1's was gone.
    assert any(a1 is not None and a2 == "WAITING_FOR_RESOURCES" for a1, a2 in seen)
    assert any(a1 is None and a2 in ("PROVISIONING", "ACTIVE") for a1, a2 in seen)


# --- paged lists and field masks ---------------------------------------------------------------


def test_the_reconciler_sees_every_resource_however_many_pages_the_list_takes(env, jobs):
    """More jobs than a page holds (the local simulator pages by 2), each host killed silently: the reconciler finds
    every one."""
    page = int(simulator(env, "config").get("default_page_size") or 0)
    assert page >= 1, "the local simulator pages its lists"
    count = page + 1
    job_ids = [
        jobs(prefix="paged", command='if [ "$TPUJOBS_ATTEMPT" = 1 ]; then sleep 600; fi; echo ok', max_restarts=2)
        for _ in range(count)
    ]
    for job_id in job_ids:
        running_at(env, job_id, 1)
    for job_id in job_ids:
        tpujobs("dev", "preempt", job_id, "--silent")
    for job_id in job_ids:
        lost = event_saying(env, job_id, "were lost", timeout=45)  # the node listing, not silence
        assert lost.source == "reconciler" and lost.attempt == 1
        job = ended(env, job_id)
        assert job.state is JobState.SUCCEEDED, job.state_reason
        assert job.attempt == 2

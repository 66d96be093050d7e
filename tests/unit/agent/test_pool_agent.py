"""The pool-mode worker agent (a warm pool's unit), run for real by its unit's startup script.

Each test starts `python3 agent.pyz --pool config.json` through `render_unit_startup_script`,
against the fake metadata server and the recording Pub/Sub and Storage stand-in of
agent_stubs.py; assignments are written to the fake metadata's `tpujobs-assignment`
as the control plane writes a unit node's metadata, and the agent waits on it with
`wait_for_change`. Jobs are real bash processes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_stubs import (
    ACCOUNT,
    BUCKET,
    FAST,
    KEY_PATH,
    PREEMPTION,
    PROJECT,
    WORKER_EVENTS,
    FakeMetadata,
    GoogleStub,
    a_job,
    chunk_prefix,
    gone,
    kill_group,
    python3_dir,
    read_record,
)

from tpujobs.agent.basics import AgentError
from tpujobs.agent.pool import parse_assignment
from tpujobs.agent.processes import group_alive
from tpujobs.domain import signing
from tpujobs.domain.job import Job
from tpujobs.domain.spec import JobSpec
from tpujobs.engine.settings import Settings
from tpujobs.engine.startup_script import assignment_text, idle_assignment_text, render_unit_startup_script
from tpujobs.local.testing import wait_for

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None or not os.path.exists("/proc/self/stat"), reason="needs bash and /proc")

SETTINGS = Settings(
    project=PROJECT, prefix="t-", logs_bucket=BUCKET, tpu_service_account=ACCOUNT, report_key="pool-tests-" + "k" * 40
)
UNIT = "demo-u0-g1"
ASSIGNMENT = "instance/attributes/tpujobs-assignment"


def attempt_key(job: Job) -> bytes:
    assert job.created_at is not None
    return signing.attempt_key(SETTINGS.report_key, job.job_id, job.created_at, job.attempt)


def assign(metadata: FakeMetadata, seq: int, job: Job | None = None) -> None:
    """Write the unit node's assignment, as the control plane's UpdateNode does; the key server
    then answers the job's attempt key, as the jobs function would to this unit's hosts."""
    google = metadata.key_server
    assert google is not None, "the metadata fixture names its key server"
    if job is None:
        text = idle_assignment_text(seq)
    else:
        text = assignment_text(job, SETTINGS, seq, UNIT, timings=FAST)
        assert job.created_at is not None
        created = str(signing.created_micros(job.created_at))
        google.key_answer = {"key": signing.key_text(attempt_key(job)), "key_version": "1", "job_created": created}
    metadata.extra[ASSIGNMENT] = text


class UnitHost:
    """One host of a pool unit: its startup script run with bash in its own process group, as
    a VM runs it; the agent's stderr goes to a file the test reads while it runs."""

    def __init__(self, tmp_path: Path, metadata: FakeMetadata, google: GoogleStub) -> None:
        self.root = tmp_path
        self.workdir = tmp_path / "pool"
        self.metadata = metadata
        self.google = google
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.extra_env: dict[str, str] = {}  # more of the host's environment

    def start(self, python_dir: Path | None = None, shape: JobSpec | None = None) -> subprocess.Popen[bytes]:
        """Runs the unit's startup script (with `python_dir`'s python3 first on PATH, if given)
        for a pool of `shape` (a plain v4-8 by default)."""
        self.starts += 1
        script = self.root / "startup.sh"
        shape = shape or a_job().spec
        script.write_text(render_unit_startup_script("demo", 0, UNIT, shape, SETTINGS, timings=FAST))
        env = {
            "PATH": (f"{python_dir}:" if python_dir else "") + os.environ.get("PATH", ""),
            "HOME": str(self.root),
            "TPUJOBS_WORKDIR": str(self.workdir),
            "TPUJOBS_METADATA_URL": self.metadata.base,
            "TPUJOBS_KEY_URL": self.google.url + KEY_PATH,
            "PUBSUB_EMULATOR_HOST": self.google.url.removeprefix("http://"),
            "STORAGE_EMULATOR_HOST": self.google.url,
            "TPUJOBS_SECRETS_ENDPOINT": self.google.url,
            "TPUJOBS_JOB_USER": "root",  # the commands write into pytest's private dirs
            **self.extra_env,
        }
        with open(self.stderr_path, "wb") as err, open(self.root / f"stdout-{self.starts}", "wb") as out:
            self.process = subprocess.Popen(
                [BASH or "bash", str(script)], cwd=self.root, env=env, stdout=out, stderr=err, start_new_session=True
            )
        return self.process

    @property
    def stderr_path(self) -> Path:
        return self.root / f"stderr-{self.starts}"

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def said(self, fragment: str) -> bool:
        return fragment in self.stderr()

    def attempt_dir(self, job: Job) -> Path:
        return self.workdir / "jobs" / job.job_id / f"attempt-{job.attempt}"

    def record(self, job: Job) -> dict[str, Any]:
        name = f".tpujobs-attempt-{job.job_id}-a{job.attempt}-slice0-worker0.json"
        return read_record(self.attempt_dir(job) / name)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            kill_group(self.process.pid)
            self.process.wait(timeout=10)


@pytest.fixture
def google() -> Iterator[GoogleStub]:
    with GoogleStub() as server:
        yield server


@pytest.fixture
def metadata(google: GoogleStub) -> Iterator[FakeMetadata]:
    """A unit node's metadata: an idle assignment (no key anywhere: hosts fetch it from `google`)."""
    with FakeMetadata(**{ASSIGNMENT: idle_assignment_text(0)}) as server:
        server.key_server = google
        yield server


@pytest.fixture
def host(tmp_path: Path, metadata: FakeMetadata, google: GoogleStub) -> Iterator[UnitHost]:
    unit = UnitHost(tmp_path, metadata, google)
    try:
        yield unit
    finally:
        unit.stop()


def reports_of(google: GoogleStub, job: Job, topic: str = WORKER_EVENTS) -> list[dict[str, Any]]:
    """The payloads published for the job's attempt, each checked to verify under its own key."""
    found = []
    for data, attributes in google.signed(topic):
        payload = json.loads(data)
        if (payload["job_id"], payload["attempt"]) != (job.job_id, job.attempt):
            continue
        problem = signing.signature_problem(attempt_key(job), data, attributes.get(signing.SIGNATURE_ATTRIBUTE))
        assert problem is None, (payload, problem)
        found.append(payload)
    return found


def kinds_of(google: GoogleStub, job: Job) -> list[str]:
    return [payload["kind"] for payload in reports_of(google, job)]


def test_a_unit_runs_two_assignments_one_after_the_other_each_in_a_fresh_directory(
    tmp_path: Path, host: UnitHost, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """Two jobs in turn: each in its own new work dir with its own TPUJOBS_ variables, the first's dir gone when the
    second starts; a SIGTERM then sends the running second job's notice, under its key, and the agent stops."""
    seen = tmp_path / "seen"
    first = a_job(
        job_id="first-1", command=f'echo "$TPUJOBS_JOB_ID $PWD" >> {seen}; env > {tmp_path / "env"}; touch ../junk'
    )
    first_work = host.attempt_dir(first) / "work"
    second = a_job(
        job_id="second-1",
        command=(
            f'echo "$TPUJOBS_JOB_ID $PWD" >> {seen}; ls -A .. >> {seen}; '
            f"if [ -e {first_work} ]; then echo first-there; else echo first-gone; fi >> {seen}; "
            "echo ready; sleep 600"
        ),
    )
    process = host.start()
    assign(metadata, 1, first)
    wait_for(lambda: host.said("job first-1 attempt 1: ended"))
    assert kinds_of(google, first)[0] == "started" and kinds_of(google, first)[-1] == "exited"
    assign(metadata, 2, second)
    wait_for(lambda: b"ready" in google.output(chunk_prefix(job_id="second-1")))

    lines = seen.read_text().splitlines()
    second_work = host.attempt_dir(second) / "work"
    assert lines == [f"first-1 {first_work}/code", f"second-1 {second_work}/code", "code", "first-gone"]
    assert not first_work.exists()
    first_env = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line)
    assert sorted(name for name in first_env if name.startswith("TPUJOBS_")) == [
        "TPUJOBS_ATTEMPT",
        "TPUJOBS_CHECKPOINT_URI",
        "TPUJOBS_JOB_ID",
        "TPUJOBS_NUM_SLICES",
        "TPUJOBS_NUM_WORKERS",
        "TPUJOBS_RESUME",
        "TPUJOBS_SLICE_ID",
        "TPUJOBS_WORKER_ID",
    ]
    assert first_env["TPUJOBS_JOB_ID"] == "first-1" and first_env["TPUJOBS_CHECKPOINT_URI"].endswith("/first-1/")

    os.kill(process.pid, signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    notices = reports_of(google, second, PREEMPTION)
    assert [n["reason"] for n in notices] == ["SIGTERM"]
    assert reports_of(google, first, PREEMPTION) == []
    assert "exited" not in kinds_of(google, second)
    assert not second_work.exists()


@pytest.mark.parametrize("python", ["default", "3.8"])
def test_withdrawing_a_job_kills_its_group_and_its_double_forked_daemon_and_publishes_nothing(
    tmp_path: Path, host: UnitHost, metadata: FakeMetadata, google: GoogleStub, python: str
) -> None:
    """An assignment replacing a running job: its group (deaf to SIGTERM) and a setsid daemon it left are killed
    at once (the next assignment is readable on the host), nothing more is published for it, and the new job then
    runs on the clean unit."""
    daemon_file = tmp_path / "daemon.pid"
    busy = a_job(
        job_id="busy-1",
        command=(
            f"( setsid sleep 600 & echo $! > {daemon_file} ); "
            "trap 'echo got-term' TERM; echo ready; while true; do sleep 0.05; done"
        ),
    )
    after = a_job(job_id="after-1", command="echo after-ran")
    host.start(python3_dir(tmp_path, python))
    assign(metadata, 1, busy)
    wait_for(lambda: b"ready" in google.output(chunk_prefix(job_id="busy-1")) and "running" in host.record(busy))
    daemon = int(daemon_file.read_text())
    group = host.record(busy)["running"]["pid"]
    assert not gone(daemon) and group_alive(group)

    assign(metadata, 2, after)
    wait_for(lambda: "exited" in kinds_of(google, after))
    assert gone(daemon)
    assert not group_alive(group)
    assert "job busy-1 attempt 1: another job is assigned, so its processes are killed at once" in host.stderr()
    assert host.record(busy)["ended"] == "withdrawn"
    assert set(kinds_of(google, busy)) <= {"started", "heartbeat"}
    assert reports_of(google, busy, PREEMPTION) == []
    output = google.output(chunk_prefix(job_id="busy-1"))
    assert b"withdrawn (assignment seq 2 replaces it)" in output
    assert not (host.attempt_dir(busy) / "work").exists()
    assert google.output(chunk_prefix(job_id="after-1")) == b"after-ran\n"


def test_a_job_withdrawn_to_idle_gets_its_grace_and_what_it_left_is_killed_before_the_unit_idles(
    tmp_path: Path, host: UnitHost, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """An idle assignment withdraws the running job with SIGTERM and its grace (its trap runs); then its group
    and the setsid daemon it left are killed, and nothing more is published for it."""
    daemon_file = tmp_path / "daemon.pid"
    busy = a_job(
        job_id="busy-1",
        command=(
            f"( setsid sleep 600 & echo $! > {daemon_file} ); "
            "trap 'echo got-term' TERM; echo ready; while true; do sleep 0.05; done"
        ),
    )
    host.start()
    assign(metadata, 1, busy)
    wait_for(lambda: b"ready" in google.output(chunk_prefix(job_id="busy-1")) and "running" in host.record(busy))
    daemon = int(daemon_file.read_text())
    assign(metadata, 2)
    wait_for(lambda: host.said("job busy-1 attempt 1: withdrawn with exit code"))
    assert gone(daemon)
    assert "1 leftover process killed" in host.stderr()
    assert set(kinds_of(google, busy)) <= {"started", "heartbeat"}
    output = google.output(chunk_prefix(job_id="busy-1"))
    assert b"got-term" in output and b"withdrawn (assignment seq 2 replaces it)" in output


def test_a_stale_seq_and_bad_json_are_ignored_and_the_agent_goes_on(
    tmp_path: Path, host: UnitHost, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """After seq 5, a late seq 3 runs nothing, and text that is not JSON runs nothing; seq 6 then runs."""
    runs = tmp_path / "runs"
    jobs = {name: a_job(job_id=f"{name}-1", command=f"echo {name} >> {runs}") for name in ("a", "b", "c")}
    process = host.start()
    assign(metadata, 5, jobs["a"])
    wait_for(lambda: host.said("job a-1 attempt 1: ended"))
    assign(metadata, 3, jobs["b"])
    wait_for(lambda: host.said("assignment seq 3 ignored: seq 5 was seen already"))
    metadata.extra[ASSIGNMENT] = '{"seq": 7, "job_id": '
    wait_for(lambda: host.said("assignment ignored: the assignment is not JSON"))
    assign(metadata, 6, jobs["c"])
    wait_for(lambda: host.said("job c-1 attempt 1: ended"))
    assert runs.read_text() == "a\nc\n"
    assert kinds_of(google, jobs["b"]) == []
    assert process.poll() is None


def test_a_restarted_agent_runs_nothing_again_and_reports_nothing_for_an_attempt_that_ended(
    tmp_path: Path, host: UnitHost, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """The same assignment still in the metadata after the agent restarts: the record says the attempt ended here, so
    nothing runs and nothing is sent; a SIGTERM to an idle agent sends no notice."""
    runs = tmp_path / "runs"
    job = a_job(job_id="done-1", command=f"echo run >> {runs}; exit 3")
    first = host.start()
    assign(metadata, 1, job)
    wait_for(lambda: host.said("job done-1 attempt 1: ended (exited) with exit code 3"))
    os.kill(first.pid, signal.SIGTERM)
    assert first.wait(timeout=30) == 0
    assert google.messages(PREEMPTION) == []
    sent = kinds_of(google, job)

    host.start()
    wait_for(lambda: host.said("already ended on this host"))
    wait_for(lambda: host.said("job done-1 attempt 1: not run again"))
    assert kinds_of(google, job) == sent and sent[-1] == "exited"
    assert runs.read_text() == "run\n"
    assert google.messages(PREEMPTION) == []


def test_a_restarted_agent_reports_an_attempt_that_was_running_as_rebooted_and_stops_its_remains(
    tmp_path: Path, host: UnitHost, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """The agent killed while its job runs, then started again with the same assignment: one signed `rebooted`, no
    second run, and the first run's command, still running, is stopped so the unit is clean."""
    runs = tmp_path / "runs"
    job = a_job(job_id="lost-1", command=f"echo run >> {runs}; echo ready; sleep 600")
    first = host.start()
    assign(metadata, 1, job)
    wait_for(lambda: b"ready" in google.output(chunk_prefix(job_id="lost-1")) and "running" in host.record(job))
    command = host.record(job)["running"]["pid"]
    kill_group(first.pid)  # the agent dies; its job, in a session of its own, runs on
    first.wait(timeout=10)
    assert "ended" not in host.record(job) and not gone(command)

    host.start()
    wait_for(lambda: "rebooted" in kinds_of(google, job))
    wait_for(lambda: host.said("job lost-1 attempt 1: not run again"))
    rebooted = [p for p in reports_of(google, job) if p["kind"] == "rebooted"]
    assert len(rebooted) == 1
    assert f"its command (pid {command}, started " in rebooted[0]["detail"]
    assert rebooted[0]["detail"].endswith(": nothing is started again")
    assert kinds_of(google, job).count("started") == 1
    assert runs.read_text() == "run\n"
    wait_for(lambda: gone(command))


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[]", "not a JSON object"),
        ('{"seq": -1}', "'seq'"),
        ('{"seq": true}', "'seq'"),
        ('{"seq": 1, "job_id": "", "attempt": 1}', "'job_id'"),
        ('{"seq": 1, "job_id": "j", "attempt": 0}', "'attempt'"),
        ('{"seq": 1, "job_id": "j", "attempt": 1}', "'config'"),
        ('{"seq": 1, "job_id": "j", "attempt": 1, "config": []}', "'config'"),
        ('{"seq": 1, "job_id": "j", "attempt": 1, "config": {"job_id": "x", "attempt": 1}}', "'config'"),
    ],
)
def test_an_unusable_assignment_is_refused_naming_the_field_without_quoting_the_key(text: str, field: str) -> None:
    """Each malformed assignment is one sentence naming what is wrong; the report key's value never appears."""
    with pytest.raises(AgentError, match=field) as refused:
        parse_assignment(text.replace('"k"', '"tpujobs-key-v1:secretvalue"'))
    assert "secretvalue" not in str(refused.value)


def test_an_idle_assignment_is_its_seq_alone() -> None:
    """{"seq": N} (and a null job_id) is idle."""
    assert parse_assignment(idle_assignment_text(4)) == {"seq": 4}
    assert parse_assignment('{"seq": 4, "job_id": null}') == {"seq": 4}


def test_a_job_without_an_image_runs_in_the_pools_image_which_was_pulled_ahead(
    tmp_path: Path, host: UnitHost, metadata: FakeMetadata, google: GoogleStub
) -> None:
    """The pool's image is pulled once at boot (a failure only logged) and is the image of a job that names none: here
    it cannot be pulled, so the job ends with the sentence naming the pool's image, and the command never runs."""
    pool_image = "127.0.0.1:9/tpujobs-test/pool-image:1"  # nothing listens on port 9
    runs = tmp_path / "runs"
    job = a_job(job_id="plain-1", command=f"echo run >> {runs}")
    process = host.start(shape=a_job(image=pool_image).spec)
    wait_for(lambda: host.said("waiting for assignments"))
    assert "the pool's image is not pulled ahead" in host.stderr() or "no docker CLI" in host.stderr()
    assign(metadata, 1, job)
    wait_for(lambda: "exited" in kinds_of(google, job))
    exited = reports_of(google, job)[-1]
    assert exited["exit_code"] != 0 and pool_image in exited["detail"]
    assert not runs.exists()
    assert process.poll() is None

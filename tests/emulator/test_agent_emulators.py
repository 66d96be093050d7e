"""The worker agent against the real Pub/Sub and Storage emulators, run from its startup script.

Each test renders the startup script for a job, runs it with bash in its own process group
(as a TPU VM or the simulator would) with a fake metadata server, then pulls the reports
from Pub/Sub subscriptions and reads the output chunks from the storage emulator. Every
message pulled must carry a `tpujobs-signature` that verifies under the fake host's key.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import tarfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tpujobs.domain import signing
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.engine import topology
from tpujobs.engine.settings import Settings
from tpujobs.engine.startup_script import AgentTimings, render_startup_script
from tpujobs.local import processes
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.emulator

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
PREFIX = "agent-"
FAST = AgentTimings(heartbeat_seconds=0.3, grace_seconds=1, chunk_seconds=0.2)
TRAP_TERM = "trap 'echo got-term; exit 9' TERM; echo ready; while true; do sleep 0.05; done"
IGNORE_TERM = "trap '' TERM; echo pid=$$; while true; do sleep 0.05; done"
KEY = bytes(range(32))  # the attempt key every fake host hands its agent


# --- a fake metadata server -----------------------------------------------------------


class FakeMetadata:
    """A GCE metadata server for one worker host, on loopback; `preempted` flips instance/preempted."""

    def __init__(self, worker: int = 0, node_id: str = "node") -> None:
        self.worker = worker
        self.node_id = node_id
        self.preempted = False
        self.key_env: dict[str, str] = {}  # the spec's env, which `attempt-key` answers with the key
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                key = urllib.parse.urlsplit(self.path).path.removeprefix("/computeMetadata/v1/")
                value = owner.values().get(key)
                if self.headers.get("Metadata-Flavor") != "Google":
                    status, value = 403, "Missing Metadata-Flavor"
                else:
                    status, value = (404, "not found") if value is None else (200, value)
                data = value.encode()
                self.send_response(status)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # the jobs function's `attempt-key`, for this host: KEY
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                answer = {"key": signing.key_text(KEY), "key_version": "1", "job_created": "1", "env": owner.key_env}
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer((processes.LOOPBACK, 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def values(self) -> dict[str, str]:
        return {
            "instance/attributes/agent-worker-number": str(self.worker),
            "instance/attributes/tpu-env": f"NODE_ID: '{self.node_id}'\nWORKER_ID: '{self.worker}'\n",
            "instance/preempted": "TRUE" if self.preempted else "FALSE",
            "instance/service-accounts/default/identity": "identity-token",
            "instance/service-accounts/default/email": "vm@example.com",
        }

    @property
    def base(self) -> str:
        return f"http://{processes.LOOPBACK}:{self.httpd.server_address[1]}/computeMetadata/v1"

    def __enter__(self) -> FakeMetadata:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# --- the emulators --------------------------------------------------------------------


class Reports:
    """Pull subscriptions on the worker-events and preemption topics of this test's project."""

    def __init__(self, project: str) -> None:
        from google.cloud import pubsub_v1

        self.publisher = pubsub_v1.PublisherClient()
        self.subscriber = pubsub_v1.SubscriberClient()
        self.project = project
        self.subscriptions = {}
        for base in (topology.WORKER_EVENTS, topology.PREEMPTION):
            topic = self.publisher.topic_path(project, topology.topic_name(base, PREFIX))
            self.publisher.create_topic(name=topic)
            subscription = self.subscriber.subscription_path(project, f"{base}-test")
            self.subscriber.create_subscription(name=subscription, topic=topic)
            self.subscriptions[base] = subscription
        self.received: dict[str, list[tuple[dict[str, Any], dict[str, str], datetime]]] = {
            base: [] for base in self.subscriptions
        }

    def pull(self, base: str, timeout: float = 1.0) -> list[tuple[dict[str, Any], dict[str, str], datetime]]:
        """Everything delivered so far on the topic (pulled and acknowledged), in publish order."""
        from google.api_core import exceptions

        deadline = time.monotonic() + timeout
        while True:
            try:
                response = self.subscriber.pull(
                    request={"subscription": self.subscriptions[base], "max_messages": 100},
                    timeout=max(0.2, deadline - time.monotonic()),
                )
            except exceptions.DeadlineExceeded:
                response = None
            if response is not None and response.received_messages:
                for received in response.received_messages:
                    message = received.message
                    attributes = dict(message.attributes)
                    signature = attributes.pop(signing.SIGNATURE_ATTRIBUTE, None)
                    names = (
                        attributes.pop(signing.KEY_VERSION_ATTRIBUTE),
                        attributes.pop(signing.JOB_CREATED_ATTRIBUTE),
                    )
                    assert names == ("1", "1"), names
                    problem = signing.signature_problem(KEY, message.data, signature)
                    assert problem is None, (problem, message.data)
                    self.received[base].append((json.loads(message.data), attributes, message.publish_time))
                self.subscriber.acknowledge(
                    request={
                        "subscription": self.subscriptions[base],
                        "ack_ids": [r.ack_id for r in response.received_messages],
                    }
                )
            if time.monotonic() >= deadline:
                break
        return sorted(self.received[base], key=lambda item: item[0]["at"])

    def wait_for(
        self, base: str, predicate: Any, timeout: float = 20.0
    ) -> list[tuple[dict[str, Any], dict[str, str], datetime]]:
        """What `base` received once `predicate` holds for its payloads (the one wait_for polls)."""

        def received() -> tuple[list[tuple[dict[str, Any], dict[str, str], datetime]]] | None:
            got = self.pull(base, timeout=0.3)  # a tuple: an empty list may be what is wanted
            return (got,) if predicate([payload for payload, _, _ in got]) else None

        try:
            return wait_for(received, timeout=timeout, interval=0)[0]
        except AssertionError:
            raise AssertionError(f"timed out; {base} had {[p for p, _, _ in self.received[base]]}") from None

    def kinds(self, timeout: float = 0.5) -> list[str]:
        return [payload["kind"] for payload, _, _ in self.pull(topology.WORKER_EVENTS, timeout)]

    def close(self) -> None:
        self.subscriber.close()


@pytest.fixture
def reports(project_id: str) -> Iterator[Reports]:
    reports = Reports(project_id)
    try:
        yield reports
    finally:
        reports.close()


@pytest.fixture
def metadata() -> Iterator[FakeMetadata]:
    with FakeMetadata(node_id="train-1-a1") as server:
        yield server


# --- running the agent ----------------------------------------------------------------


def a_job(attempt: int = 1, **spec_changes: Any) -> Job:
    data = {
        "job_id": "train-1",
        "name": "train",
        "owner": "alice",
        "accelerator_type": "v4-8",
        "command": "echo hello",
        **spec_changes,
    }
    job, _ = new_job(parse_spec(data), "us-central2-b", NOW)
    return job.evolve(attempt=attempt, queued_resource=f"train-1-a{attempt}")


class Run:
    """One agent, started through its startup script; always killed (group and all) at the end."""

    def __init__(
        self,
        job: Job,
        settings: Settings,
        workdir: Path,
        metadata: FakeMetadata,
        storage_url: str,
        host_env: dict[str, str] | None = None,
    ):
        """`host_env`: more of the host's environment (a simulated host's: unprivileged containers,
        its mark, the local Secret Manager)."""
        self.job = job
        workdir.mkdir(parents=True, exist_ok=True)
        script = workdir.parent / f"startup-{workdir.name}.sh"
        script.write_text(render_startup_script(job, settings, timings=FAST))
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(workdir.parent),
            "TPUJOBS_WORKDIR": str(workdir),
            "TPUJOBS_METADATA_URL": metadata.base,
            "TPUJOBS_KEY_URL": metadata.base.removesuffix("/computeMetadata/v1") + "/attempt-key",
            "PUBSUB_EMULATOR_HOST": os.environ["PUBSUB_EMULATOR_HOST"],
            "STORAGE_EMULATOR_HOST": storage_url,
            "TPUJOBS_JOB_USER": "root",  # the commands write into pytest's private dirs
            **(host_env or {}),
        }
        self.process = subprocess.Popen(
            ["bash", str(script)],
            cwd=workdir.parent,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def wait(self, timeout: float = 30.0) -> tuple[int, str]:
        _, err = self.process.communicate(timeout=timeout)
        return self.process.returncode, err.decode(errors="replace")

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.communicate()


@pytest.fixture
def run_agent(tmp_path: Path, metadata: FakeMetadata, storage_url: str, bucket, project_id: str):
    """Start agents for jobs of this test's project and bucket; each is killed at teardown."""
    settings = Settings(project=project_id, prefix=PREFIX, logs_bucket=bucket.name)
    runs: list[Run] = []

    def start(job: Job, metadata_server: FakeMetadata = metadata) -> Run:
        run = Run(job, settings, tmp_path / f"host-{len(runs)}" / "work", metadata_server, storage_url)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.kill()


def chunk_dir(job: Job, slice_id: int = 0, worker_id: int = 0) -> str:
    return f"logs/jobs/{job.job_id}/attempt-{job.attempt}/chunks/slice-{slice_id}-worker-{worker_id}/"


def output_of(bucket, job: Job, **where: int) -> bytes:
    """The .log chunks of one worker, concatenated in order."""
    blobs = sorted(bucket.list_blobs(prefix=chunk_dir(job, **where)), key=lambda b: b.name)
    return b"".join(b.download_as_bytes() for b in blobs if b.name.endswith(".log"))


def wait_for_output(bucket, job: Job, needle: bytes, timeout: float = 20.0) -> None:
    wait_for(lambda: needle in output_of(bucket, job), timeout, 0.1, what=f"{needle!r} in the chunks")


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    # Only zombies may remain (reaped by whoever is init here): none may be running.
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[2] == str(pgid) and fields[0] != "Z":
                return False
    return True


# --- the tests ------------------------------------------------------------------------


def test_a_command_that_exits_3_is_reported_started_and_exited_and_its_output_is_in_the_bucket(
    run_agent, reports: Reports, bucket
) -> None:
    """started, heartbeats, exited(3) arrive on Pub/Sub; the chunks concatenate to the output."""
    job = a_job(command="for i in 1 2 3; do echo line-$i; echo err-$i >&2; sleep 0.3; done; exit 3")
    code, stderr = run_agent(job).wait()
    assert code == 3, stderr
    got = reports.wait_for(topology.WORKER_EVENTS, lambda ps: any(p["kind"] == "exited" for p in ps))
    kinds = [payload["kind"] for payload, _, _ in got]
    assert kinds[0] == "started" and kinds[-1] == "exited" and "heartbeat" in kinds
    exited, attributes, _ = got[-1]
    assert exited["exit_code"] == 3
    assert (exited["job_id"], exited["attempt"], exited["slice_id"], exited["worker_id"]) == (
        "train-1",
        1,
        0,
        0,
    )
    assert attributes == {"job_id": "train-1", "attempt": "1", "kind": "exited"}
    expected = b"".join(f"line-{i}\nerr-{i}\n".encode() for i in (1, 2, 3))
    assert output_of(bucket, job) == expected
    names = sorted(b.name for b in bucket.list_blobs(prefix=chunk_dir(job)))
    assert names[-1].endswith("/complete.json") and names[0].endswith("/000000.log")
    marker = json.loads(bucket.blob(names[-1]).download_as_bytes())
    assert marker == {"exit_code": 3, "chunks": len(names) - 1}
    assert reports.pull(topology.PREEMPTION, 0.3) == []


def test_a_checkpoint_line_gives_a_checkpoint_report(run_agent, reports: Reports) -> None:
    """`TPUJOBS_CHECKPOINT step=5 ...` printed by the command arrives as kind checkpoint, step 5."""
    job = a_job(command="echo training; echo TPUJOBS_CHECKPOINT step=5 saved to gs://b/c/5")
    code, stderr = run_agent(job).wait()
    assert code == 0, stderr
    got = reports.wait_for(topology.WORKER_EVENTS, lambda ps: any(p["kind"] == "exited" for p in ps))
    checkpoints = [(p, a) for p, a, _ in got if p["kind"] == "checkpoint"]
    assert len(checkpoints) == 1
    payload, attributes = checkpoints[0]
    assert (payload["step"], payload["detail"]) == (5, "saved to gs://b/c/5")
    assert attributes == {"job_id": "train-1", "attempt": "1", "kind": "checkpoint"}


def test_sigterm_publishes_one_fast_notice_then_the_command_gets_sigterm_and_no_exited_report(
    run_agent, reports: Reports, bucket
) -> None:
    """The notice is published within moments of SIGTERM; the command's trap output reaches the chunks."""
    job = a_job(command=TRAP_TERM)
    run = run_agent(job)
    reports.wait_for(topology.WORKER_EVENTS, lambda ps: any(p["kind"] == "started" for p in ps))
    wait_for_output(bucket, job, b"ready\n")
    sent = datetime.now(timezone.utc)
    os.kill(run.process.pid, signal.SIGTERM)
    code, stderr = run.wait()
    assert code == 9, stderr  # the trap's exit code
    notices = reports.wait_for(topology.PREEMPTION, lambda ps: len(ps) >= 1)
    notice, attributes, published = notices[0]
    assert notice["reason"] == "SIGTERM"
    assert (notice["job_id"], notice["attempt"], notice["slice_id"], notice["worker_id"]) == (
        "train-1",
        1,
        0,
        0,
    )
    assert attributes == {"job_id": "train-1", "attempt": "1"}
    assert (published - sent).total_seconds() < 0.5, f"notice published {published - sent} after SIGTERM"
    assert b"got-term\n" in output_of(bucket, job)
    assert len(reports.pull(topology.PREEMPTION, 1.0)) == 1
    assert "exited" not in reports.kinds(1.0)
    assert bucket.get_blob(chunk_dir(job) + "complete.json") is None


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace_period(run_agent, reports: Reports, bucket) -> None:
    """grace_seconds 1: the whole process group is SIGKILLed about a second after the notice."""
    job = a_job(command=IGNORE_TERM)
    run = run_agent(job)
    wait_for_output(bucket, job, b"pid=")
    pgid = int(output_of(bucket, job).split(b"pid=")[1].split()[0])
    started = time.monotonic()
    os.kill(run.process.pid, signal.SIGTERM)
    code, stderr = run.wait()
    elapsed = time.monotonic() - started
    assert code == 128 + signal.SIGKILL, stderr
    assert 0.9 <= elapsed < 6, elapsed
    assert group_gone(pgid)
    assert len(reports.wait_for(topology.PREEMPTION, lambda ps: len(ps) >= 1)) == 1
    assert "exited" not in reports.kinds(1.0)


def test_instance_preempted_turning_true_does_what_sigterm_does(
    run_agent, reports: Reports, bucket, metadata: FakeMetadata
) -> None:
    """The metadata flag: one notice with reason 'metadata: instance/preempted', SIGTERM to the command."""
    job = a_job(command=TRAP_TERM)
    run = run_agent(job)
    wait_for_output(bucket, job, b"ready\n")
    metadata.preempted = True
    code, stderr = run.wait()
    assert code == 9, stderr
    notices = reports.wait_for(topology.PREEMPTION, lambda ps: len(ps) >= 1)
    assert [n["reason"] for n, _, _ in notices] == ["metadata: instance/preempted"]
    assert b"got-term\n" in output_of(bucket, job)
    kinds = reports.kinds(1.0)
    assert "started" in kinds and "exited" not in kinds


def test_a_code_tarball_is_fetched_unpacked_and_the_command_runs_in_it(run_agent, reports: Reports, bucket) -> None:
    """code_uri gs://bucket/code.tar.gz: its files are in the command's working directory."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text, mode in [
            ("data/hello.txt", "hello from the tarball\n", 0o644),
            ("run.sh", "#!/bin/bash\necho ran run.sh\n", 0o755),
        ]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(text.encode()), mode
            tar.addfile(info, io.BytesIO(text.encode()))
    bucket.blob("code/train.tar.gz").upload_from_string(buffer.getvalue())
    job = a_job(
        code_uri=f"gs://{bucket.name}/code/train.tar.gz",
        command="cat data/hello.txt && ./run.sh && basename $PWD",
    )
    code, stderr = run_agent(job).wait()
    assert code == 0, stderr
    assert output_of(bucket, job) == b"hello from the tarball\nran run.sh\ncode\n"


def test_the_command_sees_the_environment_of_contract_section_2(run_agent, reports: Reports, bucket) -> None:
    """TPUJOBS_ variables for attempt 2 of a 2-slice job on worker 3 of slice 1, plus the spec's env."""
    job = a_job(
        2,
        accelerator_type="v5litepod-16",
        slices=2,
        env={"LR": "0.1", "NAME": "a b"},
        command="env | grep -E '^(TPUJOBS_|LR=|NAME=)' | sort",
    ).evolve(resume_next=True)
    with FakeMetadata(worker=3, node_id="train-1-a2-1") as host:
        host.key_env = dict(job.spec.env)
        code, stderr = run_agent(job, host).wait()
    assert code == 0, stderr
    bucket_name = bucket.name
    expected = {
        "TPUJOBS_ATTEMPT": "2",
        "TPUJOBS_CHECKPOINT_URI": f"gs://{bucket_name}/checkpoints/jobs/train-1/",
        "TPUJOBS_JOB_ID": "train-1",
        "TPUJOBS_NUM_SLICES": "2",
        "TPUJOBS_NUM_WORKERS": "4",
        "TPUJOBS_RESUME": "1",
        "TPUJOBS_SLICE_ID": "1",
        "TPUJOBS_WORKER_ID": "3",
        "LR": "0.1",
        "NAME": "a b",
    }
    seen = dict(line.split("=", 1) for line in output_of(bucket, job, slice_id=1, worker_id=3).decode().splitlines())
    assert seen == expected
    got = reports.wait_for(topology.WORKER_EVENTS, lambda ps: any(p["kind"] == "exited" for p in ps))
    assert {(p["slice_id"], p["worker_id"]) for p, _, _ in got} == {(1, 3)}

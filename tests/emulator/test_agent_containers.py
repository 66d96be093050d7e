"""The worker agent running a job's setup and command in its container image, with real Docker.

Images are built here from a tiny local root filesystem (`build_tiny_image`) and pushed to
the session's registry on loopback (`local_registry`); the agent pulls them as a TPU VM would.
The agent runs from its startup script against the real Pub/Sub and Storage emulators, as in
test_agent_emulators.py, whose helpers these tests share. The host is a simulated one: it
says TPUJOBS_CONTAINER_PRIVILEGED=0 (this machine refuses privileged containers) and has a
SIMULATED_TPU_VM mark, as the simulator's hosts do. Every test checks that no container of
its job is left, whatever the path.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import tarfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from test_agent_emulators import (
    IGNORE_TERM,
    PREFIX,
    TRAP_TERM,
    FakeMetadata,
    Reports,
    Run,
    a_job,
    output_of,
    wait_for_output,
)
from test_simulator_workers import FAST as SIMULATOR_FAST
from test_simulator_workers import request_for

from tpujobs.agent.basics import AGENT_FAILED
from tpujobs.agent.containers import LABEL_PREFIX, PRIVILEGED_VARIABLE, SIMULATED_HOST_VARIABLE
from tpujobs.agent.rest import SECRETS_ENDPOINT_VARIABLE
from tpujobs.domain.job import Job
from tpujobs.domain.secrets import secret_id
from tpujobs.engine import topology
from tpujobs.engine.settings import Settings
from tpujobs.local import processes
from tpujobs.local.containers import build_tiny_image, docker_binary
from tpujobs.local.simulator import QrState, SimulatorServer
from tpujobs.local.simulator.secret_manager import SecretManagerServer
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.emulator

ACCOUNT = "tpujobs-tpu-vm@agent-test.iam.gserviceaccount.com"
DOCKER = docker_binary() or "docker"


def docker(*args: str) -> str:
    done = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def image(local_registry: str) -> Callable[..., tuple[str, str]]:
    """`image(files, workdir=...)`: (reference, registry digest) of a new tiny image of this test's own."""

    def build(files: dict[str, str] | None = None, workdir: str = "/workspace", tag: str = "1") -> tuple[str, str]:
        reference = f"{local_registry}/tpujobs-test/{uuid.uuid4().hex[:12]}:{tag}"
        return reference, build_tiny_image(reference, files, workdir=workdir)

    return build


class HostMetadata(FakeMetadata):
    """FakeMetadata with the VM account's token and email (for the local Secret Manager) and,
    on a multislice node, the MEGASCALE_* keys of tpu-env."""

    def __init__(self, worker: int = 0, node_id: str = "node", megascale: dict[str, str] | None = None) -> None:
        super().__init__(worker, node_id)
        self.megascale = megascale or {}

    def values(self) -> dict[str, str]:
        values = super().values()
        values["instance/attributes/tpu-env"] += "".join(f"{k}: '{v}'\n" for k, v in self.megascale.items())
        values["instance/service-accounts/default/email"] = ACCOUNT
        values["instance/service-accounts/default/token"] = json.dumps(
            {"access_token": f"simulated:{ACCOUNT}", "expires_in": 3599, "token_type": "Bearer"}
        )
        return values


@pytest.fixture
def host(tmp_path: Path, storage_url: str, bucket, project_id: str) -> Iterator[Any]:
    """`host.start(job, metadata)`: the job's agent on a simulated host; `host.secrets` is its
    local Secret Manager. Agents are killed at teardown and their containers must be gone."""

    class Host:
        settings = Settings(project=project_id, prefix=PREFIX, logs_bucket=bucket.name, tpu_service_account=ACCOUNT)
        secrets = SecretManagerServer(prefix=PREFIX)
        runs: ClassVar[list[Run]] = []
        mark = f"test-host/{uuid.uuid4().hex}"

        def start(self, job: Job, metadata: FakeMetadata, **host_env: str) -> Run:
            env = {
                PRIVILEGED_VARIABLE: "0",
                SIMULATED_HOST_VARIABLE: self.mark,
                SECRETS_ENDPOINT_VARIABLE: self.secrets.url,
                **host_env,
            }
            run = Run(job, self.settings, tmp_path / f"host-{len(self.runs)}" / "work", metadata, storage_url, env)
            self.runs.append(run)
            return run

        def add_secret(self, name: str, value: bytes) -> None:
            sid = secret_id(name, PREFIX, ACCOUNT)
            self.secrets.service.create(project_id, sid, {"automatic": {}}, {}, {})
            self.secrets.service.add_version(project_id, sid, value, None)

    running = Host()
    with running.secrets:
        try:
            yield running
        finally:
            for run in running.runs:
                run.kill()
            for run in running.runs:
                assert containers_of(run.job) == [], "a container outlived its agent"


@pytest.fixture
def metadata() -> Iterator[HostMetadata]:
    with HostMetadata(node_id="train-1-a1") as running:
        yield running


@pytest.fixture
def events(project_id: str) -> Iterator[Reports]:
    """The reports and notices the agents publish, pulled from this test's subscriptions."""
    pulled = Reports(project_id)
    try:
        yield pulled
    finally:
        pulled.close()


@pytest.fixture
def simulator(tmp_path: Path) -> Iterator[SimulatorServer]:
    """A simulator whose hosts are local processes, as test_simulator_workers.py runs it."""
    with SimulatorServer(SIMULATOR_FAST, workers_root=tmp_path / "workers") as running:
        yield running


def a_contained_job(image: str, **spec: Any) -> Job:
    """A job of this test's own id (container names must not collide between tests) in `image`."""
    return a_job(job_id=f"img-{uuid.uuid4().hex[:10]}", image=image, **spec)


def containers_of(job: Job) -> list[str]:
    """Every container, running or not, labelled with the job."""
    listed = docker("ps", "--all", "--quiet", "--filter", f"label={LABEL_PREFIX}job={job.job_id}")
    return listed.split()


def exited_report(events: Reports) -> dict[str, Any]:
    got = events.wait_for(topology.WORKER_EVENTS, lambda ps: any(p["kind"] == "exited" for p in ps))
    return next(p for p, _, _ in got if p["kind"] == "exited")


def started_reports(events: Reports) -> list[dict[str, Any]]:
    return [p for p, _, _ in events.pull(topology.WORKER_EVENTS, 0.5) if p["kind"] == "started"]


# --- running in the image --------------------------------------------------------------


def test_setup_and_command_run_in_one_container_of_the_image_and_its_exit_code_is_the_commands(
    host, metadata: HostMetadata, events: Reports, bucket, image
) -> None:
    """A file only the image has and a file setup wrote in the container are both seen by the
    command; its exit code 3 is the attempt's; `started` carries the registry's digest."""
    reference, digest = image({"/etc/only-in-image": "from-the-image\n"})
    job = a_contained_job(
        reference,
        setup="echo from-setup > /tmp/setup-was-here; echo setting-up",
        command="cat /etc/only-in-image /tmp/setup-was-here; exit 3",
    )
    code, stderr = host.start(job, metadata).wait(60)
    assert code == 3, stderr
    assert exited_report(events)["exit_code"] == 3
    assert output_of(bucket, job) == b"setting-up\nfrom-the-image\nfrom-setup\n"
    assert [p.get("image_digest") for p in started_reports(events)] == [digest]
    assert containers_of(job) == []


def test_a_failed_setup_stops_the_container_with_its_code_and_the_command_never_runs(
    host, metadata: HostMetadata, events: Reports, bucket, image
) -> None:
    """Setup exiting 4: the attempt's code is 4, the wrapper says so, the command's words never appear."""
    reference, _ = image()
    job = a_contained_job(reference, setup="echo installing; exit 4", command="echo command-ran")
    code, stderr = host.start(job, metadata).wait(60)
    assert code == 4, stderr
    assert exited_report(events)["exit_code"] == 4
    assert output_of(bucket, job) == (b"installing\n[tpujobs-agent] setup exited with 4; the command does not run\n")


def test_env_secrets_tpujobs_and_megascale_variables_reach_the_command_and_the_hosts_do_not(
    host, events: Reports, bucket, image, tmp_path: Path
) -> None:
    """Inside: the spec's env, the secret (its digest printed), TPUJOBS_*, tpu-env's MEGASCALE_*;
    not the host's own variables. The secret's value is on no command line and in no file."""
    value = b"hf_" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24].encode()
    host.add_secret("hf-token", value)
    reference, _ = image()
    job = a_contained_job(
        reference,
        accelerator_type="v5litepod-16",
        slices=2,
        env={"LR": "0.1", "NAME": "a b"},
        secrets={"HF_TOKEN": "hf-token"},
        command=(
            "printf %s \"$HF_TOKEN\" | sha256sum | cut -d' ' -f1;"
            " env | grep -v -E '^(HF_TOKEN|PWD|SHLVL|HOME|PATH|_|HOSTNAME|TINI_KILL_PROCESS_GROUP)=' | sort"
        ),
    )
    megascale = {
        "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.2:8080",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_PORT": "8080",
        "MEGASCALE_SLICE_ID": "1",
    }
    with HostMetadata(worker=3, node_id="train-1-a1-1", megascale=megascale) as metadata:
        metadata.key_env = dict(job.spec.env)  # env values come with the attempt's key, not in metadata
        run = host.start(job, metadata, HOST_ONLY_VARIABLE="must-stay-outside")
        code, stderr = run.wait(60)
    assert code == 0, stderr
    lines = output_of(bucket, job, slice_id=1, worker_id=3).decode().splitlines()
    assert lines[0] == hashlib.sha256(value).hexdigest()
    seen = dict(line.split("=", 1) for line in lines[1:])
    assert seen == {
        "LR": "0.1",
        "NAME": "a b",
        "TPUJOBS_ATTEMPT": "1",
        "TPUJOBS_CHECKPOINT_URI": seen["TPUJOBS_CHECKPOINT_URI"],
        "TPUJOBS_JOB_ID": job.job_id,
        "TPUJOBS_NUM_SLICES": "2",
        "TPUJOBS_NUM_WORKERS": "4",
        "TPUJOBS_RESUME": "0",
        "TPUJOBS_SLICE_ID": "1",
        "TPUJOBS_WORKER_ID": "3",
        **megascale,
    }
    assert seen["TPUJOBS_CHECKPOINT_URI"].startswith(f"gs://{bucket.name}/")
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert value not in path.read_bytes(), path
    assert value.decode() not in stderr
    assert containers_of(job) == []


@pytest.mark.parametrize(("workdir", "mounted_at"), [("/srv/app", "/srv/app"), ("/", "/workspace")])
def test_the_code_directory_is_mounted_at_the_images_working_directory(
    host, metadata: HostMetadata, events: Reports, bucket, image, workdir: str, mounted_at: str
) -> None:
    """The code tarball's files are in the command's working directory: the image's WorkingDir,
    or /workspace when the image names none but `/`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = b"hello from the tarball\n"
        info = tarfile.TarInfo("data/hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    bucket.blob("code/train.tar.gz").upload_from_string(buffer.getvalue())
    reference, _ = image(workdir=workdir)
    job = a_contained_job(
        reference, code_uri=f"gs://{bucket.name}/code/train.tar.gz", command="pwd; cat data/hello.txt"
    )
    code, stderr = host.start(job, metadata).wait(60)
    assert code == 0, stderr
    assert output_of(bucket, job) == f"{mounted_at}\nhello from the tarball\n".encode()


# --- stopping ---------------------------------------------------------------------------


def test_a_preemption_notice_sends_sigterm_to_the_command_inside_the_container(
    host, metadata: HostMetadata, events: Reports, bucket, image
) -> None:
    """instance/preempted turning TRUE: one notice, the command's trap runs in the container
    (its exit code 9 is the agent's), no exited report, and the container is gone."""
    reference, _ = image()
    job = a_contained_job(reference, command=TRAP_TERM)
    run = host.start(job, metadata)
    wait_for_output(bucket, job, b"ready\n", timeout=60)
    metadata.preempted = True
    code, stderr = run.wait(60)
    assert code == 9, stderr
    notices = events.wait_for(topology.PREEMPTION, lambda ps: len(ps) >= 1)
    assert [n["reason"] for n, _, _ in notices] == ["metadata: instance/preempted"]
    assert b"got-term\n" in output_of(bucket, job)
    assert "exited" not in events.kinds(1.0)
    assert containers_of(job) == []


def test_a_command_ignoring_sigterm_in_the_container_is_killed_after_the_grace(
    host, metadata: HostMetadata, events: Reports, bucket, image
) -> None:
    """SIGTERM to the agent, a command that traps it away: `docker kill` after the grace, 137."""
    reference, _ = image()
    job = a_contained_job(reference, command=IGNORE_TERM)
    run = host.start(job, metadata)
    wait_for_output(bucket, job, b"pid=", timeout=60)
    os.kill(run.process.pid, signal.SIGTERM)
    code, stderr = run.wait(60)
    assert code == 128 + signal.SIGKILL, stderr
    assert len(events.wait_for(topology.PREEMPTION, lambda ps: len(ps) >= 1)) == 1
    assert "exited" not in events.kinds(1.0)
    assert containers_of(job) == []


# --- pulling ----------------------------------------------------------------------------


def test_a_missing_image_ends_the_attempt_with_not_found_naming_it_and_runs_nothing(
    host, metadata: HostMetadata, events: Reports, bucket, local_registry: str
) -> None:
    """An image the registry does not have: exited(1) whose detail says `not found` and names
    the image; the same sentence is in the job's output; nothing started."""
    reference = f"{local_registry}/tpujobs-test/never-pushed-{uuid.uuid4().hex[:8]}:1"
    job = a_contained_job(reference, setup="echo setup-ran", command="echo command-ran")
    code, stderr = host.start(job, metadata).wait(60)
    assert code == AGENT_FAILED, stderr
    detail = exited_report(events)["detail"]
    assert detail.startswith(f"cannot pull the image {reference}: not found"), detail
    output = output_of(bucket, job)
    assert detail.encode() in output and b"-ran" not in output
    assert started_reports(events) == []
    assert containers_of(job) == []


def test_an_unreachable_registry_ends_the_attempt_with_no_network(
    host, metadata: HostMetadata, events: Reports, bucket
) -> None:
    """A registry on a closed loopback port: exited(1), detail `no network`, naming the image."""
    reference = f"{processes.LOOPBACK}:{processes.free_port()}/tpujobs-test/unreachable:1"
    job = a_contained_job(reference, command="echo command-ran")
    code, stderr = host.start(job, metadata).wait(60)
    assert code == AGENT_FAILED, stderr
    detail = exited_report(events)["detail"]
    assert detail.startswith(f"cannot pull the image {reference}: no network"), detail
    assert b"command-ran" not in output_of(bucket, job)


def test_if_missing_runs_the_image_already_here_and_always_pulls_the_registrys(
    host, metadata: HostMetadata, events: Reports, bucket, image
) -> None:
    """The registry holds version 2 under a tag this host has as version 1: `if-missing` runs
    version 1 (no pull), `always` pulls and runs version 2; each reports the digest it ran."""
    old, old_digest = image({"/etc/version": "1\n"}, tag="old")
    repository = old.rsplit(":", 1)[0]
    reference = f"{repository}:current"
    new_digest = build_tiny_image(reference, {"/etc/version": "2\n"})
    docker("tag", old, reference)  # here: version 1 under the tag; in the registry: version 2
    runs = {}
    for policy in ("if-missing", "always"):
        job = a_contained_job(reference, image_pull_policy=policy, command="cat /etc/version")
        code, stderr = host.start(job, metadata).wait(60)
        assert code == 0, stderr
        runs[policy] = output_of(bucket, job)
    assert runs == {"if-missing": b"1\n", "always": b"2\n"}
    assert [p.get("image_digest") for p in started_reports(events)] == [old_digest, new_digest]


def test_an_image_docker_cannot_start_is_reported_with_dockers_own_words(
    host, metadata: HostMetadata, events: Reports, bucket, local_registry: str, tmp_path: Path
) -> None:
    """An image without a shell: docker's init cannot start the wrapper (127), and the exited
    report's detail quotes what it said, naming the image."""
    reference = f"{local_registry}/tpujobs-test/no-shell-{uuid.uuid4().hex[:8]}:1"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("etc/hostname")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"none\n"))
    subprocess.run([DOCKER, "import", "-", reference], input=buffer.getvalue(), capture_output=True, check=True)
    docker("push", reference)
    job = a_contained_job(reference, command="echo command-ran")
    code, stderr = host.start(job, metadata).wait(60)
    assert code == 127, stderr
    detail = exited_report(events)["detail"]
    assert detail.startswith(f"docker could not run the image {reference}: "), detail
    assert "tini" in detail
    assert containers_of(job) == []


# --- the simulator ----------------------------------------------------------------------


def test_a_simulated_host_that_dies_takes_its_containers_with_it(simulator: SimulatorServer, image) -> None:
    """kill_host: the container the host started with its mark is removed as the host dies,
    and the host was told to run containers unprivileged."""
    reference, _ = image()
    script = f"""#!/bin/bash
echo "$TPUJOBS_CONTAINER_PRIVILEGED" > "$TPUJOBS_WORKDIR/privileged"
{DOCKER} run -d --network host --label "tpujobs.host=$SIMULATED_TPU_VM" {reference} sleep 300 \
  > "$TPUJOBS_WORKDIR/container"
while true; do sleep 0.1; done
"""
    sim = simulator.simulator
    sim.queued_resources.create_queued_resource("tpujobs-test", "us-central2-b", "qr", request_for(script, "v4-8"))
    wait_for(
        lambda: sim.queued_resources.get_queued_resource("tpujobs-test", "us-central2-b", "qr").state is QrState.ACTIVE
    )
    (host,) = simulator.workers("qr")
    container = wait_for(
        lambda: (host.workdir / "container").exists() and (host.workdir / "container").read_text().strip(), timeout=60
    )
    assert (host.workdir / "privileged").read_text() == "0\n"
    wait_for(lambda: docker("ps", "--quiet", "--no-trunc", "--filter", f"id={container}") == container, timeout=30)
    sim.nodes.kill_host("qr", 0, 0)
    wait_for(lambda: docker("ps", "--all", "--quiet", "--filter", f"id={container}") == "", timeout=30)

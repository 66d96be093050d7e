"""The simulator runs each worker host's startup script and does to it what the cloud does.

The startup script used here writes its environment and its metadata server's answers into
its scratch directory, then idles on a FIFO with bash builtins only (no child process, so a
SIGKILL leaves nothing for init to reap) and, on SIGTERM, records the signal and what
instance/preempted said at that moment.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from typer.testing import CliRunner

from tpujobs.agent.config import parse_tpu_env, slice_id_from_node_id
from tpujobs.cli.dev_stack import dev_app
from tpujobs.local import stack
from tpujobs.local.simulator import (
    QrState,
    QueuedResourceRequest,
    SimulatorConfig,
    SimulatorServer,
    SliceRequest,
    WorkerInfo,
    metadata_url,
)
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.emulator

PROJECT = "tpujobs-test"
ZONE = "us-central2-b"
RUNTIME = "tpu-ubuntu2204-base"
GRACE = 0.6
FAST = SimulatorConfig(
    waiting_seconds=0.01,
    provisioning_seconds=0.01,
    suspending_seconds=0.05,
    tick_seconds=0.01,
    preemption_grace_seconds=GRACE,
    delete_grace_seconds=GRACE,
)
MARK = "TPUJOBS_TEST_MARK"  # passed in the simulator's environment, must reach the workers

ASK = """\
import os, sys, urllib.request
request = urllib.request.Request(
    os.environ["TPUJOBS_METADATA_URL"] + "/" + sys.argv[1], headers={"Metadata-Flavor": "Google"}
)
sys.stdout.write(urllib.request.urlopen(request, timeout=5).read().decode())
"""
KEYS = (
    "instance/attributes/agent-worker-number",
    "instance/attributes/tpu-env",
    "instance/attributes/accelerator-type",
    "instance/preempted",
)


def startup_script(*, on_term: str = "exit 0", then: str = "idle", ask_at_term: bool = True) -> str:
    """A worker that reports what it sees, then idles (or exits, with then="exit 3"); at SIGTERM it
    marks `term` and (with `ask_at_term`, a Python start) reads instance/preempted before `on_term`."""
    ask = f"{shlex.quote(sys.executable)} ask.py instance/preempted > preempted-at-term; " if ask_at_term else ""
    python = shlex.quote(sys.executable)
    asks = "\n".join(f'{python} ask.py {key} > "answers/{key.replace("/", "_")}"' for key in KEYS)
    tail = "exit 3" if then == "exit 3" else (
        "mkfifo idle; exec 9<>idle\nwhile :; do read -r -t 30 -u 9 || true; done"
    )  # fmt: skip
    return f"""#!/bin/bash
cd "$TPUJOBS_WORKDIR/.."
cat > ask.py <<'PY'
{ASK}PY
mkdir answers
{asks}
env > env.txt
trap 'echo term >> term; {ask}{on_term}' TERM
touch ready
{tail}
"""


def request_for(
    script: str, accelerator_type: str = "v4-16", multislice: int = 0, node_id: str = "node"
) -> QueuedResourceRequest:
    template = {"metadata": {"startup-script": script}, "schedulingConfig": {"spot": True}}
    if multislice:
        spec = SliceRequest(accelerator_type, RUNTIME, node_id_prefix="s", node_count=multislice, template=template)
    else:
        spec = SliceRequest(accelerator_type, RUNTIME, node_id=node_id, template=template)
    return QueuedResourceRequest(slices=(spec,), spot=True)


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SimulatorServer]:
    environ = {**os.environ, MARK: "from-the-simulator"}
    with SimulatorServer(FAST, workers_root=tmp_path / "workers", environ=environ) as running:
        yield running


def start(
    server: SimulatorServer, script: str, accelerator_type: str = "v4-16", multislice: int = 0
) -> tuple[WorkerInfo, ...]:
    """Create a QR, wait until ACTIVE and until every worker wrote its answers."""
    sim = server.simulator
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", request_for(script, accelerator_type, multislice))
    wait_for(
        lambda: sim.queued_resources.get_queued_resource(PROJECT, ZONE, "qr").state is QrState.ACTIVE,
        what="ACTIVE",
    )
    workers = server.workers("qr")
    assert workers, "no worker started"
    for info in workers:  # every variant touches "ready" once it has written its answers
        wait_for(lambda i=info: (i.scratch / "ready").exists(), what="worker ready")
    return workers


def worker(server: SimulatorServer, slice_index: int, index: int) -> WorkerInfo:
    return next(w for w in server.workers("qr") if (w.slice_index, w.worker) == (slice_index, index))


def answer(info: WorkerInfo, key: str) -> str:
    return (info.scratch / "answers" / key.replace("/", "_")).read_text()


def environment(info: WorkerInfo) -> dict[str, str]:
    lines = (info.scratch / "env.txt").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def metadata_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, Any]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode(), response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), error.headers


# -- starting ------------------------------------------------------------------------------------


def test_an_active_v4_16_runs_one_process_per_host_with_its_own_metadata_and_environment(
    server: SimulatorServer, tmp_path: Path
) -> None:
    """v4-16: two workers, each in its own group and scratch dir, told its own worker number."""
    workers = start(server, startup_script())
    assert [(w.slice_index, w.worker, w.node_id) for w in workers] == [
        (0, 0, "node"),
        (0, 1, "node"),
    ]
    for info in workers:
        assert info.alive and info.exit_code is None and info.pgid == info.pid
        assert os.getpgid(info.pid) == info.pid != os.getpgid(0)
        assert info.scratch == tmp_path / "workers" / "qr" / f"slice-0-worker-{info.worker}"
        assert answer(info, "instance/attributes/agent-worker-number") == str(info.worker)
        assert answer(info, "instance/attributes/accelerator-type") == "v4-16"
        assert answer(info, "instance/preempted") == "FALSE"
        tpu_env = parse_tpu_env(answer(info, "instance/attributes/tpu-env"))
        assert {key: tpu_env[key] for key in ("ACCELERATOR_TYPE", "NODE_ID", "WORKER_ID")} == {
            "ACCELERATOR_TYPE": "v4-16",
            "NODE_ID": "node",
            "WORKER_ID": str(info.worker),
        }
        assert (tpu_env["PREEMPTIBLE"], tpu_env["ZONE"]) == ("true", ZONE)
        assert not any(key.startswith("MEGASCALE_") for key in tpu_env)
        env = environment(info)
        assert env["TPUJOBS_WORKDIR"] == str(info.scratch / "work")
        assert env["TPUJOBS_METADATA_URL"] == metadata_url(server.url, PROJECT, ZONE, "node", info.worker)
        assert env[MARK] == "from-the-simulator"
        assert info.log.exists()


def test_a_multislice_of_two_v4_8_runs_one_process_per_node(server: SimulatorServer) -> None:
    """2 x v4-8: nodes s-0 and s-1, one worker each, each told its own node id and, in
    tpu-env as multislice TPU VMs get it, its MEGASCALE slice id, the slice count and the
    coordinator (worker 0 of slice 0, with the MEGASCALE port): what the agent and JAX read."""
    workers = start(server, startup_script(), "v4-8", multislice=2)
    assert [(w.slice_index, w.worker, w.node_id) for w in workers] == [
        (0, 0, "s-0"),
        (1, 0, "s-1"),
    ]
    assert [w.scratch.name for w in workers] == ["slice-0-worker-0", "slice-1-worker-0"]
    first = server.simulator.nodes.get_node(PROJECT, ZONE, "s-0")
    for info in workers:
        tpu_env = parse_tpu_env(answer(info, "instance/attributes/tpu-env"))
        assert tpu_env["NODE_ID"] == info.node_id
        assert answer(info, "instance/attributes/agent-worker-number") == "0"
        assert {key: value for key, value in tpu_env.items() if key.startswith("MEGASCALE_")} == {
            "MEGASCALE_COORDINATOR_ADDRESS": f"{first.host_addresses[0]}:8080",
            "MEGASCALE_NUM_SLICES": "2",
            "MEGASCALE_PORT": "8080",
            "MEGASCALE_SLICE_ID": str(info.slice_index),
        }
        assert slice_id_from_node_id(tpu_env["NODE_ID"], "s") == info.slice_index


def test_state_and_workers_endpoints_show_each_worker_process(server: SimulatorServer) -> None:
    """GET state lists every QR's workers (pid, pgid, scratch, alive); :workers the QR's own."""
    workers = start(server, startup_script(), "v4-8")
    control = SimulatorControl(server.url)
    state = control.state()
    listed = state["workers"][f"projects/{PROJECT}/locations/{ZONE}/queuedResources/qr"]
    assert listed == [workers[0].to_json()]
    assert (listed[0]["pid"], listed[0]["alive"]) == (workers[0].pid, True)
    assert control.workers(ZONE, "qr") == listed


def test_a_script_that_ends_by_itself_stays_ended_and_the_queued_resource_stays_active(
    server: SimulatorServer,
) -> None:
    """A startup script exiting 3 is reported exited with 3 and nobody restarts it or the QR."""
    start(server, startup_script(then="exit 3"), "v4-8")
    ended = wait_for(lambda: not worker(server, 0, 0).alive and worker(server, 0, 0))
    assert (ended.exit_code, ended.stopped_by) == (3, "")
    time.sleep(0.1)
    assert server.simulator.queued_resources.get_queued_resource(PROJECT, ZONE, "qr").state is QrState.ACTIVE
    assert len(server.workers("qr")) == 1


# -- faults --------------------------------------------------------------------------------------


def test_preemption_sends_sigterm_after_the_metadata_turns_true(server: SimulatorServer) -> None:
    """preempt: every worker gets SIGTERM, and instance/preempted already says TRUE in its trap.

    The grace is long so that the trap's own Python start never races the SIGKILL on a slow machine;
    the workers end as soon as their traps do."""
    reconfigure(server, preemption_grace_seconds=60)
    workers = start(server, startup_script())
    server.simulator.queued_resources.preempt("qr")
    for info in workers:
        answer = info.scratch / "preempted-at-term"  # written after the `term` marker, in the trap
        assert wait_for(lambda a=answer: a.exists() and a.read_text(), what="the trap's answer") == "TRUE"
        assert (info.scratch / "term").exists()
    ended = wait_for(lambda: all(not w.alive for w in server.workers("qr")) and server.workers("qr"))
    assert [(w.exit_code, w.stopped_by) for w in ended] == [(0, "preemption")] * 2
    assert server.simulator.queued_resources.get_queued_resource(PROJECT, ZONE, "qr").state in (
        QrState.SUSPENDING,
        QrState.SUSPENDED,
    )


def test_a_worker_that_ignores_sigterm_is_sigkilled_after_the_preemption_grace(
    server: SimulatorServer,
) -> None:
    """A trap that does not exit survives SIGTERM until preemption_grace_seconds, then SIGKILL."""
    (info,) = start(server, startup_script(on_term="true"), "v4-8")
    preempted_at = time.monotonic()
    server.simulator.queued_resources.preempt("qr")
    wait_for(lambda: (info.scratch / "term").exists(), what="SIGTERM marker")
    assert worker(server, 0, 0).alive
    ended = wait_for(lambda: not worker(server, 0, 0).alive and worker(server, 0, 0), timeout=5)
    took = time.monotonic() - preempted_at
    assert GRACE * 0.9 <= took < GRACE + 2.0
    assert (ended.exit_code, ended.stopped_by) == (-signal.SIGKILL, "preemption")
    assert wait_for(lambda: group_gone(info.pgid), what="group gone")


def test_kill_host_kills_exactly_that_worker_without_notice(server: SimulatorServer) -> None:
    """POST :kill-host?slice=0&worker=1: worker 1 SIGKILLed, no SIGTERM, worker 0 unaffected."""
    start(server, startup_script())
    assert SimulatorControl(server.url).kill_host(ZONE, "qr", worker=1, slice_index=0)["state"] == "REPAIRING"
    killed = wait_for(lambda: not worker(server, 0, 1).alive and worker(server, 0, 1))
    assert (killed.exit_code, killed.stopped_by) == (-signal.SIGKILL, "host-failure")
    assert not (killed.scratch / "term").exists()
    assert wait_for(lambda: group_gone(killed.pgid), what="group gone")
    time.sleep(0.1)
    survivor = worker(server, 0, 0)
    assert survivor.alive and not (survivor.scratch / "term").exists()
    assert server.simulator.queued_resources.get_queued_resource(PROJECT, ZONE, "qr").state is QrState.ACTIVE
    assert not server.simulator.nodes.get_node(PROJECT, ZONE, "node").preempted


def test_failing_the_queued_resource_sigkills_every_worker(server: SimulatorServer) -> None:
    """fail: all workers SIGKILLed at once, without SIGTERM."""
    start(server, startup_script())
    server.simulator.queued_resources.fail("qr", "stockout")
    ended = wait_for(lambda: all(not w.alive for w in server.workers("qr")) and server.workers("qr"))
    assert [(w.exit_code, w.stopped_by) for w in ended] == [(-signal.SIGKILL, "failure")] * 2
    assert not any((w.scratch / "term").exists() for w in ended)


def test_deleting_the_queued_resource_stops_every_worker(server: SimulatorServer) -> None:
    """delete: SIGTERM to all workers, none keeps running, even after the QR is gone."""
    workers = start(server, startup_script(ask_at_term=False), multislice=2)
    assert len(workers) == 4
    server.simulator.queued_resources.delete_queued_resource(PROJECT, ZONE, "qr", force=True)
    for info in workers:
        wait_for(lambda i=info: group_gone(i.pgid), what="group gone")
        assert (info.scratch / "term").exists()
    assert {(w.exit_code, w.stopped_by) for w in server.workers("qr")} == {(0, "deletion")}


def test_deleting_sigkills_a_worker_that_ignores_sigterm_after_the_delete_grace(
    server: SimulatorServer,
) -> None:
    """delete of a QR whose worker traps SIGTERM and carries on: SIGKILL after delete_grace_seconds."""
    (info,) = start(server, startup_script(on_term="true"), "v4-8")
    server.simulator.queued_resources.delete_queued_resource(PROJECT, ZONE, "qr", force=True)
    ended = wait_for(lambda: not worker(server, 0, 0).alive and worker(server, 0, 0), timeout=5)
    assert (ended.exit_code, ended.stopped_by) == (-signal.SIGKILL, "deletion")
    assert (info.scratch / "term").exists()


# -- shutdown ------------------------------------------------------------------------------------


def test_stopping_the_server_leaves_no_worker_process(tmp_path: Path) -> None:
    """stop(): every worker group is gone afterwards, the obedient and the one ignoring SIGTERM."""
    config = SimulatorConfig(
        waiting_seconds=0.01, provisioning_seconds=0.01, tick_seconds=0.01, delete_grace_seconds=0.3
    )
    server = SimulatorServer(config, workers_root=tmp_path)
    try:
        server.start()
        obedient = start(server, startup_script(), "v4-16")
        server.simulator.queued_resources.create_queued_resource(
            PROJECT,
            ZONE,
            "stubborn",
            request_for(startup_script(on_term="true"), "v4-8", node_id="other"),
        )
        stubborn = wait_for(lambda: server.workers("stubborn"), what="stubborn worker")
        wait_for(lambda: (stubborn[0].scratch / "ready").exists(), what="stubborn ready")
    finally:
        server.stop()
    for info in (*obedient, *stubborn):
        with pytest.raises(ProcessLookupError):
            os.killpg(info.pgid, 0)


def test_a_made_up_workers_root_is_removed_when_the_server_stops() -> None:
    """Without workers_root the scratch dirs live in a temporary directory, gone after stop()."""
    with SimulatorServer(FAST) as server:
        root = server.workers_root
        assert root is not None and root.is_dir()
        start(server, startup_script(then="exit 3"), "v4-8")
    assert not root.exists()


def test_sigterm_to_the_simulator_process_stops_its_workers(tmp_path: Path) -> None:
    """python -m tpujobs.local.simulator with --workers-root: on SIGTERM it exits 0, its workers gone."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tpujobs.local.simulator",
            "--port=0",
            f"--workers-root={tmp_path}",
            "--waiting-seconds=0.01",
            "--provisioning-seconds=0.01",
            "--preemption-grace-seconds=7",
            "--delete-grace-seconds=0.3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip().rsplit(" ", 1)[-1]
        assert SimulatorControl(url).config()["preemption_grace_seconds"] == 7.0
        parent = f"projects/{PROJECT}/locations/{ZONE}"
        body = {
            "tpu": {
                "nodeSpec": [
                    {
                        "parent": parent,
                        "nodeId": "node",
                        "node": {
                            "acceleratorType": "v4-16",
                            "runtimeVersion": RUNTIME,
                            "metadata": {"startup-script": startup_script(on_term="true")},
                        },
                    }
                ]
            }
        }
        create = urllib.request.Request(
            f"{url}/v2/{parent}/queuedResources?queuedResourceId=qr",
            data=json.dumps(body).encode(),
            method="POST",
        )
        urllib.request.urlopen(create, timeout=5).close()

        def ready_workers() -> list[dict[str, Any]]:
            listed = SimulatorControl(url).workers(ZONE, "qr")
            ready = all(Path(w["scratch"], "ready").exists() for w in listed)
            return listed if len(listed) == 2 and ready else []

        workers = wait_for(ready_workers, what="two ready workers")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        for listed in workers:
            with pytest.raises(ProcessLookupError):
                os.killpg(listed["pgid"], 0)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# -- the metadata server over HTTP ---------------------------------------------------------------


def test_metadata_without_the_flavor_header_is_forbidden(server: SimulatorServer) -> None:
    """Like GCE: no Metadata-Flavor: Google is 403; with it, 200 text and the flavor echoed."""
    start(server, startup_script(then="exit 3"), "v4-8")
    url = metadata_url(server.url, PROJECT, ZONE, "node", 0) + "/instance/preempted"
    status, _, _ = metadata_get(url)
    assert status == 403
    status, body, headers = metadata_get(url, {"Metadata-Flavor": "Google"})
    assert (status, body) == (200, "FALSE")
    assert headers["Metadata-Flavor"] == "Google"
    assert headers["Content-Type"].startswith("text/plain")


def test_waiting_for_change_on_preempted_returns_true_when_the_node_is_preempted(
    server: SimulatorServer,
) -> None:
    """instance/preempted?wait_for_change=true is held until preemption, then answers TRUE."""
    start(server, startup_script(then="exit 3"), "v4-8")
    url = metadata_url(server.url, PROJECT, ZONE, "node", 0)
    url += "/instance/preempted?wait_for_change=true&timeout_sec=10"
    answers: list[tuple[int, str]] = []
    waiter = threading.Thread(target=lambda: answers.append(metadata_get(url, {"Metadata-Flavor": "Google"})[:2]))
    waiter.start()
    time.sleep(0.2)
    assert answers == []
    server.simulator.queued_resources.preempt("qr")
    waiter.join(timeout=5)
    assert answers == [(200, "TRUE")]


# -- tpujobs dev preempt -------------------------------------------------------------------------


@pytest.fixture
def local_stack(tmp_path: Path, emulators: dict[str, str], project_id: str, server: SimulatorServer) -> Iterator[Path]:
    """A recorded local stack made of the test's Firestore emulator and simulator."""
    state = stack.StackState(
        state_dir=tmp_path,
        env={
            "GOOGLE_CLOUD_PROJECT": project_id,
            "FIRESTORE_EMULATOR_HOST": emulators["FIRESTORE_EMULATOR_HOST"],
            "TPUJOBS_TPU_ENDPOINT": server.url,
        },
        processes=(),
        reused={"firestore": emulators["FIRESTORE_EMULATOR_HOST"]},
    )
    (tmp_path / stack.STACK_FILE).write_text(json.dumps(state.to_json()))
    with mock.patch.dict(os.environ):  # the command points os.environ at the stack
        yield tmp_path


def active_job(server: SimulatorServer, firestore_client: Any, project_id: str) -> None:
    server.simulator.queued_resources.create_queued_resource(
        project_id, ZONE, "job-1-a1", request_for(startup_script(), "v4-8")
    )
    wait_for(
        lambda: (
            server.simulator.queued_resources.get_queued_resource(project_id, ZONE, "job-1-a1").state is QrState.ACTIVE
        )
    )
    (info,) = server.workers("job-1-a1")
    wait_for(lambda: (info.scratch / "ready").exists(), what="worker ready")  # its trap is set
    firestore_client.collection("jobs").document("job-1").set(
        {"job_id": "job-1", "queued_resource": "job-1-a1", "zone": ZONE, "state": "RUNNING"}
    )


def test_dev_preempt_preempts_the_jobs_current_queued_resource(
    local_stack: Path, server: SimulatorServer, firestore_client: Any, project_id: str
) -> None:
    """tpujobs dev preempt JOB_ID reads the job's QR from Firestore and preempts it."""
    active_job(server, firestore_client, project_id)
    result = CliRunner().invoke(dev_app, ["preempt", "job-1", "--state-dir", str(local_stack)])
    assert result.exit_code == 0, result.output
    qr = server.simulator.queued_resources.get_queued_resource(project_id, ZONE, "job-1-a1")
    assert qr.state in (QrState.SUSPENDING, QrState.SUSPENDED)
    (info,) = server.workers("job-1-a1")
    wait_for(lambda: (info.scratch / "term").exists(), what="SIGTERM marker")


def test_dev_preempt_silent_kills_host_zero_without_notice(
    local_stack: Path, server: SimulatorServer, firestore_client: Any, project_id: str
) -> None:
    """--silent SIGKILLs worker 0 of slice 0; the QR stays ACTIVE and no SIGTERM arrives."""
    active_job(server, firestore_client, project_id)
    result = CliRunner().invoke(dev_app, ["preempt", "job-1", "--silent", "--state-dir", str(local_stack)])
    assert result.exit_code == 0, result.output
    killed = wait_for(lambda: not server.workers("job-1-a1")[0].alive and server.workers("job-1-a1")[0])
    assert (killed.exit_code, killed.stopped_by) == (-signal.SIGKILL, "host-failure")
    qr = server.simulator.queued_resources.get_queued_resource(project_id, ZONE, "job-1-a1")
    assert qr.state is QrState.ACTIVE


def test_dev_preempt_of_an_unknown_job_or_without_a_stack_fails_clearly(local_stack: Path, tmp_path: Path) -> None:
    """An unknown job id and a missing stack each exit 1 with a sentence saying which."""
    runner = CliRunner()
    missing = runner.invoke(dev_app, ["preempt", "nope", "--state-dir", str(local_stack)])
    assert missing.exit_code == 1
    assert "no such job" in missing.output
    no_stack = runner.invoke(dev_app, ["preempt", "nope", "--state-dir", str(tmp_path / "none")])
    assert no_stack.exit_code == 1
    assert "no local stack" in no_stack.output


# -- hosts that never boot, reboots and maintenance, on real processes --------------------------

BOOT_COUNTING = """#!/bin/bash
cd "$TPUJOBS_WORKDIR"
echo booted >> boots
echo "boot number $(wc -l < boots)"
trap 'echo term >> ../term; exit 0' TERM
touch "../ready-$(wc -l < boots)" ../ready
[ -p ../idle ] || mkfifo ../idle
exec 9<>../idle
while :; do read -r -t 30 -u 9 || true; done
"""


def reconfigure(server: SimulatorServer, **changes: float) -> None:
    server.simulator.fault_plan.reconfigure(dataclasses.replace(server.simulator.config, **changes))


def test_queued_resources_after_no_boot_turn_active_but_run_no_startup_script(
    server: SimulatorServer,
) -> None:
    """no_boot(1): the next QR is ACTIVE and READY, yet no process ran and no disk was made."""
    server.simulator.fault_plan.no_boot(1)
    sim = server.simulator
    sim.queued_resources.create_queued_resource(PROJECT, ZONE, "qr", request_for(startup_script(), "v4-16"))
    wait_for(lambda: sim.queued_resources.get_queued_resource(PROJECT, ZONE, "qr").state is QrState.ACTIVE)
    time.sleep(0.2)
    assert server.workers("qr") == ()
    assert sim.nodes.get_node(PROJECT, ZONE, "node").state.value == "READY"
    assert server.workers_root is not None and not (server.workers_root / "qr").exists()


def test_reboot_kills_a_host_without_sigterm_and_reruns_its_script_on_the_same_disk(
    server: SimulatorServer,
) -> None:
    """reboot(worker=1): that host's processes die by SIGKILL with no trap run; after
    reboot_seconds its startup script runs again in the same scratch, whose files survived, and
    worker.log goes on. Worker 0 runs on untouched."""
    reconfigure(server, reboot_seconds=0.2)
    first = start(server, BOOT_COUNTING)
    server.simulator.nodes.reboot("qr", 0, 1)
    rebooted = wait_for(lambda: worker(server, 0, 1).boot == 2 and worker(server, 0, 1))
    assert rebooted.scratch == first[1].scratch
    wait_for(lambda: (rebooted.scratch / "ready-2").exists(), what="second boot")
    assert (rebooted.workdir / "boots").read_text() == "booted\nbooted\n"
    assert not (rebooted.scratch / "term").exists()  # a reset: no SIGTERM
    log = rebooted.log.read_text()
    assert "boot number 1" in log and "boot number 2" in log
    assert rebooted.alive and rebooted.pid != first[1].pid
    assert wait_for(lambda: group_gone(first[1].pgid), what="old group gone")
    survivor = worker(server, 0, 0)
    assert (survivor.boot, survivor.pid, survivor.alive) == (1, first[0].pid, True)
    node = server.simulator.nodes.get_node(PROJECT, ZONE, "node")
    assert node.state.value == "READY"


def test_maintenance_warns_through_the_metadata_then_stops_the_hosts_then_boots_them_again(
    server: SimulatorServer,
) -> None:
    """A wait_for_change on instance/maintenance-event returns TERMINATE_ON_HOST_MAINTENANCE; after the
    notice every host gets SIGTERM (stopped by maintenance); after maintenance_seconds they boot again
    and the event is NONE."""
    reconfigure(server, maintenance_notice_seconds=0.5, maintenance_seconds=0.5)
    workers = start(server, BOOT_COUNTING, "v4-8")
    url = metadata_url(server.url, PROJECT, ZONE, "node", 0) + "/instance/maintenance-event"
    _, before, headers = metadata_get(url, {"Metadata-Flavor": "Google"})
    assert before == "NONE"
    answers: list[tuple[int, str]] = []
    wait = f"{url}?wait_for_change=true&timeout_sec=10&last_etag={headers['ETag']}"
    waiter = threading.Thread(target=lambda: answers.append(metadata_get(wait, {"Metadata-Flavor": "Google"})[:2]))
    waiter.start()
    server.simulator.nodes.maintenance("qr")
    waiter.join(timeout=5)
    assert answers == [(200, "TERMINATE_ON_HOST_MAINTENANCE")]
    wait_for(lambda: (workers[0].scratch / "term").exists(), what="SIGTERM at the end of the notice")
    back = wait_for(lambda: worker(server, 0, 0).boot == 2 and worker(server, 0, 0))
    wait_for(lambda: (back.scratch / "ready-2").exists(), what="boot after maintenance")
    assert metadata_get(url, {"Metadata-Flavor": "Google"})[1] == "NONE"


# -- tpujobs dev fault ---------------------------------------------------------------------------


def fault(local_stack: Path, *args: str) -> Any:
    """Run `tpujobs dev fault ARGS` against the test's stack; the CliRunner result."""
    return CliRunner().invoke(dev_app, ["fault", *args, "--state-dir", str(local_stack)])


def test_dev_fault_error_plans_errors_that_the_real_client_meets(
    local_stack: Path, server: SimulatorServer, project_id: str
) -> None:
    """fault error --method get --code UNAVAILABLE --count 2: two gets fail with 503, the third works."""
    from google.api_core import exceptions

    from tpujobs.adapters.tpu import build_client

    result = fault(local_stack, "error", "--method", "get", "--code", "UNAVAILABLE", "--count", "2")
    assert result.exit_code == 0, result.output
    assert "503 UNAVAILABLE" in result.output
    client = build_client(server.url)
    name = f"projects/{project_id}/locations/{ZONE}/queuedResources/none"
    for _ in range(2):
        with pytest.raises(exceptions.ServiceUnavailable):
            client.get_queued_resource(name=name)
    with pytest.raises(exceptions.NotFound):
        client.get_queued_resource(name=name)


def test_dev_fault_error_quota_applied_and_show_and_clear(local_stack: Path, server: SimulatorServer) -> None:
    """--quota and --applied reach the plan; show prints it as JSON; clear forgets it."""
    result = fault(local_stack, "error", "--method", "create", "--code", "429", "--quota", "--applied")
    assert result.exit_code == 0, result.output
    shown = fault(local_stack, "show")
    assert json.loads(shown.stdout)["errors"]["create"] == [
        {"code": 429, "status": "RESOURCE_EXHAUSTED", "quota": True, "applied": True, "message": ""}
    ]
    assert fault(local_stack, "clear").exit_code == 0
    assert server.simulator.fault_plan.faults()["errors"]["create"] == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("error", "--method", "get", "--code", "NOPE"), "bad --code"),
        (("error", "--method", "get", "--code", "503", "--quota"), "bad --code"),
        (("no-boot", "job-1", "--count", "2"), "not both"),
        (("reboot", "nope"), "no such job"),
    ],
)
def test_dev_fault_refuses_what_makes_no_sense_with_a_sentence(
    local_stack: Path, args: tuple[str, ...], says: str
) -> None:
    """A bad code, a quota that is no 429, a JOB with --count, an unknown job: exit 1 saying which."""
    result = fault(local_stack, *args)
    assert result.exit_code == 1
    assert says in result.output


def test_dev_fault_no_boot_count_and_no_boot_of_a_waiting_job(
    local_stack: Path, server: SimulatorServer, firestore_client: Any, project_id: str
) -> None:
    """no-boot --count 2 plans two; no-boot JOB marks the job's waiting QR, which turns ACTIVE with
    no process, and no-boot of an ACTIVE job's QR is refused."""
    assert fault(local_stack, "no-boot", "--count", "2").exit_code == 0
    assert server.simulator.fault_plan.faults()["noBoot"] == 2
    server.simulator.fault_plan.clear_faults()
    reconfigure_capacity = dataclasses.replace(server.simulator.config, capacity={f"v4@{ZONE}": 0})
    server.simulator.fault_plan.reconfigure(reconfigure_capacity)
    server.simulator.queued_resources.create_queued_resource(
        project_id, ZONE, "job-2-a1", request_for(startup_script(), "v4-8")
    )
    firestore_client.collection("jobs").document("job-2").set(
        {"job_id": "job-2", "queued_resource": "job-2-a1", "zone": ZONE, "state": "PROVISIONING"}
    )
    result = fault(local_stack, "no-boot", "job-2")
    assert result.exit_code == 0, result.output
    server.simulator.fault_plan.reconfigure(dataclasses.replace(server.simulator.config, capacity={}))
    wait_for(
        lambda: (
            server.simulator.queued_resources.get_queued_resource(project_id, ZONE, "job-2-a1").state is QrState.ACTIVE
        )
    )
    time.sleep(0.2)
    assert server.workers("job-2-a1") == ()
    refused = fault(local_stack, "no-boot", "job-2")
    assert refused.exit_code == 1
    assert "ACTIVE" in refused.output


def test_dev_fault_reboot_reruns_the_jobs_host(
    local_stack: Path, server: SimulatorServer, firestore_client: Any, project_id: str
) -> None:
    """fault reboot JOB --worker 0: the host is SIGKILLed (stopped by reboot) and boots a second time."""
    reconfigure(server, reboot_seconds=0.2)
    active_job(server, firestore_client, project_id)
    (first,) = server.workers("job-1-a1")
    result = fault(local_stack, "reboot", "job-1", "--worker", "0")
    assert result.exit_code == 0, result.output
    assert "RESTARTING" in result.output
    second = wait_for(lambda: server.workers("job-1-a1")[0].boot == 2 and server.workers("job-1-a1")[0])
    assert second.alive and second.scratch == first.scratch
    assert not (first.scratch / "term").exists()


def test_dev_fault_maintenance_announces_and_then_takes_the_host_down(
    local_stack: Path, server: SimulatorServer, firestore_client: Any, project_id: str
) -> None:
    """fault maintenance JOB --notice 0: the node goes REPAIRING and its host gets SIGTERM."""
    active_job(server, firestore_client, project_id)
    (info,) = server.workers("job-1-a1")
    result = fault(local_stack, "maintenance", "job-1", "--notice", "0")
    assert result.exit_code == 0, result.output
    wait_for(lambda: (info.scratch / "term").exists(), what="SIGTERM of the maintenance")
    node = server.simulator.nodes.get_node(project_id, ZONE, "node")
    assert (node.state.value, node.health) == ("REPAIRING", "UNHEALTHY_MAINTENANCE")
    assert node.maintenance_event == "TERMINATE_ON_HOST_MAINTENANCE"


def test_dev_fault_node_health_and_node_state_change_what_the_api_shows(
    local_stack: Path, server: SimulatorServer, firestore_client: Any, project_id: str
) -> None:
    """node-health JOB unhealthy_tensorflow --description and node-state JOB UNKNOWN; the host runs on."""
    active_job(server, firestore_client, project_id)
    health = fault(local_stack, "node-health", "job-1", "unhealthy_tensorflow", "--description", "XLA died")
    assert health.exit_code == 0, health.output
    state = fault(local_stack, "node-state", "job-1", "UNKNOWN")
    assert state.exit_code == 0, state.output
    node = server.simulator.nodes.get_node(project_id, ZONE, "node")
    assert (node.state.value, node.health, node.health_description) == (
        "UNKNOWN",
        "UNHEALTHY_TENSORFLOW",
        "XLA died",
    )
    assert server.workers("job-1-a1")[0].alive
    assert fault(local_stack, "node-state", "job-1", "ON_FIRE").exit_code != 0

"""`tpujobs dev preempt` and `tpujobs dev fault ...` on a job whose slices are Compute Engine MIGs, and on
jobs that run on a warm-pool unit (either platform), against a simulator running real host processes
and the Firestore emulator holding the job documents."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from typer.testing import CliRunner

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
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.emulator

REGION, ZONE = "us-central1", "us-central1-a"
FAST = SimulatorConfig(
    waiting_seconds=0.01,
    provisioning_seconds=0.05,
    compute_operation_seconds=0.05,
    tick_seconds=0.01,
    reboot_seconds=0.2,
    maintenance_seconds=0.5,
    # Generous: a preempted VM must still be STOPPING when the command's answer is read.
    preemption_grace_seconds=5.0,
    delete_grace_seconds=0.5,
)
# Counts its boots on its disk, notes a SIGTERM beside it, then idles on a FIFO with builtins only.
HOST = """#!/bin/bash
cd "$TPUJOBS_WORKDIR"
echo booted >> boots
trap 'echo term >> ../term; exit 0' TERM
touch "../ready-$(wc -l < boots)" ../ready
[ -p ../idle ] || mkfifo ../idle
exec 9<>../idle
while :; do read -r -t 30 -u 9 || true; done
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SimulatorServer]:
    with SimulatorServer(FAST, workers_root=tmp_path / "workers") as running:
        yield running


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


def dev(local_stack: Path, *args: str) -> Any:
    """`tpujobs dev ARGS` against the test's stack; the CliRunner result."""
    return CliRunner().invoke(dev_app, [*args, "--state-dir", str(local_stack)])


def make_slice(server: SimulatorServer, project: str, name: str, hosts: int = 2) -> None:
    """A Spot v7x slice as the Compute adapter makes it: template, workload policy (multi-host), MIG."""
    sim = server.simulator
    properties = {
        "machineType": "tpu7x-standard-4t",
        "disks": [{"boot": True}],
        "networkInterfaces": [{"network": "global/networks/default"}],
        "scheduling": {
            "provisioningModel": "SPOT",
            "instanceTerminationAction": "DELETE",
            "onHostMaintenance": "TERMINATE",
            "automaticRestart": False,
        },
        "metadata": {"items": [{"key": "startup-script", "value": HOST}]},
    }
    sim.compute.operations.insert_template(project, REGION, {"name": name, "properties": properties})
    group: dict[str, Any] = {
        "name": name,
        "baseInstanceName": name,
        "instanceTemplate": f"projects/{project}/regions/{REGION}/instanceTemplates/{name}",
        "targetSize": hosts,
        "instanceLifecyclePolicy": {"defaultActionOnFailure": "DO_NOTHING"},
    }
    if hosts > 1:
        workload = {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}
        sim.compute.operations.insert_policy(project, REGION, {"name": name, "workloadPolicy": workload})
        group["resourcePolicies"] = {"workloadPolicy": f"projects/{project}/regions/{REGION}/resourcePolicies/{name}"}
    sim.compute.groups.insert_group(project, ZONE, group)


def hosts(server: SimulatorServer, project: str, group: str) -> tuple[WorkerInfo, ...]:
    backing = server.simulator.compute.groups.get_group(project, ZONE, group).record.backing
    return server.workers(backing, zone=ZONE, project=project)


def running(server: SimulatorServer, project: str, group: str, count: int = 2) -> tuple[WorkerInfo, ...]:
    """Wait until every VM of the MIG is RUNNING and every host has set its SIGTERM trap."""
    wait_for(
        lambda: (
            [m.status for m in server.simulator.compute.groups.get_group(project, ZONE, group).members]
            == ["RUNNING"] * count
        ),
        what=f"{group} RUNNING",
    )
    found = wait_for(lambda: len(hosts(server, project, group)) == count and hosts(server, project, group))
    for info in found:
        wait_for(lambda i=info: (i.scratch / "ready").exists(), what="host ready")
    return found


def record_job(firestore_client: Any, job_id: str, holding: str, slices: int = 1, unit: str = "") -> None:
    firestore_client.collection("jobs").document(job_id).set(
        {
            "job_id": job_id,
            "queued_resource": holding,
            "warm_pool_unit": unit,
            "zone": ZONE,
            "state": "RUNNING",
            "spec": {"slices": slices},
        }
    )


@pytest.fixture
def compute_job(server: SimulatorServer, firestore_client: Any, project_id: str) -> tuple[WorkerInfo, ...]:
    """Job `v7x-1` running on one two-host slice, its MIG `v7x-1-c1`; its two hosts."""
    make_slice(server, project_id, "v7x-1-c1")
    found = running(server, project_id, "v7x-1-c1")
    record_job(firestore_client, "v7x-1", "v7x-1-c1")
    return found


def test_dev_preempt_of_a_compute_job_preempts_every_vm_of_its_mig(
    local_stack: Path, server: SimulatorServer, project_id: str, compute_job: tuple[WorkerInfo, ...]
) -> None:
    """dev preempt JOB: both Spot VMs are STOPPING with instance/preempted TRUE, and each host gets SIGTERM."""
    result = dev(local_stack, "preempt", "v7x-1")
    assert result.exit_code == 0, result.output
    assert "preempted the Spot VMs of v7x-1-c1" in result.output
    members = server.simulator.compute.groups.get_group(project_id, ZONE, "v7x-1-c1").members
    assert [(m.status, m.record.preempted) for m in members] == [("STOPPING", True)] * 2
    for info in compute_job:
        wait_for(lambda i=info: (i.scratch / "term").exists(), what="SIGTERM of the preemption")


def test_dev_preempt_silent_of_a_compute_job_kills_worker_zero_without_notice(
    local_stack: Path, server: SimulatorServer, project_id: str, compute_job: tuple[WorkerInfo, ...]
) -> None:
    """--silent: worker 0's host is SIGKILLed with no SIGTERM and its VM TERMINATED as a host error leaves it,
    not preempted; worker 1 runs on, RUNNING."""
    result = dev(local_stack, "preempt", "v7x-1", "--silent")
    assert result.exit_code == 0, result.output
    killed = wait_for(
        lambda: not hosts(server, project_id, "v7x-1-c1")[0].alive and hosts(server, project_id, "v7x-1-c1")[0]
    )
    assert (killed.exit_code, killed.stopped_by) == (-signal.SIGKILL, "host-failure")
    assert not (killed.scratch / "term").exists()
    survivor = hosts(server, project_id, "v7x-1-c1")[1]
    assert survivor.alive and not (survivor.scratch / "term").exists()
    members = server.simulator.compute.groups.get_group(project_id, ZONE, "v7x-1-c1").members
    assert [(m.status, m.record.preempted) for m in members] == [("TERMINATED", False), ("RUNNING", False)]


def test_dev_preempt_of_a_multislice_compute_job_preempts_each_slices_mig(
    local_stack: Path, server: SimulatorServer, firestore_client: Any, project_id: str
) -> None:
    """A job of two one-host slices holds MIGs `{holding}-0` and `{holding}-1`: dev preempt hits both."""
    for index in (0, 1):
        make_slice(server, project_id, f"multi-c1-{index}", hosts=1)
    for index in (0, 1):
        running(server, project_id, f"multi-c1-{index}", count=1)
    record_job(firestore_client, "multi", "multi-c1", slices=2)
    result = dev(local_stack, "preempt", "multi")
    assert result.exit_code == 0, result.output
    for index in (0, 1):
        (member,) = server.simulator.compute.groups.get_group(project_id, ZONE, f"multi-c1-{index}").members
        assert member.record.preempted


def test_dev_preempt_of_a_job_on_a_compute_warm_pool_unit_preempts_the_units_mig(
    local_stack: Path, server: SimulatorServer, firestore_client: Any, project_id: str
) -> None:
    """A pool job's document names its unit (`warm_pool_unit`): the unit's MIG is preempted, not `JOB-c1`."""
    make_slice(server, project_id, "pool-c0-g1")
    running(server, project_id, "pool-c0-g1")
    record_job(firestore_client, "pooled", "", unit="pool-c0-g1")
    result = dev(local_stack, "preempt", "pooled")
    assert result.exit_code == 0, result.output
    assert "its warm-pool unit" in result.output
    members = server.simulator.compute.groups.get_group(project_id, ZONE, "pool-c0-g1").members
    assert all(m.record.preempted for m in members)


def test_dev_preempt_of_a_job_on_a_tpu_api_warm_pool_unit_preempts_the_units_queued_resource(
    local_stack: Path, server: SimulatorServer, firestore_client: Any, project_id: str
) -> None:
    """Issue 28: `dev preempt` of a pool job used to look for `JOB-a1`; it now preempts the unit's queued resource."""
    template = {"metadata": {"startup-script": HOST}, "schedulingConfig": {"spot": True}}
    request = QueuedResourceRequest(
        slices=(SliceRequest("v4-8", "tpu-ubuntu2204-base", node_id="unit", template=template),)
    )
    server.simulator.queued_resources.create_queued_resource(
        project_id, ZONE, "pool-u0-g1", dataclasses.replace(request, spot=True)
    )
    wait_for(
        lambda: (
            server.simulator.queued_resources.get_queued_resource(project_id, ZONE, "pool-u0-g1").state
            is QrState.ACTIVE
        )
    )
    record_job(firestore_client, "pooled-tpu", "pooled-tpu-a1", unit="pool-u0-g1")
    result = dev(local_stack, "preempt", "pooled-tpu")
    assert result.exit_code == 0, result.output
    state = server.simulator.queued_resources.get_queued_resource(project_id, ZONE, "pool-u0-g1").state
    assert state in (QrState.SUSPENDING, QrState.SUSPENDED)


def test_dev_fault_reboot_of_a_compute_job_resets_one_vm_whose_host_boots_again(
    local_stack: Path, server: SimulatorServer, project_id: str, compute_job: tuple[WorkerInfo, ...]
) -> None:
    """fault reboot JOB --worker 1: that host dies without SIGTERM and runs its startup script again on the
    same disk; worker 0 keeps its first boot."""
    result = dev(local_stack, "fault", "reboot", "v7x-1", "--worker", "1")
    assert result.exit_code == 0, result.output
    second = wait_for(lambda: (w := hosts(server, project_id, "v7x-1-c1")[1]).boot == 2 and w)
    wait_for(lambda: (second.scratch / "ready-2").exists(), what="second boot")
    assert (second.workdir / "boots").read_text() == "booted\nbooted\n"
    assert not (second.scratch / "term").exists()
    first = hosts(server, project_id, "v7x-1-c1")[0]
    assert (first.boot, first.pid, first.alive) == (1, compute_job[0].pid, True)


def test_dev_fault_maintenance_of_a_compute_job_terminates_its_vms_for_good(
    local_stack: Path, server: SimulatorServer, project_id: str, compute_job: tuple[WorkerInfo, ...]
) -> None:
    """fault maintenance JOB --notice 0: every host gets SIGTERM (instance/maintenance-event is never
    set, as Google leaves it for TPU VMs), and the VMs end TERMINATED, their hosts never booting again."""
    result = dev(local_stack, "fault", "maintenance", "v7x-1", "--notice", "0")
    assert result.exit_code == 0, result.output
    backing = server.simulator.compute.groups.get_group(project_id, ZONE, "v7x-1-c1").record.backing
    assert server.simulator.node_updates.host_node(project_id, ZONE, backing).maintenance_event == "NONE"
    for info in compute_job:
        wait_for(lambda i=info: (i.scratch / "term").exists(), what="SIGTERM of the maintenance")
    groups = server.simulator.compute.groups
    members = lambda: [m.status for m in groups.get_group(project_id, ZONE, "v7x-1-c1").members]  # noqa: E731
    wait_for(lambda: members() == ["TERMINATED", "TERMINATED"], what="TERMINATED for good")
    assert all(w.boot == 1 for w in hosts(server, project_id, "v7x-1-c1"))


def test_dev_fault_maintenance_upcoming_announces_it_on_every_vm_as_google_does(
    local_stack: Path, server: SimulatorServer, project_id: str, compute_job: tuple[WorkerInfo, ...]
) -> None:
    """--scheduled-in 600: each VM shows upcomingMaintenance and its metadata key; the hosts run on."""
    result = dev(local_stack, "fault", "maintenance", "v7x-1", "--scheduled-in", "600", "--window", "1200")
    assert result.exit_code == 0, result.output
    for member in server.simulator.compute.groups.get_group(project_id, ZONE, "v7x-1-c1").members:
        upcoming = member.record.upcoming_maintenance
        assert upcoming is not None and upcoming["maintenanceStatus"] == "PENDING"
    url = metadata_url(
        server.url,
        project_id,
        ZONE,
        server.simulator.compute.groups.get_group(project_id, ZONE, "v7x-1-c1").record.backing,
        1,
    )
    request = urllib.request.Request(url + "/instance/upcoming-maintenance", headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert "window_start_time" in answer.read().decode()
    assert all(w.alive and w.boot == 1 for w in hosts(server, project_id, "v7x-1-c1"))


def test_dev_fault_no_boot_of_a_waiting_compute_job_gives_it_hosts_that_never_boot(
    local_stack: Path, server: SimulatorServer, firestore_client: Any, project_id: str
) -> None:
    """no-boot JOB on a slice waiting for chips: its VMs turn RUNNING with no host process; on a RUNNING
    slice it is refused with a sentence."""
    sim = server.simulator
    sim.fault_plan.reconfigure(dataclasses.replace(sim.config, capacity={f"v7x@{ZONE}": 0}))
    make_slice(server, project_id, "late-c1")
    record_job(firestore_client, "late", "late-c1")
    result = dev(local_stack, "fault", "no-boot", "late")
    assert result.exit_code == 0, result.output
    sim.fault_plan.reconfigure(dataclasses.replace(sim.config, capacity={}))
    wait_for(
        lambda: [m.status for m in sim.compute.groups.get_group(project_id, ZONE, "late-c1").members] == ["RUNNING"] * 2
    )
    assert hosts(server, project_id, "late-c1") == ()
    refused = dev(local_stack, "fault", "no-boot", "late")
    assert refused.exit_code == 1
    assert "running" in refused.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("node-health", "v7x-1", "unhealthy_tensorflow"), "node-health cannot apply"),
        (("node-state", "v7x-1", "UNKNOWN"), "node-state cannot apply"),
        (("reboot", "v7x-1", "--slice", "3"), "no such slice"),
    ],
)
def test_dev_fault_verbs_that_cannot_apply_to_a_compute_job_say_why(
    local_stack: Path, compute_job: tuple[WorkerInfo, ...], args: tuple[str, ...], says: str
) -> None:
    """A TPU node's health or state, or a slice the job does not have: exit 1 with a sentence."""
    result = dev(local_stack, "fault", *args)
    assert result.exit_code == 1
    assert says in result.output
    assert all(info.alive for info in compute_job)


def tpu_unit(server: SimulatorServer, project: str, name: str) -> tuple[WorkerInfo, ...]:
    """A v4-8 queued resource `name` (one node of the same name), ACTIVE, its host ready."""
    template = {"metadata": {"startup-script": HOST}}
    request = QueuedResourceRequest(
        slices=(SliceRequest("v4-8", "tpu-ubuntu2204-base", node_id=name, template=template),)
    )
    server.simulator.queued_resources.create_queued_resource(project, ZONE, name, request)
    wait_for(lambda: server.simulator.queued_resources.get_queued_resource(project, ZONE, name).state is QrState.ACTIVE)
    found = wait_for(lambda: server.workers(name, zone=ZONE, project=project))
    for info in found:
        wait_for(lambda i=info: (i.scratch / "ready").exists(), what="host ready")
    return found


def test_dev_fault_maintenance_upcoming_on_a_tpu_api_unit_announces_it_as_google_does(
    local_stack: Path, server: SimulatorServer, firestore_client: Any, project_id: str
) -> None:
    """--scheduled-in 600 on a job on a TPU API warm-pool unit: the unit's node shows upcomingMaintenance
    (SCHEDULED, PENDING) and its host's instance/upcoming-maintenance the window; the host runs on."""
    (host,) = tpu_unit(server, project_id, "pool-u1-g1")
    record_job(firestore_client, "pooled-m", "pooled-m-a1", unit="pool-u1-g1")
    result = dev(local_stack, "fault", "maintenance", "pooled-m", "--scheduled-in", "600", "--window", "1200")
    assert result.exit_code == 0, result.output
    assert "maintenance scheduled in 600 s for 1200 s on pool-u1-g1" in result.output
    upcoming = server.simulator.nodes.get_node(project_id, ZONE, "pool-u1-g1").upcoming_maintenance
    assert upcoming is not None and (upcoming["type"], upcoming["maintenanceStatus"]) == ("SCHEDULED", "PENDING")
    url = metadata_url(server.url, project_id, ZONE, "pool-u1-g1", 0) + "/instance/upcoming-maintenance?alt=json"
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Metadata-Flavor": "Google"}), timeout=5) as got:
        assert json.loads(got.read())["window_start_time"] == upcoming["windowStartTime"]
    assert host.alive and not (host.scratch / "term").exists()


def test_dev_fault_maintenance_upcoming_on_a_tpu_api_job_takes_its_hosts_down_when_the_window_starts(
    local_stack: Path, server: SimulatorServer, firestore_client: Any, project_id: str
) -> None:
    """--scheduled-in 0: the window starts at once, so the host gets SIGTERM, boots again after the
    maintenance, and the node's notice is gone."""
    (host,) = tpu_unit(server, project_id, "tpu-1-a1")
    record_job(firestore_client, "tpu-1", "tpu-1-a1")
    result = dev(local_stack, "fault", "maintenance", "tpu-1", "--scheduled-in", "0")
    assert result.exit_code == 0, result.output
    wait_for(lambda: (host.scratch / "term").exists(), what="SIGTERM of the maintenance")
    wait_for(lambda: all(w.boot == 2 and w.alive for w in server.workers("tpu-1-a1", zone=ZONE, project=project_id)))
    assert server.simulator.nodes.get_node(project_id, ZONE, "tpu-1-a1").upcoming_maintenance is None
